"""Fashion-MNIST beside the wheels: copy the training files from the cache into a wheelhouse, and back on a laptop.

    python tools/wheelhouse_data.py pack --dest wheelhouse      (make wheelhouse: when the cache has them)
    python tools/wheelhouse_data.py unpack --src wheelhouse     (make course / make lab, from a wheelhouse)

The files are the two the lessons read (dpcourse.data.TRAIN_FILES), each
checked against its published md5 (dpcourse.data.MD5) before it is copied
either way, into ``wheelhouse/fashion-mnist/`` and into the data cache
(``$DPCOURSE_DATA_DIR``, else ``~/.cache/dpcourse/fashion-mnist``). A file
already in the cache is left as it is. Nothing to copy is not an error: the
lessons then download the data, or fall back to synthetic data and say so.
Half the set is: the files are copied together or not at all, so a stick
never carries, and a cache never receives, one file without the other.

Exit status: 0 done (or nothing to do), 2 a file whose md5 does not match or
a file missing beside the other (named; nothing copied).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from dpcourse import data

FOLDER = "fashion-mnist"


def _check(source: Path) -> None:
    """Raises ValueError unless ``source``'s md5 is the published one."""
    expected = data.MD5[source.name]
    found = data.md5_of(source)
    if found != expected:
        raise ValueError(f"{source} has md5 {found}, not the published {expected}: delete it and download it again.")


def _copy(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` through a temporary file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _whole_or_none(found: dict[str, Path], have_already: set[str], where: Path, fix: str) -> None:
    """Raises ValueError when some of the files are found and another is neither found nor already there."""
    missing = [n for n in data.TRAIN_FILES if n not in found and n not in have_already]
    if found and missing:
        raise ValueError(
            f"{where} has {', '.join(found)} but not {', '.join(missing)}, and the lessons need both: {fix}. "
            "Nothing was copied."
        )


def pack(dest: Path, cache: Path | None = None) -> list[str]:
    """Copy the training files from the cache into ``dest/fashion-mnist/``; the names copied (none if not cached).

    Raises:
        ValueError: a file's md5 is not the published one, or the cache has
            one of the files without the other (each named; nothing copied).
    """
    cache = data.cache_dir() if cache is None else cache
    found = {name: cache / name for name in data.TRAIN_FILES if (cache / name).is_file()}
    _whole_or_none(found, set(), cache, "run a lesson once online to download it, then pack again")
    for source in found.values():
        _check(source)
    for name, source in found.items():
        _copy(source, dest / FOLDER / name)
    return list(found)


def unpack(src: Path, cache: Path | None = None) -> list[str]:
    """Copy the files of ``src/fashion-mnist/`` into the cache where it lacks them; the names copied.

    Raises:
        ValueError: a file's md5 is not the published one, or the wheelhouse
            has one file without the other and the cache lacks it too (named;
            nothing copied).
    """
    cache = data.cache_dir() if cache is None else cache
    found = {name: src / FOLDER / name for name in data.TRAIN_FILES if (src / FOLDER / name).is_file()}
    there = {name for name in data.TRAIN_FILES if (cache / name).is_file()}
    _whole_or_none(found, there, src / FOLDER, "pack the wheelhouse again from a cache that has both")
    wanted = {name: path for name, path in found.items() if name not in there}
    for source in wanted.values():
        _check(source)
    for name, source in wanted.items():
        _copy(source, cache / name)
    return list(wanted)


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
