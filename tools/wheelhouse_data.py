"""Fashion-MNIST beside the wheels: copy the training files from the cache into a wheelhouse, and back on a laptop.

    python tools/wheelhouse_data.py pack --dest wheelhouse      (make wheelhouse: when the cache has them)
    python tools/wheelhouse_data.py unpack --src wheelhouse     (make course / make lab, from a wheelhouse)

The files are the two the lessons read (dpcourse.data.TRAIN_FILES), each
checked against its published md5 (dpcourse.data.MD5) before it is copied
either way, into ``wheelhouse/fashion-mnist/`` and into the data cache
(``$DPCOURSE_DATA_DIR``, else ``~/.cache/dpcourse/fashion-mnist``). A file
already in the cache is left as it is. Nothing to copy is not an error: the
lessons then download the data, or fall back to synthetic data and say so.

Exit status: 0 done (or nothing to do), 2 a file whose md5 does not match
(named; nothing copied for it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from dpcourse import data

FOLDER = "fashion-mnist"


def _copy_checked(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` through a temporary file, once its md5 is the published one.

    Raises:
        ValueError: the md5 does not match (nothing is written).
    """
    expected = data.MD5[source.name]
    found = data.md5_of(source)
    if found != expected:
        raise ValueError(f"{source} has md5 {found}, not the published {expected}: delete it and download it again.")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def pack(dest: Path, cache: Path | None = None) -> list[str]:
    """Copy the training files from the cache into ``dest/fashion-mnist/``; the names copied (none if not cached)."""
    cache = data.cache_dir() if cache is None else cache
    copied = []
    for name in data.TRAIN_FILES:
        if (cache / name).is_file():
            _copy_checked(cache / name, dest / FOLDER / name)
            copied.append(name)
    return copied


def unpack(src: Path, cache: Path | None = None) -> list[str]:
    """Copy the files of ``src/fashion-mnist/`` into the cache where it lacks them; the names copied."""
    cache = data.cache_dir() if cache is None else cache
    copied = []
    for name in data.TRAIN_FILES:
        if (src / FOLDER / name).is_file() and not (cache / name).is_file():
            _copy_checked(src / FOLDER / name, cache / name)
            copied.append(name)
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("pack").add_argument("--dest", type=Path, required=True)
    sub.add_parser("unpack").add_argument("--src", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.action == "pack":
            copied = pack(args.dest)
            where = args.dest / FOLDER
            none = f"the data cache {data.cache_dir()} has no Fashion-MNIST files: run a lesson once online, then again"
        else:
            copied = unpack(args.src)
            where = data.cache_dir()
            none = "nothing to copy (no files in the wheelhouse, or the cache has them)"
    except ValueError as err:
        print(f"wheelhouse-data: {err}", file=sys.stderr)
        return 2
    print(f"wheelhouse-data: {', '.join(copied)} -> {where}" if copied else f"wheelhouse-data: {none}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
