"""One writer per folder: a lock file held by the operating system (it dies with its process) that names its holder.

The course runner holds its ``--out`` folder with it
(``coursetools.outfolder``), and a run of notebook 11 holds its checkpoint
folder (:func:`dpcourse.checkpoints.checkpoint.hold`): a second writer is
refused with :class:`FolderLocked`, which carries the holder's record so
that each caller words the sentence for its own flag.

The lock is ``flock`` on the open lock file (``fcntl.flock``; on Windows,
``msvcrt.locking``), which the kernel drops when its process ends however it
ends (SIGKILL included), so a lock left by a killed run never blocks its
restart, even one with the same process id on the same host (PID 1 in a
container). The file's text (a JSON record: process, host, boot, since
when, command) only names the holder; it decides nothing on this machine.
On a shared folder whose file system does not pass locks between machines,
a record written by another machine (another boot id) counts as live while
its holder keeps touching it (``stale_s``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

RECORD_MAX_BYTES = 64 * 1024  # a lock's record is a few hundred bytes; more is not a record
WRITE_GRACE_S = 2.0  # a held lock with no record yet: its holder is writing it; wait this long for it
_HELD: dict[str, int] = {}  # lock path -> open descriptor, for the locks this process holds


class FolderLocked(RuntimeError):
    """Another writer holds the folder.

    Attributes:
        lock: the lock file's path.
        holder: its record (``pid``, ``host``, ``started`` in UTC ISO 8601, ``command``); ``{}`` when unreadable.
        same_host: the holder runs on this machine (so it is alive: the operating system holds its lock).
        this_process: the holder is this very process (a run inside a run).
    """

    def __init__(self, lock: Path, holder: dict, same_host: bool, this_process: bool):
        super().__init__(f"{lock} is held by {describe(holder)}")
        self.lock, self.holder, self.same_host, self.this_process = lock, holder, same_host, this_process


def describe(holder: dict) -> str:
    """``process PID on HOST, started WHEN (COMMAND)``: the holder of a lock, in words (any record, even an odd one)."""
    holder = holder if isinstance(holder, dict) else {}

    def field(key: str) -> str:
        value = holder.get(key)
        return "?" if value is None or value == "" else str(value)[:200]

    command = f" ({field('command')})" if holder.get("command") else ""
    return f"process {field('pid')} on {field('host')}, started {field('started')}{command}"


def boot_id() -> str:
    """This machine's boot id (Linux; the same in every container of one machine), or ``""`` where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except (OSError, ValueError):
        return ""


def _same_machine(holder: dict) -> bool:
    """Whether a record was written on this machine: its boot id, else its host name, is this one's (or it names none)."""
    theirs, mine = holder.get("boot"), boot_id()
    if isinstance(theirs, str) and theirs and mine:
        return theirs == mine
    host = holder.get("host")
    return not (isinstance(host, str) and host) or host == socket.gethostname()


def read_record(lock: str | os.PathLike) -> dict:
    """A lock file's record as a dict; ``{}`` when it is empty, unreadable, too long or not a JSON object."""
    try:
        with open(lock, "rb") as fh:
            raw = fh.read(RECORD_MAX_BYTES + 1)
        record = json.loads(raw.decode("utf-8")) if len(raw) <= RECORD_MAX_BYTES else {}
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def _try_lock(fd: int) -> bool:
    """Take the operating system's lock on ``fd`` without waiting; False when another open file holds it."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:  # one byte far past the record, so that the record stays readable
            os.lseek(fd, 1 << 30, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):
        return False
    except OSError as err:
        if fcntl is None and err.errno in (13, 36):  # EACCES, EDEADLOCK: Windows' "locked by another process"
            return False
        raise
    return True


def _write_record(fd: int, record: dict) -> None:
    """Replace the text of the open lock file with ``record`` and flush it to disk."""
    data = json.dumps(record).encode("utf-8")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    written = 0
    while written < len(data):
        written += os.write(fd, data[written:])
    os.fsync(fd)


def _is_current(fd: int, lock: Path) -> bool:
    """Whether the open file ``fd`` is still the file at ``lock`` (not one a releasing holder just removed)."""
    try:
        now = os.stat(lock)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def acquire(folder: str | os.PathLike, name: str, command: str = "", *, stale_s: float | None = None) -> Path:
    """Take the lock file ``folder/name`` for this process; return its path. Release it with :func:`release`.

    The file is opened (created when absent) and locked by the operating
    system without waiting; the process that gets the lock writes its record
    into it. Two processes started at one instant never both get it, and a
    lock whose process has ended, by any means, is free: its record, whatever
    it holds (nothing, a process id that exists again, text that is not
    JSON), is replaced. One exception: a record from another machine
    (another boot id or host) that was touched less than ``stale_s`` seconds
    ago counts as held (its holder may be alive where the lock cannot be
    seen), and one untouched for longer is free even while the file system
    still holds its lock (a vanished machine's lock on a network file
    system): the file is replaced by a new one. With ``stale_s=None``, a
    record from another machine is never taken over.

    Raises:
        FolderLocked: a live process (this one included) holds the lock, or
            a record from another machine is not stale.
        OSError: the folder cannot be written (read-only, full, not a folder);
            nothing is left behind.
    """
    lock = Path(folder) / name
    if str(lock) in _HELD:
        raise FolderLocked(lock, read_record(lock), True, True)
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "boot": boot_id(),
        "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": command,
    }
    for _ in range(20):  # each retry follows a holder that released the file between our open and our lock
        existed = lock.exists()
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            if not _try_lock(fd):
                holder = _record_of_live_holder(lock)
                if _abandoned(fd, holder, stale_s):
                    # A stale record under a lock held now: a vanished machine's lock on a shared file
                    # system, or a process here that took the lock an instant ago and is writing its own
                    # record over that one (two runs started together beside a stale lock).
                    holder = _record_once_rewritten(lock, holder)
                if _abandoned(fd, holder, stale_s):
                    _remove_if_current(fd, lock)  # a lock a dead machine keeps on a shared file system
                    os.close(fd)
                    continue  # the new file is free (or another run's, just made: refused as such)
                raise FolderLocked(lock, holder, _same_machine(holder) if holder else True, False)
            if not _is_current(fd, lock):
                os.close(fd)
                continue
            holder = read_record(lock)
            if holder and not _same_machine(holder):
                age = time.time() - os.fstat(fd).st_mtime
                if stale_s is None or age < stale_s:
                    raise FolderLocked(lock, holder, False, False)
            try:
                _write_record(fd, me)
            except OSError:
                if not existed:
                    with contextlib.suppress(OSError):
                        os.unlink(lock)  # made by this attempt: leave nothing behind
                raise
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        _HELD[str(lock)] = fd
        return lock
    raise FolderLocked(lock, {}, False, False)


def _abandoned(fd: int, holder: dict, stale_s: float | None) -> bool:
    """Whether a held lock was written by another machine that stopped touching it ``stale_s`` seconds ago.

    A network file system keeps the lock of a machine that vanished (a
    preempted VM) until its server gives up on that machine, which NFSv3
    may never do; the holder's touches tell a dead one from a live one.
    """
    if stale_s is None or not holder or _same_machine(holder):
        return False
    return time.time() - os.fstat(fd).st_mtime >= stale_s


def _record_of_live_holder(lock: Path) -> dict:
    """The record of a lock another process holds, waiting up to :data:`WRITE_GRACE_S` for one just taken."""
    deadline = time.monotonic() + WRITE_GRACE_S
    while True:
        record = read_record(lock)
        if record or time.monotonic() > deadline:
            return record
        time.sleep(0.05)


def _remove_if_current(fd: int, lock: Path) -> None:
    """Remove the lock file ``fd`` is open on, unless another run already replaced it, one run at a time.

    Two runs that both judged a vanished machine's lock stale would otherwise
    both remove "it", the second removing the first's new file (or failing
    on a file already gone): the check and the removal happen under a second
    lock, ``<name>.takeover``, which stays in the folder (removing it would
    race in turn). Where ``fcntl`` is missing (Windows) there is no such lock.
    """
    guard = None
    if fcntl is not None:
        guard = os.open(lock.with_name(f"{lock.name}.takeover"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(guard, fcntl.LOCK_EX)  # held for a stat and an unlink
    try:
        if _is_current(fd, lock):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)
    finally:
        if guard is not None:
            os.close(guard)


def _record_once_rewritten(lock: Path, stale: dict) -> dict:
    """The lock's record once it is no longer ``stale``, waiting up to :data:`WRITE_GRACE_S` (else ``stale``).

    A process that just took the lock replaces the stale record with its own
    within microseconds; a vanished machine never does. Without this wait, a
    run started at the same instant as the new holder took the stale record
    for the holder's, removed the new holder's file and took another: both
    ran, and the first then found its folder "deleted" (20 of 100 tries).
    """
    deadline = time.monotonic() + WRITE_GRACE_S
    while time.monotonic() <= deadline:
        record = read_record(lock)
        if record and record != stale:
            return record
        time.sleep(0.02)
    return stale


def still_held(lock: str | os.PathLike) -> bool:
    """Whether this process holds ``lock`` and its file is still the one locked (not deleted, moved or replaced)."""
    fd = _HELD.get(str(Path(lock)))
    if fd is None:
        return False
    try:
        return _is_current(fd, Path(lock))
    except OSError:
        return False


def holds(lock: str | os.PathLike) -> bool:
    """Whether this process holds ``lock`` (taken by :func:`acquire` and not released)."""
    return str(Path(lock)) in _HELD


def release(lock: str | os.PathLike) -> None:
    """Give up a lock taken by :func:`acquire` in this process (never another's); never raises.

    The file is removed when it can be (a folder that turned read-only
    keeps it, and the next run takes it over: its holder is gone); the
    operating system's lock ends with the descriptor.
    """
    fd = _HELD.pop(str(Path(lock)), None)
    if fd is None:
        return
    with contextlib.suppress(OSError):
        if _is_current(fd, Path(lock)):
            os.unlink(lock)
    with contextlib.suppress(OSError):
        os.close(fd)
