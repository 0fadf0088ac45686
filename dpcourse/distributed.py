"""Multi-controller JAX: one program in many processes, each feeding its own devices.

Taught in notebook 08. In JAX's multi-controller model every process runs the
same program. ``jax.distributed.initialize`` connects the processes through a
coordinator service that process 0 starts; afterwards ``jax.devices()`` lists
the devices of *all* processes (global) and ``jax.local_devices()`` those of
this process. Arrays are global: a process holds only the shards on its own
devices, so each process must supply its own rows of every batch
(``jax.make_array_from_process_local_data``). Collectives between processes
go through gloo on CPU and NCCL on GPU.

What this module holds:

- :func:`initialize`: start the distributed runtime from explicit arguments or
  from the environment variables below.
- :func:`global_mesh`, :func:`process_rows`, :func:`process_local_batches`:
  the global mesh and the slice of the global batch that this process loads.
- :func:`is_main_process`, :func:`print_main`: only process 0 prints results
  and writes files.
- :func:`train_worker`: the data-parallel training program every process
  runs (``python -m dpcourse.distributed worker``).
- :func:`launch_local`: start N worker processes on 127.0.0.1, each with K
  simulated CPU devices, within a time limit, and end every one of them when
  one fails.

Environment variables read by :func:`spec_from_env` (set by
:func:`launch_local` locally and by ``deploy/multihost.yaml`` on GKE):

========================== ===================================================
``DPCOURSE_COORDINATOR``    ``host:port`` of process 0's coordinator service
``DPCOURSE_NUM_PROCESSES``  total number of processes, >= 1
``DPCOURSE_PROCESS_ID``     this process's id, ``0 .. N-1`` (on GKE: the Job's
                            completion index)
``DPCOURSE_INIT_TIMEOUT_S`` optional: seconds to wait for every process to
                            join the coordinator (default 300, as in JAX)
========================== ===================================================
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpcourse import config as _config
from dpcourse import data as _data
from dpcourse import devices as _devices
from dpcourse.train import check_global_batch, max_abs_diff

COORDINATOR_ENV = "DPCOURSE_COORDINATOR"
NUM_PROCESSES_ENV = "DPCOURSE_NUM_PROCESSES"
PROCESS_ID_ENV = "DPCOURSE_PROCESS_ID"
INIT_TIMEOUT_ENV = "DPCOURSE_INIT_TIMEOUT_S"
# JAX's own variable for the address the coordinator listens on (default
# [::]:port, every interface); the local launcher keeps it on loopback.
JAX_BIND_ENV = "JAX_COORDINATOR_BIND_ADDRESS"

DEFAULT_PORT = 8476  # any free port works; deploy/multihost.yaml uses this one
DEFAULT_INIT_TIMEOUT_S = 300  # jax.distributed.initialize's own default
AXIS = "data"
WORKER_FAILURE_EXIT = 3  # exit status of a worker told to fail (tests)

# Lines of an absl "Check failure" stack dump: addresses, not information.
_STACK_LINE = re.compile(r"^\s+@\s+0x[0-9a-f]+")


class DistributedSetupError(RuntimeError):
    """The distributed runtime cannot start as asked; the message says what to change."""


class CoordinatorPortInUse(DistributedSetupError):
    """The coordinator's port is already taken on this machine."""


class LaunchError(RuntimeError):
    """A local multi-process launch failed; every process it started has been ended.

    Attributes:
        exit_codes: exit status of every launched process, by process id
            (negative: ended by that signal).
        pids: operating-system process ids, by process id.
        stderr_tails: the last lines of each process's stderr.
        wall_s: seconds from the first start to the end of the last process.
    """

    def __init__(
        self,
        message: str,
        exit_codes: dict[int, int],
        pids: dict[int, int],
        stderr_tails: dict[int, str],
        wall_s: float,
    ):
        super().__init__(message)
        self.exit_codes = exit_codes
        self.pids = pids
        self.stderr_tails = stderr_tails
        self.wall_s = wall_s


class WorkerFailed(LaunchError):
    """A worker process exited with a non-zero status (``process_id`` names it)."""

    def __init__(self, message: str, process_id: int, **kwargs):
        super().__init__(message, **kwargs)
        self.process_id = process_id


class LaunchTimeout(LaunchError):
    """The workers did not all finish within the launcher's time limit."""


# ---------------------------------------------------------------------------
# Starting the runtime
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DistributedSpec:
    """Who this process is in a multi-process run.

    Attributes:
        coordinator_address: ``host:port`` where process 0 runs the coordinator.
        num_processes: total number of processes (>= 1).
        process_id: this process, ``0 .. num_processes - 1``.
        init_timeout_s: seconds every process waits for all of them to join.
    """

    coordinator_address: str
    num_processes: int
    process_id: int
    init_timeout_s: int = DEFAULT_INIT_TIMEOUT_S

    def __post_init__(self):
        check_coordinator_address(self.coordinator_address)
        if self.num_processes < 1:
            raise DistributedSetupError(f"num_processes must be >= 1, got {self.num_processes}.")
        if not 0 <= self.process_id < self.num_processes:
            raise DistributedSetupError(
                f"process_id {self.process_id} is outside 0..{self.num_processes - 1} "
                f"(num_processes={self.num_processes}). Every process needs a distinct id in that range."
            )
        if self.init_timeout_s < 1:
            raise DistributedSetupError(f"init_timeout_s must be >= 1 second, got {self.init_timeout_s}.")


def check_coordinator_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 as ``[::1]:port``) and check the port.

    Returns:
        ``(host, port)``.

    Raises:
        DistributedSetupError: not of the form ``host:port`` with a port in 1..65535.
    """
    host, sep, port_text = str(address).rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise DistributedSetupError(
            f"Coordinator address {address!r} is not host:port (for example 127.0.0.1:{DEFAULT_PORT}, "
            f"or jax-multihost-0.jax-multihost:{DEFAULT_PORT} on GKE)."
        )
    return host, int(port_text)


def _int_env(name: str, env: dict[str, str]) -> int | None:
    text = env.get(name)
    if text is None or not text.strip():
        return None
    try:
        return int(text.strip())
    except ValueError:
        raise DistributedSetupError(f"{name}={text!r} is not a whole number.") from None


def spec_from_env(env: dict[str, str] | None = None) -> DistributedSpec:
    """Read :class:`DistributedSpec` from the ``DPCOURSE_*`` variables (module docstring).

    Raises:
        DistributedSetupError: a required variable is missing or malformed; the
            message lists every missing one and how to set it.
    """
    env = dict(os.environ if env is None else env)
    coordinator = (env.get(COORDINATOR_ENV) or "").strip()
    num_processes = _int_env(NUM_PROCESSES_ENV, env)
    process_id = _int_env(PROCESS_ID_ENV, env)
    missing = [
        name
        for name, value in (
            (COORDINATOR_ENV, coordinator),
            (NUM_PROCESSES_ENV, num_processes),
            (PROCESS_ID_ENV, process_id),
        )
        if value in (None, "")
    ]
    if missing:
        raise DistributedSetupError(
            f"{', '.join(missing)} not set. Every process needs {COORDINATOR_ENV}=host:port of process 0, "
            f"{NUM_PROCESSES_ENV}=N and {PROCESS_ID_ENV}=0..N-1 (or pass them to initialize()). "
            "Locally, launch_local() sets them; on GKE, deploy/multihost.yaml does."
        )
    timeout = _int_env(INIT_TIMEOUT_ENV, env)
    return DistributedSpec(
        coordinator, num_processes, process_id, DEFAULT_INIT_TIMEOUT_S if timeout is None else timeout
    )


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    init_timeout_s: int | None = None,
    heartbeat_timeout_s: int = 100,
    cpu_collectives: str = "gloo",
    cpu_devices: int | None = None,
) -> DistributedSpec:
    """Join the multi-process run: ``jax.distributed.initialize`` with clear errors.

    Arguments left as None come from the environment (:func:`spec_from_env`).
    Must run before anything starts a JAX backend (``jax.devices()``, an array,
    a computation). Cluster auto-detection is switched off: the three values
    given are the whole truth, on a laptop and on GKE alike.

    Args:
        coordinator_address: ``host:port`` of process 0's coordinator.
        num_processes: total processes; process 0 waits for all of them.
        process_id: this process's id, ``0 .. num_processes - 1``.
        init_timeout_s: seconds to wait for the coordinator and for every
            process to join (``initialization_timeout`` of JAX); past it the
            process ends with ``DEADLINE_EXCEEDED`` instead of hanging.
        heartbeat_timeout_s: seconds without a heartbeat after which the
            coordinator declares a process dead and ends the others.
        cpu_collectives: ``"gloo"`` (cross-process collectives on CPU over
            TCP) or ``"mpi"``; GPUs use NCCL whatever this says.
        cpu_devices: simulated CPU devices for this process (local runs);
            None leaves the device set-up alone.

    Returns:
        The :class:`DistributedSpec` that was used.

    Raises:
        DistributedSetupError: a JAX backend already started in this process,
            or a value is missing or malformed.
        CoordinatorPortInUse: this is process 0 and the coordinator's port is taken.
    """
    import jax

    if _devices.backend_started():
        raise DistributedSetupError(
            "A JAX backend already started in this process, so it can no longer join a multi-process run. "
            "Call dpcourse.distributed.initialize() first, before jax.devices() or any computation "
            "(in a notebook: restart the kernel)."
        )
    if None in (coordinator_address, num_processes, process_id):
        from_env = spec_from_env()  # raises, naming every missing variable
        coordinator_address = coordinator_address if coordinator_address is not None else from_env.coordinator_address
        num_processes = num_processes if num_processes is not None else from_env.num_processes
        process_id = process_id if process_id is not None else from_env.process_id
    if init_timeout_s is None:
        from_env_timeout = _int_env(INIT_TIMEOUT_ENV, dict(os.environ))
        init_timeout_s = DEFAULT_INIT_TIMEOUT_S if from_env_timeout is None else from_env_timeout
    spec = DistributedSpec(coordinator_address, int(num_processes), int(process_id), int(init_timeout_s))
    if cpu_devices is not None:
        _devices.setup_devices(cpu_devices)
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    try:
        jax.distributed.initialize(
            coordinator_address=spec.coordinator_address,
            num_processes=spec.num_processes,
            process_id=spec.process_id,
            initialization_timeout=spec.init_timeout_s,
            heartbeat_timeout_seconds=heartbeat_timeout_s,
            cluster_detection_method="deactivate",
        )
    except Exception as err:  # JaxRuntimeError has no stable public import path
        if "Failed to start RPC server" in str(err):
            raise CoordinatorPortInUse(
                f"Process 0 could not start the coordinator on {spec.coordinator_address}: the port is "
                "already in use (another run, or another program). Pick another port, or end the program "
                "that holds it."
            ) from err
        raise
    return spec


def shutdown() -> None:
    """Leave the run cleanly (a barrier: every process must call it)."""
    import jax

    jax.distributed.shutdown()


def is_main_process() -> bool:
    """True in process 0, the one that prints results and writes files."""
    import jax

    return jax.process_index() == 0


def print_main(*args: Any, **kwargs: Any) -> None:
    """``print`` in process 0 only; the other processes stay quiet."""
    if is_main_process():
        print(*args, **kwargs)


def log(message: str) -> None:
    """A diagnostic line on stderr, tagged with this process (every process logs)."""
    import jax

    print(f"[process {jax.process_index()}/{jax.process_count()}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# The global mesh and who loads which rows
# ---------------------------------------------------------------------------


def global_mesh(axis: str = AXIS):
    """A 1-D mesh over every device of every process, in process order.

    ``jax.devices()`` lists all processes' devices (not only this process's
    ``jax.local_devices()``), sorted so that each process's devices are
    neighbours; along ``axis`` process 0 then owns the first block of every
    batch, process 1 the next, and so on.
    """
    import jax
    from jax.sharding import Mesh

    devs = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devs), (axis,))


def process_rows(sharding, global_shape: Sequence[int], axis: int) -> list[tuple[int, int]]:
    """The ranges ``[start, stop)`` of dimension ``axis`` held by this process's devices.

    Read from the sharding itself (``addressable_devices_indices_map``), so
    it is right for any device order. Overlapping ranges (replicas on
    several local devices) are merged.

    Args:
        sharding: a ``jax.sharding.Sharding`` of an array of ``global_shape``.
        global_shape: the global array's shape.
        axis: the dimension that is split (1 for stacked batches
            ``[n_batches, global_batch, ...]``).

    Returns:
        Sorted, disjoint ranges; their rows, concatenated, are what
        ``jax.make_array_from_process_local_data`` expects from this process.
    """
    spans = set()
    for index in sharding.addressable_devices_indices_map(tuple(global_shape)).values():
        part = index[axis]
        start = 0 if part.start is None else part.start
        stop = global_shape[axis] if part.stop is None else part.stop
        spans.add((int(start), int(stop)))
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(stop, merged[-1][1]))
        else:
            merged.append((start, stop))
    return merged


def process_local_batches(
    dataset: _data.Dataset, n_batches: int, global_batch: int, rows: Sequence[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """This process's rows of the stacked global batches, and nothing else.

    The same values as the columns ``rows`` of both arrays that
    ``data.stacked_batches(dataset, n_batches, global_batch)`` returns (same
    example order, same wrap-around), without building the global batches
    on the host.

    Returns:
        images float32 ``[n_batches, local_rows, 784]`` and labels int32
        ``[n_batches, local_rows]``, ``local_rows`` = the rows in ``rows``.

    Raises:
        ValueError: a range lies outside ``0..global_batch``, or the dataset is empty.
    """
    if dataset.n_examples == 0:
        raise ValueError("The dataset is empty.")
    columns = np.concatenate([np.arange(start, stop) for start, stop in rows]) if rows else np.zeros(0, int)
    if columns.size and (columns.min() < 0 or columns.max() >= global_batch):
        raise ValueError(f"Rows {list(rows)} lie outside a global batch of {global_batch}.")
    # data.stacked_batches takes examples (b * global_batch + r) % n in order.
    index = (np.arange(n_batches)[:, None] * global_batch + columns[None, :]) % dataset.n_examples
    return dataset.images[index], dataset.labels[index]


def relative_diff(reference: dict, other: dict) -> float:
    """``max |reference - other| / max |reference|`` over dicts of arrays (the plain difference when
    ``reference`` is all zeros).

    For gradients: the tolerance then does not depend on their scale.

    Raises:
        ValueError: different keys or leaf shapes.
    """
    scale = max((float(np.max(np.abs(np.asarray(v)))) for v in reference.values() if np.size(v)), default=0.0)
    diff = max_abs_diff(reference, other)
    return diff / scale if scale else diff


def params_digest(params: dict) -> str:
    """sha256 (hex, first 16 digits) of the parameters' float32 bytes, in key order.

    Bitwise identical parameters give the same digest; in a multi-process
    run every process should report the same one.
    """
    digest = hashlib.sha256()
    for name in sorted(params):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(np.asarray(params[name], dtype=np.float32)).tobytes())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------
# The worker: the program every process runs
# ---------------------------------------------------------------------------


def train_worker(
    profile: str | None,
    steps: int,
    data_source: str | None = None,
    global_batch: int | None = None,
    out_dir: str | os.PathLike | None = None,
) -> dict:
    """Data-parallel training for ``steps`` steps over every device of every process.

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

    Returns:
        The summary (same in every process, except ``process_id``).

    Raises:
        ValueError: ``steps`` < 1, or ``global_batch`` does not divide by the
            global device count (the message names the nearest valid sizes).
    """
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpcourse import model, train

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    start = time.perf_counter()
    cfg = _config.get_config(profile, backend=jax.default_backend())
    mesh = global_mesh()
    n_global = jax.device_count()
    global_batch = cfg.global_batch(n_global) if global_batch is None else global_batch
    per_device_batch = check_global_batch(global_batch, n_global)

    # Parameters: the same seed in every process, so every copy starts equal.
    optimizer = train.make_optimizer(cfg)
    params = jax.device_put(model.init_params(cfg), NamedSharding(mesh, P()))
    opt_state = optimizer.init(params)

    # Data: each process loads only its rows of every global batch.
    x_sharding = NamedSharding(mesh, P(None, AXIS, None))
    y_sharding = NamedSharding(mesh, P(None, AXIS))
    x_shape = (cfg.n_batches, global_batch, _data.N_FEATURES)
    rows = process_rows(x_sharding, x_shape, axis=1)
    dataset = _data.load_fashion_mnist(source=data_source, limit=cfg.max_train_examples, seed=cfg.seed)
    x_local, y_local = process_local_batches(dataset, cfg.n_batches, global_batch, rows)
    x = jax.make_array_from_process_local_data(x_sharding, x_local, x_shape)
    y = jax.make_array_from_process_local_data(y_sharding, y_local, x_shape[:2])
    log(
        f"{len(jax.local_devices())} local of {n_global} global devices; loaded rows {rows} "
        f"of each global batch of {global_batch} ({dataset.source} data)"
    )

    # The step of notebook 05: per-shard gradients, pmean over every device.
    step = jax.jit(train.make_shard_map_step(cfg, optimizer, mesh, AXIS))
    compile_start = time.perf_counter()
    compiled = step.lower(params, opt_state, x[0], y[0]).compile()
    compile_s = time.perf_counter() - compile_start
    losses, accuracies, step_s = [], [], []
    for i in range(steps):
        t0 = time.perf_counter()
        params, opt_state, metrics = compiled(params, opt_state, x[i % cfg.n_batches], y[i % cfg.n_batches])
        jax.block_until_ready(params)
        step_s.append(time.perf_counter() - t0)
        if i == 0:  # AdamW's update hides a scaled gradient; its first moment does not
            first_moment = {k: np.asarray(v.addressable_data(0)) for k, v in train.adam_first_moment(opt_state).items()}
        losses.append(float(metrics["loss"]))
        accuracies.append(float(metrics["accuracy"]))

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
        "losses": losses,
        "accuracies": accuracies,
        "compile_s": compile_s,
        "step_s": step_s,
        # Steady state: the first step after compilation is slower, leave it out when we can.
        "ms_per_step": 1000.0 * float(np.median(step_s[1:] if steps > 1 else step_s)),
        "worker_s": time.perf_counter() - start,
        "params_digest": digest,
        "replicas_agree": bool(all(bytes(d).hex()[:16] == digest for d in np.asarray(digests))),
        "layout": [
            {"process": int(r[0]), "rows": [int(r[1]), int(r[2])], "devices": [int(v) for v in r[3:]]}
            for r in np.asarray(layouts)
        ],
    }
    summary["examples_per_s"] = global_batch / (summary["ms_per_step"] / 1000.0)
    if is_main_process() and out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "params.npz", **host_params)
        np.savez(out / "first_moment.npz", **first_moment)
        (out / "result.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_main(
        f"{summary['num_processes']} processes x {summary['local_devices']} {summary['backend']} devices; "
        f"global batch {global_batch}; loss {losses[0]:.4f} -> {losses[-1]:.4f} in {steps} steps; "
        f"{summary['ms_per_step']:.1f} ms/step ({summary['examples_per_s']:,.0f} examples/s); params {digest}; "
        f"replicas agree: {'yes' if summary['replicas_agree'] else 'NO'}",
        flush=True,
    )
    return summary


def single_process_reference(
    profile: str | None, steps: int, devices: Sequence, data_source: str | None = None, global_batch: int | None = None
) -> tuple[dict[str, np.ndarray], list[float], dict[str, np.ndarray]]:
    """The same training in this one process, on ``devices``, for comparison.

    The whole global batch is put on the mesh with ``jax.device_put``; the
    step, the initial parameters and the batches are those of
    :func:`train_worker`. Notebook 08 writes the same lines out in full.

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
    mesh = Mesh(np.array(devices), (AXIS,))
    global_batch = cfg.global_batch(len(devices)) if global_batch is None else global_batch
    check_global_batch(global_batch, len(devices))
    optimizer = train.make_optimizer(cfg)
    params = jax.device_put(model.init_params(cfg), NamedSharding(mesh, P()))
    opt_state = optimizer.init(params)
    dataset = _data.load_fashion_mnist(source=data_source, limit=cfg.max_train_examples, seed=cfg.seed)
    x_host, y_host = _data.stacked_batches(dataset, cfg.n_batches, global_batch)
    x = jax.device_put(x_host, NamedSharding(mesh, P(None, AXIS, None)))
    y = jax.device_put(y_host, NamedSharding(mesh, P(None, AXIS)))
    step = jax.jit(train.make_shard_map_step(cfg, optimizer, mesh, AXIS))
    losses, first_moment = [], None
    for i in range(steps):
        params, opt_state, metrics = step(params, opt_state, x[i % cfg.n_batches], y[i % cfg.n_batches])
        losses.append(float(metrics["loss"]))
        if i == 0:
            first_moment = {k: np.asarray(v) for k, v in jax.device_get(train.adam_first_moment(opt_state)).items()}
    return {k: np.asarray(v) for k, v in jax.device_get(params).items()}, losses, first_moment


# ---------------------------------------------------------------------------
# The local launcher
# ---------------------------------------------------------------------------


@dataclass
class LaunchResult:
    """A finished local multi-process run.

    Attributes:
        wall_s: seconds from starting the first process to the end of the last.
        n_processes: processes launched; devices_per_process: simulated CPU
            devices in each.
        summary: process 0's ``result.json`` (see :func:`train_worker`).
        params: process 0's final parameters, float32 host arrays.
        first_moment: process 0's AdamW first moment after step 1, ``(1 -
            b1) x`` the first gradient (host arrays, shaped like ``params``).
        stdout, stderr: each process's output, by process id.
        env: the ``DPCOURSE_*`` variables each process was given, by process id.
        port: the coordinator's port.
    """

    wall_s: float
    n_processes: int
    devices_per_process: int
    summary: dict
    params: dict[str, np.ndarray]
    first_moment: dict[str, np.ndarray] = field(default_factory=dict)
    stdout: dict[int, str] = field(default_factory=dict)
    stderr: dict[int, str] = field(default_factory=dict)
    env: dict[int, dict[str, str]] = field(default_factory=dict)
    port: int = 0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`CoordinatorPortInUse` when ``host:port`` cannot be bound.

    Binds with ``SO_REUSEADDR``, as the coordinator's gRPC server does, so a
    port left in TIME_WAIT by an earlier run counts as free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            raise CoordinatorPortInUse(
                f"Coordinator port {port} on {host} is already in use ({err.strerror}). Pass another port, "
                "or port=None to let the launcher pick a free one."
            ) from None


def _strip_cpu_count_flag(flags: str) -> str:
    return " ".join(t for t in flags.split() if not t.startswith(_devices.CPU_COUNT_FLAG + "="))


def worker_env(
    process_id: int, num_processes: int, coordinator: str, init_timeout_s: int, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of one local worker process.

    The ``DPCOURSE_*`` variables of the module docstring, the coordinator
    kept on loopback, JAX's SIGTERM handler off, CPU only (local workers share this machine's cores; on
    a GPU workstation they would otherwise all claim the same GPUs), and no
    CPU device count inherited from this process's ``XLA_FLAGS`` (each
    worker sets its own).
    """
    env = dict(os.environ if base is None else base)
    env.update(
        {
            COORDINATOR_ENV: coordinator,
            NUM_PROCESSES_ENV: str(num_processes),
            PROCESS_ID_ENV: str(process_id),
            INIT_TIMEOUT_ENV: str(init_timeout_s),
            JAX_BIND_ENV: coordinator,
            "JAX_PLATFORMS": "cpu",
            # JAX's preemption service catches SIGTERM (so that a preempted job can
            # checkpoint first); local workers have nothing to save, and SIGTERM
            # must end them at once.
            "JAX_ENABLE_PREEMPTION_SERVICE": "false",
            "PYTHONUNBUFFERED": "1",
            "XLA_FLAGS": _strip_cpu_count_flag(env.get("XLA_FLAGS", "")),
        }
    )
    env.pop("JAX_NUM_CPU_DEVICES", None)
    env.pop("DPCOURSE_RESULTS", None)  # workers never record into the notebook's results
    return env


def output_tail(text: str, lines: int = 15) -> str:
    """The last ``lines`` informative lines of a worker's output.

    Drops the addresses of absl's stack dumps and gloo's connection notices
    (``[Gloo] Rank 3 is connected to 7 peer ranks``).
    """
    kept = [
        line
        for line in text.splitlines()
        if line.strip() and not _STACK_LINE.match(line) and not line.startswith("[Gloo]")
    ]
    return "\n".join(kept[-lines:])


def _diagnose(
    stderr: str,
    exit_code: int,
    process_id: int,
    launched: Sequence[int],
    num_processes: int,
    coordinator: str,
    init_timeout_s: int,
) -> str:
    """A sentence on the likely cause of a worker's failure."""
    n_launched = len(launched)
    # When the port is taken, JAX 0.10.2 usually raises "Failed to start RPC
    # server", but now and then crashes (SIGSEGV) right after logging "Failed
    # to add port to server": look for both.
    if any(s in stderr for s in ("Failed to start RPC server", "Failed to add port", "CoordinatorPortInUse")):
        return (
            f"The coordinator could not listen on {coordinator}: the port is already in use. "
            "Pass another port, or port=None to pick a free one."
        )
    if "DEADLINE_EXCEEDED" in stderr and ("RegisterTask" in stderr or "Barrier" in stderr):
        if 0 not in launched:
            return (
                f"The coordinator at {coordinator} could not be reached within {init_timeout_s} s: process 0, "
                "which runs it, was not launched, so nothing listens there. On real hosts: check the "
                "address, that process 0 started, and that the port is open between the hosts."
            )
        if n_launched < num_processes:
            return (
                f"num_processes={num_processes}, but only {n_launched} process(es) were launched: the "
                f"coordinator waits for all {num_processes} to join and gave up after "
                f"{init_timeout_s} s. Launch as many processes as num_processes says."
            )
        return (
            f"Process {process_id} could not reach the coordinator at {coordinator}, or not every one of "
            f"the {num_processes} processes joined, within {init_timeout_s} s. Check that process 0 "
            "started, that the address is right and reachable, and that every process was launched."
        )
    if "stopped sending heartbeats" in stderr:
        return (
            f"Process {process_id} was stopped by JAX because another process stopped sending heartbeats "
            "(it died); look for the first process that failed."
        )
    if "injected failure" in stderr:
        return f"Process {process_id} was told to fail (fail_process={process_id})."
    if "does not divide evenly" in stderr:
        return "The global batch does not divide by the global device count (see the error above)."
    if exit_code < 0:
        name = signal.Signals(-exit_code).name if -exit_code in signal.Signals._value2member_map_ else str(-exit_code)
        return f"Process {process_id} was ended by signal {name} (a crash, or the machine ran out of memory)."
    return f"Process {process_id} raised an error (its stderr is below)."


def _end_all(procs: dict[int, subprocess.Popen], grace_s: float = 3.0) -> None:
    """End every process still running: SIGTERM to its process group, then SIGKILL."""
    running = [p for p in procs.values() if p.poll() is None]
    for proc in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # each worker leads its own group
    deadline = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def launch_local(
    n_processes: int = 2,
    devices_per_process: int = 4,
    *,
    profile: str | None = None,
    steps: int = 3,
    data_source: str | None = None,
    global_batch: int | None = None,
    num_processes: int | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    timeout_s: float = 120.0,
    init_timeout_s: int = 20,
    fail_process: int | None = None,
    process_ids: Sequence[int] | None = None,
    check_port: bool = True,
) -> LaunchResult:
    """Run :func:`train_worker` as ``n_processes`` local processes x ``devices_per_process`` CPU devices.

    Each process is ``python -m dpcourse.distributed worker`` with its own
    ``DPCOURSE_*`` environment (:func:`worker_env`); process 0 runs the
    coordinator on ``host:port``; collectives between processes use gloo.
    Whatever happens (a worker fails, the time limit passes, an interrupt),
    every process started here is ended before this function returns or
    raises: SIGTERM to its process group, SIGKILL 3 s later.

    Args:
        n_processes: processes to start (>= 1).
        devices_per_process: simulated CPU devices in each (>= 1).
        profile: config profile of the workers (None: ``$DPCOURSE_PROFILE``/automatic).
        steps: training steps.
        data_source: ``"real"``, ``"synthetic"`` or ``"auto"``; pass the source
            of the run you will compare with, so both use the same data.
        global_batch: examples per step over all devices (default:
            ``per_device_batch x n_processes x devices_per_process``).
        num_processes: the process count the workers are told (default
            ``n_processes``; another value shows what a mismatch does).
        port: coordinator port (None: a free one).
        host: address of the coordinator (loopback for local runs).
        timeout_s: limit for the whole run, in seconds.
        init_timeout_s: how long each worker waits for the coordinator and the
            others to join (``initialization_timeout``); below ``timeout_s``.
        fail_process: make this process exit with an error right after it
            joined (to see how failures are handled).
        process_ids: ids of the processes to start (default ``0 ..
            n_processes - 1``); leaving out 0 shows an unreachable coordinator.
        check_port: check that the port is free before launching.

    Returns:
        A :class:`LaunchResult`.

    Raises:
        ValueError: counts < 1, ``init_timeout_s`` >= ``timeout_s``, process ids
            outside ``0 .. num_processes - 1`` or repeated, or a global
            batch that does not divide by ``n_processes x devices_per_process``
            (checked before anything starts).
        CoordinatorPortInUse: ``port`` is taken (checked before anything starts).
        WorkerFailed: a worker exited with an error; the message names it,
            gives the likely cause and the tail of its stderr.
        LaunchTimeout: the run did not finish within ``timeout_s``.
    """
    if n_processes < 1 or devices_per_process < 1:
        raise ValueError(
            f"Need n_processes >= 1 and devices_per_process >= 1, got {n_processes} and {devices_per_process}."
        )
    num_processes = n_processes if num_processes is None else num_processes
    launched = list(range(n_processes)) if process_ids is None else [int(i) for i in process_ids]
    if len(set(launched)) != len(launched) or not launched or not all(0 <= i < num_processes for i in launched):
        raise ValueError(
            f"process_ids {launched} must be distinct ids in 0..{num_processes - 1} (num_processes={num_processes})."
        )
    if init_timeout_s >= timeout_s:
        raise ValueError(
            f"init_timeout_s ({init_timeout_s}) must be below timeout_s ({timeout_s}) so that a "
            "worker waiting for the others gives up before the launcher does."
        )
    if global_batch is not None:
        check_global_batch(global_batch, n_processes * devices_per_process)
    if port is None:
        port = free_port(host)
    elif check_port:
        check_port_free(host, port)
    coordinator = f"{host}:{port}"
    command = [
        sys.executable,
        "-m",
        "dpcourse.distributed",
        "worker",
        "--steps",
        str(steps),
        "--cpu-devices",
        str(devices_per_process),
    ]
    for flag, value in (
        ("--profile", profile),
        ("--data-source", data_source),
        ("--global-batch", global_batch),
        ("--fail-process", fail_process),
    ):
        if value is not None:
            command += [flag, str(value)]

    procs: dict[int, subprocess.Popen] = {}
    envs: dict[int, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="dpcourse-multihost-") as tmp:
        folder = Path(tmp)
        # Closed in the `finally` below, after the workers are gone.
        logs = {i: (open(folder / f"stdout.{i}", "w+"), open(folder / f"stderr.{i}", "w+")) for i in launched}  # noqa: SIM115
        start = time.monotonic()
        failed: tuple[int, int] | None = None
        timed_out = False
        try:
            for i in launched:
                env = worker_env(i, num_processes, coordinator, init_timeout_s)
                envs[i] = {k: env[k] for k in (COORDINATOR_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV, INIT_TIMEOUT_ENV)}
                out, err = logs[i]
                procs[i] = subprocess.Popen(
                    command + ["--out", str(folder / "out")],
                    env=env,
                    stdout=out,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            while True:
                codes = {i: p.poll() for i, p in procs.items()}
                bad = [(i, c) for i, c in codes.items() if c not in (None, 0)]
                if bad:
                    failed = bad[0]
                    break
                if all(c == 0 for c in codes.values()):
                    break
                if time.monotonic() - start > timeout_s:
                    timed_out = True
                    break
                time.sleep(0.05)
        finally:
            _end_all(procs)
            wall_s = time.monotonic() - start
            texts = {}
            for i, (out, err) in logs.items():
                out.seek(0)
                err.seek(0)
                texts[i] = (out.read(), err.read())
                out.close()
                err.close()
        exit_codes = {i: p.returncode for i, p in procs.items()}
        pids = {i: p.pid for i, p in procs.items()}
        tails = {i: output_tail(texts[i][1]) for i in texts}
        details = dict(exit_codes=exit_codes, pids=pids, stderr_tails=tails, wall_s=wall_s)
        if failed is not None:
            i, code = failed
            cause = _diagnose(texts[i][1], code, i, launched, num_processes, coordinator, init_timeout_s)
            raise WorkerFailed(
                f"Worker process {i} of {num_processes} failed (exit status {code}) after {wall_s:.1f} s. {cause} "
                f"Every process was ended (exit statuses {exit_codes}).\n--- stderr of process {i} (last lines) ---\n"
                f"{tails[i] or '(empty)'}",
                process_id=i,
                **details,
            )
        if timed_out:
            raise LaunchTimeout(
                f"The {len(launched)} worker processes did not finish within {timeout_s:.0f} s; every process was "
                f"ended (exit statuses {exit_codes}). Raise timeout_s for a larger profile, or read the stderr "
                f"below.\n" + "\n".join(f"--- process {i} ---\n{tails[i] or '(empty)'}" for i in tails),
                **details,
            )
        result_file = folder / "out" / "result.json"
        if not result_file.exists():
            raise WorkerFailed(
                f"Process 0 exited cleanly but wrote no result.json.\n{tails.get(0, '')}", process_id=0, **details
            )
        summary = json.loads(result_file.read_text())
        with np.load(folder / "out" / "params.npz") as npz:
            params = {k: np.array(npz[k]) for k in npz.files}
        with np.load(folder / "out" / "first_moment.npz") as npz:
            first_moment = {k: np.array(npz[k]) for k in npz.files}
    return LaunchResult(
        wall_s=wall_s,
        n_processes=len(launched),
        devices_per_process=devices_per_process,
        summary=summary,
        params=params,
        first_moment=first_moment,
        stdout={i: t[0] for i, t in texts.items()},
        stderr={i: t[1] for i, t in texts.items()},
        env=envs,
        port=port,
    )


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _worker_main(args: argparse.Namespace) -> int:
    """One worker process: join, train, leave; on any error, exit at once.

    A failing process exits with ``os._exit`` instead of a normal exit:
    JAX's exit handler would call ``jax.distributed.shutdown()``, a barrier
    that waits (up to 5 minutes) for processes that may be stuck in a
    collective with this one.
    """
    try:
        spec = initialize(
            args.coordinator,
            args.num_processes,
            args.process_id,
            init_timeout_s=args.init_timeout_s,
            cpu_devices=args.cpu_devices,
        )
        if args.fail_process is not None and spec.process_id == args.fail_process:
            print(
                f"[process {spec.process_id}] injected failure (--fail-process {args.fail_process})",
                file=sys.stderr,
                flush=True,
            )
            os._exit(WORKER_FAILURE_EXIT)
        train_worker(args.profile, args.steps, args.data_source, args.global_batch, args.out)
        shutdown()
    except BaseException:  # noqa: BLE001 - report anything, then leave without the shutdown barrier
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    return 0


def _launch_main(args: argparse.Namespace) -> int:
    n_devices = args.processes * args.devices_per_process
    result = launch_local(
        args.processes,
        args.devices_per_process,
        profile=args.profile,
        steps=args.steps,
        data_source=args.data_source,
        global_batch=args.global_batch,
        port=args.port,
        timeout_s=args.timeout_s,
        init_timeout_s=args.init_timeout_s,
    )
    print(output_tail(result.stdout[0]))
    print(f"wall time of the {args.processes}-process run: {result.wall_s:.1f} s")
    if args.compare:
        _devices.setup_devices(n_devices)
        import jax

        have = len(jax.devices("cpu"))
        if have < n_devices:
            print(
                f"error: --compare needs {n_devices} CPU devices in this process for the single-process "
                f"reference, but JAX has {have} (XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} wins). "
                "Unset the device count in XLA_FLAGS or raise it.",
                file=sys.stderr,
            )
            return 2
        reference, _, first_moment = single_process_reference(
            args.profile, args.steps, jax.devices("cpu")[:n_devices], result.summary["data_source"], args.global_batch
        )
        print(
            f"max |param diff| vs one process with {n_devices} devices: "
            f"{max_abs_diff(reference, result.params):.3g}; first-step gradients, relative: "
            f"{relative_diff(first_moment, result.first_moment):.3g}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m dpcourse.distributed {worker,launch} ...``."""
    parser = argparse.ArgumentParser(prog="python -m dpcourse.distributed", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--profile", choices=_config.profile_names() + ["auto"], default=None)
    common.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    common.add_argument(
        "--data-source",
        choices=["auto", "real", "synthetic"],
        default=None,
        help=f"default: ${_data.DATA_ENV}, else auto",
    )
    common.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="examples per step over all devices (default: per-device batch x devices)",
    )
    worker = sub.add_parser(
        "worker",
        parents=[common],
        help=f"one process of a run; reads {COORDINATOR_ENV}, {NUM_PROCESSES_ENV}, {PROCESS_ID_ENV} unless given",
    )
    worker.add_argument("--coordinator", default=None, help="host:port of process 0")
    worker.add_argument("--num-processes", type=int, default=None)
    worker.add_argument("--process-id", type=int, default=None)
    worker.add_argument("--init-timeout-s", type=int, default=None)
    worker.add_argument("--cpu-devices", type=int, default=None, help="simulated CPU devices in this process")
    worker.add_argument("--out", default=None, help="folder for process 0's result.json and params.npz")
    worker.add_argument("--fail-process", type=int, default=None, help=argparse.SUPPRESS)
    worker.set_defaults(func=_worker_main)
    launch = sub.add_parser("launch", parents=[common], help="run N local worker processes on 127.0.0.1")
    launch.add_argument("--processes", type=int, default=2)
    launch.add_argument("--devices-per-process", type=int, default=4)
    launch.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    launch.add_argument("--timeout-s", type=float, default=120.0)
    launch.add_argument("--init-timeout-s", type=int, default=20)
    launch.add_argument(
        "--compare",
        action="store_true",
        help="also train in this process on the same number of devices and print the difference",
    )
    launch.set_defaults(func=_launch_main)
    args = parser.parse_args(argv)
    if args.profile == "auto":
        args.profile = None
    try:
        return args.func(args)
    except (LaunchError, DistributedSetupError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
