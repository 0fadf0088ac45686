"""One writer per folder: a lock file that names its holder (process, host, since when), stale once that process is gone.

The course runner holds its ``--out`` folder with it
(``coursetools.outfolder``), and a run of notebook 11 holds its checkpoint
folder (:func:`dpcourse.checkpoints.checkpoint.hold`): a second writer is
refused with :class:`FolderLocked`, which carries the holder's record so
that each caller words the sentence for its own flag.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from pathlib import Path


class FolderLocked(RuntimeError):
    """Another writer holds the folder.

    Attributes:
        lock: the lock file's path.
        holder: its record (``pid``, ``host``, ``started`` in UTC ISO 8601, ``command``); ``{}`` when unreadable.
        same_host: the holder runs on this machine (so it is alive: a dead one's lock is replaced).
        this_process: the holder is this very process (a run inside a run).
    """

    def __init__(self, lock: Path, holder: dict, same_host: bool, this_process: bool):
        super().__init__(f"{lock} is held by {describe(holder)}")
        self.lock, self.holder, self.same_host, self.this_process = lock, holder, same_host, this_process


def describe(holder: dict) -> str:
    """``process PID on HOST, started WHEN (COMMAND)``: the holder of a lock, in words."""
    return f"process {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}" + (
        f" ({holder['command']})" if holder.get("command") else ""
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def acquire(folder: str | os.PathLike, name: str, command: str = "", write=None) -> Path:
    """Take the lock file ``folder/name`` (a JSON record of this process); return its path.

    The record is first written to a temporary file (by ``write(path,
    text)``, default :meth:`Path.write_text`) and then hard-linked to the
    lock's name, which fails when the lock exists: never two holders. A lock
    whose process is gone (same host, dead pid) is stale and replaced.
    Release it with :func:`release`.

    Raises:
        FolderLocked: a live process here, this process, or a process on
            another host (which cannot be checked) holds it.
        OSError: the folder cannot be written (read-only, full, not a folder).
    """
    folder = Path(folder)
    lock = folder / name
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": command,
    }
    tmp = folder / f"{name}.{os.getpid()}.tmp"
    (write or (lambda path, text: Path(path).write_text(text, encoding="utf-8")))(tmp, json.dumps(me))
    try:
        for _ in range(3):
            try:
                os.link(tmp, lock)
                return lock
            except FileExistsError:
                pass
            try:
                holder = json.loads(lock.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue  # released in between: try again
            except (OSError, ValueError):
                holder = {}
            holder = holder if isinstance(holder, dict) else {}
            same_host = holder.get("host") == me["host"]
            pid = holder.get("pid")
            if same_host and isinstance(pid, int) and pid != me["pid"] and not _alive(pid):
                lock.unlink(missing_ok=True)  # stale: that process was killed
                continue
            raise FolderLocked(lock, holder, same_host, same_host and pid == me["pid"])
        raise FolderLocked(lock, {}, False, False)
    finally:
        tmp.unlink(missing_ok=True)


def release(lock: str | os.PathLike) -> None:
    """Remove a lock taken by :func:`acquire` in this process (never another's)."""
    try:
        holder = json.loads(Path(lock).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(holder, dict) and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        Path(lock).unlink(missing_ok=True)
