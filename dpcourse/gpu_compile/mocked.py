"""Where the gradient all-reduce lands, compiled for a given backend and device count.

Taught in notebooks 04 and 05. Collective placement is the compiler's
decision, and each backend has its own compiler: XLA's GPU pipeline runs
passes the CPU pipeline does not (``while-loop-all-reduce-code-motion``,
written to move an all-reduce whose result is only accumulated in a loop
out of that loop; source: ``xla/service/while_loop_all_reduce_code_motion.h``
and ``xla/service/gpu/gpu_compiler.cc`` in openxla/xla; the pass name does
not occur in jaxlib's CPU library, checked in 0.10.2 and 0.12.0.1, where
other pass names such as ``all-reduce-combiner`` do). So a placement read
on CPU devices says nothing certain about GPUs.

This module compiles the course's three data-parallel steps (plain ``jit``,
the device-axis step, the ``shard_map`` step) in a fresh subprocess per
device count, and reports each program's collectives with
:mod:`dpcourse.compiled.collectives`:

- ``platform="gpu"``: on a machine with at least one NVIDIA GPU, JAX can
  compile for a *mocked* multi-GPU topology (config
  ``jax_mock_gpu_topology``, environment ``JAX_MOCK_GPU_TOPOLOGY``, read when
  the backend starts; form ``<slices>x<hosts per slice>x<GPUs per host>``,
  e.g. ``1x4x1`` for 4 GPUs). Nothing runs on the mocked GPUs: the programs
  are only compiled, so one real GPU is enough.
- ``platform="cpu"``: simulated CPU devices stand in (any machine); the
  result is the CPU compiler's placement.

Every report carries the backend and topology it came from.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pkgutil
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

MOCK_TOPOLOGY_ENV = "JAX_MOCK_GPU_TOPOLOGY"
GPU_TOPOLOGIES = ("1x2x1", "1x4x1", "1x8x1")
STEPS = ("jit", "device_axis", "shard_map")
STEP_LABELS = {
    "jit": "jit(train_step)",
    "device_axis": "jit(device-axis step)",
    "shard_map": "jit(shard_map step)",
}
REPORT_PREFIX = "DPCOURSE_PLACEMENT_REPORT "
CPU_ONLY_CAVEAT = (
    "This is the CPU compiler's placement. XLA's GPU compiler, measured with JAX 0.10.2 and 0.12.0.1 "
    "for H100 SXM, H200 and L4 targets, moves this all-reduce out of the loop (pass "
    "while-loop-all-reduce-code-motion, then gpu-all-reduce-combiner merges it into one): the GPU compile "
    "below shows it."
)
PASS_NAME = "while-loop-all-reduce-code-motion"


def parse_topology(topology: str) -> tuple[int, int, int]:
    """Split a mocked GPU topology ``"<slices>x<hosts>x<gpus per host>"`` into three ints.

    Raises:
        ValueError: not three positive whole numbers joined by ``x``; the
            message gives an example.
    """
    parts = str(topology).strip().lower().split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(
            f"GPU topology {topology!r} is not of the form <slices>x<hosts per slice>x<GPUs per host> "
            "with positive whole numbers, e.g. '1x4x1' for 4 GPUs."
        )
    slices, hosts, per_host = (int(p) for p in parts)
    return slices, hosts, per_host


def topology_device_count(topology: str) -> int:
    """GPUs in a mocked topology: slices x hosts x GPUs per host (see :func:`parse_topology`)."""
    slices, hosts, per_host = parse_topology(topology)
    return slices * hosts * per_host


@dataclass(frozen=True)
class StepPlacement:
    """The collectives of one compiled step.

    Attributes:
        step: one of :data:`STEPS`.
        collectives: collective instructions in the program.
        in_loop: of which inside a ``while`` body (a ``lax.scan``).
        runs_per_step: collective executions per step (None: a trip count unknown).
        bytes_per_step: bytes through collectives per step, per device (result sizes).
        rows: one dict per collective (:meth:`dpcourse.compiled.collectives.CollectiveReport.rows`).
    """

    step: str
    collectives: int
    in_loop: int
    runs_per_step: int | None
    bytes_per_step: int | None
    rows: list[dict] = field(default_factory=list)

    @classmethod
    def from_report(cls, step: str, report) -> StepPlacement:
        """From a :class:`dpcourse.compiled.collectives.CollectiveReport`."""
        return cls(step, report.count, report.in_loop_count, report.runs_per_step, report.bytes_per_step, report.rows())


@dataclass(frozen=True)
class PlacementReport:
    """Collective placement of the course's steps for one backend and device count.

    Attributes:
        platform: the backend the programs were compiled for (``"gpu"`` or ``"cpu"``).
        topology: the mocked GPU topology (``"1x4x1"``), or None for CPU devices.
        n_devices: devices in the mesh (the ``data`` axis).
        device_kind: the devices' kind (for mocked GPUs, the real GPU's).
        profile: the workload profile compiled (:mod:`dpcourse.config`).
        jax_version, jaxlib_version: the versions that compiled them.
        steps: step name -> :class:`StepPlacement`; empty when ``error`` is set.
        error: why the compile could not be done (None when it was).
    """

    platform: str
    topology: str | None
    n_devices: int
    device_kind: str = ""
    profile: str = ""
    jax_version: str = ""
    jaxlib_version: str = ""
    steps: dict[str, StepPlacement] = field(default_factory=dict)
    error: str | None = None

    @property
    def where(self) -> str:
        """Backend and topology in words, e.g. ``gpu, mocked topology 1x4x1 (4 devices)``."""
        if self.topology:
            return f"{self.platform}, mocked topology {self.topology} ({self.n_devices} devices)"
        return f"{self.platform}, {self.n_devices} devices"

    def to_line(self) -> str:
        """One line a worker prints: :data:`REPORT_PREFIX` and the report as JSON."""
        return REPORT_PREFIX + json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> PlacementReport:
        """Rebuild a report from :func:`dataclasses.asdict` output.

        Raises:
            ValueError: a field is missing or a step is unknown.
        """
        try:
            steps = {name: StepPlacement(**value) for name, value in payload.get("steps", {}).items()}
            unknown = set(steps) - set(STEPS)
            if unknown:
                raise ValueError(f"unknown steps {sorted(unknown)}")
            fields = {k: v for k, v in payload.items() if k != "steps"}
            return cls(steps=steps, **fields)
        except TypeError as err:
            raise ValueError(f"Not a placement report: {err}.") from err

    @classmethod
    def from_output(cls, text: str) -> PlacementReport:
        """Find the report line in a worker's output (the last one wins).

        Raises:
            ValueError: no report line in ``text``, or it is not valid JSON.
        """
        lines = [line for line in text.splitlines() if line.startswith(REPORT_PREFIX)]
        if not lines:
            raise ValueError("No placement report in the worker's output.")
        try:
            payload = json.loads(lines[-1][len(REPORT_PREFIX) :])
        except json.JSONDecodeError as err:
            raise ValueError(f"The placement report line is not JSON: {err}.") from err
        return cls.from_dict(payload)


def _cuda_plugin_names() -> list[str]:
    names = [n for n in ("jax_cuda12_plugin", "jax_cuda13_plugin") if importlib.util.find_spec(n) is not None]
    # jax_plugins is a namespace package holding xla_cuda12 / xla_cuda13 when installed;
    # find_spec looks without importing it.
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        names += [
            f"jax_plugins.{m.name}" for m in pkgutil.iter_modules(spec.submodule_search_locations) if "cuda" in m.name
        ]
    return names


def _nvidia_gpus(timeout_s: float = 10.0) -> list[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")] if out.returncode == 0 else []


def gpu_unavailable_reason() -> str | None:
    """Why GPU placement cannot be compiled on this machine, or None when it can.

    Needs at least one NVIDIA GPU (listed by ``nvidia-smi -L``) and jaxlib's
    CUDA plugin. Starts no JAX backend.
    """
    if not _nvidia_gpus():
        return "no NVIDIA GPU here (nvidia-smi is absent or lists no GPU)"
    if not _cuda_plugin_names():
        return "jaxlib's CUDA plugin is not installed (pip install 'jax[cuda12]' or 'jax[cuda13]')"
    return None


def worker_env(
    platform: str, topology: str | None = None, n_devices: int | None = None, base: dict | None = None
) -> dict[str, str]:
    """The environment of one worker: the backend and device count, set before JAX starts.

    GPU: ``JAX_PLATFORMS=cuda``, ``JAX_MOCK_GPU_TOPOLOGY=topology``, one
    visible GPU (the first already visible), and no memory preallocation
    (the worker only compiles; a notebook may hold the GPU). CPU:
    ``JAX_PLATFORMS=cpu`` and ``n_devices`` simulated devices.

    Raises:
        ValueError: unknown platform, a bad topology, or ``n_devices`` < 1.
    """
    from dpcourse.devices import CPU_COUNT_FLAG

    env = dict(os.environ if base is None else base)
    env.pop(MOCK_TOPOLOGY_ENV, None)
    env.pop("DPCOURSE_RESULTS", None)  # workers never record into a notebook's results
    env.pop("JAX_NUM_CPU_DEVICES", None)
    flags = " ".join(t for t in env.get("XLA_FLAGS", "").split() if not t.startswith(CPU_COUNT_FLAG + "="))
    if platform == "gpu":
        if topology is None:
            raise ValueError("A GPU placement report needs a topology, e.g. '1x4x1'.")
        parse_topology(topology)
        visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip() or "0"
        env.update(
            {
                "JAX_PLATFORMS": "cuda",
                MOCK_TOPOLOGY_ENV: topology,
                "CUDA_VISIBLE_DEVICES": visible,
                "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            }
        )
    elif platform == "cpu":
        if not isinstance(n_devices, int) or n_devices < 1:
            raise ValueError(f"A CPU placement report needs n_devices >= 1, got {n_devices!r}.")
        env["JAX_PLATFORMS"] = "cpu"
        flags = f"{flags} {CPU_COUNT_FLAG}={n_devices}".strip()
    else:
        raise ValueError(f"Unknown platform {platform!r}: use 'gpu' or 'cpu'.")
    env["XLA_FLAGS"] = flags
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_worker(
    platform: str,
    profile: str,
    topology: str | None = None,
    n_devices: int | None = None,
    timeout_s: float = 600.0,
) -> PlacementReport:
    """Compile the three steps in a fresh process and return their placement.

    Args:
        platform: ``"gpu"`` (mocked ``topology``) or ``"cpu"`` (``n_devices``
            simulated devices).
        profile: the workload profile (``"full"``, ``"cpu"``, ``"smoke"``).

    Returns:
        The report; when the worker fails or times out, a report whose
        ``error`` holds the reason and the tail of its output (nothing is
        made up).

    Raises:
        ValueError: bad arguments (see :func:`worker_env`).
    """
    env = worker_env(platform, topology, n_devices)
    n = topology_device_count(topology) if platform == "gpu" else n_devices
    cmd = [sys.executable, "-m", "dpcourse.gpu_compile.mocked", "--platform", platform, "--profile", profile]
    cmd += ["--topology", topology] if platform == "gpu" else ["--devices", str(n_devices)]
    failed = PlacementReport(platform, topology if platform == "gpu" else None, n, profile=profile)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return _with_error(failed, f"the compile worker did not finish within {timeout_s:.0f} s")
    text = out.stdout + "\n" + out.stderr
    try:
        return PlacementReport.from_output(out.stdout)
    except ValueError:
        lines = [line for line in text.strip().splitlines() if line.strip()]
        said = [line[len("error: ") :] for line in lines if line.startswith("error: ")]
        reason = said[-1] if said else " | ".join(lines[-3:])
        return _with_error(failed, f"worker exited with status {out.returncode}: {reason[-600:]}")


def _with_error(report: PlacementReport, message: str) -> PlacementReport:
    return PlacementReport(**{**asdict(report), "steps": {}, "error": message})


def compile_steps(profile: str, devices: list) -> dict[str, StepPlacement]:
    """Compile the three steps for ``devices`` (in this process) and report their collectives.

    The arguments are abstract (``jax.ShapeDtypeStruct`` with shardings):
    parameters and optimizer state replicated ``P()``, the global batch
    ``[per_device_batch x n, 784]`` sharded ``P('data', None)`` over an
    Auto-axes mesh. Nothing is allocated or run, so the devices may be
    mocked or belong to other processes.
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpcourse import config, model, train
    from dpcourse.compiled import collectives

    cfg = config.make_config(profile)
    n = len(devices)
    mesh = Mesh(np.array(devices), ("data",))
    replicated = NamedSharding(mesh, P())
    optimizer = train.make_optimizer(cfg)
    init = model.init_params(cfg)

    def abstract(tree, sharding):
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)

    params = abstract(jax.eval_shape(lambda: init), replicated)
    opt_state = abstract(jax.eval_shape(optimizer.init, init), replicated)
    global_batch = cfg.global_batch(n)
    x = jax.ShapeDtypeStruct((global_batch, 784), np.float32, sharding=NamedSharding(mesh, P("data", None)))
    y = jax.ShapeDtypeStruct((global_batch,), np.int32, sharding=NamedSharding(mesh, P("data")))
    makers = {
        "jit": lambda: train.make_train_step(cfg, optimizer),
        "device_axis": lambda: train.make_device_axis_step(cfg, optimizer, n),
        "shard_map": lambda: train.make_shard_map_step(cfg, optimizer, mesh),
    }
    out = {}
    for name in STEPS:
        compiled = jax.jit(makers[name]()).lower(params, opt_state, x, y).compile()
        out[name] = StepPlacement.from_report(name, collectives.parse_hlo(compiled.as_text()))
    return out


def _worker(args: argparse.Namespace) -> int:
    import jax
    import jaxlib

    expected = topology_device_count(args.topology) if args.platform == "gpu" else args.devices
    try:
        devices = jax.devices()
    except Exception as err:  # noqa: BLE001 - any backend start failure is reported, not raised
        said = (str(err).strip().splitlines() or ["no message; is a GPU visible and jaxlib's CUDA plugin installed?"])[
            0
        ]
        print(f"error: JAX could not start the {args.platform} backend ({type(err).__name__}: {said})", file=sys.stderr)
        return 1
    platform = devices[0].platform
    if platform != args.platform:
        print(f"error: asked for {args.platform} devices, JAX started {platform}.", file=sys.stderr)
        return 1
    if len(devices) != expected:
        print(f"error: expected {expected} {platform} devices, JAX sees {len(devices)}.", file=sys.stderr)
        return 1
    report = PlacementReport(
        platform=platform,
        topology=args.topology if args.platform == "gpu" else None,
        n_devices=len(devices),
        device_kind=devices[0].device_kind,
        profile=args.profile,
        jax_version=jax.__version__,
        jaxlib_version=jaxlib.__version__,
        steps=compile_steps(args.profile, devices),
    )
    print(report.to_line(), flush=True)
    return 0


def rows(reports: list[PlacementReport]) -> list[dict]:
    """Table rows, one per report and step: backend, topology, collectives, loop placement, bytes."""
    out = []
    for rep in reports:
        base = {"backend": rep.platform, "topology": rep.topology or "-", "devices": rep.n_devices}
        if rep.error:
            out.append({**base, "step": "(not compiled)", "collectives": rep.error})
            continue
        for name in STEPS:
            s = rep.steps[name]
            out.append(
                {
                    **base,
                    "step": STEP_LABELS[name],
                    "collectives": s.collectives,
                    "inside loop": s.in_loop,
                    "runs per step": "unknown" if s.runs_per_step is None else s.runs_per_step,
                    "bytes per step": "unknown" if s.bytes_per_step is None else s.bytes_per_step,
                }
            )
    return out


def record(reports: list[PlacementReport]) -> list:
    """Record each step's collectives per step, in-loop count and bytes (dpcourse.record).

    Metric names carry the backend and topology
    (``collectives_in_loop_jit_gpu_1x4x1``), and each record's ``backend``,
    ``device_kind`` and ``device_count`` are those of the compile, so
    ``compare`` never matches a mocked GPU figure with a CPU one. Reports
    with an error record nothing.
    """
    from dpcourse import record as results

    written = []
    for rep in reports:
        if rep.error:
            continue
        suffix = f"{rep.platform}_{rep.topology}" if rep.topology else f"{rep.platform}_{rep.n_devices}"
        kind = f"{rep.device_kind} (mocked topology {rep.topology})" if rep.topology else rep.device_kind
        where = dict(backend=rep.platform, device_kind=kind, device_count=rep.n_devices)
        for name in STEPS:
            s = rep.steps[name]
            for metric, value, unit in (
                (f"collectives_per_step_{name}_{suffix}", s.runs_per_step, "count"),
                (f"collectives_in_loop_{name}_{suffix}", s.in_loop, "count"),
                (f"collective_bytes_per_step_{name}_{suffix}", s.bytes_per_step, "bytes"),
            ):
                written.append(results.record(metric, value, unit, **where))
    return [w for w in written if w is not None]


def show_mocked_gpu_placement(profile: str, backend: str) -> list[PlacementReport]:
    """Notebooks 04 and 05: compile the steps for the mocked GPU topologies and show the table.

    One fresh process per topology in :data:`GPU_TOPOLOGIES`; the reports
    are recorded. Where no GPU can compile them, it prints why and that the
    placement shown by the notebook is ``backend``'s compiler's.

    Returns:
        The reports (empty when GPU placement cannot be compiled here).
    """
    from IPython.display import display

    from dpcourse import show

    reason = gpu_unavailable_reason()
    if reason is not None:
        print(f"GPU placement cannot be compiled here: {reason}.")
        print(f"The placement shown above is the {backend.upper()} compiler's.")
        return []
    import jax

    reports = [run_worker("gpu", profile, topology=t) for t in GPU_TOPOLOGIES]
    caption = f"Compiled for mocked GPU topologies ({profile} profile, JAX {jax.__version__})"
    display(show.table(rows(reports), caption=caption))
    record(reports)
    return reports


def report(profile: str, topologies: tuple[str, ...] = GPU_TOPOLOGIES, cpu_devices: int = 8) -> list[PlacementReport]:
    """Placement on mocked GPUs (where possible) and on ``cpu_devices`` simulated CPU devices.

    Prints one line per report as it arrives (a GPU check script's output).
    """
    reason = gpu_unavailable_reason()
    reports = [] if reason else [run_worker("gpu", profile, topology=t) for t in topologies]
    if reason:
        print(f"GPU placement cannot be compiled here: {reason}.")
    reports.append(run_worker("cpu", profile, n_devices=cpu_devices))
    for rep in reports:
        print(rep.to_line())
    return reports


def main(argv: list[str] | None = None) -> int:
    """Command line.

    ``python -m dpcourse.gpu_compile.mocked --report --profile full``: the table
    for mocked 2, 4 and 8 GPUs (where an NVIDIA GPU is present) and 8 CPU
    devices. With ``--platform`` it is one worker (used by :func:`run_worker`).
    """
    parser = argparse.ArgumentParser(description="Compile the course's steps and report their collectives.")
    parser.add_argument("--report", action="store_true", help="every GPU topology and 8 CPU devices, one process each")
    parser.add_argument("--platform", choices=("gpu", "cpu"))
    parser.add_argument("--profile", required=True)
    parser.add_argument("--topology", help="mocked GPU topology, e.g. 1x4x1 (gpu)")
    parser.add_argument("--devices", type=int, help="simulated CPU devices (cpu)")
    args = parser.parse_args(argv)
    if args.report:
        reports = report(args.profile)
        for row in rows(reports):
            print("  ".join(f"{k}={v}" for k, v in row.items()))
        return 0 if all(r.error is None for r in reports if r.platform == "cpu") else 1
    if args.platform is None:
        parser.error("give --report, or --platform for one worker")
    if args.platform == "gpu" and not args.topology:
        parser.error("--platform gpu needs --topology")
    if args.platform == "cpu" and not args.devices:
        parser.error("--platform cpu needs --devices")
    return _worker(args)


if __name__ == "__main__":
    sys.exit(main())


# The lessons' GPU cell moved to dpcourse.gpu_compile.notebook; the previous layout called it here.
_NOTEBOOK_NAMES = ("show_gpu_placement", "show_compilers", "records", "table_rows")


def __getattr__(name: str):
    if name in _NOTEBOOK_NAMES:
        from dpcourse import _moved
        from dpcourse.gpu_compile import notebook

        _moved.warn_moved(f"dpcourse.gpu_compile.mocked.{name}", f"dpcourse.gpu_compile.notebook.{name}")
        return getattr(notebook, name)
    raise AttributeError(f"module 'dpcourse.gpu_compile.mocked' has no attribute {name!r}")
