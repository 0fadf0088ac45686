"""A collective health check: one tiny ``shard_map`` + ``pmean`` over every device, with a hard timeout.

A broken peer-to-peer path between GPUs (seen on multi-GPU workstations)
makes NCCL collectives hang instead of fail: the first all-reduce of a
lesson, or of the GPU test Job, would then wait until its deadline. This
check runs one all-reduce in a separate process that is killed after
``timeout_s`` seconds, and says what to try. Notebook 01 and
deploy/notebook-tests.yaml run it (``python -m dpcourse check-collectives``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

# Runs in a fresh interpreter on the default backend's devices (all GPUs on a
# GPU node; on a CPU, the simulated devices that XLA_FLAGS asks for).
PROBE = """
import json
import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

devices = jax.devices()
mesh = Mesh(np.array(devices), ("devices",))
n = len(devices)
mean = jax.jit(jax.shard_map(lambda x: jax.lax.pmean(x, "devices"), mesh=mesh, in_specs=P("devices"), out_specs=P("devices")))
out = np.asarray(mean(jnp.arange(n, dtype=jnp.float32)).block_until_ready())
print(json.dumps({"devices": n, "platform": devices[0].platform, "kind": devices[0].device_kind,
                  "values": out.tolist(), "expected": (n - 1) / 2}))
"""

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
    """A passed probe: devices all-reduced over, their platform and kind, and wall time (s) with JAX's start."""

    devices: int
    platform: str
    kind: str
    wall_s: float

    def __str__(self) -> str:
        return (
            f"pmean over {self.devices} {self.platform} device(s) ({self.kind}) finished and agreed, "
            f"in {self.wall_s:.1f} s including JAX's start in a fresh process."
        )


def check_collectives(timeout_s: float = 60.0, command: list[str] | None = None) -> CollectiveCheck:
    """Run one ``shard_map`` + ``lax.pmean`` over all devices of the default backend, killed after ``timeout_s``.

    Args:
        timeout_s: seconds before the probe process is killed (JAX's start included).
        command: the probe command (default: this interpreter running :data:`PROBE`); tests
            pass a stand-in.

    Returns:
        :class:`CollectiveCheck` when every device got the global mean.

    Raises:
        CollectiveCheckError: the probe ran past ``timeout_s`` (the message says what to try:
            ``NCCL_DEBUG=INFO``, ``NCCL_P2P_DISABLE=1``, the driver), exited with an error
            (its stderr is in the message), or returned a wrong mean.
        ValueError: ``timeout_s`` is not a positive number of seconds (nothing was started).
    """
    if not timeout_s > 0:  # also NaN: a zero or negative limit would report every probe as a hang
        raise ValueError(f"timeout must be a positive number of seconds (for example 60), got {timeout_s!r}.")
    cmd = command or [sys.executable, "-c", PROBE]
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as err:
        raise CollectiveCheckError(
            f"A one-element pmean over all devices did not finish within {timeout_s:g} s: the devices "
            f"cannot complete a collective (a hang, not slowness), and every multi-device lesson would "
            f"hang the same way. The probe process was stopped. {HANG_ADVICE}"
        ) from err
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise CollectiveCheckError(
            f"The all-reduce probe failed (exit status {out.returncode}):\n{out.stderr.strip()[-2000:]}"
        )
    try:
        result = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError) as err:
        raise CollectiveCheckError(f"The all-reduce probe printed no result:\n{out.stdout[-2000:]}") from err
    if any(abs(v - result["expected"]) > 1e-6 for v in result["values"]):
        raise CollectiveCheckError(
            f"pmean over {result['devices']} device(s) gave {result['values']}, expected {result['expected']} "
            f"on every device: the collective is wrong. {HANG_ADVICE}"
        )
    return CollectiveCheck(result["devices"], result["platform"], result["kind"], round(wall, 2))
