"""Save and restore a resumable training state with Orbax: targets, run checks, errors in one sentence.

Notebook 11 teaches the calls (``CheckpointManager``, ``save``,
``wait_until_finished``, ``restore`` onto a target built from
``jax.ShapeDtypeStruct``) in its own cells; this module is the reusable
version that the lesson's fresh process (:mod:`dpcourse.checkpoints.resume`), the
multi-process worker and the tests use. A checkpoint step holds two items:
``state`` (the resumable state: parameters, AdamW state, step, PRNG key,
data position) and ``run`` (a JSON description of the model and profile,
checked before any array is read).

Errors are :class:`CheckpointError` with one sentence that says what to
do; a save that fails leaves the previous step as ``latest_step()``
(Orbax writes a step into ``<step>.orbax-checkpoint-tmp`` and renames it
when complete; the saving manager lists the step as soon as ``save``
returns, but a manager opened later never lists a step without the rename,
and no restore reads it: tests/lessons/test_checkpoint_claims.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

STATE_KEYS = ("params", "opt_state", "step", "key", "data_position")
STATE_ITEM, RUN_ITEM = "state", "run"
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # Orbax's name for a step still being written
FORMS = ("replicated", "fsdp")
# The Config fields that decide a checkpoint's shapes or its training: a
# checkpoint saved with another value of any of them is refused.
RUN_FIELDS = ("profile", "width", "block_repeats", "block_mix", "learning_rate", "seed")

_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_NO_RIGHTS = {errno.EROFS, errno.EACCES, errno.EPERM}
# Tensorstore reports an operating-system error inside a ValueError's text.
_TS_ERRNO = re.compile(r"os_error_code='?(\d+)")


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or restored; the message says why and what to do."""


class CheckpointMismatch(CheckpointError):
    """A checkpoint from another model, profile or state layout; the message names what differs."""


def run_description(cfg, global_batch: int) -> dict[str, Any]:
    """What a checkpoint must agree with to be resumed: :data:`RUN_FIELDS` of ``cfg`` and the global batch.

    Args:
        cfg: a :class:`dpcourse.config.Config`.
        global_batch: examples per step over all devices (the same on any mesh
            the run resumes on, or it is another training).
    """
    return {**{name: getattr(cfg, name) for name in RUN_FIELDS}, "global_batch": int(global_batch)}


def check_run(saved: Mapping[str, Any], expected: Mapping[str, Any], where: str) -> None:
    """Refuse a checkpoint whose run description differs from this run's.

    Raises:
        CheckpointMismatch: naming every field that differs, both values, and
            what to do (restore with the saved settings, or use another directory).
    """
    differ = [k for k in expected if saved.get(k) != expected[k]]
    if differ:
        pairs = ", ".join(f"{k} {saved.get(k)!r} (this run: {expected[k]!r})" for k in differ)
        raise CheckpointMismatch(
            f"The checkpoint in {where} is from another run: {pairs}. Resume it with the settings it was saved "
            "with, or give this run a new checkpoint directory."
        )


def make_state(params, opt_state, step: int, key, data_position: int) -> dict[str, Any]:
    """The resumable state as one pytree (:data:`STATE_KEYS`).

    Args:
        params, opt_state: the model's parameters and the optimizer's state (arrays on any mesh).
        step: steps taken so far.
        key: the PRNG key the next step splits (``jax.random.PRNGKey``: uint32 ``[2]``).
        data_position: batches consumed so far (the next batch's index in the data stream).
    """
    return {
        "params": params,
        "opt_state": opt_state,
        "step": np.int32(step),
        "key": key,
        "data_position": np.int32(data_position),
    }


def state_shardings(state, mesh: Mesh, form: str, min_elements: int | None = None):
    """The shardings of ``state`` on ``mesh`` for one form of lesson 10: a tree of ``NamedSharding``.

    ``"replicated"``: every leaf ``P()``. ``"fsdp"``: parameters and AdamW
    state by :func:`dpcourse.sharded.forms.shard_specs` over the mesh's first axis
    (``"data"``), the step, key and data position ``P()``.

    Raises:
        ValueError: an unknown form (the message lists :data:`FORMS`).
    """
    from dpcourse.sharded import forms as sharded

    if form not in FORMS:
        raise ValueError(f"Unknown form {form!r}: use one of {', '.join(FORMS)}.")
    rep = NamedSharding(mesh, P())
    out = jax.tree.map(lambda _: rep, state)
    if form == "fsdp":
        axis = mesh.axis_names[0]
        kwargs = {} if min_elements is None else {"min_elements": min_elements}
        for part in ("params", "opt_state"):
            out[part] = sharded.shard_specs(state[part], mesh.shape[axis], axis, **kwargs).shardings(mesh)
    return out


def abstract_target(state, shardings):
    """``jax.ShapeDtypeStruct`` leaves with the shapes and dtypes of ``state`` and the **target** ``shardings``.

    ``state`` may hold arrays or ``ShapeDtypeStruct`` (for example
    ``jax.eval_shape`` of the initialisation); nothing is allocated.
    """
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=s), state, shardings)


def open_manager(directory: str | os.PathLike, *, asynchronous: bool = True, max_to_keep: int | None = 3):
    """An ``orbax.checkpoint.CheckpointManager`` for ``directory`` (created when missing).

    Args:
        asynchronous: Orbax's default; ``save`` returns once the arrays are
            copied to host memory and writes them in a background thread.
        max_to_keep: newest steps kept (None: all).

    Raises:
        CheckpointError: the directory cannot be created or is not a folder.
    """
    import orbax.checkpoint as ocp

    class Manager(ocp.CheckpointManager):
        # Orbax 0.11.32 (the release Windows gets: requirements.txt) asks JAX's preemption
        # service at every save and fails where it is off, as in the launcher's local
        # workers; Orbax 0.12 reads that as "no preemption", and so does this.
        def reached_preemption(self, step: int) -> bool:
            try:
                return super().reached_preemption(step)
            except RuntimeError as err:
                if "reemption sync manager" not in str(err):
                    raise
                return False

    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=asynchronous)
    try:
        return Manager(Path(directory).absolute(), options=options)
    except OSError as err:
        raise CheckpointError(explain(err, f"open the checkpoint directory {directory}")) from err


def explain(err: BaseException, doing: str) -> str:
    """One sentence for a failed save or restore: what failed, the operating system's reason, what to do."""
    code = getattr(err, "errno", None)
    if code is None:
        found = _TS_ERRNO.search(str(err))
        code = int(found[1]) if found else None
    if code in _NO_ROOM:
        return (
            f"Could not {doing}: no room left ({os.strerror(code)}). Free space or point the run at a "
            "directory with room; the last complete step is unchanged and still the one restored."
        )
    if code in _NO_RIGHTS:
        return (
            f"Could not {doing}: the directory cannot be written ({os.strerror(code)}). Give the run a "
            "writable directory; the last complete step is unchanged and still the one restored."
        )
    first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
    return f"Could not {doing}: {type(err).__name__}: {first}"


def save(manager, step: int, state, run: Mapping[str, Any], *, force: bool = True) -> bool:
    """Start saving ``state`` and its run description as ``step``; the arrays are written in the background.

    Every process of a multi-process run calls it with the same step. Call
    :func:`finish` (or ``manager.wait_until_finished()``) before trusting
    the step: a failure in the background surfaces only there.

    Returns:
        Whether a save was started (Orbax skips a step its policy does not keep).

    Raises:
        CheckpointError: the save could not start (the previous step stays the latest).
    """
    import orbax.checkpoint as ocp

    args = ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardSave(state), RUN_ITEM: ocp.args.JsonSave(dict(run))})
    try:
        return manager.save(int(step), args=args, force=force)
    except (OSError, ValueError) as err:
        raise CheckpointError(explain(err, f"save step {step} to {manager.directory}")) from err


def finish(manager) -> None:
    """Wait for the background save; turn its failure into :class:`CheckpointError`.

    Raises:
        CheckpointError: the save failed (the message says why); the step is
            not listed by ``latest_step()``.
    """
    try:
        manager.wait_until_finished()
    except Exception as err:  # noqa: BLE001 - whatever the background thread raised, said in one sentence
        raise CheckpointError(explain(err, f"finish the save in {manager.directory}")) from err


def read_run(manager, step: int) -> dict[str, Any]:
    """The run description saved with ``step`` (read before any array)."""
    import orbax.checkpoint as ocp

    restored = manager.restore(step, args=ocp.args.Composite(**{RUN_ITEM: ocp.args.JsonRestore()}))
    return dict(restored[RUN_ITEM])


def restore(manager, target, run: Mapping[str, Any], step: int | None = None):
    """Restore ``step`` (default: the latest complete one) onto ``target``'s shapes, dtypes and shardings.

    Args:
        target: a tree of ``jax.ShapeDtypeStruct`` with the shardings this run
            wants (:func:`abstract_target`); never the saved ones.
        run: this run's :func:`run_description`; a checkpoint saved by
            another run is refused before any array is read.

    Returns:
        ``(step, state)``: the step restored and the state, every leaf with
        its target's sharding.

    Raises:
        CheckpointError: no complete step in the directory, or reading failed.
        CheckpointMismatch: another model or profile (named), or a state
            whose leaves differ from the target's (named by their paths).
    """
    import orbax.checkpoint as ocp

    where = str(manager.directory)
    unplaced = [
        jax.tree_util.keystr(path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(target)
        if getattr(leaf, "sharding", None) is None
    ]
    if unplaced:
        raise CheckpointError(
            f"The target leaves {', '.join(unplaced[:5])} have no sharding: Orbax would put them back on the "
            "mesh they were saved from, not this run's. Build the target with jax.ShapeDtypeStruct(shape, "
            "dtype, sharding=...) from this run's mesh (checkpoint.abstract_target)."
        )
    step = manager.latest_step() if step is None else step
    if step is None:
        raise CheckpointError(f"No complete checkpoint in {where}: start the run from step 0 instead.")
    check_run(read_run(manager, step), run, f"{where} (step {step})")
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardRestore(target)}))
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointMismatch(
            f"Step {step} in {where} does not fit the target state ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:300]}): the saved state has another layout; use a new directory."
        ) from err
    except OSError as err:
        raise CheckpointError(explain(err, f"restore step {step} from {where}")) from err
    return step, restored[STATE_ITEM]


def half_written(directory: str | os.PathLike) -> list[str]:
    """Names of the steps in ``directory`` that were started and never committed (Orbax's temporary folders)."""
    folder = Path(directory)
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(TMP_SUFFIX)) if folder.is_dir() else []


def directory_bytes(path: str | os.PathLike) -> int:
    """Bytes of every file under ``path`` (a checkpoint step's size on disk, before the file system's blocks)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def leaf_bytes(tree) -> int:
    """Bytes of the arrays of ``tree`` counted once each (global shape x itemsize), whatever their sharding."""
    return sum(int(np.prod(np.shape(a))) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


@contextlib.contextmanager
def fail_at_commit(error: BaseException | None = None, *, kill: bool = False) -> Iterator[None]:
    """Simulate a failure at the last moment of a save: every array written, the step not yet committed.

    While active, Orbax's commit (the rename of ``<step>.orbax-checkpoint-tmp``
    to ``<step>``) raises ``error`` (for example ``OSError(errno.ENOSPC,
    ...)``, a full disk) or, with ``kill=True``, ends this process at once
    with SIGKILL, as a preempted machine would. Used by notebook 11 and the
    tests; other renames pass through.
    """
    if (error is None) == (not kill):
        raise ValueError("Give either an error to raise or kill=True.")
    real = os.rename

    def rename(src, dst, *args, **kwargs):
        if str(src).endswith(TMP_SUFFIX):
            if kill:
                os.kill(os.getpid(), 9)
            raise error
        return real(src, dst, *args, **kwargs)

    os.rename = rename
    try:
        yield
    finally:
        os.rename = real


@contextlib.contextmanager
def quiet_orbax_log() -> Iterator[None]:
    """Hold back Orbax's own log of a failed background save (a traceback on stderr, through absl's logger).

    The failure still raises where the lesson waits for it (``wait_until_finished()``,
    :func:`finish`); only the second copy, logged from Orbax's thread, is held back,
    so a planted failure shows once, as the lesson's own sentence.
    """
    import logging

    logger = logging.getLogger("absl")
    before = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(before)
