"""make wheelhouse, tried as a venue uses it: three platforms downloaded, then a fresh venv installs with no network.

Slow (several hundred MB of downloads and a full install): `make wheelhouse-test`,
which `make test` runs. Skipped, with the reason, where the package registry
cannot be reached.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "wheelhouse.py"
PLATFORMS = ("linux-x86_64", "macos-arm64", "windows-x86_64")


def registry_reachable() -> tuple[bool, str]:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", "/tmp/wheelhouse-probe", "six"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode == 0, done.stderr.strip()[-500:]


def no_network_prefix() -> list[str]:
    """``unshare -n`` (no network at all) where this user may use it; else nothing (--no-index still applies)."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n"]
    return []


def test_three_platforms_then_an_offline_install_that_imports_the_course(tmp_path):
    ok, why = registry_reachable()
    if not ok:
        pytest.skip(f"the package registry cannot be reached, so the wheelhouse cannot be downloaded: {why}")
    dest = tmp_path / "wheelhouse"
    args = [sys.executable, str(TOOL), "--dest", str(dest)]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((dest / "MANIFEST.json").read_text())
    assert set(manifest) == set(PLATFORMS)
    names = {p.name for p in dest.glob("*.whl")}
    assert any("jaxlib" in n and "manylinux" in n for n in names)
    assert any("jaxlib" in n and "macosx" in n and "arm64" in n for n in names)
    assert any("jaxlib" in n and "win_amd64" in n for n in names)
    assert any(n.startswith("colorama-") for n in names), "Windows needs colorama (by marker only)"

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    source = tmp_path / "course"
    shutil.copytree(
        ROOT, source, ignore=shutil.ignore_patterns(".venv*", ".git", "node_modules", "results", "build", "workspace")
    )
    start = time.monotonic()
    install = [
        *no_network_prefix(),
        "sh",
        "-c",
        # --no-compile: no bytecode for modules this test never imports (a venue's install writes it; the time says so)
        f"{python} -m pip install --quiet --no-compile --no-index --find-links {dest} -r {source / 'requirements.txt'}"
        f" && {python} -m pip install --quiet --no-compile --no-index --find-links {dest} --no-deps -e {source}",
    ]
    done = subprocess.run(install, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    check = subprocess.run(
        [str(python), "-c", "import dpcourse, jax, jupyterlab; print(jax.__version__, len(jax.devices()))"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
    )
    assert check.returncode == 0, check.stderr[-2000:]
    sizes = {p: round(manifest[p]["bytes"] / 1e6) for p in PLATFORMS}
    said = f"offline install {seconds:.0f} s without bytecode; jax {check.stdout.strip()}"
    print(f"\nwheelhouse MB per platform {sizes}; {said}")
