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
  runs (``python -m dpcourse.distributed worker``, as ``deploy/multihost.yaml``
  starts it on GKE).

Starting N local processes, watching them and explaining their failures is
:mod:`dpcourse.launcher`'s job (``python -m dpcourse.launcher``); it imports
this module, never the reverse.

Environment variables read by :func:`spec_from_env` (set by
``dpcourse.launcher.launch_local`` locally and by ``deploy/multihost.yaml`` on GKE):

========================== ===================================================
``DPCOURSE_COORDINATOR``    ``host:port`` of process 0's coordinator service
                            (an IPv6 address in brackets: ``[::1]:8476``)
``DPCOURSE_NUM_PROCESSES``  total number of processes, >= 1
``DPCOURSE_PROCESS_ID``     this process's id, ``0 .. N-1`` (on GKE: the Job's
                            completion index)
``DPCOURSE_INIT_TIMEOUT_S`` optional: seconds to wait for every process to
                            join the coordinator (default 300, as in JAX)
========================== ===================================================
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
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


class DistributedSetupError(RuntimeError):
    """The distributed runtime cannot start as asked; the message says what to change."""


class CoordinatorPortInUse(DistributedSetupError):
    """The coordinator's port is already taken on this machine."""


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
    """Split ``host:port`` and check it; an IPv6 address must be in brackets, ``[::1]:8476``.

    ``host`` is a name (``jax-multihost-0.jax-multihost``), an IPv4 address or
    a bracketed IPv6 address, the form gRPC, and so JAX's coordinator, reads.
    Unbracketed, ``::1:8476`` is ambiguous (is ``8476`` the port or the last
    group of the address?), so it is refused rather than guessed.

    Returns:
        ``(host, port)``, the host without brackets (``("::1", 8476)``), as
        ``socket`` takes it.

    Raises:
        DistributedSetupError: not ``host:port`` with a port in 1..65535, an
            unbracketed IPv6 address, or brackets around something that is not one.
    """
    text = str(address).strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise DistributedSetupError(
            f"Coordinator address {address!r} is not host:port (for example 127.0.0.1:{DEFAULT_PORT}, "
            f"[::1]:{DEFAULT_PORT} for IPv6, or jax-multihost-0.jax-multihost:{DEFAULT_PORT} on GKE)."
        )
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise DistributedSetupError(
                f"Coordinator address {address!r}: brackets are for IPv6 addresses, and {inner!r} is not one. "
                f"Write an IPv4 address or a name without brackets ({inner}:{port_text})."
            ) from None
        return inner, int(port_text)
    if ":" in host or "[" in host or "]" in host:
        bare = host.strip("[]")
        raise DistributedSetupError(
            f"Coordinator address {address!r}: an IPv6 address must be written in brackets, "
            f"[{bare}]:{port_text}, so that the port cannot be mistaken for part of the address."
        )
    return host, int(port_text)


def format_coordinator_address(host: str, port: int) -> str:
    """``host:port`` for a coordinator, with an IPv6 address in brackets (``[::1]:8476``).

    ``host`` may come with or without brackets.

    Raises:
        DistributedSetupError: the result is not a valid coordinator address
            (:func:`check_coordinator_address`).
    """
    bare = str(host).strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        is_v6 = isinstance(ipaddress.ip_address(bare), ipaddress.IPv6Address)
    except ValueError:
        is_v6 = False
    address = f"[{bare}]:{port}" if is_v6 else f"{bare}:{port}"
    check_coordinator_address(address)
    return address


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
            "Locally, dpcourse.launcher.launch_local() sets them; on GKE, deploy/multihost.yaml does."
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


def global_mesh(axis: str = AXIS, backend: str | None = None):
    """A 1-D mesh over every device of every process, in process order.

    ``jax.devices(backend)`` lists all processes' devices (not only this
    process's ``jax.local_devices()``), sorted so that each process's devices
    are neighbours; along ``axis`` process 0 then owns the first block of
    every batch, process 1 the next, and so on.

    Args:
        axis: the mesh's one axis name.
        backend: ``"cpu"``, ``"gpu"``, ... (None: JAX's default backend, the
            GPU where there is one).
    """
    import jax
    from jax.sharding import Mesh

    devs = sorted(jax.devices(backend), key=lambda d: (d.process_index, d.id))
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


def main(argv: list[str] | None = None) -> int:
    """``python -m dpcourse.distributed worker ...``; ``launch ...`` hands over to ``python -m dpcourse.launcher``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:
        # The launcher has its own module (it imports this one, never the
        # reverse); the old command keeps working by handing over to it.
        os.execv(sys.executable, [sys.executable, "-m", "dpcourse.launcher", *argv[1:]])
    parser = argparse.ArgumentParser(prog="python -m dpcourse.distributed", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser(
        "worker",
        help=f"one process of a run; reads {COORDINATOR_ENV}, {NUM_PROCESSES_ENV}, {PROCESS_ID_ENV} unless given",
    )
    add_run_options(worker)
    worker.add_argument("--coordinator", default=None, help="host:port of process 0 ([::1]:port for IPv6)")
    worker.add_argument("--num-processes", type=int, default=None)
    worker.add_argument("--process-id", type=int, default=None)
    worker.add_argument("--init-timeout-s", type=int, default=None)
    worker.add_argument("--cpu-devices", type=int, default=None, help="simulated CPU devices in this process")
    worker.add_argument("--out", default=None, help="folder for process 0's result.json and params.npz")
    worker.add_argument("--fail-process", type=int, default=None, help=argparse.SUPPRESS)
    sub.add_parser("launch", help="run N local worker processes: see python -m dpcourse.launcher --help")
    args = parser.parse_args(argv)
    if args.profile == "auto":
        args.profile = None
    try:
        return _worker_main(args)
    except (DistributedSetupError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
