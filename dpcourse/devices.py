"""Device setup and reporting: what JAX sees.

Taught in notebook 01. Simulated CPU devices must be configured before the
JAX backend starts; once it has started, device settings are ignored, so
this module refuses to pretend they took effect.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

CPU_COUNT_FLAG = "--xla_force_host_platform_device_count"
# Environment variables read once, when the backend starts.
BACKEND_START_VARIABLES = (
    "XLA_FLAGS",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "JAX_PLATFORMS",
    "CUDA_VISIBLE_DEVICES",
)

RESTART_HINT = (
    "Restart the kernel (Kernel > Restart Kernel in JupyterLab) and run "
    "dpcourse.devices.setup_devices() before any other JAX call."
)
SIMULATED_DEVICES_HINT = (
    "To get simulated CPU devices, restart the kernel and call "
    "dpcourse.devices.setup_devices(n_cpu_devices=8) first, or start Python "
    f"with XLA_FLAGS={CPU_COUNT_FLAG}=8."
)

# Environment as it was when setup_devices() let the backend start.
_snapshot: dict[str, str | None] | None = None
# The device count this module appended to XLA_FLAGS, if it did.
_appended: str | None = None
# The argument of the call that configured the devices before JAX started.
_requested: int | None = None


class DeviceSetupError(RuntimeError):
    """Device settings cannot take effect, or too few devices are present."""


def backend_started() -> bool:
    """Whether a JAX backend has already been initialised in this process."""
    try:
        from jax._src import xla_bridge  # private, but the only direct probe

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # pragma: no cover - future JAX
        return False


def _flag_value(flags: str, name: str) -> str | None:
    value = None
    for token in flags.split():
        if token.startswith(name + "="):
            value = token.split("=", 1)[1]
    return value


def setup_devices(n_cpu_devices: int = 8) -> int:
    """Ask for ``n_cpu_devices`` simulated CPU devices before the backend starts.

    Appends ``--xla_force_host_platform_device_count`` to ``XLA_FLAGS`` (keeping
    every flag already there; a count already set by the user wins) and sets
    ``jax_num_cpu_devices`` to the same count. Only the CPU backend is
    affected: GPUs are used as they are, and the simulated CPU devices stay
    available for lessons that need more devices than there are GPUs.

    Calling it again after the backend started with the count it already
    has, or with the same argument as the call that configured it (re-running
    a notebook cell), is fine; asking for another count is refused.

    Args:
        n_cpu_devices: number of CPU devices to simulate (an int >= 1).

    Returns:
        The number of CPU devices that will be simulated.

    Raises:
        ValueError: ``n_cpu_devices`` is not an int >= 1.
        DeviceSetupError: the backend already started with another CPU
            device count (the message says to restart the kernel), or
            ``XLA_FLAGS`` holds a device count that is not a positive integer.
    """
    global _snapshot, _appended, _requested
    if isinstance(n_cpu_devices, bool) or not isinstance(n_cpu_devices, int) or n_cpu_devices < 1:
        raise ValueError(f"n_cpu_devices must be an int >= 1, got {n_cpu_devices!r}.")
    flags = os.environ.get("XLA_FLAGS", "")
    user_value = _flag_value(flags, CPU_COUNT_FLAG)
    if user_value is not None and user_value == _appended:
        user_value = None  # the flag is ours, from an earlier call
    if user_value is not None and not (user_value.isdigit() and int(user_value) >= 1):
        raise DeviceSetupError(
            f"XLA_FLAGS sets {CPU_COUNT_FLAG}={user_value}, which is not a positive whole number. "
            "Fix or remove it, then restart the kernel."
        )
    wanted = int(user_value) if user_value is not None else n_cpu_devices

    import jax

    if backend_started():
        have = len(jax.devices("cpu"))
        if n_cpu_devices in (have, _requested):
            return have
        raise DeviceSetupError(
            f"The JAX backend already started with {have} CPU device(s); "
            f"asking for {n_cpu_devices} now has no effect. {RESTART_HINT}"
        )
    _requested = n_cpu_devices
    if user_value is None and _flag_value(flags, CPU_COUNT_FLAG) is None:
        os.environ["XLA_FLAGS"] = (flags + f" {CPU_COUNT_FLAG}={wanted}").strip()
        _appended = str(wanted)
    try:
        jax.config.update("jax_num_cpu_devices", wanted)
    except RuntimeError as err:  # the backend started in between
        raise DeviceSetupError(f"{err} {RESTART_HINT}") from err
    _snapshot = {name: os.environ.get(name) for name in BACKEND_START_VARIABLES}
    return wanted


def settings_changed_after_start() -> list[str]:
    """Names of backend-start variables changed since :func:`setup_devices`.

    JAX reads them once, when its backend starts; later changes are ignored
    silently. Notebook 01 warns about each name returned.
    """
    if _snapshot is None:
        return []
    return [name for name in BACKEND_START_VARIABLES if os.environ.get(name) != _snapshot.get(name)]


@dataclass(frozen=True)
class DeviceInfo:
    """One device as JAX reports it."""

    id: int
    platform: str
    kind: str
    process_index: int
    memory_bytes: int | None  # bytes_limit from memory_stats(); None if unknown


@dataclass(frozen=True)
class DeviceReport:
    """What JAX sees: versions, backend and devices (notebook 01)."""

    python: str
    jax: str
    jaxlib: str
    optax: str
    backend: str
    process_count: int
    devices: list[DeviceInfo] = field(default_factory=list)
    cpu_device_count: int = 0

    @property
    def device_count(self) -> int:
        return len(self.devices)

    @property
    def device_kind(self) -> str:
        kinds = sorted({d.kind for d in self.devices})
        return ", ".join(kinds)


def _device_info(device) -> DeviceInfo:
    memory = None
    try:
        stats = device.memory_stats()
        if stats:
            memory = stats.get("bytes_limit")
    except Exception:  # CPU and some plugins do not report memory
        memory = None
    return DeviceInfo(
        id=device.id,
        platform=device.platform,
        kind=device.device_kind,
        process_index=device.process_index,
        memory_bytes=memory,
    )


def device_report() -> DeviceReport:
    """Collect versions, the default backend and its devices (starts the backend)."""
    import jax
    import jaxlib
    import optax

    return DeviceReport(
        python=sys.version.split()[0],
        jax=jax.__version__,
        jaxlib=jaxlib.__version__,
        optax=optax.__version__,
        backend=jax.default_backend(),
        process_count=jax.process_count(),
        devices=[_device_info(d) for d in jax.devices()],
        cpu_device_count=len(jax.devices("cpu")),
    )


@dataclass(frozen=True)
class LessonDevices:
    """Devices a multi-device lesson runs on, and how to label its results."""

    devices: list
    simulated: bool
    label: str

    @property
    def count(self) -> int:
        return len(self.devices)


def lesson_devices(min_devices: int = 2):
    """Choose the devices for a multi-device lesson.

    The default backend's devices when there are at least ``min_devices`` of
    them (GPUs on a multi-GPU node); otherwise the simulated CPU devices,
    labelled as such (one GPU, or a laptop).

    Returns:
        :class:`LessonDevices` with the devices, whether they are simulated,
        and a label for tables.

    Raises:
        DeviceSetupError: fewer than ``min_devices`` devices on both the
            default backend and the CPU; the message says how to get
            simulated devices.
    """
    import jax

    default = jax.devices()
    if len(default) >= min_devices:
        simulated = default[0].platform == "cpu"
        return LessonDevices(default, simulated, _label(default, simulated))
    cpu = jax.devices("cpu")
    if len(cpu) >= min_devices:
        return LessonDevices(cpu, True, _label(cpu, True))
    user_count = _flag_value(os.environ.get("XLA_FLAGS", ""), CPU_COUNT_FLAG)
    if user_count is not None and user_count != _appended:
        hint = (
            f"Your XLA_FLAGS sets {CPU_COUNT_FLAG}={user_count}, which wins over the notebook's "
            f"setting: raise it to at least {min_devices} or remove it, then restart the kernel."
        )
    else:
        hint = SIMULATED_DEVICES_HINT
    raise DeviceSetupError(
        f"This lesson needs at least {min_devices} devices; JAX sees "
        f"{len(default)} {default[0].platform} device(s) on its default backend and {len(cpu)} CPU "
        f"device(s). {hint}"
    )


def _label(devices: list, simulated: bool) -> str:
    kind = devices[0].device_kind
    if simulated:
        return f"{len(devices)} simulated CPU devices (share the same cores)"
    return f"{len(devices)} x {kind}"


def gpu_topology(timeout_s: float = 10.0) -> str | None:
    """Output of ``nvidia-smi topo -m``, or None where nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def probe_backend(timeout_s: float = 120.0) -> str:
    """JAX's default backend name, asked in a subprocess (this process stays JAX-free).

    The course runner uses it to pick the automatic profile without holding
    GPU memory that the notebook kernels need. GPU memory preallocation is
    switched off in the probe.

    Raises:
        RuntimeError: the probe failed (the message holds its stderr).
    """
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    out = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.default_backend())"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"Could not start JAX to find its backend:\n{out.stderr.strip()[-2000:]}")
    return out.stdout.strip().splitlines()[-1]
