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

The training program every process runs is :mod:`dpcourse.multihost.worker`
(``python -m dpcourse.multihost.worker``, as ``deploy/multihost.yaml`` starts it on
GKE). Starting N local processes, watching them and explaining their
failures is :mod:`dpcourse.multihost.launcher`'s job (``python -m dpcourse.multihost.launcher``).
Both import this module, never the reverse.

Environment variables read by :func:`spec_from_env` (set by
``dpcourse.multihost.launcher.launch_local`` locally and by ``deploy/multihost.yaml`` on GKE):

========================== ===================================================
``DPCOURSE_COORDINATOR``    ``host:port`` of process 0's coordinator service
                            (an IPv6 address in brackets: ``[::1]:8476``), or
                            ``unix:/path`` for a Unix-domain socket (local runs)
``DPCOURSE_NUM_PROCESSES``  total number of processes, >= 1
``DPCOURSE_PROCESS_ID``     this process's id, ``0 .. N-1`` (on GKE: the Job's
                            completion index)
``DPCOURSE_INIT_TIMEOUT_S`` optional: seconds to wait for every process to
                            join the coordinator (default 300, as in JAX)
``DPCOURSE_COLLECTIVES_HOST`` optional: the address gloo listens on (local
                            runs: ``127.0.0.1``); unset, gloo listens on the
                            address this machine's host name resolves to
========================== ===================================================

A local run keeps itself to its user (:func:`dpcourse.multihost.ports.private_coordinator`):
the coordinator listens on a Unix-domain socket in a folder only that user may
enter (mode 0700), which gRPC, and so ``jax.distributed.initialize``, accepts as
``unix:/path``; another user of the machine cannot connect to it, so cannot join
the run, read what the processes exchange through it (who has which devices,
gloo's addresses) or end it. Gloo's own connections stay on TCP, on loopback.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpcourse import data as _data
from dpcourse import devices as _devices
from dpcourse.train import max_abs_diff

COORDINATOR_ENV = "DPCOURSE_COORDINATOR"
NUM_PROCESSES_ENV = "DPCOURSE_NUM_PROCESSES"
PROCESS_ID_ENV = "DPCOURSE_PROCESS_ID"
INIT_TIMEOUT_ENV = "DPCOURSE_INIT_TIMEOUT_S"
COLLECTIVES_HOST_ENV = "DPCOURSE_COLLECTIVES_HOST"
# A local launcher's start line: each process, JAX imported, leaves a file there and waits for the others'
# before it joins, so that JAX's initialization timeout counts from when every process can report.
READY_DIR_ENV = "DPCOURSE_READY_DIR"
READY_COUNT_ENV = "DPCOURSE_READY_COUNT"
READY_WAIT_S = 600.0  # a bound of its own; the launcher ends a start-up that takes too long sooner
UNIX_PREFIX = "unix:"  # gRPC's form of a Unix-domain socket address: unix:/absolute/path
# A Unix-domain socket's path holds at most 107 bytes on Linux (sun_path is 108 with its NUL; macOS: 103).
UNIX_PATH_MAX = 103
# A socket path's characters gRPC reads alike on both sides: its client parses unix:<path> as a URI ("?" starts
# a query, "#" a fragment, "%41" is "A"), its server as written or percent-decoded (chttp2_server.cc, by version).
PLAIN_PATH = re.compile(r"[A-Za-z0-9/._-]+")
# JAX's own variable for the address the coordinator listens on (default
# [::]:port, every interface); the local launcher keeps it on loopback.
JAX_BIND_ENV = "JAX_COORDINATOR_BIND_ADDRESS"

DEFAULT_PORT = 8476  # any free port works; deploy/multihost.yaml uses this one
DEFAULT_INIT_TIMEOUT_S = 300  # jax.distributed.initialize's own default
AXIS = "data"
WORKER_FAILURE_EXIT = 3  # exit status of a worker told to fail (tests)
# Exit status of a worker whose checkpoint folder cannot be used (a file, read-only, held by another run, past
# --steps, another run's): every retry would fail the same way, so the GKE Job fails at once on it
# (sysexits.h EX_CONFIG, as deploy/multihost-checkpoint.yaml's FailJob rule).
UNUSABLE_CHECKPOINT_EXIT = 78


class DistributedSetupError(RuntimeError):
    """The distributed runtime cannot start as asked; the message says what to change."""


class CoordinatorPortInUse(DistributedSetupError):
    """The coordinator's port is already taken on this machine."""


# ---------------------------------------------------------------------------
# Starting the runtime
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DistributedSpec:
    """Who this process is in a multi-process run: process 0's coordinator (``host:port``), the number of
    processes (>= 1), this process's id (``0 .. num_processes - 1``), the seconds each waits for all to join."""

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

    ``unix:/absolute/path`` names a Unix-domain socket instead (a local run's
    coordinator, :func:`dpcourse.multihost.ports.private_coordinator`).

    Returns:
        ``(host, port)``, the host without brackets (``("::1", 8476)``), as
        ``socket`` takes it; ``(path, 0)`` for a Unix-domain socket.

    Raises:
        DistributedSetupError: not ``host:port`` with a port in 1..65535, an
            unbracketed IPv6 address, or brackets around something that is not one;
            a ``unix:`` path that is not absolute, longer than a socket's path may be, or
            with a character outside :data:`PLAIN_PATH`.
    """
    text = str(address).strip()
    if text.startswith(UNIX_PREFIX):
        path = text[len(UNIX_PREFIX) :]
        if not path.startswith("/"):
            raise DistributedSetupError(
                f"Coordinator address {address!r}: a Unix-domain socket is written unix:/absolute/path."
            )
        if len(path.encode()) > UNIX_PATH_MAX or not PLAIN_PATH.fullmatch(path):
            raise DistributedSetupError(
                f"Coordinator address {address!r}: a Unix-domain socket's path must hold at most {UNIX_PATH_MAX} "
                f"bytes (this one has {len(path.encode())}) and only ASCII letters, digits and /._- (gRPC reads "
                "it as a URI): put the socket in such a folder, as dpcourse.multihost.ports.run_folder() does."
            )
        return path, 0
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
    names = (COORDINATOR_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV)
    missing = [name for name, value in zip(names, (coordinator, num_processes, process_id)) if value in (None, "")]
    if missing:
        raise DistributedSetupError(
            f"{', '.join(missing)} not set. Every process needs {COORDINATOR_ENV}=host:port of process 0, "
            f"{NUM_PROCESSES_ENV}=N and {PROCESS_ID_ENV}=0..N-1 (or pass them to initialize()). "
            "Locally, dpcourse.multihost.launcher.launch_local() sets them; on GKE, deploy/multihost.yaml does."
        )
    timeout = _int_env(INIT_TIMEOUT_ENV, env)
    return DistributedSpec(
        coordinator, num_processes, process_id, DEFAULT_INIT_TIMEOUT_S if timeout is None else timeout
    )


def tpu_slice_spec() -> DistributedSpec | None:
    """This process's place on a GKE TPU slice as JAX's own detection (``GkeTpuCluster``) finds it; None elsewhere.

    Raises:
        DistributedSetupError: they name no slice (Kaggle's one-host TPU image sets ``TPU_PROCESS_ADDRESSES=local``).
    """
    from jax._src.clusters.cloud_tpu_cluster import GkeTpuCluster, coordinator_port

    listed = GkeTpuCluster._get_worker_host_names_env_var()
    if listed is None:
        return None
    hosts, worker = listed.split(","), os.environ.get("TPU_WORKER_ID", "").strip()
    if "local" in hosts or "" in hosts or not worker.isdigit() or int(worker) >= len(hosts):
        raise DistributedSetupError(
            f"This host sets TPU_WORKER_ID={worker!r} and its TPU hosts to {listed!r}, which is no multi-host slice "
            f"(Kaggle's one-host TPU image sets TPU_PROCESS_ADDRESSES=local): run the lesson in one process, or "
            f"set {COORDINATOR_ENV}, {NUM_PROCESSES_ENV} and {PROCESS_ID_ENV} to say where this process belongs."
        )
    host = (os.environ.get("MEGASCALE_COORDINATOR_ADDRESS") or hosts[0]).split(":")[0]
    address = f"{host}:{os.environ.get('JAX_COORDINATOR_PORT') or coordinator_port}"
    return DistributedSpec(address, GkeTpuCluster.get_process_count(), GkeTpuCluster.get_process_id())


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    init_timeout_s: int | None = None,
    heartbeat_timeout_s: int = 100,
    cpu_collectives: str = "gloo",
    cpu_devices: int | None = None,
    collectives_host: str | None = None,
) -> DistributedSpec:
    """Join the multi-process run: ``jax.distributed.initialize`` with clear errors.

    Arguments left as None come from the environment (:func:`spec_from_env`); with none given and no
    ``DPCOURSE_*`` set, a GKE TPU slice's pod is placed by JAX's own detection (:func:`tpu_slice_spec`).
    Must run before anything starts a JAX backend (``jax.devices()``, an array,
    a computation). Elsewhere cluster auto-detection is switched off: the three values
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
        collectives_host: the address gloo listens on for the other
            processes' connections (``127.0.0.1`` for a local run; None:
            ``$DPCOURSE_COLLECTIVES_HOST``, else gloo's own choice, the
            address this machine's host name resolves to, which may face
            the network).

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
            "Call dpcourse.multihost.distributed.initialize() first, before jax.devices() or any computation "
            "(in a notebook: restart the kernel)."
        )
    given = (coordinator_address, num_processes, process_id)
    on_slice = tpu_slice_spec() if given == (None,) * 3 and not os.environ.get(COORDINATOR_ENV) else None
    if None in given:  # spec_from_env raises, naming every missing variable
        known = astuple(on_slice or spec_from_env())[:3]
        coordinator_address, num_processes, process_id = (g if g is not None else k for g, k in zip(given, known))
    if init_timeout_s is None:
        from_env_timeout = _int_env(INIT_TIMEOUT_ENV, dict(os.environ))
        init_timeout_s = DEFAULT_INIT_TIMEOUT_S if from_env_timeout is None else from_env_timeout
    spec = DistributedSpec(coordinator_address, int(num_processes), int(process_id), int(init_timeout_s))
    if cpu_devices is not None:
        _devices.setup_devices(cpu_devices)
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    unix = spec.coordinator_address.startswith(UNIX_PREFIX)
    wait_for_the_others(spec.process_id)
    try:
        own = dict(
            coordinator_address=spec.coordinator_address,
            num_processes=spec.num_processes,
            process_id=spec.process_id,
            cluster_detection_method="deactivate",
            # JAX's default listens on every interface at the address's port, which a socket path has not.
            coordinator_bind_address=spec.coordinator_address if unix else None,
        )
        jax.distributed.initialize(
            initialization_timeout=spec.init_timeout_s,
            heartbeat_timeout_seconds=heartbeat_timeout_s,
            **({} if on_slice is not None else own),
        )
    except Exception as err:  # JaxRuntimeError has no stable public import path
        if "Failed to start RPC server" in str(err):
            if unix:
                raise DistributedSetupError(
                    f"Process 0 could not start the coordinator on {spec.coordinator_address}: the socket "
                    "exists already or its folder cannot be written. Use a fresh folder of your own."
                ) from err
            raise CoordinatorPortInUse(
                f"Process 0 could not start the coordinator on {spec.coordinator_address}: the port is "
                "already in use (another run, or another program). Pick another port, or end the program "
                "that holds it."
            ) from err
        raise
    host = collectives_host if collectives_host is not None else os.environ.get(COLLECTIVES_HOST_ENV, "").strip()
    if host and cpu_collectives == "gloo":
        _gloo_listens_on(host)
    return spec


def wait_for_the_others(process_id: int, env: dict[str, str] | None = None, wait_s: float = READY_WAIT_S) -> None:
    """Leave ``ready.<process_id>`` in ``$DPCOURSE_READY_DIR`` and wait until ``$DPCOURSE_READY_COUNT`` files are there.

    Starting Python and importing JAX takes seconds on a quiet machine and
    far longer on a busy one, and not the same time in every process; JAX's
    initialization timeout counts from each process's own join, so a
    process that joined early could give up on one still importing. The
    local launcher sets both variables (the folder is its own run's); without
    them this returns at once (a GKE pod, a process started by hand).
    """
    env = os.environ if env is None else env
    folder, count = env.get(READY_DIR_ENV), _int_env(READY_COUNT_ENV, dict(env))
    if not folder or not count:
        return
    ready = Path(folder)
    (ready / f"ready.{process_id}").touch()
    deadline = time.monotonic() + wait_s
    while len(list(ready.glob("ready.*"))) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def _gloo_listens_on(host: str) -> None:
    """Make the CPU backend's gloo collectives listen on ``host`` instead of the host name's address.

    JAX builds gloo without an address (``make_cpu_client`` in
    ``jax/_src/xla_bridge.py``, 0.10.2 to 0.12), so gloo listens on the
    address ``gethostname()`` resolves to (gloo's ``tcp/device.cc``): on a
    cloud VM, its network address. ``make_gloo_tcp_collectives`` takes a
    ``hostname``; the CPU backend is registered again with collectives built
    on it (``jax.extend.backend.register_backend_factory``), before any
    backend starts. Call it after ``jax.distributed.initialize``.

    Raises:
        DistributedSetupError: this JAX has no such hook; the message says
            which version the course was tried with.
    """
    from jax.extend import backend

    try:
        from jax._src import distributed as jax_distributed
        from jax._src import xla_bridge
        from jax._src.lib import _jax

        make_gloo = _jax.make_gloo_tcp_collectives
        make_cpu_client = xla_bridge.make_cpu_client
    except (ImportError, AttributeError) as err:
        raise DistributedSetupError(
            f"This JAX cannot keep gloo's connections on {host} ({err}); the course was tried with JAX 0.10.2 and "
            f"0.12. Unset {COLLECTIVES_HOST_ENV} to let gloo listen where it chooses."
        ) from None

    def cpu_client():
        collectives = make_gloo(distributed_client=jax_distributed.global_state.client, hostname=host)
        return make_cpu_client(collectives=collectives)

    backend.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)


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

    # One write for the whole line: C++ libraries write to the same stream (the worker sends gloo's notices
    # there), and their text between a line and its newline would break the line.
    sys.stderr.write(f"[process {jax.process_index()}/{jax.process_count()}] {message}\n")
    sys.stderr.flush()


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
