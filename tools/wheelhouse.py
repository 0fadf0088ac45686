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
runs on, not the target, so the packages that other platforms need only by
marker (colorama and pywinpty on Windows, appnope on macOS) are named here.
wheelhouse/MANIFEST.json lists each platform's files and size.

Exit status: 0 done, 1 a download failed (pip's message, and whether the
registry could be reached), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
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
BUILD = ["setuptools>=77"]
DEFAULT = ["linux-x86_64", "macos-arm64", "windows-x86_64"]


def download(platform: str, dest: Path, requirements: Path, python_version: str) -> dict:
    """pip download for one platform into ``dest``; returns its files and bytes and seconds."""
    with tempfile.TemporaryDirectory() as tmp:
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
            str(requirements),
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
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    manifest_path = args.dest / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
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
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in args.dest.glob("*.whl"))
    print(
        f"wheelhouse: {args.dest}: {total / 1e6:.0f} MB in all, for Python {args.python_version}. "
        "Learners: make course (or pip install --no-index --find-links wheelhouse -r requirements.txt)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
