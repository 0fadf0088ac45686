"""tools/wheelhouse.py's manifest and its check: an unfinished wheelhouse is refused with what is missing.

Cheap (no download): the downloads are replaced by files written here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("wheelhouse_tool", ROOT / "tools" / "wheelhouse.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)
PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def wheelhouse(tmp_path: Path, platforms: dict[str, list[str]] | None, python: str = PY) -> Path:
    dest = tmp_path / "wheelhouse"
    dest.mkdir()
    (dest / "six-1.17.0-py2.py3-none-any.whl").write_bytes(b"wheel")
    if platforms is not None:
        manifest = {name: {"files": files, "bytes": 5, "python": python} for name, files in platforms.items()}
        (dest / "MANIFEST.json").write_text(json.dumps(manifest))
    return dest


def test_wheels_without_a_manifest_are_an_unfinished_download_with_how_to_finish_it(tmp_path):
    problem = tool.check(wheelhouse(tmp_path, None))
    assert "no MANIFEST.json" in problem and "did not finish" in problem and "make wheelhouse" in problem


def test_a_wheelhouse_without_this_platform_names_it_and_the_command_that_adds_it(tmp_path):
    dest = wheelhouse(tmp_path, {"linux-x86_64": ["six-1.17.0-py2.py3-none-any.whl"]})
    problem = tool.check(dest, platform="macos-arm64")
    assert "(macos-arm64; it has: linux-x86_64)" in problem and "--platform macos-arm64" in problem


def test_another_python_and_a_missing_listed_file_are_named(tmp_path):
    dest = wheelhouse(tmp_path, {"linux-x86_64": ["six-1.17.0-py2.py3-none-any.whl", "jax-0.10.2.whl"]}, "3.9")
    assert "made for Python 3.9" in tool.check(dest, python_version="3.11", platform="linux-x86_64")
    problem = tool.check(dest, python_version="3.9", platform="linux-x86_64")
    assert "lacks 1 file(s)" in problem and "jax-0.10.2.whl" in problem


def test_a_complete_wheelhouse_passes(tmp_path):
    dest = wheelhouse(tmp_path, {"linux-x86_64": ["six-1.17.0-py2.py3-none-any.whl"]})
    assert tool.check(dest, platform="linux-x86_64") is None


def test_an_interrupted_download_leaves_no_manifest(tmp_path, monkeypatch):
    dest = wheelhouse(tmp_path, {"linux-x86_64": ["six-1.17.0-py2.py3-none-any.whl"]})  # an earlier, finished run

    def download(platform, dest, requirements, python_version):
        if platform != "linux-x86_64":
            raise KeyboardInterrupt  # SIGINT or SIGTERM while the second platform downloads
        return {"files": ["six-1.17.0-py2.py3-none-any.whl"], "bytes": 5, "download_s": 0.1}

    monkeypatch.setattr(tool, "download", download)
    with pytest.raises(KeyboardInterrupt):
        tool.main(["--dest", str(dest)])
    assert not (dest / "MANIFEST.json").exists()
    assert tool.main(["--dest", str(dest), "--platform", "linux-x86_64"]) == 0
    assert json.loads((dest / "MANIFEST.json").read_text())["linux-x86_64"]["python"] == PY


def test_the_makefiles_install_refuses_an_unfinished_wheelhouse_before_pip(tmp_path):
    dest = wheelhouse(tmp_path, None)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")  # make sees the venv's Python: nothing is created
    done = subprocess.run(
        ["make", "-s", f"VENV={venv}", f"WHEELHOUSE={dest}", f"{venv}/.installed"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "no MANIFEST.json" in done.stderr, done.stderr
    assert "pip" not in done.stdout and not (venv / ".installed").exists()


def test_the_requirements_markers_are_read_for_the_target_platform_not_this_machine():
    text = (ROOT / "requirements.txt").read_text()
    windows = tool.for_platform(text, "windows-x86_64", "3.11")
    linux = tool.for_platform(text, "linux-x86_64", "3.11")
    orbax = {
        name: [line for line in out.splitlines() if line.startswith("orbax-checkpoint")]
        for name, out in (("windows", windows), ("linux", linux))
    }
    # Orbax 0.11.33 and later need uvloop, which Windows cannot install.
    assert orbax == {"windows": ["orbax-checkpoint==0.11.32"], "linux": ["orbax-checkpoint==0.12.8"]}
    assert "jax==" in windows and ";" not in "".join(line for line in windows.splitlines() if not line.startswith("#"))


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_path_that_is_no_folder_is_named_as_such_not_as_an_unfinished_download(tmp_path, kind):
    dest = tmp_path / "wheelhouse"
    if kind == "file":
        dest.write_text("")
    problem = tool.check(dest)
    assert ("is a file, not a folder" if kind == "file" else "does not exist") in problem
    assert "did not finish" not in problem and "cannot be read" not in problem
