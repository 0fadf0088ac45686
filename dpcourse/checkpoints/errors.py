"""A checkpoint's errors: one sentence each, what failed, the operating system's reason and what to do.

:mod:`dpcourse.checkpoints.checkpoint` (notebook 11) and the writer's lock
(:mod:`dpcourse.checkpoints.holding`) raise these; both import this module,
which imports neither.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_NO_RIGHTS = {errno.EROFS, errno.EACCES, errno.EPERM}
# Tensorstore reports an operating-system error inside a ValueError's text.
_TS_ERRNO = re.compile(r"os_error_code='?(\d+)")


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or restored; the message says why and what to do.

    ``lasting`` is true when running again would fail the same way (a full
    or read-only disk, another run's checkpoint, a folder that is a file):
    a GKE Job then fails at once instead of retrying. It is false for an
    error whose cause is unknown (the multi-process worker exits with 1).
    """

    lasting = True

    def __init__(self, message: str, *, lasting: bool = True):
        super().__init__(message)
        self.lasting = lasting

    def _render_traceback_(self) -> list[str]:  # IPython (a lesson's cell) shows the sentence alone
        return [f"{type(self).__name__}: {self}"]


class CheckpointGone(CheckpointError):
    """The checkpoint directory this run holds was deleted, moved or unmounted while it ran."""


class CheckpointMismatch(CheckpointError):
    """A checkpoint from another model, profile or state layout; the message names what differs."""


class CheckpointInUse(CheckpointError):
    """Another run writes to the checkpoint directory (the message names it: process, host, since when)."""


class StepPastTarget(CheckpointError, ValueError):
    """The checkpoint is already past the step a run was asked to train to (the message names both)."""


class BatchDoesNotSplit(CheckpointError, ValueError):
    """The device count does not divide the global batch a resumed run keeps (the message names counts that do)."""


def shape_error(value, schema: dict) -> str | None:
    """Where ``value`` (read from a JSON file) departs from ``schema`` (Draft 2020-12), in a few words; None: it fits."""
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    return None if error is None else f"{error.json_path}: {error.message[:200]}"


def check_directory(directory: str | os.PathLike) -> Path:
    """The checkpoint directory as an absolute path, refused when it is a file (a missing one is created later).

    Raises:
        CheckpointError: ``directory`` (or a folder above it) is a file.
    """
    path = Path(directory).absolute()
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise CheckpointError(
                f"The checkpoint directory {directory} cannot be used: {part} is a file, not a folder. Give the "
                "run a folder (an absent one is created), or move the file away."
            )
    return path


def as_error(err: BaseException, doing: str) -> CheckpointError:
    """:func:`explain`'s sentence as a :class:`CheckpointError`, lasting unless its cause is unknown."""
    sentence = explain(err, doing)
    return CheckpointError(sentence, lasting=not sentence.startswith(f"Could not {doing}: {type(err).__name__}: "))


def explain(err: BaseException, doing: str) -> str:
    """One sentence for a failed save or restore: what failed, the operating system's reason, what to do."""
    code = getattr(err, "errno", None)
    if code is None:
        found = _TS_ERRNO.search(str(err))
        code = int(found[1]) if found else None
    path = getattr(err, "filename", None)
    at = f": {path}" if path and str(path) not in doing else ""  # the place, when it is not the one named
    if code in _NO_ROOM:
        return (
            f"Could not {doing}: no room left ({os.strerror(code)}{at}). Free space or point the run at a "
            "directory with room; the last complete step is unchanged and still the one restored."
        )
    if code in _NO_RIGHTS:
        return (
            f"Could not {doing}: the directory cannot be written ({os.strerror(code)}{at}). Give the run a "
            "writable directory; the last complete step is unchanged and still the one restored."
        )
    if code == errno.ENOENT:
        return (
            f"Could not {doing}: {getattr(err, 'filename', None) or 'a folder it writes into'} does not exist any "
            "more (deleted, moved or unmounted during the run). Give the run a directory that stays; steps "
            "saved before are wherever the directory went."
        )
    if code in (errno.ENOTEMPTY, errno.EEXIST) or type(err).__name__ == "StepAlreadyExistsError":
        return (
            f"Could not {doing}: that step is already saved there, by this run earlier or by another run "
            "writing the same directory. Give each run its own checkpoint directory; the saved step is unchanged."
        )
    first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
    return f"Could not {doing}: {type(err).__name__}: {first}"
