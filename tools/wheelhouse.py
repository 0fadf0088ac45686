"""Download the course's pinned requirements for Linux, macOS and Windows into one folder (make wheelhouse).

    python tools/wheelhouse.py [--dest wheelhouse] [--python-version 3.11] [--platform linux ...]

An instructor hands the folder out on a USB stick or a local share; on each
laptop `make course` / `make lab` (or `pip install --no-index --find-links
wheelhouse -r requirements.txt`) then installs with no network.

Each platform is downloaded with pip's --platform tags (binary wheels only):
Linux x86-64 with several manylinux tags (jaxlib is manylinux_2_27, others
2_17 or 2014), macOS 12 or later on arm64 and x86-64 (scipy has no macOS 11
wheel), Windows x86-64. macOS x86-64 (Intel Macs) is not in the default
set: jaxlib publishes no macOS x86-64 wheel after 0.4.38, so the pinned JAX
cannot be installed there (``--platform macos-x86_64`` says so). pip evaluates environment markers for the machine it
runs on, not the target: the markers in the requirements file itself are
evaluated here for each target (Windows takes another Orbax), and the packages
that other platforms need only through a dependency's marker (colorama and
pywinpty on Windows, appnope on macOS) are named here.
wheelhouse/MANIFEST.json lists each platform's files and size. It is written
last, in one step: a folder without it is a download that did not finish.

    python tools/wheelhouse.py --check wheelhouse

is what the Makefile's installs run before they use the folder: it refuses a
wheelhouse with no manifest, without this machine's platform or Python, or
with a listed file missing, naming what is missing and how to finish it.

Exit status: 0 done (or the check passed), 1 a download failed (pip's
message, and whether the registry could be reached) or the check refused,
2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as _platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = {
    "linux-x86_64": ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"],
    "macos-arm64": ["macosx_12_0_arm64", "macosx_11_0_arm64", "macosx_10_9_universal2"],
    "macos-x86_64": ["macosx_12_0_x86_64", "macosx_11_0_x86_64", "macosx_10_9_x86_64", "macosx_10_9_universal2"],
    "windows-x86_64": ["win_amd64"],
}
# Needed on that platform only through an environment marker (see above), and
# the build backend of `pip install -e .` (pyproject.toml's build-system).
EXTRA = {
    "windows-x86_64": ["colorama", "pywinpty"],
    "macos-arm64": ["appnope"],
    "macos-x86_64": ["appnope"],
}
# The values of the environment markers (PEP 508) for each platform.
MARKERS = {
    "linux-x86_64": {
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": "x86_64",
    },
    "macos-arm64": {
        "sys_platform": "darwin",
        "platform_system": "Darwin",
        "os_name": "posix",
        "platform_machine": "arm64",
    },
    "macos-x86_64": {
        "sys_platform": "darwin",
        "platform_system": "Darwin",
        "os_name": "posix",
        "platform_machine": "x86_64",
    },
    "windows-x86_64": {
        "sys_platform": "win32",
        "platform_system": "Windows",
        "os_name": "nt",
        "platform_machine": "AMD64",
    },
}
BUILD = ["setuptools>=77"]
DEFAULT = ["linux-x86_64", "macos-arm64", "windows-x86_64"]


def for_platform(text: str, platform: str, python_version: str) -> str:
    """The requirements ``text`` with each line's environment marker evaluated for ``platform``.

    A line whose marker holds there keeps its requirement without the marker; a
    line whose marker does not hold is left out. Lines without one are kept.
    """
    from packaging.markers import Marker

    env = {**MARKERS[platform], "python_version": python_version, "python_full_version": f"{python_version}.0"}
    lines = []
    for line in text.splitlines():
        requirement, sep, marker = line.partition(";")
        if sep and not line.lstrip().startswith("#"):
            if not Marker(marker.split("#")[0].strip()).evaluate(env):
                continue
            line = requirement.rstrip()
        lines.append(line)
    return "\n".join(lines) + "\n"


def download(platform: str, dest: Path, requirements: Path, python_version: str) -> dict:
    """pip download for one platform into ``dest``; returns its files and bytes and seconds."""
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as spec:
        resolved = Path(spec) / requirements.name
        resolved.write_text(for_platform(requirements.read_text(), platform, python_version))
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--dest",
            tmp,
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            "-r",
            str(resolved),
            *BUILD,
            *EXTRA.get(platform, []),
        ]
        for tag in PLATFORMS[platform]:
            command += ["--platform", tag]
        start = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.monotonic() - start
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if not line.startswith("WARNING: Location")]
            raise RuntimeError("\n".join(lines).strip()[-3000:])
        files = sorted(p.name for p in Path(tmp).iterdir())
        size = sum((Path(tmp) / name).stat().st_size for name in files)
        for name in files:
            if not (dest / name).exists():
                shutil.move(str(Path(tmp) / name), dest / name)
    return {"files": files, "bytes": size, "download_s": round(seconds, 1)}


def this_platform() -> str:
    """This machine's name in :data:`PLATFORMS` (``linux-x86_64``, ``macos-arm64``, ...), or ``system-machine``."""
    system = {"linux": "linux", "darwin": "macos", "win32": "windows"}.get(sys.platform, sys.platform)
    machine = _platform.machine().lower()
    machine = {"amd64": "x86_64", "x64": "x86_64", "aarch64": "arm64"}.get(machine, machine)
    return f"{system}-{machine}"


def check(dest: Path, python_version: str | None = None, platform: str | None = None) -> str | None:
    """Why ``dest`` cannot serve an offline install on this machine (one sentence), or None when it can.

    Args:
        dest: the wheelhouse folder.
        python_version: the installing Python, ``"3.11"`` (default: this one).
        platform: a name of :data:`PLATFORMS` (default: :func:`this_platform`).
    """
    python_version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    platform = platform or this_platform()
    if not dest.is_dir():
        what = "is a file, not a folder" if dest.exists() else "does not exist"
        return (
            f"{dest} {what}: give the folder `make wheelhouse` wrote (wheelhouse/ by default), "
            f"or make one there with `python tools/wheelhouse.py --dest {dest}` on a machine with network."
        )
    wheels = sorted(dest.glob("*.whl"))
    finish = (
        f"finish it with `make wheelhouse` (or `python tools/wheelhouse.py --dest {dest}`) on a machine with network"
    )
    away = f"or move {dest} away to install from the package registry"
    manifest_path = dest / "MANIFEST.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        return (
            f"The wheelhouse {dest} holds {len(wheels)} wheel(s) but no MANIFEST.json, which make wheelhouse writes "
            f"last: its download did not finish. {finish[0].upper() + finish[1:]}, {away}."
        )
    except (OSError, ValueError) as err:
        return f"The wheelhouse's {manifest_path} cannot be read ({err}): {finish}, {away}."
    entry = manifest.get(platform) if isinstance(manifest, dict) else None
    if not isinstance(entry, dict):
        have = ", ".join(sorted(manifest)) if isinstance(manifest, dict) and manifest else "none"
        if platform in PLATFORMS:
            how = f"add it with `python tools/wheelhouse.py --dest {dest} --platform {platform}`"
        else:
            how = "make wheelhouse does not download for this machine, so install from the package registry"
        return f"The wheelhouse {dest} has no wheels for this machine ({platform}; it has: {have}): {how}, {away}."
    if entry.get("python") != python_version:
        return (
            f"The wheelhouse {dest} was made for Python {entry.get('python')}, and this is Python {python_version}: "
            f"make it again with `python tools/wheelhouse.py --dest {dest} --python-version {python_version}`, "
            f"or install with Python {entry.get('python')}."
        )
    missing = [name for name in entry.get("files", []) if not (dest / name).exists()]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return f"The wheelhouse {dest} lacks {len(missing)} file(s) its manifest lists for {platform} ({shown}): {finish}, {away}."
    return None


def _write_manifest(path: Path, manifest: dict) -> None:
    """Write ``path`` in one step (a temporary file, then a rename): whole or absent."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--requirements", type=Path, default=ROOT / "requirements.txt")
    parser.add_argument(
        "--python-version",
        default=f"{sys.version_info.major}.{sys.version_info.minor}",
        help="the learners' Python (default: this one's)",
    )
    parser.add_argument("--platform", action="append", choices=sorted(PLATFORMS), help=f"default: {', '.join(DEFAULT)}")
    parser.add_argument("--check", type=Path, metavar="DIR", help="only check that DIR can serve an install here")
    args = parser.parse_args(argv)
    if args.check is not None:
        problem = check(args.check, args.python_version)
        if problem:
            print(f"wheelhouse: {problem}", file=sys.stderr)
            return 1
        return 0
    args.dest.mkdir(parents=True, exist_ok=True)
    manifest_path = args.dest / "MANIFEST.json"
    try:
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    except ValueError:
        manifest = {}
    # Until every platform is in, the folder has no manifest: an install refuses it (check above).
    manifest_path.unlink(missing_ok=True)
    for platform in args.platform or DEFAULT:
        try:
            entry = download(platform, args.dest, args.requirements, args.python_version)
        except RuntimeError as err:
            reach = (
                "could not reach the package registry"
                if "connection" in str(err).lower() or "No matching distribution" in str(err)
                else "pip failed"
            )
            print(f"wheelhouse: {platform}: {reach}:\n{err}", file=sys.stderr)
            return 1
        entry["python"] = args.python_version
        manifest[platform] = entry
        print(
            f"wheelhouse: {platform}: {len(entry['files'])} files, {entry['bytes'] / 1e6:.0f} MB "
            f"({entry['download_s']} s)"
        )
    _write_manifest(manifest_path, manifest)
    total = sum(p.stat().st_size for p in args.dest.glob("*.whl"))
    print(
        f"wheelhouse: {args.dest}: {total / 1e6:.0f} MB in all, for Python {args.python_version}. "
        "Learners: make course (or pip install --no-index --find-links wheelhouse -r requirements.txt)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
