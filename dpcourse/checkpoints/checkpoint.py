"""Save and restore a resumable training state with Orbax: targets, run checks, errors in one sentence.

Notebook 11 teaches the calls (``CheckpointManager``, ``save``,
``wait_until_finished``, ``restore`` onto a target built from
``jax.ShapeDtypeStruct``) in its own cells; this module is the reusable
version that the lesson's fresh process (:mod:`dpcourse.checkpoints.resume`), the
multi-process worker and the tests use. A checkpoint step holds two items:
``state`` (the resumable state: parameters, AdamW state, step, PRNG key,
data position) and ``run`` (a JSON description of the model and profile,
checked before any array is read, with where the step was made beside it:
:mod:`dpcourse.checkpoints.provenance`).

Errors are :class:`CheckpointError` with one sentence that says what to
do; a save that fails leaves the previous step as ``latest_step()``
(Orbax writes a step into ``<step>.orbax-checkpoint-tmp`` and renames it
when complete; the saving manager lists the step as soon as ``save``
returns, but a manager opened later never lists a step without the rename,
and no restore reads it: tests/lessons/test_checkpoint_claims.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse.checkpoints import provenance
from dpcourse.checkpoints.errors import (  # noqa: F401 - the errors are part of this module's interface
    BatchDoesNotSplit,
    CheckpointError,
    CheckpointGone,
    CheckpointInUse,
    CheckpointMismatch,
    StepPastTarget,
    as_error,
    check_directory,
    explain,
    shape_error,
)
from dpcourse.checkpoints.holding import (  # noqa: F401 - the writer's lock, its own module
    LOCK_NAME,
    LOCK_REFRESH_S,
    LOCK_STALE_S,
    check_still_there,
    hold,
)

STATE_KEYS = ("params", "opt_state", "step", "key", "data_position")
STATE_ITEM, RUN_ITEM = "state", "run"
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # Orbax's name for a step still being written
FORMS = ("replicated", "fsdp")
# The Config fields that decide a checkpoint's shapes or its training: a
# checkpoint saved with another value of any of them is refused.
RUN_FIELDS = ("profile", "width", "block_repeats", "block_mix", "learning_rate", "seed")
# The run description's shape, checked wherever it is read: a step whose description departs from it is damaged.
RUN_SCHEMA = {
    "type": "object",
    "required": [*RUN_FIELDS, "global_batch"],
    "properties": {"global_batch": {"type": "integer", "minimum": 1}},
}

SAVE_BARRIER_S = 60  # the longest a background save waits for the other processes (each has written its part)
DAMAGED_SUFFIX = ".damaged"  # a damaged step set aside by a run that resumed from an earlier one
_READ_FAILED = re.compile(r"Error reading|OUT_OF_RANGE|DATA_LOSS|FAILED_PRECONDITION|NOT_FOUND|Truncated|corrupt")
_TS_READ = re.compile(r'Error reading "([^"/]+)[^"]*"[^:]*"[^"]*": (.+)')


def steps_to_train(saved_step: int | None, target: int, where: str, option: str) -> int:
    """How many steps a run resumed from ``saved_step`` trains to reach ``target`` (0: it is already there).

    The one rule of the resume command and the multi-process worker:
    nothing saved starts from step 0; a checkpoint at the target has
    nothing left to do (the caller says so, saves nothing and succeeds);
    one past it is refused.

    Raises:
        StepPastTarget: ``saved_step`` > ``target`` (also a ``ValueError``);
            the message names both and ``option`` (``--until``, ``--steps``).
        ValueError: ``target`` < 1.
    """
    if target < 1:
        raise ValueError(f"{option} must be >= 1 (the step to train to), got {target}.")
    saved = 0 if saved_step is None else int(saved_step)
    if saved > target:
        raise StepPastTarget(
            f"The checkpoint in {where} is at step {saved}, past {option} {target}: raise {option} to at least "
            f"{saved} to train further, or give another checkpoint directory."
        )
    return target - saved


def check_devices_for_batch(global_batch: int, n_devices: int, where: str) -> None:
    """Refuse a device count that does not divide a resumed run's global batch, which the checkpoint fixes.

    A resumed run keeps its global batch (:func:`run_description`), so the
    advice is the device counts that divide it, never another batch.

    Raises:
        BatchDoesNotSplit: ``global_batch`` does not divide by ``n_devices`` (also a ``ValueError``); the
            message lists the counts that do.
    """
    if n_devices < 1 or global_batch % n_devices:
        fits = [k for k in range(1, min(global_batch, 64) + 1) if global_batch % k == 0]
        raise BatchDoesNotSplit(
            f"The run in {where} keeps its global batch of {global_batch} (another batch would be another "
            f"training), and it does not divide evenly over {n_devices} devices: resume on a device count that "
            f"divides it ({', '.join(map(str, fits))})."
        )


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
        CheckpointError: the directory cannot be created or is a file.
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

    # A step's folder is made before save() returns, so that a folder that cannot be written fails there, in
    # the process that made it, rather than in a background thread that the other processes wait for; and
    # no background wait on other processes lasts longer than SAVE_BARRIER_S (Orbax's default: 20 minutes).
    async_options = ocp.AsyncOptions(timeout_secs=SAVE_BARRIER_S, create_directories_asynchronously=False)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, enable_async_checkpointing=asynchronous, async_options=async_options
    )
    path = check_directory(directory)
    check_still_there(path)
    try:
        return Manager(path, options=options)
    except OSError as err:
        raise as_error(err, f"open the checkpoint directory {directory}") from err


def save(manager, step: int, state, run: Mapping[str, Any], *, force: bool = True) -> bool:
    """Start saving ``state`` and its run description as ``step``; the arrays are written in the background.

    The run description is saved with :func:`dpcourse.checkpoints.provenance.describe`
    of ``state`` beside it (backend, device kind and count, mesh, library
    versions, time): :func:`restore` tells it.

    Every process of a multi-process run calls it with the same step. Call
    :func:`finish` (or ``manager.wait_until_finished()``) before trusting
    the step: a failure in the background surfaces only there.

    Returns:
        Whether a save was started (Orbax skips a step its policy does not keep).

    Raises:
        CheckpointError: the save could not start (the previous step stays the latest).
    """
    import orbax.checkpoint as ocp

    described = {**run, provenance.KEY: provenance.describe(state)}  # where it was made, told at every restore
    args = ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardSave(state), RUN_ITEM: ocp.args.JsonSave(described)})
    check_still_there(manager.directory)
    try:
        return manager.save(int(step), args=args, force=force)
    except (OSError, ValueError, ocp.checkpoint_manager.StepAlreadyExistsError) as err:
        raise as_error(err, f"save step {step} to {manager.directory}") from err


def finish(manager) -> None:
    """Wait for the background save; turn its failure into :class:`CheckpointError`.

    Raises:
        CheckpointError: the save failed (the message says why); the step is
            not listed by ``latest_step()``.
    """
    try:
        manager.wait_until_finished()
    except Exception as err:  # noqa: BLE001 - whatever the background thread raised, said in one sentence
        check_still_there(manager.directory)
        raise as_error(err, f"finish the save in {manager.directory}") from err
    check_still_there(manager.directory)


def _run_of(manager, step: int) -> tuple[dict[str, Any] | None, str | None]:
    """``(run description, None)`` of ``step``, or ``(None, what is damaged)``: its files, its JSON, its shape."""
    import orbax.checkpoint as ocp

    broken = damage(Path(str(manager.directory)) / str(step))
    if broken:
        return None, broken
    try:
        saved = manager.restore(step, args=ocp.args.Composite(**{RUN_ITEM: ocp.args.JsonRestore()}))[RUN_ITEM]
    except Exception as err:  # noqa: BLE001 - whatever Orbax raises on a run item it cannot read
        return None, _read_failure(err) or f"its run description cannot be read ({type(err).__name__})"
    wrong = shape_error(saved, RUN_SCHEMA)
    return (None, f"its run description has the wrong shape, {wrong}") if wrong else (dict(saved), None)


def steps(manager) -> list[int]:
    """The complete steps of ``manager``'s folder, newest first.

    Raises:
        CheckpointError: a folder there is named like a step but not as Orbax names one (``04``), which Orbax
            would pass over without a word.
    """
    folder = Path(str(manager.directory))
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    odd = sorted(name for name in names if name.isdigit() and name != str(int(name)))
    if odd:
        raise CheckpointError(
            f"The folder {odd[0]} in {folder} looks like step {int(odd[0])}, but Orbax reads a step only under "
            f"its number's own name: rename it to {int(odd[0])}, or move it out of the folder."
        )
    return sorted(manager.all_steps(), reverse=True)


def newest_run(manager) -> tuple[int | None, dict[str, Any] | None]:
    """``(step, run description)`` of the newest step whose description reads whole; ``(None, None)``: no step.

    A damaged newer step is passed over here; :func:`restore` with ``warn`` names it and sets it aside.

    Raises:
        CheckpointError: steps are there and none has a description that reads whole, or a misnamed step
            folder (:func:`steps`).
    """
    found = steps(manager)
    for step in found:
        saved, broken = _run_of(manager, step)
        if saved is not None:
            return step, saved
    if found:
        raise CheckpointError(
            f"No step in {manager.directory} has a run description that reads whole (step {found[0]}: "
            f"{broken}): move the damaged steps away and train from step 0, or use another directory."
        )
    return None, None


def damage(step_dir: str | os.PathLike) -> str | None:
    """What is wrong with a committed step's folder, in a few words, from its files alone; None when nothing shows.

    Checks that the folder holds both items (``state``, ``run``), and that
    Orbax's metadata files (``_CHECKPOINT_METADATA``, ``state/_METADATA``,
    ``run/metadata``) are there and parse as JSON. A data file cut short or
    lost shows only when it is read (:func:`restore`).
    """
    folder = Path(step_dir)
    if not folder.exists():
        return "there is no such step"
    if not folder.is_dir() or not any(folder.iterdir()):
        return "its folder is empty"
    for item in (STATE_ITEM, RUN_ITEM):
        if not (folder / item).is_dir():
            return f"its item '{item}' is missing"
    for name in ("_CHECKPOINT_METADATA", f"{STATE_ITEM}/_METADATA", f"{RUN_ITEM}/metadata"):
        try:
            json.loads((folder / name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return f"its metadata file {name} is missing"
        except (OSError, ValueError) as err:
            return f"its metadata file {name} cannot be read ({type(err).__name__})"
    return None


def _read_failure(err: BaseException) -> str | None:
    """A few words on a data file that could not be read, found in ``err`` or the errors it was raised from."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err)
        found = _TS_READ.search(text)
        if found:
            return f"the data of {found[1]} cannot be read: {found[2].strip()[:200]}"
        if _READ_FAILED.search(text) or isinstance(err, FileNotFoundError):
            return f"a data file cannot be read: {text.strip().splitlines()[0][:200] if text.strip() else type(err).__name__}"
        err = err.__cause__ or err.__context__
    return None


def _restore_step(manager, target, run, step: int, runs: list):
    """Restore one step; ``(state, None)``, or ``(None, what is damaged)`` for a step whose files are damaged.

    ``runs`` gets the step's run description once it is read.
    """
    import orbax.checkpoint as ocp

    where = str(manager.directory)
    saved, broken = _run_of(manager, step)
    if broken:
        return None, broken
    check_run(saved, run, f"{where} (step {step})")
    runs[:] = [saved]
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardRestore(target)}))
    except OSError as err:
        if isinstance(err, FileNotFoundError):
            return None, _read_failure(err)
        raise as_error(err, f"restore step {step} from {where}") from err
    except Exception as err:  # noqa: BLE001 - Orbax raises a plain Exception for a file it cannot read
        failure = _read_failure(err)
        if failure:
            return None, failure
        raise CheckpointMismatch(
            f"Step {step} in {where} does not fit the target state ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:300]}): the saved state has another layout; use a new directory."
        ) from err
    return restored[STATE_ITEM], None


def restore(
    manager,
    target,
    run: Mapping[str, Any],
    step: int | None = None,
    warn=None,
    *,
    agree=None,
    barrier=None,
    primary=True,
    say=None,
):
    """Restore ``step`` (default: the latest complete one) onto ``target``'s shapes, dtypes and shardings.

    A latest step whose files are damaged (:func:`damage`, or a data file
    that cannot be read) is never restored. With ``warn`` (a callable taking
    one sentence), the newest earlier step that restores whole is restored
    instead, ``warn`` is told "step 4 in DIR is damaged (...); step 2 is
    complete: resuming from step 2", and each damaged step is set aside as
    ``<step>.damaged`` (kept, never listed again) so that the run can save
    that step anew. Without ``warn`` that sentence is an error.

    Args:
        target: a tree of ``jax.ShapeDtypeStruct`` with the shardings this run
            wants (:func:`abstract_target`); never the saved ones.
        run: this run's :func:`run_description`; a checkpoint saved by
            another run is refused before any array is read.
        step: a given step is restored or refused, never replaced by another.
        agree, barrier, primary: for several processes restoring together
            (the multi-process worker), which must all take the same step:
            ``agree(what_is_damaged_or_None)`` returns the verdict every
            process shares (the first process's cause, naming it), only the
            ``primary`` process sets damaged steps aside, and ``barrier()``
            waits for that before every process reads the folder again.

    Returns:
        ``(step, state)``: the step restored and the state, every leaf with
        its target's sharding.

    Raises:
        CheckpointError: no complete step in the directory, a damaged step
            (without ``warn``, or with no whole step before it), or reading failed.
        CheckpointMismatch: another model or profile (named), or a state
            whose leaves differ from the target's (named by their paths).
    """
    where = str(manager.directory)
    check_still_there(where)
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
    candidates = steps(manager) if step is None else [int(step)]
    if not candidates:
        raise CheckpointError(
            f"No complete checkpoint in {where}: there is nothing to resume; train from step 0 "
            "(the run saves its steps there)."
        )
    damaged = []
    for candidate in candidates:
        saved_run = []
        state, broken = _restore_step(manager, target, run, candidate, saved_run)
        if agree is not None:
            broken = agree(broken)  # one process's damaged file is every process's damaged step
        if broken is None:
            break
        damaged.append((candidate, broken))
    said = "; ".join(f"step {k} in {where} is damaged ({why})" for k, why in damaged)
    if broken is not None and step is not None:
        raise CheckpointError(f"{said}: restore another step (manager.all_steps() lists them).")
    if broken is not None:
        raise CheckpointError(
            f"{said}; no earlier step is complete. Move the damaged steps away and train from step 0, "
            "or give the run another checkpoint directory."
        )
    if damaged and warn is None:
        raise CheckpointError(f"{said}; step {candidate} is complete: restore it with step={candidate}.")
    if damaged:
        kept = []
        for k, _ in damaged if primary else ():
            names = [f"{k}{DAMAGED_SUFFIX}", *(f"{k}{DAMAGED_SUFFIX}.{i}" for i in range(2, 100))]
            aside = next((name for name in names if not (Path(where) / name).exists()), None)
            with contextlib.suppress(OSError):  # a step set aside before keeps its name; this one takes the next
                if aside is not None:
                    os.rename(Path(where) / str(k), Path(where) / aside)
                    kept.append(aside)
        if barrier is not None:
            barrier()  # every process reads the folder again after the primary one set the steps aside
        if hasattr(manager, "reload"):
            manager.reload()
        aside = f" (kept as {', '.join(kept)})" if kept else ""
        warn(f"{said}; step {candidate} is complete: resuming from step {candidate}{aside}.")
    if say is not None:
        say(provenance.restored_sentence(candidate, saved_run[0], target))
    return candidate, state


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
    """Simulate a failure at the last moment of a save: every item committed inside the step, the step not.

    While active, the step's commit (Orbax's rename of ``<step>.orbax-checkpoint-tmp``
    to ``<step>``, after every item's own rename inside it and after its
    ``commit_success.txt``) raises ``error`` (for example ``OSError(errno.ENOSPC,
    ...)``, a full disk) or, with ``kill=True``, ends this process at once
    with SIGKILL, as a preempted machine would. The items' renames
    (``<step>.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp`` to ``.../state``)
    and every other rename pass through. Used by notebook 11 and the tests.
    """
    if (error is None) == (not kill):
        raise ValueError("Give either an error to raise or kill=True.")
    real = os.rename

    def rename(src, dst, *args, **kwargs):
        source = Path(src)
        # The step's own folder, not an item's inside it (whose parent is the step's temporary folder).
        if source.name.endswith(TMP_SUFFIX) and not source.parent.name.endswith(TMP_SUFFIX):
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
