"""The training program of notebook 13: data parallel over the live devices, saving at the agreed preemption step.

Each process runs ``python -m dpcourse.multihost.elastic`` (started by
:mod:`dpcourse.multihost.elastic_run`). It trains the course's model on the
replicated form with notebook 05's ``shard_map`` step and, at every step:

1. asks JAX's preemption service whether this is the step every process
   agreed on after one of them got SIGTERM
   (``multihost_utils.reached_preemption_sync_point``); if so it saves that
   step with notebook 11's checkpoint and leaves with
   :data:`dpcourse.multihost.preemption.PREEMPTED_EXIT_CODE`;
2. with ``--recoverable``, passes a liveness barrier (``multihost_utils.
   live_devices`` with an empty body) before the step's all-reduce: when a
   process is gone, the survivors rebuild the mesh on the live devices,
   split the same global batch over them, and go on.

Each process appends its events (one JSON object a line, with the wall
clock) to ``OUT/events.<process>.jsonl``; process 0 writes the final
parameters to ``OUT/params.npz``. :func:`reference_params` is the same
training in one process, with the same change of mesh at the same step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpcourse.multihost import parent as _parent
from dpcourse.multihost import preemption as _preemption
from dpcourse.multihost.preemption import PREEMPTED_EXIT_CODE

# Imported lazily (JAX takes seconds to import): the process reports "started" and holds a preemption notice first.
AXIS = "data"  # dpcourse.multihost.distributed.AXIS, the mesh's one axis
PROCESS_ID_ENV = "DPCOURSE_PROCESS_ID"  # dpcourse.multihost.distributed.PROCESS_ID_ENV

LOSS_KINDS = ("between", "collective")  # where a process is lost: between two steps, or inside the all-reduce
COORDINATOR_LINGER_S = 0.5  # process 0 leaves this long after the others (it serves them until they are gone)
MAX_HEARTBEAT_TIMEOUT_S = 600  # a loss seen later than this is no lesson; JAX keeps the timeout in milliseconds
IN_COLLECTIVE_DELAY_S = 0.5  # how long the lost process waits after the barrier, so the others are in the all-reduce


class Events:
    """Append this process's events to ``OUT/events.<process>.jsonl``, each with the wall clock (no-op without OUT)."""

    def __init__(self, out: str | None, process_id: int) -> None:
        self.path = Path(out) / f"events.{process_id}.jsonl" if out else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, event: str, **fields) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")


def read_events(out: str | os.PathLike, process_id: int) -> list[dict]:
    """The events process ``process_id`` wrote so far (a line cut short by a kill is left out)."""
    path = Path(out) / f"events.{process_id}.jsonl"
    events = []
    for line in path.read_text().splitlines() if path.exists() else ():
        with contextlib.suppress(json.JSONDecodeError):
            events.append(json.loads(line))
    return events


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file a process wrote (its final parameters), as host arrays, the file closed."""
    with np.load(path) as npz:
        return {k: np.array(npz[k]) for k in npz.files}


def mesh_devices(devices: Sequence) -> list:
    """``devices`` in mesh order: by process, then id (each process's rows of a batch stay together)."""
    return sorted(devices, key=lambda d: (d.process_index, d.id))


def place_batch(mesh, x_host: np.ndarray, y_host: np.ndarray):
    """One global batch (host arrays, every process holds all of it) as global arrays split over the mesh."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpcourse.multihost.distributed import process_rows

    x_sharding = NamedSharding(mesh, P(AXIS, None))
    rows = process_rows(x_sharding, x_host.shape, axis=0)
    mine = np.concatenate([np.arange(a, b) for a, b in rows])
    x = jax.make_array_from_process_local_data(x_sharding, x_host[mine], x_host.shape)
    y = jax.make_array_from_process_local_data(NamedSharding(mesh, P(AXIS)), y_host[mine], y_host.shape)
    return x, y


def place_replicated(mesh, tree):
    """A tree of host arrays (the same in every process) as arrays replicated over ``mesh``."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rep = NamedSharding(mesh, P())
    return jax.tree.map(lambda a: jax.make_array_from_process_local_data(rep, np.asarray(a), np.shape(a)), tree)


def to_host(tree):
    """This process's full copy of replicated arrays, as host arrays."""
    import jax

    return jax.tree.map(lambda a: np.asarray(a.addressable_data(0)) if hasattr(a, "addressable_data") else a, tree)


def _live(all_devices: list):
    """The liveness barrier: the devices whose processes are alive, the same list in every live process."""
    from jax.experimental import multihost_utils

    try:
        with multihost_utils.live_devices(all_devices) as live:
            pass
    except multihost_utils.ProcessFailureError:
        with multihost_utils.live_devices(all_devices) as live:  # the set after the failure, agreed again
            pass
    return mesh_devices(live)


def train(args: argparse.Namespace, events: Events) -> int:
    """Train ``args.steps`` steps; returns the exit status (0, or :data:`PREEMPTED_EXIT_CODE` after a save)."""
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh

    from dpcourse import config as _config
    from dpcourse import data as _data
    from dpcourse import model
    from dpcourse import train as _train
    from dpcourse.checkpoints import checkpoint

    cfg = _config.get_config(args.profile, backend="cpu")
    pid = jax.process_index()
    all_devices = mesh_devices(jax.devices())
    dataset = _data.load_fashion_mnist(source=args.data_source, limit=cfg.max_train_examples, seed=cfg.seed)
    xs, ys = _data.stacked_batches(dataset, cfg.n_batches, args.global_batch)
    optimizer = _train.make_optimizer(cfg)
    params = model.init_params(cfg)
    opt_state = optimizer.init(params)
    run = checkpoint.run_description(cfg, args.global_batch)
    key = np.asarray(jax.random.key_data(jax.random.PRNGKey(cfg.seed)))
    start = 0
    manager = checkpoint.open_manager(args.checkpoint_dir) if args.checkpoint_dir else None
    mesh = Mesh(np.array(all_devices), (AXIS,))
    events("loaded")  # the data, the model and Orbax imported and made: each stage reports, for the silence bound
    if manager is not None and checkpoint.steps(manager):  # a misnamed step folder (04) is told there
        events("restoring", step=manager.latest_step())
        state = checkpoint.make_state(params, opt_state, 0, key, 0)
        target = checkpoint.abstract_target(state, checkpoint.state_shardings(state, mesh, "replicated"))
        start, state = checkpoint.restore(manager, target, run)
        params, opt_state = to_host(state["params"]), to_host(state["opt_state"])
        events("resumed", step=start)
    devices = all_devices
    step_fn = None
    lost = False
    began = time.time()
    for i in range(start, args.steps):
        if multihost_utils.reached_preemption_sync_point(i):  # a notice agreed on: save this step, leave
            events("sync point", step=i)
            _save(manager, i, params, opt_state, key, run, devices, len(all_devices))
            events("saved", step=i)
            return PREEMPTED_EXIT_CODE
        if args.lose_process == pid and args.lose_at == i and args.lose_where == "between":
            events("killed", step=i, where="between")
            os.kill(os.getpid(), signal.SIGKILL)
        if args.recoverable:
            live = _live(all_devices)
            if [d.id for d in live] != [d.id for d in devices]:
                lost = True
                events("live", step=i, processes=sorted({d.process_index for d in live}))
                devices, step_fn = live, None
            else:
                events("alive", step=i)  # past the barrier: next, the step's all-reduce
            if lost and args.leave_at == i:
                _save(manager, i, params, opt_state, key, run, devices, len(all_devices))
                events("saved", step=i)
                return PREEMPTED_EXIT_CODE
        if step_fn is None:  # the mesh over the devices alive now, its step compiled
            events("compiling", step=i, devices=len(devices))
            mesh = Mesh(np.array(devices), (AXIS,))
            params, opt_state = place_replicated(mesh, to_host(params)), place_replicated(mesh, to_host(opt_state))
            step_fn = jax.jit(_train.make_shard_map_step(cfg, optimizer, mesh, AXIS))
        x, y = place_batch(mesh, xs[i % cfg.n_batches], ys[i % cfg.n_batches])
        if args.lose_process == pid and args.lose_at == i and args.lose_where == "collective":
            time.sleep(IN_COLLECTIVE_DELAY_S)  # the others are inside the step's all-reduce by now
            events("killed", step=i, where="collective")
            os.kill(os.getpid(), signal.SIGKILL)
        params, opt_state, metrics = step_fn(params, opt_state, x, y)
        loss = float(metrics["loss"])
        time.sleep(max(0.0, args.step_s - (time.time() - began)))  # a step of a larger model lasts this long
        began = time.time()
        events("step", step=i + 1, loss=loss, devices=len(devices))
        if args.save_every and (i + 1) % args.save_every == 0 and i + 1 < args.steps:
            _save(manager, i + 1, params, opt_state, key, run, devices, len(all_devices))
    if manager is not None:
        _save(manager, args.steps, params, opt_state, key, run, devices, len(all_devices))
    if args.out and pid == min(d.process_index for d in devices):
        np.savez(Path(args.out) / "params.npz", **to_host(params))
    events("done", step=args.steps)
    return 0


def _save(manager, step: int, params, opt_state, key, run, devices: list, n_all: int) -> None:
    """Save ``step`` with notebook 11's checkpoint: every live process takes part, and only they."""
    from jax.sharding import Mesh

    from dpcourse.checkpoints import checkpoint

    if manager is None or (Path(manager.directory) / str(step)).exists():
        return  # no folder, or the step is saved already (by --save-every, or the run this one resumed)
    if len(devices) < n_all:  # Orbax's barriers would wait for the lost processes: only the live ones save
        manager = survivors_manager(manager.directory, sorted({d.process_index for d in devices}))
    mesh = Mesh(np.array(devices), (AXIS,))
    params, opt_state = to_host(params), to_host(opt_state)
    if len({d.process_index for d in devices}) > 1:
        params, opt_state = place_replicated(mesh, params), place_replicated(mesh, opt_state)
    # else: a lone survivor's arrays are all its own, which Orbax refuses in a run of several processes
    # ("Cannot serialize host local jax.Array"); it saves them as the host arrays they are.
    state = checkpoint.make_state(params, opt_state, step, key, step)
    checkpoint.save(manager, step, state, run)
    checkpoint.finish(manager)


def survivors_manager(directory: str | os.PathLike, processes: Sequence[int]):
    """A checkpoint manager for the live ``processes`` alone: Orbax's barriers wait for them only.

    Orbax's own barriers span every process of the run by default, and its
    first one after a process was lost fails (a gloo all-gather with the lost
    peer); named as its ``active_processes``, the survivors save alone.
    """
    import orbax.checkpoint as ocp

    from dpcourse.checkpoints import checkpoint

    options = ocp.CheckpointManagerOptions(
        max_to_keep=3,
        async_options=ocp.AsyncOptions(timeout_secs=checkpoint.SAVE_BARRIER_S),
        multiprocessing_options=ocp.options.MultiprocessingOptions(
            primary_host=min(processes), active_processes=set(processes), barrier_sync_key_prefix="live"
        ),
        create=False,  # Orbax leaves making the folder to a subset of processes: it exists by now
    )
    return ocp.CheckpointManager(Path(directory), options=options)


def reference_params(
    profile: str | None,
    steps: int,
    global_batch: int,
    devices: Sequence,
    change_at: int | None = None,
    devices_after: Sequence | None = None,
    data_source: str | None = None,
) -> dict[str, np.ndarray]:
    """The same training in this one process: on ``devices``, then from step ``change_at`` on ``devices_after``,
    the global batch split over however many devices there are (notebook 08's reference, with the change)."""
    from dpcourse.multihost.worker import single_process_reference

    return single_process_reference(profile, steps, devices, data_source, global_batch, change_at, devices_after)[0]


def check_args(args: argparse.Namespace, n_processes: int | None = None) -> str | None:
    """One sentence on what is wrong with the options (None: nothing), before anything starts: the checks of
    :func:`dpcourse.multihost.elastic_run.check_plan`, for ``n_processes`` processes (1 where unknown)."""
    from dpcourse.multihost import elastic_run  # it imports this module: here, not at the top

    n = n_processes or 1
    if args.cpu_devices < 1 or args.global_batch % (n * args.cpu_devices):
        return f"--global-batch must split over {n} processes x --cpu-devices {args.cpu_devices} (1 or more)."
    unbounded = float(MAX_HEARTBEAT_TIMEOUT_S) ** 3  # no launcher here to bound the run or its silences
    plan = {**vars(args), "n_processes": n, "timeout_s": unbounded, "stall_s": unbounded}
    try:
        elastic_run.check_plan({**plan, "preempt_process": None, "preempt_on": "step", "preempt_after_step": None})
    except elastic_run.RunRefused as err:
        return str(err)
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m dpcourse.multihost.elastic [options]``: one process of notebook 13's runs."""
    from dpcourse import config as _config

    parser = argparse.ArgumentParser(prog="python -m dpcourse.multihost.elastic", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=_config.profile_names(), default=None)
    parser.add_argument("--data-source", choices=["auto", "real", "synthetic"], default=None)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--cpu-devices", type=int, default=1)
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--save-every", type=int, default=None, help="steps between checkpoints")
    parser.add_argument("--out", default=None)
    parser.add_argument("--recoverable", action="store_true", help="go on without a lost process")
    parser.add_argument("--heartbeat-timeout-s", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.0, help="the least time a step takes (paced)")
    parser.add_argument("--lose-process", type=int, default=None, help="the process that is lost (SIGKILL)")
    parser.add_argument("--lose-at", type=int, default=None, help="the step at which it is lost")
    parser.add_argument("--lose-where", choices=LOSS_KINDS, default="between")
    parser.add_argument("--leave-at", type=int, default=None, help="after a loss: save at this step and leave")
    args = parser.parse_args(argv)
    n_text = os.environ.get("DPCOURSE_NUM_PROCESSES", "")
    refused = check_args(args, int(n_text) if n_text.strip().isdigit() else None)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    _parent.follow_parent()  # the launcher killed (a notebook's kernel): this process ends too
    _preemption.hold_early_notice()  # a SIGTERM before JAX listens is passed on once it does
    pid_text = os.environ.get(PROCESS_ID_ENV, "")
    events = Events(args.out, int(pid_text) if pid_text.strip().isdigit() else 0)
    events("started")  # the first moment this process can report: the launcher's silence bound starts here
    import jax

    from dpcourse.multihost.distributed import DistributedSetupError, initialize

    jax.config.update("jax_enable_recoverability", bool(args.recoverable))
    try:
        spec = initialize(heartbeat_timeout_s=args.heartbeat_timeout_s, cpu_devices=args.cpu_devices)
    except DistributedSetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    events = Events(args.out, spec.process_id)
    if jax.config.jax_enable_preemption_service:
        # The step this run starts from, told to the preemption service before the restore: a notice from here
        # on is agreed at a later step (an earlier one is held until now, then passed on).
        first = _preemption.latest_saved_step(args.checkpoint_dir)
        if _preemption.ask_from(first):
            events("sync point", step=first)
            events("saved", step=first)  # already in the folder: nothing was trained since
            os._exit(PREEMPTED_EXIT_CODE)
    _preemption.pass_on_notice(bool(jax.config.jax_enable_preemption_service))
    events("joined")
    from dpcourse.checkpoints.checkpoint import quiet_orbax_log

    with quiet_orbax_log():
        try:
            code = train(args, events)
        except Exception as err:  # a checkpoint or a run description it cannot use: its sentence, no traceback
            if not (type(err).__module__.startswith("dpcourse.checkpoints.") or isinstance(err, ValueError)):
                raise
            print(f"error: {err}", file=sys.stderr, flush=True)
            code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0 and not args.recoverable:
        from dpcourse.multihost.distributed import shutdown

        shutdown()
    # A preempted process, or one whose partner is gone, leaves without the shutdown barrier (which would wait
    # for every process, lost ones included). Process 0 runs the coordination service: it leaves a moment after
    # the others, whose last calls to the service would otherwise fail and end them with SIGABRT.
    if spec.process_id == 0 and (code != 0 or args.recoverable):
        time.sleep(COORDINATOR_LINGER_S)
    os._exit(code)


if __name__ == "__main__":
    from dpcourse.multihost.worker import keep_stdout_for_python

    keep_stdout_for_python()
    sys.exit(main())
