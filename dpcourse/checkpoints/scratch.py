"""Notebook 11's scratch folder for checkpoints: made where there is room for them, copied in one sentence on failure.

The lesson saves, copies and resumes checkpoints in a temporary folder
(``tempfile``'s: ``$TMPDIR``, else ``/tmp``). A temporary folder that is
full, read-only or missing is said once, naming that folder and the
variable that moves it, before anything is written, instead of a raw
``shutil.Error`` (or "No usable temporary directory") from a cell half-way.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

from dpcourse.checkpoints.errors import CheckpointError, explain

# Checkpoint steps notebook 11 keeps on disk at once, counted from its cells: the replicated folder (3, with
# the two failed saves), the FSDP one (1), three resumed copies of the first (4 each), the killed run's copy (4),
# the multi-process run (4), the timed saves (4) and another model's (1): 29, rounded up.
# Measured: with the smoke profile (17.7 MB asked) the folder's disk peaked at 10.1 MB used (df every 0.2 s).
LESSON_STEPS_ON_DISK = 32
# A step's files beyond its arrays' 12 bytes per parameter: Orbax's metadata and the file system's blocks
# (measured with the smoke profile: 344,260 bytes of files for 318,072 bytes of arrays, in 19 files).
STEP_OVERHEAD_BYTES = 128 * 1024
MOVE_IT = "start Jupyter with TMPDIR set to a folder on a disk with room (then restart the kernel)"


def lesson_bytes(cfg) -> int:
    """Bytes notebook 11 keeps in its scratch folder at once: :data:`LESSON_STEPS_ON_DISK` steps and another model's.

    A step holds 12 bytes per parameter (the parameters and AdamW's two
    moments, float32) and :data:`STEP_OVERHEAD_BYTES`; section 8's other
    model is the ``cpu`` profile's (``smoke``'s when the lesson runs ``cpu``).
    """
    from dpcourse import config, model

    other = config.make_config("cpu" if cfg.profile != "cpu" else "smoke")
    step, other_step = (12 * model.param_count(c) + STEP_OVERHEAD_BYTES for c in (cfg, other))
    return LESSON_STEPS_ON_DISK * step + other_step


def _mb(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:,.1f} MB"


def scratch_folder(prefix: str, need_bytes: int) -> Path:
    """A new temporary folder with at least ``need_bytes`` free on its disk, removed when the process ends.

    Raises:
        CheckpointError: there is no usable temporary folder, it cannot be
            written, or its disk has less than ``need_bytes`` free; the
            message names the folder, the room it has and needs, and what
            to do. Nothing is left behind.
    """
    try:
        where = tempfile.gettempdir()
    except (OSError, ValueError) as err:  # every candidate is full, read-only or missing
        raise CheckpointError(
            f"There is no usable temporary folder for the lesson's checkpoints ({err}): free space in "
            f"{os.environ.get('TMPDIR') or '/tmp'}, or {MOVE_IT}."
        ) from None
    try:
        folder = Path(tempfile.mkdtemp(prefix=prefix))
    except OSError as err:
        raise CheckpointError(
            f"{explain(err, f'make a folder for the checkpoints in the temporary folder {where}')} Or {MOVE_IT}."
        ) from None
    free = shutil.disk_usage(folder).free
    if free < need_bytes:
        shutil.rmtree(folder, ignore_errors=True)
        raise CheckpointError(
            f"The temporary folder {where} has {_mb(free)} free, and this lesson writes about {_mb(need_bytes)} of "
            f"checkpoints there: free space on that disk, or {MOVE_IT}."
        )
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # no last cell removes it: cells run again
    return folder


def fresh(folder: str | os.PathLike) -> Path:
    """``folder``, emptied of what an earlier run of the same cell saved there (a cell runs again after Run All)."""
    shutil.rmtree(folder, ignore_errors=True)
    return Path(folder)


def copy_folder(source: str | os.PathLike, destination: str | os.PathLike) -> Path:
    """Copy a checkpoint folder over ``destination`` (``shutil.copytree``); a copy that fails is removed and said in one sentence.

    Raises:
        CheckpointError: the copy failed (a full or read-only disk, say); the message names ``destination``.
    """
    destination = fresh(destination)
    try:
        # copy2 looked up at each file, not bound when shutil was imported (a test fills the disk through it)
        shutil.copytree(source, destination, copy_function=lambda src, dst: shutil.copy2(src, dst))
    except (shutil.Error, OSError) as err:
        with contextlib.suppress(OSError):
            shutil.rmtree(destination, ignore_errors=True)
        cause = err
        if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list) and err.args[0]:
            # shutil.Error holds (source, destination, reason text) for each file it could not copy.
            reason = str(err.args[0][0][-1])
            code = next(
                (c for c in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES) if os.strerror(c) in reason), None
            )
            cause = OSError(code, reason) if code else RuntimeError(reason)
        raise CheckpointError(explain(cause, f"copy {source} to {destination}")) from None
    return destination
