"""Compile training steps for GPUs or TPU slices this machine does not have, or for simulated CPU devices.

A step is named by a dotted builder path ``"module:function"``; the function
has the signature ``build(cfg, mesh) -> (jitted_fn, abstract_args)``, where
``cfg`` is a :class:`dpcourse.config.Config`, ``mesh`` a 1-D
``jax.sharding.Mesh`` with axis ``"data"``, and ``abstract_args`` a tuple of
``jax.ShapeDtypeStruct`` with ``NamedSharding`` on ``mesh``. Nothing runs:
each step is lowered and compiled, and its optimised program is read for
collectives (:mod:`dpcourse.compiled.collectives`), ``memory_analysis()`` and
``cost_analysis()``. The course's own steps are :data:`COURSE_STEPS`; other
lessons pass their own builders.

Every compile runs in a fresh subprocess (:func:`compile_jobs`) with
``JAX_PLATFORMS=cpu`` (and the extras' folders on ``PYTHONPATH``), where the
devices come from ``jax.experimental.topologies.get_topology_desc``, for a
target of :mod:`dpcourse.cross_compile.targets`: GPUs with
``platform="cuda", target_config=<text proto>, topology="1x1xN"``, a TPU
slice with ``platform="tpu", topology_name="v5e:2x4"`` (libtpu describes
the slice; no TPU needed, measured with libtpu 0.0.42 and JAX 0.10.2 on a
2-core machine without one). Each needs its platform's optional extra
(``requirements-gpu-compile.txt``, ``requirements-tpu-compile.txt``);
:func:`compile_jobs` checks it before starting the subprocess and returns
a result with a clear ``error`` when it is missing (libtpu's environment
off a TPU VM: :data:`TPU_ENV`). ``disable_passes`` names XLA passes to switch off
(``--xla_disable_hlo_passes``), for experiments such as turning off
``while-loop-all-reduce-code-motion``. :func:`start_jobs` starts the same
subprocess without waiting for it (a lesson starts it early and collects
it later, while its own cells run).

Most of a GPU compile of this course's small steps is code generation:
each kernel is a separate ``ptxas`` run (about 45 per step, measured with
jaxlib 0.10.2), and the steps of a lesson share most of their kernels. So
each GPU job gets its own XLA kernel cache (``xla_gpu_kernel_cache_file``,
one file per job in a temporary folder that is removed afterwards): a
kernel already built for an earlier step of the same job is reused. The
cache changes only how the machine code is built, not the optimised
program, its collectives or ``memory_analysis()`` (measured: the same
figures with and without it); it cut lesson 10's compile (6 steps, smoke
profile, 8 x H200 and 8 x L4) from 27 s to 13-17 s on a shared 2-core CPU.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from dpcourse.backend.xlaflags import check_xla_flags, describe_abort
from dpcourse.cross_compile import mocked
from dpcourse.cross_compile import targets as gpu_targets
from dpcourse.cross_compile.result import RESULT_PREFIX, CompileResult, StepResult  # noqa: F401 - this module's results
from dpcourse.exercises.checks import first_sentence

COURSE_STEPS: dict[str, str] = {
    "jit": "dpcourse.cross_compile.steps:jit_step",
    "device_axis": "dpcourse.cross_compile.steps:device_axis_step",
    "shard_map": "dpcourse.cross_compile.steps:shard_map_step",
}
FAST_STEPS: dict[str, str] = {"jit_unrolled_bf16": "dpcourse.cross_compile.steps:fast_jit_step"}
BACKENDS = ("gpu", "tpu", "mocked", "cpu")
DEVICELESS = ("gpu", "tpu")  # backends whose devices this machine does not have
# libtpu on a machine that is no TPU VM: one worker, this host (else it logs an error about
# the worker host names it could not find), and no query of the cloud's metadata server. And
# load it beside other processes: libtpu takes /tmp/libtpu_lockfile, and a second process that
# loads it meanwhile (a second compile worker, a notebook holding the chips) stops with "ABORTED:
# Internal error when accessing libtpu multi-process lockfile" (measured, libtpu 0.0.42); a
# compile opens no chip.
TPU_ENV = {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_SKIP_MDS_QUERY": "1", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
COST_KEYS = ("flops", "bytes accessed", "transcendentals", "optimal_seconds")
KERNEL_CACHE_OPTION = "xla_gpu_kernel_cache_file"  # an XLA debug option, passed per compile
MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
)


def load_builder(path: str):
    """Import the builder named ``"module:function"``.

    Raises:
        ValueError: not of that form, or the module or function cannot be found.
    """
    module_name, sep, func_name = str(path).partition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"A step builder is named 'module:function', e.g. {COURSE_STEPS['jit']!r}; got {path!r}.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"Step builder {path!r}: cannot import {module_name!r} ({err}).") from err
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise ValueError(f"Step builder {path!r}: {module_name} has no function {func_name!r}.")
    return fn


@dataclass(frozen=True)
class Job:
    """One (backend, target, device count, profile) to compile.

    ``backend`` is one of :data:`BACKENDS`: ``"gpu"`` (``target`` a key of
    :data:`dpcourse.cross_compile.targets.TARGETS`, compiled without a GPU),
    ``"tpu"`` (``target`` a key of :data:`dpcourse.cross_compile.targets.TPU_TARGETS`,
    a slice, compiled without a TPU; ``n_devices`` is its chip count),
    ``"mocked"`` (``target`` a mocked topology such as ``"1x4x1"``, compiled
    on a machine with one NVIDIA GPU, :mod:`dpcourse.cross_compile.mocked`), or
    ``"cpu"`` (simulated CPU devices; ``target`` is ``"cpu"``).

    Raises:
        ValueError: an unknown backend or target, ``n_devices`` below 1, or a
            mocked topology or TPU slice of another device count.
    """

    backend: str
    target: str
    n_devices: int
    profile: str

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"Unknown backend {self.backend!r}: use one of {', '.join(map(repr, BACKENDS))}.")
        if self.backend in DEVICELESS:
            gpu_targets.target(self.target, self.backend)
        if not isinstance(self.n_devices, int) or self.n_devices < 1:
            raise ValueError(f"n_devices must be a whole number >= 1, got {self.n_devices!r}.")
        if self.backend == "tpu" and gpu_targets.target(self.target).chips != self.n_devices:
            spec = gpu_targets.target(self.target)
            raise ValueError(
                f"TPU slice {spec.topology!r} has {spec.chips} chips, not n_devices={self.n_devices}: "
                "give the slice's own count."
            )
        if self.backend == "mocked" and mocked.topology_device_count(self.target) != self.n_devices:
            raise ValueError(
                f"Mocked topology {self.target!r} has {mocked.topology_device_count(self.target)} GPUs, "
                f"not n_devices={self.n_devices}: give the topology's own count."
            )

    def to_arg(self) -> str:
        return f"{self.backend}:{self.target}:{self.n_devices}:{self.profile}"

    @classmethod
    def from_arg(cls, text: str) -> Job:
        parts = text.split(":")
        if len(parts) != 4 or not parts[2].isdigit():
            raise ValueError(f"A job is backend:target:n_devices:profile (e.g. gpu:h200:8:smoke); got {text!r}.")
        return cls(parts[0], parts[1], int(parts[2]), parts[3])


def _label(job: Job) -> str:
    if job.backend == "mocked":
        return f"mocked GPU ({job.target})"
    return gpu_targets.target(job.target).label if job.backend in DEVICELESS else "CPU"


def _result(job: Job, disabled: tuple[str, ...] = (), **fields) -> CompileResult:
    """The :class:`CompileResult` of ``job``: what the job says of its target, and ``fields``."""
    deviceless = job.backend in DEVICELESS
    return CompileResult(
        job.backend,
        job.target,
        job.n_devices,
        job.profile,
        target_label=_label(job),
        approximate=deviceless and gpu_targets.target(job.target).approximate,
        deviceless=deviceless,
        disabled_passes=list(disabled),
        **fields,
    )


def _failed(job: Job, message: str, disabled: tuple[str, ...] = ()) -> CompileResult:
    return _result(job, disabled, error=message)


# ---- in the worker process ----


def _cost(compiled) -> tuple[dict[str, float], str]:
    """``cost_analysis()`` figures and where they came from.

    A program compiled for a topology (no GPU here) returns no cost analysis
    (None, measured with jaxlib 0.10.2); then XLA's ``HloCostAnalysis`` runs
    over the same optimised module, through the CPU client
    (``hlo_module_cost_analysis``): the GPU program's own instructions and
    fusions, counted by XLA's generic cost model.
    """
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - a backend without a cost model gives none
        cost = None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    source = "compiled.cost_analysis()"
    if not cost:
        try:
            import jax
            from jax._src.lib import _jax

            module = compiled.runtime_executable().hlo_modules()[0]
            cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
            source = "XLA HloCostAnalysis of the optimised module (hlo_module_cost_analysis)"
        except Exception:  # noqa: BLE001 - no cost figures then, said by an empty dict
            return {}, "none"
    return {k: float(cost[k]) for k in COST_KEYS if k in cost}, source


def _memory(compiled) -> dict[str, int]:
    try:
        mem = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - a backend without memory analysis gives none
        return {}
    return {f: int(getattr(mem, f)) for f in MEMORY_FIELDS if getattr(mem, f, None) is not None}


def _compile(lowered, options: dict | None):
    """``lowered.compile(options)``; a jaxlib that does not know an option compiles without them."""
    if not options:
        return lowered.compile()
    try:
        return lowered.compile(dict(options))
    except Exception as err:  # noqa: BLE001 - jaxlib raises JaxRuntimeError, not exported the same everywhere
        if "No such compile option" not in str(err):
            raise
        return lowered.compile()


def compile_step(
    name: str, builder: str, cfg, mesh, hlo_path: str | None = None, compiler_options: dict | None = None
) -> StepResult:
    """Build, lower and compile one step in this process (used by the worker).

    ``hlo_path``: where to write the optimised program text (None: nowhere).
    ``compiler_options``: XLA options for this compile (``{KERNEL_CACHE_OPTION: path}``
    for a GPU job); an option this jaxlib does not know is dropped.
    Errors from the builder or the compiler are returned in ``error``.
    """
    from dpcourse.compiled import collectives, schedule

    t0 = time.perf_counter()
    gpu = mesh.devices.flat[0].platform in ("gpu", "cuda")
    with tempfile.TemporaryDirectory(prefix="dpcourse-passes-") as dump:
        try:
            fn, args = load_builder(builder)(cfg, mesh)
            options = {**(compiler_options or {}), **(schedule.scheduler_dump_options(dump) if gpu else {})}
            compiled = _compile(fn.lower(*args), options)
            text = compiled.as_text()
        except Exception as err:  # noqa: BLE001 - reported per step, the others still compile
            said = first_sentence(err)
            return StepResult(name, builder, error=f"{type(err).__name__}: {said}")
        lhs = schedule.scheduler_ran(dump) if gpu else None
    elapsed = time.perf_counter() - t0
    if hlo_path:
        with open(hlo_path, "w") as f:
            f.write(text)
    report = collectives.parse_hlo(text)
    rows = [
        {
            "kind": c.kind,
            "name": c.name,
            "bytes": c.bytes,
            "in_loop": c.in_loop,
            "runs_per_step": c.runs_per_step,
            "bytes_per_step": c.bytes_per_step,
        }
        for c in report.collectives
    ]
    cost, source = _cost(compiled)
    return StepResult(
        name,
        builder,
        rows,
        report.count,
        report.in_loop_count,
        report.runs_per_step,
        report.bytes_per_step,
        _memory(compiled),
        cost,
        round(elapsed, 3),
        source,
        schedule=schedule.read_schedule(text, mesh.size).summary(),
        scheduler_ran=lhs,
    )


def _devices(job: Job) -> list:
    import jax

    if job.backend == "cpu":
        devs = jax.devices("cpu")
        if len(devs) < job.n_devices:
            raise RuntimeError(f"asked for {job.n_devices} CPU devices, JAX has {len(devs)}")
        return devs[: job.n_devices]
    if job.backend == "mocked":  # JAX_MOCK_GPU_TOPOLOGY was set before JAX started (worker_env)
        try:
            devs = jax.devices()
        except Exception as err:  # noqa: BLE001 - any backend start failure is reported, not raised
            said = str(err).strip().splitlines()[:1] or ["no message; is a GPU visible, with jaxlib's CUDA plugin?"]
            raise RuntimeError(f"JAX could not start the CUDA backend ({type(err).__name__}: {said[0]})") from err
        if devs[0].platform != "gpu" or len(devs) != job.n_devices:
            raise RuntimeError(f"asked for {job.n_devices} mocked GPUs, JAX sees {len(devs)} {devs[0].platform}")
        return devs
    from jax.experimental import topologies

    if job.backend == "tpu":
        topo = topologies.get_topology_desc(platform="tpu", topology_name=gpu_targets.target(job.target).topology)
        return list(topo.devices)
    text = gpu_targets.config_text(job.target)
    topo = topologies.get_topology_desc(
        platform="cuda", topology_name=job.target, target_config=text, topology=f"1x1x{job.n_devices}"
    )
    return list(topo.devices)


def run_jobs(jobs: list[Job], steps: dict[str, str], disabled: tuple[str, ...] = (), hlo_dir: str | None = None):
    """Compile every step for every job in this process; yields one :class:`CompileResult` per job."""
    import jax
    import jaxlib
    import numpy as np
    from jax.sharding import Mesh

    from dpcourse import config

    for job in jobs:
        try:
            devices = _devices(job)
        except Exception as err:  # noqa: BLE001 - reported per job
            said = first_sentence(err)
            yield _failed(job, f"no {job.backend} devices: {type(err).__name__}: {said}", disabled)
            continue
        mesh = Mesh(np.array(devices), ("data",))
        cfg = config.make_config(job.profile)
        out = {}
        with tempfile.TemporaryDirectory(prefix="dpcourse-kernels-") as kernels:
            # One kernel cache per job (per GPU model): later steps reuse the kernels of earlier ones.
            options = {KERNEL_CACHE_OPTION: os.path.join(kernels, "kernels.bin")} if job.backend == "gpu" else None
            for name, builder in steps.items():
                path = None
                if hlo_dir:
                    path = os.path.join(hlo_dir, f"{job.backend}_{job.target}_{job.n_devices}_{job.profile}_{name}.hlo")
                out[name] = compile_step(name, builder, cfg, mesh, path, options)
        yield _result(
            job,
            disabled,
            device_kind=devices[0].device_kind,
            jax_version=jax.__version__,
            jaxlib_version=jaxlib.__version__,
            steps=out,
        )


# ---- from the caller's process ----


def _own_flags(flags: str) -> list[str]:
    """The tokens of ``flags`` a compile worker keeps: all but the CPU device count and passes switched off."""
    from dpcourse.devices import CPU_COUNT_FLAG

    return [t for t in flags.split() if not t.startswith((CPU_COUNT_FLAG + "=", "--xla_disable_hlo_passes="))]


def worker_env(jobs: list[Job], disabled: tuple[str, ...] = (), base: dict | None = None) -> dict[str, str]:
    """The worker's environment, set before JAX starts: the platform its jobs need, passes switched off.

    GPU and TPU targets and CPU jobs: the CPU platform only, enough simulated
    CPU devices, the extras' folders on ``PYTHONPATH`` and, for a TPU job,
    :data:`TPU_ENV`. A mocked topology (one job alone, as JAX reads it when
    it starts): the CUDA platform with :func:`dpcourse.cross_compile.mocked.mocked_env`.

    Raises:
        ValueError: a mocked job together with other jobs.
    """
    from dpcourse.devices import CPU_COUNT_FLAG

    mocked_jobs = [j for j in jobs if j.backend == "mocked"]
    if mocked_jobs and len(jobs) > 1:
        raise ValueError("A mocked GPU topology is read when JAX starts: compile each mocked job on its own.")
    env = dict(os.environ if base is None else base)
    for key in ("DPCOURSE_RESULTS", "JAX_NUM_CPU_DEVICES", "JAX_MOCK_GPU_TOPOLOGY"):
        env.pop(key, None)
    flags = _own_flags(env.get("XLA_FLAGS", ""))
    passes = ["--xla_disable_hlo_passes=" + ",".join(disabled)] if disabled else []
    env["PYTHONUNBUFFERED"] = "1"
    if mocked_jobs:
        return {**mocked.mocked_env(mocked_jobs[0].target, env), "XLA_FLAGS": " ".join(flags + passes)}
    cpu = max([j.n_devices for j in jobs if j.backend == "cpu"], default=1)
    flags += [f"{CPU_COUNT_FLAG}={cpu}"] + passes
    # The plugin's start-up check needs a driver; with the CPU platform only it
    # is skipped, and get_topology_desc still compiles for CUDA.
    env.update({"JAX_PLATFORMS": "cpu", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1", "XLA_FLAGS": " ".join(flags)})
    if any(j.backend == "tpu" for j in jobs):
        env.update(TPU_ENV)
    sides = [str(p) for p in (gpu_targets.extra_path("gpu"), gpu_targets.extra_path("tpu")) if p is not None]
    if sides:  # the extras' own folders, on this process's path only
        env["PYTHONPATH"] = os.pathsep.join(sides + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class PendingCompile:
    """A compile worker started by :func:`start_jobs`; :meth:`results` waits for it.

    The worker's output goes to temporary files (not pipes), so it never
    blocks on a full pipe while nobody reads it.
    """

    def __init__(self, jobs: list[Job], runnable: list[Job], missing, disabled, timeout_s: float, cmd):
        # missing: why the jobs left out cannot compile here: one reason, or a reason per backend.
        self.jobs, self.runnable, self.missing, self.disabled = list(jobs), list(runnable), missing, disabled
        self.timeout_s, self.started = timeout_s, time.monotonic()
        self._results: list[CompileResult] | None = None
        self._proc = self._out = self._err = None
        if runnable:
            self._out = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in results()
            self._err = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in results()
            env = worker_env(runnable, disabled)
            self._proc = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, text=True, env=env)

    def done(self) -> bool:
        """True when the worker has finished (or none was needed)."""
        return self._proc is None or self._proc.poll() is not None

    def results(self) -> list[CompileResult]:
        """Wait for the worker (until ``timeout_s`` after its start); one result per job, in order."""
        if self._results is not None:
            return self._results
        results: dict[Job, CompileResult] = {}
        if self._proc is not None:
            try:
                self._proc.wait(timeout=max(0.0, self.timeout_s - (time.monotonic() - self.started)))
                self._out.seek(0)
                self._err.seek(0)
                stdout, stderr = self._out.read(), self._err.read()
                for line in stdout.splitlines():
                    if line.startswith(RESULT_PREFIX):
                        res = CompileResult.from_dict(json.loads(line[len(RESULT_PREFIX) :]))
                        results[Job(res.backend, res.target, res.n_devices, res.profile)] = res
                tail = " | ".join([ln for ln in (stdout + stderr).strip().splitlines() if ln.strip()][-3:])
                reason = describe_abort(stderr) or (
                    f"the compile worker exited with status {self._proc.returncode}: {tail[-600:]}"
                )
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
                reason = f"the compile worker did not finish within {self.timeout_s:.0f} s"
            finally:
                self._out.close()
                self._err.close()
            for j in self.runnable:
                results.setdefault(j, _failed(j, reason, self.disabled))
        for j in self.jobs:
            why = self.missing.get(j.backend) if isinstance(self.missing, dict) else self.missing
            results.setdefault(j, _failed(j, f"not compiled: {why}", self.disabled))
        self._results = [results[j] for j in self.jobs]
        return self._results


def start_jobs(
    jobs: list[Job],
    steps: dict[str, str] | None = None,
    disable_passes: tuple[str, ...] = (),
    timeout_s: float = 900.0,
    hlo_dir: str | None = None,
) -> PendingCompile:
    """Start compiling ``steps`` for every job in one fresh subprocess, and return without waiting.

    The arguments are :func:`compile_jobs`'s; ``PendingCompile.results()``
    returns what :func:`compile_jobs` would (``timeout_s`` counts from now).

    Raises:
        ValueError: a builder path not of the form ``"module:function"``, or a
            mocked job among others (each needs a process of its own).
        XlaFlagsError: a ValueError; ``XLA_FLAGS`` holds a token XLA would end the
            worker on (:func:`dpcourse.backend.xlaflags.check_xla_flags`); nothing is started.
    """
    steps = dict(COURSE_STEPS if steps is None else steps)
    for builder in steps.values():
        if ":" not in builder:
            load_builder(builder)  # raises with the example
    disabled = tuple(disable_passes)
    missing = {p: gpu_targets.extra_missing(p) for p in DEVICELESS if any(j.backend == p for j in jobs)}
    if any(j.backend == "mocked" for j in jobs):
        worker_env(jobs, disabled, base={})  # raises for a mocked job among others
        missing["mocked"] = mocked.gpu_unavailable_reason()
    runnable = [j for j in jobs if missing.get(j.backend) is None]
    if runnable:  # the worker inherits the caller's XLA_FLAGS: a bad token would end it with XLA's flag list
        check_xla_flags(" ".join(_own_flags(os.environ.get("XLA_FLAGS", ""))))
    cmd = [sys.executable, "-m", "dpcourse.cross_compile.compile"] + [
        a for j in runnable for a in ("--job", j.to_arg())
    ]
    cmd += [a for name, b in steps.items() for a in ("--step", f"{name}={b}")]
    cmd += ["--disable-pass", ",".join(disabled)] if disabled else []
    cmd += ["--hlo-dir", str(hlo_dir)] if hlo_dir else []
    return PendingCompile(jobs, runnable, missing, disabled, timeout_s, cmd)


def compile_jobs(
    jobs: list[Job],
    steps: dict[str, str] | None = None,
    disable_passes: tuple[str, ...] = (),
    timeout_s: float = 900.0,
    hlo_dir: str | None = None,
) -> list[CompileResult]:
    """Compile ``steps`` for every job in one fresh subprocess; one result per job, in order.

    Args:
        jobs: what to compile for (:class:`Job`).
        steps: step name -> builder ``"module:function"`` (default :data:`COURSE_STEPS`).
        disable_passes: XLA pass names to switch off in the worker.
        timeout_s: the worker's time limit.
        hlo_dir: a folder to write each optimised program to (None: none).

    Returns:
        Results; a GPU or TPU job gets an ``error`` (nothing compiled for it)
        when its platform's extra is missing (:func:`dpcourse.cross_compile.targets.extra_missing`),
        a mocked job when this machine has no NVIDIA GPU or CUDA plugin
        (:func:`dpcourse.cross_compile.mocked.gpu_unavailable_reason`), and every job
        does when the worker fails or times out.

    Raises:
        ValueError: a builder path not of the form ``"module:function"``, or
            ``XLA_FLAGS`` holding a token XLA would end the worker on (XlaFlagsError).
    """
    return start_jobs(jobs, steps, disable_passes, timeout_s, hlo_dir).results()


def compile_mocked(
    profile: str,
    topologies: tuple[str, ...] = mocked.GPU_TOPOLOGIES,
    steps: dict[str, str] | None = None,
    disable_passes: tuple[str, ...] = (),
    timeout_s: float = 600.0,
) -> list[CompileResult]:
    """Compile ``steps`` for each mocked GPU topology, one fresh process each; one result per topology.

    Args:
        profile: the workload profile (``"full"``, ``"cpu"``, ``"smoke"``).
        topologies: mocked topologies (:data:`dpcourse.cross_compile.mocked.GPU_TOPOLOGIES`).
        steps: step name -> builder ``"module:function"`` (default :data:`COURSE_STEPS`).
        disable_passes: XLA passes to switch off.

    Returns:
        Results of backend ``"mocked"``; each has ``error`` set when this
        machine cannot compile them (:func:`dpcourse.cross_compile.mocked.gpu_unavailable_reason`)
        or its worker failed.

    Raises:
        ValueError: a bad topology or builder name.
    """
    jobs = [Job("mocked", t, mocked.topology_device_count(t), profile) for t in topologies]
    return [compile_jobs([job], steps, disable_passes, timeout_s)[0] for job in jobs]


def main(argv: list[str] | None = None) -> int:
    """The worker: ``python -m dpcourse.cross_compile.compile --job gpu:h200:8:smoke --step jit=dpcourse.cross_compile.compile:jit_step``.

    Run it through :func:`compile_jobs`, which sets the environment.
    """
    parser = argparse.ArgumentParser(description="Compile steps for GPUs or TPUs without them, or for CPU devices.")
    parser.add_argument("--job", action="append", required=True, help="backend:target:n_devices:profile")
    parser.add_argument("--step", action="append", help="name=module:function (default: the course's steps)")
    parser.add_argument("--disable-pass", default="", help="comma-separated XLA passes to switch off")
    parser.add_argument("--hlo-dir", help="write each optimised program here")
    args = parser.parse_args(argv)
    jobs = [Job.from_arg(j) for j in args.job]
    steps = dict(COURSE_STEPS)
    if args.step:
        steps = dict(s.split("=", 1) for s in args.step)
    disabled = tuple(p for p in args.disable_pass.split(",") if p)
    for platform in DEVICELESS:
        missing = gpu_targets.extra_missing(platform) if any(j.backend == platform for j in jobs) else None
        if missing:  # checked again here: a missing libdevice segfaults
            print(f"error: {missing}", file=sys.stderr)
            return 1
    for res in run_jobs(jobs, steps, disabled, args.hlo_dir):
        print(res.to_line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
