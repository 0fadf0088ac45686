"""One run writes a checkpoint directory at a time: :func:`hold` takes its lock, :func:`check_still_there` sees it vanish."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from dpcourse.checkpoints import folderlock
from dpcourse.checkpoints.errors import CheckpointError, CheckpointGone, CheckpointInUse, as_error, check_directory

LOCK_NAME = ".dpcourse-checkpoint.lock"  # the writer's lock file (:func:`hold`)
_HELD_DIRS: dict[str, Path] = {}  # directory -> its lock file, for the directories this process holds
LOCK_REFRESH_S, LOCK_STALE_S = 10.0, 60.0  # the holder touches its lock this often; older than this, it is stale


def check_still_there(directory: str | os.PathLike) -> None:
    """Refuse to go on in a directory this process holds (:func:`hold`) whose lock file is gone or replaced.

    Orbax creates a missing directory again as it saves: without this, a
    run whose folder was deleted, moved or unmounted would write its next
    step into a new, empty folder as if nothing had happened.

    Raises:
        CheckpointGone: the directory (or its lock file) was removed or replaced since :func:`hold` took it.
    """
    lock = _HELD_DIRS.get(str(Path(directory).absolute()))
    if lock is not None and not folderlock.still_held(lock):
        raise CheckpointGone(
            f"The checkpoint directory {directory} was deleted, moved or unmounted while this run used it (its "
            "lock file is gone): the run stopped rather than save into a new, empty folder. Put the directory "
            "back (or mount it again) and resume, or give the run another directory."
        )


@contextlib.contextmanager
def hold(directory: str | os.PathLike, command: str = "") -> Iterator[Path]:
    """Hold ``directory`` as its one writer while the block runs: a lock file naming this process.

    Two runs saving into one directory would overwrite each other's steps
    (or fail half-way with "Directory not empty"). The lock
    (:mod:`dpcourse.checkpoints.folderlock`) is held by the operating system and
    ends with this process however it ends, so a killed run's restart takes
    it over, even with the same process id on the same host (a container's
    PID 1). This process also touches it every :data:`LOCK_REFRESH_S`
    seconds, so that a lock written on another machine, where the file
    system may not pass the lock on, counts as stale once it is
    :data:`LOCK_STALE_S` seconds old. Leaving the block never raises for
    the lock: an error inside the block stays the error.

    Raises:
        CheckpointInUse: another live run holds it (process, host, since when).
        CheckpointError: the directory is a file or cannot be written.
    """
    path = check_directory(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if (path / LOCK_NAME).is_dir():
            raise CheckpointError(
                f"The checkpoint directory {directory} cannot be used: its lock {path / LOCK_NAME} is a folder, "
                "not a file. Remove that folder, or give the run another directory."
            )
        lock = folderlock.acquire(path, LOCK_NAME, command, stale_s=LOCK_STALE_S)
    except folderlock.FolderLocked as err:
        if err.this_process:
            raise CheckpointInUse(
                f"The checkpoint directory {directory} is already held by this process "
                f"({folderlock.describe(err.holder)}; a run inside a run): "
                "let the first run finish, or give this one another directory."
            ) from None
        elsewhere = (
            ""
            if err.same_host
            else f"; one on another machine counts as over {LOCK_STALE_S:.0f} s after its last touch"
        )
        raise CheckpointInUse(
            f"The checkpoint directory {directory} is in use by another run ({folderlock.describe(err.holder)}): "
            "two runs saving there would overwrite each other's steps. Wait for it to finish, or give this run "
            f"another directory (a lock whose run has ended frees itself{elsewhere})."
        ) from None
    except OSError as err:
        raise as_error(err, f"lock the checkpoint directory {directory}") from err
    stop = threading.Event()

    def touch():
        while not stop.wait(LOCK_REFRESH_S):
            with contextlib.suppress(OSError):
                os.utime(lock)

    toucher = threading.Thread(target=touch, name="dpcourse-checkpoint-lock", daemon=True)
    toucher.start()
    _HELD_DIRS[str(path)] = lock
    try:
        yield lock
    finally:
        stop.set()
        _HELD_DIRS.pop(str(path), None)
        folderlock.release(lock)
