"""The data-parallel training program every process of a multi-host run executes.

Taught in notebook 08, which writes the data loading of
:func:`load_global_batches` in a cell of its own. Each
process runs ``python -m dpcourse.multihost.worker`` (started by
:func:`dpcourse.multihost.launcher.launch_local` on this machine, by
``deploy/multihost.yaml`` on GKE): it joins the runtime with
:func:`dpcourse.multihost.distributed.initialize`, trains on its own rows of every
global batch, and process 0 reports. :func:`single_process_reference` is the
same training in one process, the yardstick the multi-process result is
compared with. With a checkpoint folder and JAX's preemption service on (a
GKE pod; the local launcher turns it off), a SIGTERM to any process makes
every process save the step they agree on and leave with
``PREEMPTED_EXIT_CODE`` (notebook 13's form, :class:`Preempted`).

Imports flow one way: launcher -> worker -> distributed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpcourse import config as _config
from dpcourse import data as _data
from dpcourse.multihost.distributed import (
    AXIS,
    COORDINATOR_ENV,
    NUM_PROCESSES_ENV,
    PROCESS_ID_ENV,
    UNUSABLE_CHECKPOINT_EXIT,
    WORKER_FAILURE_EXIT,
    DistributedSetupError,
    global_mesh,
    initialize,
    is_main_process,
    log,
    params_digest,
    print_main,
    process_local_batches,
    process_rows,
    shutdown,
)
from dpcourse.multihost.heartbeat import Heartbeat
from dpcourse.multihost.parent import follow_parent
from dpcourse.multihost.plan import check_savable_split
from dpcourse.multihost.preemption import (
    PREEMPTED_EXIT_CODE,
    ask_from,
    hold_early_notice,
    latest_saved_step,
    pass_on_notice,
)
from dpcourse.train import check_global_batch


class Preempted(Exception):
    """Every process saved the preemption step they agreed on: the worker leaves with ``PREEMPTED_EXIT_CODE``.

    Not an error: a GKE Job's ``podFailurePolicy`` retries that status
    without counting it (notebook 13; ``deploy/multihost-checkpoint.yaml``).
    """

    def __init__(self, step: int, checkpoint_dir: str) -> None:
        self.step = step
        super().__init__(
            f"preempted: every process saved step {step} to {checkpoint_dir}; "
            f"leaving with status {PREEMPTED_EXIT_CODE} to resume from there"
        )


def load_global_batches(mesh, dataset: _data.Dataset, n_batches: int, global_batch: int) -> tuple[list, object, object]:
    """This process's rows of every stacked batch, made into global arrays sharded over ``AXIS``.

    Notebook 08 writes the same lines in a cell of its own. The rows are
    read from the sharding (:func:`dpcourse.multihost.distributed.process_rows`), so
    they are right for any device order; only those rows are loaded.

    Returns:
        ``(rows, x, y)``: this process's ``[start, stop)`` ranges of the
        batch dimension, images ``[n_batches, global_batch, 784]`` float32
        sharded ``P(None, AXIS, None)`` and labels ``[n_batches,
        global_batch]`` int32 sharded ``P(None, AXIS)`` (global arrays).
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    x_sharding = NamedSharding(mesh, P(None, AXIS, None))
    y_sharding = NamedSharding(mesh, P(None, AXIS))
    x_shape = (n_batches, global_batch, _data.N_FEATURES)
    rows = process_rows(x_sharding, x_shape, axis=1)
    x_local, y_local = process_local_batches(dataset, n_batches, global_batch, rows)
    x = jax.make_array_from_process_local_data(x_sharding, x_local, x_shape)
    y = jax.make_array_from_process_local_data(y_sharding, y_local, x_shape[:2])
    return rows, x, y


_HELD = contextlib.ExitStack()  # the checkpoint folder's lock, held by process 0 until this process ends


def hold_directory(checkpoint_dir: str | os.PathLike) -> None:
    """Process 0 takes the checkpoint folder's lock for the whole run; every process learns whether it could.

    Raises:
        CheckpointInUse: in process 0, another run holds the folder (named);
            in the others, process 0 could not take it (its error names why).
        CheckpointError: the folder is a file (checked in every process first).
    """
    from jax.experimental import multihost_utils

    from dpcourse.checkpoints import checkpoint

    checkpoint.check_directory(checkpoint_dir)
    refusal = None
    if is_main_process():
        try:
            _HELD.enter_context(checkpoint.hold(checkpoint_dir, "python -m dpcourse.multihost.worker"))
        except checkpoint.CheckpointError as err:
            refusal = err
    if int(multihost_utils.broadcast_one_to_all(np.int32(refusal is not None))):
        raise refusal or checkpoint.CheckpointInUse(
            f"Process 0 could not take the lock of the checkpoint directory {checkpoint_dir} (its error says why)."
        )


def agree_on_damage(broken: str | None) -> str | None:
    """Every process's verdict on one checkpoint step, shared: the first process that found it damaged, and why.

    Each process reads only its own shards, so a file cut short may show in
    one process alone; the others must still skip the step with it, or the
    processes would train from different steps.
    """
    from jax.experimental import multihost_utils

    width = 400
    text = (broken or "").encode("utf-8")[: width - 1]
    row = np.zeros(width, np.uint8)
    row[0] = broken is not None
    row[1 : 1 + len(text)] = np.frombuffer(text, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(row)).reshape(-1, width)
    for process, found in enumerate(rows):
        if found[0]:
            return f"process {process} found: {bytes(found[1:]).rstrip(bytes(1)).decode('utf-8', 'replace')}"
    return None


def train_worker(
    profile: str | None,
    steps: int,
    data_source: str | None = None,
    global_batch: int | None = None,
    out_dir: str | os.PathLike | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    save_every: int | None = None,
    fail_at_step: int | None = None,
    heartbeat: Heartbeat | None = None,
) -> dict:
    """Data-parallel training for ``steps`` steps over every device of every process.

    ``heartbeat`` (the launcher's progress file, :mod:`dpcourse.multihost.progress`)
    is told each stage: compiling, then each step.

    Call it in every process after :func:`initialize`. Every process builds
    the same global mesh and the same initial parameters (same seed), loads
    only its own rows of each global batch and turns them into global arrays
    with ``jax.make_array_from_process_local_data``; the step is notebook
    05's ``shard_map`` step, whose ``pmean`` now crosses processes. Process 0
    writes ``result.json``, ``params.npz`` (final parameters) and
    ``first_moment.npz`` (AdamW's first moment after step 1, ``(1 - b1) x``
    the first gradient) into ``out_dir``.

    Args:
        profile: config profile (None: ``$DPCOURSE_PROFILE``, else automatic).
        steps: training steps (>= 1); step ``i`` uses batch ``i % n_batches``.
        data_source: ``"real"``, ``"synthetic"`` or ``"auto"`` (None: ``$DPCOURSE_DATA``).
        global_batch: examples per step over all processes (default
            ``per_device_batch x`` global device count).
        out_dir: where process 0 writes its files (None: nowhere).
        checkpoint_dir: resume from the latest step saved there, if any, and
            save every ``save_every`` steps and at the end (notebook 11; every
            process calls save and restore; a shared folder on several machines).
        save_every: steps between checkpoints (None: only at the end).
        fail_at_step: this process exits (status 1, no shutdown) when it
            reaches this step, after the saves before it finished: a process
            killed mid-run.

    Returns:
        The summary (same in every process, except ``process_id``).

    Raises:
        ValueError: ``steps`` < 1; ``global_batch`` does not divide by the
            global device count (the message names the nearest valid sizes);
            or the latest checkpoint in ``checkpoint_dir`` is past ``steps``.
            A checkpoint at exactly ``steps`` is no error: no step is trained,
            ``losses`` is empty and ``ms_per_step`` is None (a finished Job
            applied again).
        Preempted: with a ``checkpoint_dir`` and JAX's preemption service on,
            after a process got SIGTERM: every process saved the step they
            agreed on (``multihost_utils.reached_preemption_sync_point``).
    """
    try:
        return _train(
            profile, steps, data_source, global_batch, out_dir, checkpoint_dir, save_every, fail_at_step, heartbeat
        )
    finally:
        _HELD.close()  # the checkpoint folder's lock, if process 0 took it


def _train(profile, steps, data_source, global_batch, out_dir, checkpoint_dir, save_every, fail_at_step, heartbeat):
    """:func:`train_worker`'s work; the caller releases the checkpoint folder's lock whatever happens."""
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpcourse import model, train

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    start = time.perf_counter()
    # JAX's preemption service (on unless JAX_ENABLE_PREEMPTION_SERVICE=false, which the local launcher sets)
    # catches SIGTERM; once any process got it, every process reaches the same agreed step, saves it and
    # leaves (notebook 13). The step this run starts from is told to the service first, before the data, the
    # restore and the compile, so a notice during them is agreed at a step this run reaches.
    preemptible = checkpoint_dir is not None and bool(jax.config.jax_enable_preemption_service)
    if preemptible and ask_from(latest_saved_step(checkpoint_dir)):
        raise Preempted(latest_saved_step(checkpoint_dir), checkpoint_dir)  # already saved: nothing to add
    if preemptible:
        pass_on_notice()  # a SIGTERM held since the start-up, now that the service knows this run's step
    cfg = _config.get_config(profile, backend=jax.default_backend())
    mesh = global_mesh()
    n_global = jax.device_count()
    global_batch = cfg.global_batch(n_global) if global_batch is None else global_batch
    saved = Path(checkpoint_dir).iterdir() if checkpoint_dir is not None and Path(checkpoint_dir).is_dir() else ()
    if any(p.name.isdigit() for p in saved):  # a resumed run keeps its global batch
        from dpcourse.checkpoints.checkpoint import check_devices_for_batch

        check_devices_for_batch(global_batch, n_global, str(checkpoint_dir))
    per_device_batch = check_global_batch(global_batch, n_global)

    # Parameters: the same seed in every process, so every copy starts equal.
    optimizer = train.make_optimizer(cfg)
    params = jax.device_put(model.init_params(cfg), NamedSharding(mesh, P()))
    opt_state = optimizer.init(params)

    # Data: each process loads only its rows of every global batch.
    dataset = _data.load_fashion_mnist(source=data_source, limit=cfg.max_train_examples, seed=cfg.seed)
    rows, x, y = load_global_batches(mesh, dataset, cfg.n_batches, global_batch)
    log(
        f"{len(jax.local_devices())} local of {n_global} global devices; loaded rows {rows} "
        f"of each global batch of {global_batch} ({dataset.source} data)"
    )

    # Notebook 11: resume from the latest checkpoint, onto this run's mesh (any process count).
    start_step, manager = 0, None
    heartbeat = heartbeat or Heartbeat(path="")
    if checkpoint_dir is not None:
        from dpcourse.checkpoints import checkpoint

        check_savable_split(jax.process_count(), jax.local_device_count(), checkpoint_dir)
        heartbeat.set(f"restoring from {checkpoint_dir}")
        run = checkpoint.run_description(cfg, global_batch)
        hold_directory(checkpoint_dir)
        manager = checkpoint.open_manager(checkpoint_dir)
        state = checkpoint.make_state(params, opt_state, 0, jax.random.PRNGKey(cfg.seed), 0)
        shardings = checkpoint.state_shardings(state, mesh, "replicated")
        if checkpoint.steps(manager):  # a step folder Orbax would pass over (04) is told there
            start_step, state = checkpoint.restore(
                manager,
                checkpoint.abstract_target(state, shardings),
                run,
                warn=lambda said: print_main(said),
                agree=agree_on_damage if jax.process_count() > 1 else None,
                barrier=lambda: multihost_utils.sync_global_devices("dpcourse damaged steps set aside"),
                primary=is_main_process(),
            )
            params, opt_state = state["params"], state["opt_state"]
        if not checkpoint.steps_to_train(start_step, steps, checkpoint_dir, "--steps"):
            log(f"{checkpoint_dir} already holds step {steps}: nothing left to train (raise --steps to go on)")
        elif start_step:
            log(f"resumed from step {start_step} of {checkpoint_dir}")

    # The step of notebook 05: per-shard gradients, pmean over every device.
    step = jax.jit(train.make_shard_map_step(cfg, optimizer, mesh, AXIS))
    heartbeat.set("compiling the step")
    compile_start = time.perf_counter()
    compiled = step.lower(params, opt_state, x[0], y[0]).compile()
    compile_s = time.perf_counter() - compile_start
    losses, accuracies, step_s, first_moment = [], [], [], {}
    # A GKE Job retries the preempted exit without counting it.
    saved_step = start_step
    for i in range(start_step, steps):
        if preemptible and multihost_utils.reached_preemption_sync_point(i):
            if i > saved_step:
                key = jax.device_put(jax.random.PRNGKey(cfg.seed), shardings["key"])  # unused by this step
                heartbeat.set(f"saving step {i} to {checkpoint_dir} (preempted)")
                checkpoint.save(manager, i, checkpoint.make_state(params, opt_state, i, key, i), run)
            checkpoint.finish(manager)
            manager.close()
            raise Preempted(i, checkpoint_dir)
        heartbeat.set(f"step {i + 1} of {steps}")
        if fail_at_step is not None and i == fail_at_step:
            if manager is not None:
                checkpoint.finish(manager)
            print(f"[process {jax.process_index()}] injected failure at step {i}", file=sys.stderr, flush=True)
            os._exit(WORKER_FAILURE_EXIT)
        t0 = time.perf_counter()
        params, opt_state, metrics = compiled(params, opt_state, x[i % cfg.n_batches], y[i % cfg.n_batches])
        jax.block_until_ready(params)
        step_s.append(time.perf_counter() - t0)
        if i == 0:  # AdamW's update hides a scaled gradient; its first moment does not
            first_moment = {k: np.asarray(v.addressable_data(0)) for k, v in train.adam_first_moment(opt_state).items()}
        losses.append(float(metrics["loss"]))
        accuracies.append(float(metrics["accuracy"]))
        if manager is not None and (i + 1 == steps or (save_every and (i + 1) % save_every == 0)):
            key = jax.device_put(jax.random.PRNGKey(cfg.seed), shardings["key"])  # unused by this step
            heartbeat.set(f"saving step {i + 1} to {checkpoint_dir}")
            checkpoint.save(manager, i + 1, checkpoint.make_state(params, opt_state, i + 1, key, i + 1), run)
            saved_step = i + 1
    if manager is not None:
        heartbeat.set(f"finishing the saves to {checkpoint_dir}")
        checkpoint.finish(manager)
        manager.close()

    # Replicated parameters: every process holds a full copy; they must agree.
    host_params = {k: np.asarray(v.addressable_data(0)) for k, v in params.items()}
    digest = params_digest(host_params)
    digests = multihost_utils.process_allgather(np.frombuffer(bytes.fromhex(digest), np.uint8))
    local_ids = [d.id for d in sorted(jax.local_devices(), key=lambda d: d.id)]
    first, last = rows[0][0], rows[-1][1]
    layouts = multihost_utils.process_allgather(np.array([jax.process_index(), first, last, *local_ids]))
    summary = {
        "process_id": jax.process_index(),
        "num_processes": jax.process_count(),
        "global_devices": n_global,
        "local_devices": len(local_ids),
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "jax_version": jax.__version__,
        "profile": cfg.profile,
        "data_source": dataset.source,
        "global_batch": global_batch,
        "per_device_batch": per_device_batch,
        "steps": steps,
        "resumed_from": start_step,
        "losses": losses,
        "accuracies": accuracies,
        "compile_s": compile_s,
        "step_s": step_s,
        # Steady state: the first step after compilation is slower, leave it out when we can.
        # None when a resumed run had no step left to train.
        "ms_per_step": 1000.0 * float(np.median(step_s[1:] if len(step_s) > 1 else step_s)) if step_s else None,
        "worker_s": time.perf_counter() - start,
        "params_digest": digest,
        "replicas_agree": bool(all(bytes(d).hex()[:16] == digest for d in np.asarray(digests))),
        "layout": [
            {"process": int(r[0]), "rows": [int(r[1]), int(r[2])], "devices": [int(v) for v in r[3:]]}
            for r in np.asarray(layouts)
        ],
    }
    summary["examples_per_s"] = global_batch / (summary["ms_per_step"] / 1000.0) if step_s else None
    if is_main_process() and out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "params.npz", **host_params)
        np.savez(out / "first_moment.npz", **first_moment)
        (out / "result.json").write_text(json.dumps(summary, indent=2) + "\n")
    if losses:
        trained = (
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in steps {start_step}..{steps}; "
            f"{summary['ms_per_step']:.1f} ms/step ({summary['examples_per_s']:,.0f} examples/s)"
        )
    else:
        trained = f"no step trained (the checkpoint already holds step {steps})"
    print_main(
        f"{summary['num_processes']} processes x {summary['local_devices']} {summary['backend']} devices; "
        f"global batch {global_batch}; {trained}; params {digest}; "
        f"replicas agree: {'yes' if summary['replicas_agree'] else 'NO'}",
        flush=True,
    )
    return summary


def single_process_reference(
    profile: str | None,
    steps: int,
    devices: Sequence,
    data_source: str | None = None,
    global_batch: int | None = None,
    change_at: int | None = None,
    devices_after: Sequence | None = None,
) -> tuple[dict[str, np.ndarray], list[float], dict[str, np.ndarray]]:
    """The same training in this one process, on ``devices`` (from step ``change_at`` on ``devices_after``).

    The whole global batch is put on the mesh with ``jax.device_put``; the
    step, the initial parameters and the batches are those of
    :func:`train_worker`. Notebook 08 writes the same lines out in full.
    It runs under its own mesh (``jax.set_mesh``), whatever mesh the caller
    set in context, as the worker processes do. A change of devices keeps the
    global batch, split over the new ones (notebook 13's survivors).

    Returns:
        Final parameters as host arrays (``{name: float32 array}``), the
        loss of every step, and AdamW's first moment after step 1 (host arrays).

    Raises:
        ValueError: ``global_batch`` does not divide by ``len(devices)``.
    """
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpcourse import model, train

    cfg = _config.get_config(profile, backend=devices[0].platform)
    global_batch = cfg.global_batch(len(devices)) if global_batch is None else global_batch
    check_global_batch(global_batch, len(devices))
    optimizer = train.make_optimizer(cfg)
    params, opt_state = model.init_params(cfg), None
    dataset = _data.load_fashion_mnist(source=data_source, limit=cfg.max_train_examples, seed=cfg.seed)
    x_host, y_host = _data.stacked_batches(dataset, cfg.n_batches, global_batch)
    losses, first_moment = [], None
    for i in range(steps):
        if i == 0 or i == change_at:  # the mesh over this part's devices, the state and the batches on it
            mesh = Mesh(np.array(list(devices if i == 0 else devices_after)), (AXIS,))
            with jax.set_mesh(mesh):  # its own Auto mesh, whatever the caller set (notebook 03, section 4)
                params = jax.device_put(jax.device_get(params), NamedSharding(mesh, P()))
                kept = None if opt_state is None else jax.device_get(opt_state)
                opt_state = optimizer.init(params) if kept is None else jax.device_put(kept, NamedSharding(mesh, P()))
                x = jax.device_put(x_host, NamedSharding(mesh, P(None, AXIS, None)))
                y = jax.device_put(y_host, NamedSharding(mesh, P(None, AXIS)))
                step = jax.jit(train.make_shard_map_step(cfg, optimizer, mesh, AXIS))
        with jax.set_mesh(mesh):
            params, opt_state, metrics = step(params, opt_state, x[i % cfg.n_batches], y[i % cfg.n_batches])
        losses.append(float(metrics["loss"]))
        if i == 0:
            first_moment = {k: np.asarray(v) for k, v in jax.device_get(train.adam_first_moment(opt_state)).items()}
    return {k: np.asarray(v) for k, v in jax.device_get(params).items()}, losses, first_moment


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def keep_stdout_for_python() -> None:
    """Send what C++ libraries write to file descriptor 1 to stderr; Python's ``print`` keeps the real stdout.

    Gloo prints a notice per connection (``[Gloo] Rank 6 is connected to 7
    peer ranks ...``) from C++, straight to descriptor 1, one per device and
    whenever a connection is made; pieces of them were once left among the
    results (``[Gloo] Rank 6`` in the output of a process that prints
    nothing), which no filter of the text can undo reliably. On stderr, with
    the other diagnostics, they never reach the results, and nothing is lost
    (NCCL's warnings also go to descriptor 1).
    """
    sys.stdout.flush()
    python_stdout = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(python_stdout, "w", buffering=1, encoding="utf-8", errors="replace")


def _worker_main(args: argparse.Namespace) -> int:
    """One worker process: join, train, leave; on any error, exit at once.

    A failing process exits with ``os._exit`` instead of a normal exit:
    JAX's exit handler would call ``jax.distributed.shutdown()``, a barrier
    that waits (up to 5 minutes) for processes that may be stuck in a
    collective with this one.
    """
    heartbeat = Heartbeat().start()  # the launcher reads it to name a process that stopped
    service = os.environ.get("JAX_ENABLE_PREEMPTION_SERVICE", "true").strip().lower() not in ("false", "0")
    if service and args.checkpoint_dir is not None:
        hold_early_notice()  # a SIGTERM before JAX listens (start-up, the join) is passed on once it does
    try:
        heartbeat.set("joining the other processes")
        spec = initialize(
            args.coordinator,
            args.num_processes,
            args.process_id,
            init_timeout_s=args.init_timeout_s,
            cpu_devices=args.cpu_devices,
        )
        if service and args.checkpoint_dir is not None:
            import jax

            if not jax.config.jax_enable_preemption_service:
                pass_on_notice(service_on=False)  # SIGTERM ends this process as before; a held one does now
        fails_here = args.fail_process is not None and spec.process_id == args.fail_process
        if fails_here and args.fail_at_step is None:
            print(
                f"[process {spec.process_id}] injected failure (--fail-process {args.fail_process})",
                file=sys.stderr,
                flush=True,
            )
            os._exit(WORKER_FAILURE_EXIT)
        heartbeat.set("joined; loading data")
        from dpcourse.checkpoints.checkpoint import quiet_orbax_log

        with quiet_orbax_log():  # a failed background save raises in the loop, said in one sentence; not logged too
            train_worker(
                args.profile,
                args.steps,
                args.data_source,
                args.global_batch,
                args.out,
                args.checkpoint_dir,
                args.save_every,
                args.fail_at_step if fails_here else None,
                heartbeat,
            )
        heartbeat.set("leaving")
        shutdown()
    except Preempted as stop:  # no shutdown barrier: the other processes are leaving too
        print_main(str(stop), flush=True)
        sys.stderr.flush()
        os._exit(PREEMPTED_EXIT_CODE)
    except BaseException as err:  # noqa: BLE001 - report anything, then leave without the shutdown barrier
        if isinstance(err, (ValueError, DistributedSetupError)) or "dpcourse.checkpoints." in type(err).__module__:
            who = args.process_id if args.process_id is not None else os.environ.get(PROCESS_ID_ENV, "?")
            sys.stderr.write(f"[process {who}] error: {err}\n")  # a sentence says it all, in one write
        else:
            traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        # 78 only where every retry would fail the same way (a GKE Job then fails at once): a checkpoint
        # error whose cause is known, a split that cannot save; not one caused by a partner that died.
        os._exit(UNUSABLE_CHECKPOINT_EXIT if getattr(err, "lasting", False) else 1)
    return 0


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of a training run, shared by the worker and the launcher's command lines."""
    parser.add_argument("--profile", choices=_config.profile_names() + ["auto"], default=None)
    parser.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    parser.add_argument(
        "--data-source",
        choices=["auto", "real", "synthetic"],
        default=None,
        help=f"default: ${_data.DATA_ENV}, else auto",
    )
    parser.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="examples per step over all devices (default: per-device batch x devices)",
    )
    parser.add_argument(
        "--checkpoint-dir", default=None, help="resume from its latest step and save there (a shared folder)"
    )
    parser.add_argument("--save-every", type=int, default=None, help="steps between checkpoints (default: at the end)")


def main(argv: list[str] | None = None) -> int:
    """``python -m dpcourse.multihost.worker [options]``: one process of a multi-host run."""
    parser = argparse.ArgumentParser(
        prog="python -m dpcourse.multihost.worker",
        description=f"{__doc__.splitlines()[0]} Reads {COORDINATOR_ENV}, {NUM_PROCESSES_ENV} and "
        f"{PROCESS_ID_ENV} unless given; on a GKE TPU slice without them, JAX finds its place.",
    )
    add_run_options(parser)
    parser.add_argument("--coordinator", default=None, help="host:port of process 0 ([::1]:port for IPv6)")
    parser.add_argument("--num-processes", type=int, default=None)
    parser.add_argument("--process-id", type=int, default=None)
    parser.add_argument("--init-timeout-s", type=int, default=None)
    parser.add_argument("--cpu-devices", type=int, default=None, help="simulated CPU devices in this process")
    parser.add_argument("--out", default=None, help="folder for process 0's result.json and params.npz")
    parser.add_argument("--fail-process", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fail-at-step", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.profile == "auto":
        args.profile = None
    follow_parent()  # a launcher that names itself (DPCOURSE_PARENT_PID): this process ends with it
    from dpcourse.backend.xlaflags import exit_on_bad_xla_flags

    exit_on_bad_xla_flags()  # a GKE Job starts this command directly, without the launcher's check
    try:
        return _worker_main(args)
    except (DistributedSetupError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    keep_stdout_for_python()  # before JAX starts Gloo, whose notices would land among the results
    sys.exit(main())
