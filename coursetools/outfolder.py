"""The runner's output folder: checked before a run, earlier results kept, one run at a time (a lock file), atomic writes, a short error on a full disk.

Two runs into one ``--out`` would mix their notebooks and records in one
``results.json``; :func:`acquire_lock` refuses the second, naming the run
that holds the folder, and a lock left by a run that was killed (its
process is gone) does not block. Every file the runner writes goes through
:func:`write_atomic` (a temporary file in the same folder, then
``os.replace``), so a reader sees the old file or the new one, never half
of one; when the disk is full, :class:`DiskFullError` says so in one line.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

from dpcourse.checkpoints import folderlock

LOCK_NAME = ".dpcourse-run.lock"
# Errors meaning "the disk (or the quota) is full".
_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


class OutputFolderError(ValueError):
    """The output folder given to the runner cannot be used."""


class FolderInUse(OutputFolderError):
    """Another run holds the output folder (its lock file names it)."""


class DiskFullError(OutputFolderError):
    """No space left where the runner writes its results."""


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) is "no space left on device" or "quota exceeded"."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _FULL:
            return True
        if "No space left on device" in str(err) or "Errno 28" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def disk_full_message(folder: Path, recorded: str = "") -> str:
    """One line: the folder, what to do about the lack of space, and what the run could record there.

    ``recorded``: what this run's ``results.json`` there holds, as the runner
    knows it (e.g. "results.json there says which notebook stopped and
    why"); by default nothing of the run was recorded.
    """
    said = recorded or "Nothing of this run could be recorded there"
    return (
        f"No space left on the disk that holds {folder}: the run stopped. Free some space "
        f"(`df -h {folder}` shows how much is left) or pass --out on another disk, then run again. "
        f"{said}; every file the course wrote there is whole (one it could not finish was removed)."
    )


def _write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file ``path`` and flush it to disk (tests replace this to fill the disk)."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``.

    On any error the temporary file is removed and ``path`` is left as it
    was (the previous version, or absent).

    Raises:
        DiskFullError: the disk or quota is full (the message names the folder).
        OSError: any other write error.
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write_file(tmp, data)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if is_disk_full(err):
            raise DiskFullError(disk_full_message(path.parent)) from err
        raise
    return path


def write_json_atomic(path: str | os.PathLike, payload) -> Path:
    """:func:`write_atomic` of ``payload`` as indented JSON."""
    return write_atomic(path, json.dumps(payload, indent=2) + "\n")


def acquire_lock(folder: Path, command: str = "") -> Path:
    """Take ``folder``'s run lock (a JSON file with pid, host, start time and command); return its path.

    :func:`dpcourse.checkpoints.folderlock.acquire` does the locking: the operating
    system holds the lock for this process, so a lock whose process has ended
    (however it ended) is free and taken over. Release it with :func:`release_lock`.

    Raises:
        FolderInUse: a live run (or a run on another host, which cannot be
            checked) holds the folder; the message names the folder, that run,
            and what to do.
        DiskFullError: no room for the lock's record (nothing is left behind).
    """
    folder = Path(folder)
    try:
        return folderlock.acquire(folder, LOCK_NAME, command)
    except OSError as err:
        if is_disk_full(err):
            raise DiskFullError(disk_full_message(folder)) from err
        raise
    except folderlock.FolderLocked as err:
        if not err.holder:
            raise FolderInUse(f"--out {folder}: could not take the run lock {err.lock}; try again.") from None
        if err.this_process:
            raise FolderInUse(f"--out {folder} is already in use by this process (a run inside a run?).") from None
        hint = (
            "Wait for it to finish, or pass another --out."
            if err.same_host
            else f"If that run is over, delete {err.lock} and run again; otherwise pass another --out."
        )
        raise FolderInUse(
            f"--out {folder} is in use by another course run ({folderlock.describe(err.holder)}): two runs in one "
            f"folder would mix their results. {hint}"
        ) from None


def release_lock(lock: Path) -> None:
    """Remove a lock taken by :func:`acquire_lock` in this process (never another run's)."""
    folderlock.release(lock)


def keep_previous_results(out_dir: Path, notebooks: list[Path]) -> Path | None:
    """Keep a ``results.json`` that a run of ``notebooks`` would overwrite and lose figures of.

    When ``out_dir/results.json`` lists a notebook that is not in
    ``notebooks`` (a full run, then ``--notebooks 09`` into the same
    folder), it is renamed to ``results.<its created time>.json`` so that
    those figures stay; a rerun of the same notebooks simply replaces it.

    Returns:
        The new path of the kept file (an unreadable file is kept too), or
        None when there is none or a rerun of the same notebooks replaces it.
    """
    path = Path(out_dir) / "results.json"
    if not path.exists():
        return None
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        old_names = {nb["notebook"] for nb in old["notebooks"]}
        created = str(old.get("created") or "previous")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        old_names, created = None, "unreadable"  # not ours to judge: keep it as well
    if old_names is not None and old_names <= {p.stem for p in notebooks}:
        return None
    stamp = re.sub(r"[^0-9A-Za-z]+", "-", created).strip("-")
    target = path.with_name(f"results.{stamp}.json")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"results.{stamp}.{n}.json")
    os.replace(path, target)
    return target


def check_output_folder(out_dir: Path, notebooks: list[Path]) -> Path:
    """Create ``out_dir`` if needed and check it can take the results; return it absolute.

    Raises:
        OutputFolderError: it is a file, is not writable, or is the folder of
            the notebooks (executed copies would overwrite the sources).
    """
    out_dir = Path(out_dir).expanduser().resolve()  # kernels run in the notebooks' folder
    if any(out_dir == p.parent.resolve() for p in notebooks):
        raise OutputFolderError(
            f"--out {out_dir} is the notebooks' folder: executed copies would overwrite "
            "the course's notebooks. Choose another folder."
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".dpcourse-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        if is_disk_full(err):
            raise DiskFullError(disk_full_message(out_dir)) from None
        raise OutputFolderError(f"--out {out_dir} cannot hold the results ({err}). Choose a writable folder.") from err
    return out_dir
