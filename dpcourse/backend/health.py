"""A collective health check: one tiny ``shard_map`` + ``pmean`` over every device, with a hard timeout.

A broken peer-to-peer path between GPUs (seen on multi-GPU workstations)
makes NCCL collectives hang instead of fail: the first all-reduce of a
lesson, or of the GPU test Job, would then wait until its deadline. This
check runs one all-reduce in a separate process, times the all-reduce
itself (JAX's start and the compile come first and are not counted), kills
the process when the all-reduce runs past ``timeout_s`` seconds, and says
what to try. Notebook 01 and
deploy/notebook-tests.yaml run it (``python -m coursetools check-collectives``).

A process that has started JAX on TPU chips holds them: no other process can
open them (:mod:`dpcourse.backend.chips`). There the probe runs in this
process instead (a collective over TPU chips does not hang on a broken
peer-to-peer path as NCCL's can; the time limit cannot apply in-process), and
a probe that finds the chips held by another process says which, in one
sentence.
"""

from __future__ import annotations

import contextlib
import io
import json
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

# Runs in a fresh interpreter on the default backend's devices (all GPUs on a
# GPU node; on a CPU, the simulated devices that XLA_FLAGS asks for). It
# prints a marker line when JAX has started and the step is compiled, so that
# the parent can time the collective alone.
PROBE = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

devices = jax.devices()
mesh = Mesh(np.array(devices), ("devices",))
n = len(devices)
x = jnp.arange(n, dtype=jnp.float32)
started = time.perf_counter() - t0
mean = jax.jit(jax.shard_map(lambda x: jax.lax.pmean(x, "devices"), mesh=mesh, in_specs=P("devices"), out_specs=P("devices")))
compiled = mean.lower(x).compile()
print("COMPILED", devices[0].platform, flush=True)
t1 = time.perf_counter()
out = np.asarray(compiled(x).block_until_ready())
collective = time.perf_counter() - t1
print(json.dumps({"devices": n, "platform": devices[0].platform, "kind": devices[0].device_kind,
                  "values": out.tolist(), "expected": (n - 1) / 2, "start_s": started,
                  "compile_s": t1 - t0 - started, "collective_s": collective}), flush=True)
"""
MARKER = "COMPILED"
# How long JAX's start and the compile may take before the check gives up (not a hang of the collective).
START_LIMIT_S = 600.0

HANG_ADVICE = (
    "Try, one at a time: NCCL_DEBUG=INFO (NCCL logs where it stops); NCCL_P2P_DISABLE=1 (routes around "
    "a broken peer-to-peer path between the GPUs, common behind PCIe switches with ACS or an IOMMU); "
    "check the driver (nvidia-smi must list every GPU, and the driver must support the CUDA version of "
    "the installed jax[cuda12]); `nvidia-smi topo -m` shows how the GPUs are connected."
)


class CollectiveCheckError(RuntimeError):
    """The all-reduce probe hung past its timeout, failed, or returned a wrong value."""


@dataclass(frozen=True)
class CollectiveCheck:
    """A passed probe: devices, platform and kind; the all-reduce's own time and JAX's start and compile (s)."""

    devices: int
    platform: str
    kind: str
    wall_s: float  # the whole probe process, JAX's start included
    collective_s: float | None = None  # the all-reduce alone (the time --timeout limits)
    start_s: float | None = None
    compile_s: float | None = None
    in_process: bool = False  # run in this process, which holds the TPU chips

    def __str__(self) -> str:
        if self.in_process:
            return (
                f"pmean over {self.devices} {self.platform} device(s) ({self.kind}) finished and agreed: the "
                f"all-reduce took {self.collective_s * 1e3:.1f} ms after a {self.compile_s:.1f} s compile. It ran "
                "in this process, which holds the TPU chips (one process at a time can open them), so no time "
                "limit applied."
            )
        if self.collective_s is None:
            return (
                f"pmean over {self.devices} {self.platform} device(s) ({self.kind}) finished and agreed, "
                f"in {self.wall_s:.1f} s including JAX's start in a fresh process."
            )
        return (
            f"pmean over {self.devices} {self.platform} device(s) ({self.kind}) finished and agreed: the "
            f"all-reduce took {self.collective_s * 1e3:.1f} ms (JAX's start {self.start_s:.1f} s and the compile "
            f"{self.compile_s:.1f} s came before it and are not counted against the timeout)."
        )


def holds_tpu_chips() -> bool:
    """Whether this process has started JAX on TPU chips, which no other process can then open."""
    if "jax" not in sys.modules:
        return False
    from dpcourse.devices import backend_started

    if not backend_started():
        return False
    import jax

    return jax.default_backend() == "tpu"


def _checked(result: dict, wall: float, in_process: bool = False) -> CollectiveCheck:
    """The probe's JSON result as a :class:`CollectiveCheck`; a wrong mean raises :class:`CollectiveCheckError`."""
    if any(abs(v - result["expected"]) > 1e-6 for v in result["values"]):
        raise CollectiveCheckError(
            f"pmean over {result['devices']} device(s) gave {result['values']}, expected {result['expected']} "
            f"on every device: the collective is wrong. {HANG_ADVICE}"
        )
    return CollectiveCheck(
        result["devices"],
        result["platform"],
        result["kind"],
        round(wall, 2),
        result.get("collective_s"),
        result.get("start_s"),
        result.get("compile_s"),
        in_process,
    )


def _check_here() -> CollectiveCheck:
    """Run :data:`PROBE` in this process (which holds the TPU chips) and check its result."""
    printed = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(printed):
        exec(compile(PROBE, "<collective probe>", "exec"), {"__name__": "__probe__"})  # noqa: S102 - our own code
    lines = [line for line in printed.getvalue().splitlines() if line.startswith("{")]
    return _checked(json.loads(lines[-1]), time.perf_counter() - start, in_process=True)


def _reader(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


def check_collectives(
    timeout_s: float = 60.0,
    command: list[str] | None = None,
    start_limit_s: float = START_LIMIT_S,
    in_process: bool | None = None,
) -> CollectiveCheck:
    """Run one ``shard_map`` + ``lax.pmean`` over all devices of the default backend; time the all-reduce itself.

    The probe process first starts JAX and compiles the step (bounded by
    ``start_limit_s``, which is slowness, not a hang), prints a marker, and
    then runs the all-reduce, which must finish within ``timeout_s``.

    Args:
        timeout_s: seconds the all-reduce itself may take after the compile.
        command: the probe command (default: this interpreter running :data:`PROBE`); tests
            pass a stand-in. A stand-in that never prints the marker is timed as a whole
            against ``timeout_s`` plus ``start_limit_s``.
        start_limit_s: seconds JAX's start plus the compile may take.
        in_process: run the probe in this process (None: where this process holds TPU chips,
            :func:`holds_tpu_chips`, since no other process could open them).

    Returns:
        :class:`CollectiveCheck` when every device got the global mean.

    Raises:
        CollectiveCheckError: the all-reduce ran past ``timeout_s`` (a hang: the message says
            what to try, NCCL settings on GPUs); JAX's start and compile ran past
            ``start_limit_s`` (said as such, without hang advice); the probe exited with an
            error (its stderr is in the message; where another process holds the TPU
            chips, one sentence naming it), or returned a wrong mean.
        ValueError: ``timeout_s`` is not a positive number of seconds (nothing was started).
    """
    if not timeout_s > 0:  # also NaN: a zero or negative limit would report every probe as a hang
        raise ValueError(f"timeout must be a positive number of seconds (for example 60), got {timeout_s!r}.")
    if command is None and (holds_tpu_chips() if in_process is None else in_process):
        return _check_here()
    cmd = command or [sys.executable, "-c", PROBE]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    errors: list[str] = []
    err_reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
    err_reader.start()
    out_lines: list[str] = []
    platform, compiled_at, timed_out = None, None, False
    deadline = start + start_limit_s
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                timed_out = True
                break
            if line is None:  # the probe closed its output: it ended
                break
            out_lines.append(line)
            if line.startswith(MARKER) and compiled_at is None:
                compiled_at = time.perf_counter()
                platform = (line.split() + ["?", "?"])[1]
                deadline = compiled_at + timeout_s
            elif line.startswith("{"):
                break  # the result: the all-reduce is over; the process's exit is not timed
        if not timed_out:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=start_limit_s)  # JAX's shutdown, not the collective
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        # The process has ended, so its stderr is at EOF; wait for the reader to hand it over (CI once
        # read the list before the thread appended to it, and reported a failure without its stderr).
        err_reader.join(timeout=10)
    wall = time.perf_counter() - start
    if timed_out:
        if compiled_at is None:
            raise CollectiveCheckError(
                f"JAX's start and the compile of the probe did not finish within {start_limit_s:g} s, so the "
                "all-reduce itself never ran: that is a slow or stuck start (a loaded machine, a GPU driver "
                "that does not answer), not a hang of the collective. The probe process was stopped."
            )
        if platform == "cpu":
            raise CollectiveCheckError(
                f"The first pmean over the CPU devices did not finish within {timeout_s:g} s after it was "
                "compiled (JAX's start and the compile are not counted). On CPU devices that is slowness, not "
                "a hang: the first run of a collective sets up threads on shared cores (1.2 s measured on a "
                "loaded 2-core machine). Raise --timeout (60 s by default); if it still stops, look for a "
                "process that holds the cores (top). The probe process was stopped."
            )
        raise CollectiveCheckError(
            f"A one-element pmean over all devices did not finish within {timeout_s:g} s after it was "
            f"compiled (JAX's start and the compile are not counted): the devices cannot complete a "
            f"collective (a hang, not slowness), and every multi-device lesson would hang the same way. "
            f"The probe process was stopped. {HANG_ADVICE}"
        )
    stderr = errors[0] if errors else ""
    if proc.returncode != 0 and not any(line.startswith("{") for line in out_lines):
        from dpcourse.backend.chips import held_message
        from dpcourse.backend.xlaflags import describe_abort

        flags = describe_abort(stderr)
        if flags:
            raise CollectiveCheckError(f"The all-reduce probe could not start JAX: {flags}")
        held = held_message(stderr)
        if held:
            raise CollectiveCheckError(held)
        raise CollectiveCheckError(
            f"The all-reduce probe failed (exit status {proc.returncode}):\n{stderr.strip()[-2000:]}"
        )
    try:
        result = json.loads([line for line in out_lines if line.strip()][-1])
    except (IndexError, ValueError) as err:
        raise CollectiveCheckError(f"The all-reduce probe printed no result:\n{''.join(out_lines)[-2000:]}") from err
    return _checked(result, wall)
