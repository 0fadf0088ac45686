"""Device setup and reporting: what JAX sees.

Taught in notebook 01. Simulated CPU devices must be configured before the
JAX backend starts; once it has started, device settings are ignored, so
this module refuses to pretend they took effect.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

CPU_COUNT_FLAG = "--xla_force_host_platform_device_count"
PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
MEM_FRACTION = "XLA_CLIENT_MEM_FRACTION"
# The older name of MEM_FRACTION; jaxlib still reads it and refuses both at once
# (jaxlib/xla_client.py, generate_pjrt_gpu_plugin_options, JAX 0.10 to 0.12).
OLD_MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
# Environment variables read once, when the backend starts (the GPU ones in
# jaxlib/xla_client.py, generate_pjrt_gpu_plugin_options).
BACKEND_START_VARIABLES = (
    "XLA_FLAGS",
    PREALLOCATE,
    MEM_FRACTION,
    OLD_MEM_FRACTION,
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB",
    "JAX_PLATFORMS",
    "CUDA_VISIBLE_DEVICES",
)
# Environment variables JAX reads when it is imported, with the config option
# each one sets (jax/_src/config.py defines each option's default from them).
IMPORT_TIME_VARIABLES = {"JAX_PLATFORMS": "jax_platforms"}

RESTART_HINT = (
    "Restart the kernel (Kernel > Restart Kernel in JupyterLab) and run "
    "dpcourse.devices.setup_devices() before any other JAX call."
)
SIMULATED_DEVICES_HINT = (
    "To get simulated CPU devices, restart the kernel and call "
    "dpcourse.devices.setup_devices(n_cpu_devices=8) first, or start Python "
    f"with XLA_FLAGS={CPU_COUNT_FLAG}=8."
)
PREALLOCATION_NOTE = (
    f"GPU memory preallocation is off in the course's kernels ({PREALLOCATE}=false, set by "
    "setup_devices), so several notebooks can share a GPU: JAX takes memory as it needs it. "
    f"For a benchmark, turn it back on before the kernel starts: {PREALLOCATE}=true "
    f"(and {MEM_FRACTION}=0.75, the share of GPU memory JAX then takes, if you want another share)."
)

# Environment as it was when the JAX backend started (recorded by the watch
# on xla_bridge.backends), or as last seen before it started.
_snapshot: dict[str, str | None] | None = None
# Whether _snapshot was taken at the moment the backend started.
_snapshot_at_start = False
# The device count this module appended to XLA_FLAGS, if it did.
_appended: str | None = None
# The argument of the call that configured the devices before JAX started.
_requested: int | None = None
# Whether setup_devices switched GPU memory preallocation off.
_preallocation_switched_off = False


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


def _environment() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in BACKEND_START_VARIABLES}


def backend_failure_message(err: BaseException) -> str:
    """What to do when JAX could not start a backend, naming ``JAX_PLATFORMS`` when it is set.

    JAX 0.10 to 0.12 end with a bare ``AssertionError`` when ``JAX_PLATFORMS``
    names only backends this machine lacks (``cuda`` without a visible GPU:
    jax/_src/xla_bridge.py, ``backends()``); this message says what happened.
    Where another process holds this host's TPU chips, the message names it
    (:func:`dpcourse.backend.chips.held_message`).
    """
    from dpcourse.backend.chips import held_message

    held = held_message(str(err))  # another process holds this host's TPU chips
    if held:
        return held
    detail = f"{type(err).__name__}: {err}" if str(err).strip() else "no backend of that kind could start here"
    platforms = os.environ.get("JAX_PLATFORMS")
    if platforms:
        return (
            f"JAX could not start a backend for JAX_PLATFORMS={platforms!r} ({detail}). "
            "Unset JAX_PLATFORMS (JAX then uses what this machine has), set JAX_PLATFORMS=cpu, or make that "
            'backend work here (for NVIDIA GPUs: pip install "jax[cuda12]" and check that nvidia-smi lists '
            "the GPUs). Set it before Python starts, then restart the kernel."
        )
    return (
        f"JAX could not start a backend ({detail}). Check the jax and jaxlib installation; "
        "JAX_PLATFORMS=cpu (set before Python starts) skips a failing GPU plugin."
    )


def _watch_backend_start() -> None:
    """Record the environment at the moment JAX starts its backend, once per process.

    Wraps ``jax._src.xla_bridge.backends`` (private, present in JAX 0.10 to
    0.12; every JAX operation starts the backend through it). The wrapper
    also turns JAX's bare ``AssertionError`` on a failed start into a
    :class:`DeviceSetupError` saying what to do. Without that function
    (a future JAX), the environment last seen before the start is used.
    """
    global _snapshot, _snapshot_at_start
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - future JAX
        return
    original = getattr(xla_bridge, "backends", None)
    if original is None or getattr(original, "_dpcourse_watch", False):
        return
    if backend_started():  # started before dpcourse could watch: now is the best known
        if _snapshot is None:
            _snapshot = _environment()
        return

    def backends():
        global _snapshot, _snapshot_at_start
        if _snapshot_at_start or xla_bridge.backends_are_initialized():
            return original()
        environment = _environment()
        try:
            result = original()
        except AssertionError as err:
            raise DeviceSetupError(backend_failure_message(err)) from err
        _snapshot, _snapshot_at_start = environment, True
        return result

    backends._dpcourse_watch = True
    backends.__wrapped__ = original
    xla_bridge.backends = backends


def _import_time_mismatches(jax) -> list[str]:
    """Variables JAX read at import whose value changed since, each with the value in effect."""
    found = []
    for name, option in IMPORT_TIME_VARIABLES.items():
        wanted = os.environ.get(name)
        try:
            in_effect = getattr(jax.config, option)
        except AttributeError:  # pragma: no cover - future JAX
            continue
        if wanted is not None and (wanted or None) != (in_effect or None):
            found.append(f"{name}={wanted!r} (JAX uses {option}={in_effect!r})")
    return found


def start_backend() -> list:
    """Start JAX's backend if needed and return the default backend's devices.

    Returns:
        ``jax.devices()``.

    Raises:
        DeviceSetupError: no backend could start (for example
            ``JAX_PLATFORMS=cuda`` on a machine without a GPU); the message
            names ``JAX_PLATFORMS`` and the fix.
    """
    import jax

    _watch_backend_start()
    try:
        return jax.devices()
    except DeviceSetupError:
        raise
    except (AssertionError, RuntimeError) as err:
        raise DeviceSetupError(backend_failure_message(err)) from err


def setup_devices(n_cpu_devices: int = 8) -> int:
    """Ask for ``n_cpu_devices`` simulated CPU devices before the backend starts.

    Appends ``--xla_force_host_platform_device_count`` to ``XLA_FLAGS`` (keeping
    every flag already there; a count already set by the user wins) and sets
    ``jax_num_cpu_devices`` to the same count. Only the CPU backend is
    affected: GPUs are used as they are, and the simulated CPU devices stay
    available for lessons that need more devices than there are GPUs.

    Unless ``XLA_PYTHON_CLIENT_PREALLOCATE`` is already set, it is set to
    ``false``: JAX otherwise takes most of a GPU's memory at start (107,927
    MiB of an H200 measured for one course kernel, 561 MiB with it off; issue
    9), and a second open notebook starves. :data:`PREALLOCATION_NOTE` says how
    to turn it back on for a benchmark.

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
            device count (the message says to restart the kernel);
            ``XLA_FLAGS`` holds a device count that is not a positive integer,
            or a token XLA would end the process on (:mod:`dpcourse.backend.xlaflags`:
            which token, and the fix; nothing is appended to it);
            a variable JAX reads at import (``JAX_PLATFORMS``) was changed after
            ``import jax``; or both ``XLA_CLIENT_MEM_FRACTION`` and its old name
            ``XLA_PYTHON_CLIENT_MEM_FRACTION`` are set.
    """
    global _snapshot, _appended, _requested, _preallocation_switched_off
    if isinstance(n_cpu_devices, bool) or not isinstance(n_cpu_devices, int) or n_cpu_devices < 1:
        raise ValueError(f"n_cpu_devices must be an int >= 1, got {n_cpu_devices!r}.")
    flags = os.environ.get("XLA_FLAGS", "")
    if not backend_started():  # a bad token would end the process when the backend starts
        from dpcourse.backend.xlaflags import XlaFlagsError, check_xla_flags

        try:
            check_xla_flags(flags)
        except XlaFlagsError as err:
            raise DeviceSetupError(str(err)) from None
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

    late = _import_time_mismatches(jax)
    if late:
        raise DeviceSetupError(
            f"{', '.join(late)}: JAX reads this variable once, when jax is imported, so the change has no "
            "effect. Set it before importing jax (in the shell that starts Python or Jupyter, or in the "
            f"first cell before any import of jax), or undo the change. {RESTART_HINT}"
        )
    _watch_backend_start()
    if backend_started():
        have = len(jax.devices("cpu"))
        if n_cpu_devices in (have, _requested):
            return have
        raise DeviceSetupError(
            f"The JAX backend already started with {have} CPU device(s); "
            f"asking for {n_cpu_devices} now has no effect. {RESTART_HINT}"
        )
    if os.environ.get(MEM_FRACTION) and os.environ.get(OLD_MEM_FRACTION):
        raise DeviceSetupError(
            f"Both {MEM_FRACTION}={os.environ[MEM_FRACTION]!r} and {OLD_MEM_FRACTION}="
            f"{os.environ[OLD_MEM_FRACTION]!r} are set. {OLD_MEM_FRACTION} is the deprecated name of "
            f"{MEM_FRACTION}, and JAX refuses to start a GPU with both: unset {OLD_MEM_FRACTION} "
            "(keep the value you want in the new name), then restart the kernel."
        )
    if PREALLOCATE not in os.environ:
        os.environ[PREALLOCATE] = "false"
        _preallocation_switched_off = True
    _requested = n_cpu_devices
    if user_value is None and _flag_value(flags, CPU_COUNT_FLAG) is None:
        os.environ["XLA_FLAGS"] = (flags + f" {CPU_COUNT_FLAG}={wanted}").strip()
        _appended = str(wanted)
    try:
        jax.config.update("jax_num_cpu_devices", wanted)
    except RuntimeError as err:  # the backend started in between
        raise DeviceSetupError(f"{err} {RESTART_HINT}") from err
    if not _snapshot_at_start:
        _snapshot = _environment()  # used only where the start itself cannot be watched
    return wanted


def preallocation_switched_off() -> bool:
    """Whether :func:`setup_devices` set ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` in this process."""
    return _preallocation_switched_off


def settings_changed_after_start() -> list[str]:
    """Names of backend-start variables changed since the JAX backend started.

    JAX reads them once, when its backend starts; later changes are ignored
    silently. Changes made before the start (after :func:`setup_devices`
    but before the first JAX operation) took effect and are not reported.
    Every lesson warns about each name returned (:func:`dpcourse.lesson.start_lesson`).

    Returns:
        The names, in :data:`BACKEND_START_VARIABLES` order; empty before the
        backend starts.
    """
    if "jax" not in sys.modules or not backend_started():
        return []
    _watch_backend_start()
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

    start_backend()
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

    default = start_backend()
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
    elif _requested is not None and _requested < min_devices:
        hint = (
            f"This kernel asked for {_requested} simulated CPU device(s) (setup_devices({_requested}); in a "
            f"lesson, N_CPU_DEVICES in its parameters cell): set it to at least {min_devices}, then restart "
            "the kernel and run the notebook again."
        )
    else:
        hint = SIMULATED_DEVICES_HINT
    raise DeviceSetupError(
        f"This lesson needs at least {min_devices} devices; JAX sees "
        f"{len(default)} {default[0].platform} device(s) on its default backend and {len(cpu)} CPU "
        f"device(s). {hint}"
    )


def keep_arrays_on(devices: list):
    """Make ``devices[0]`` JAX's default device where the default backend's first device is not among ``devices``.

    On a host with one GPU or one TPU chip, a multi-device lesson runs on
    simulated CPU devices (:func:`lesson_devices`), but JAX puts an array made
    without a device (``jnp.asarray``, a jitted function of NumPy arrays,
    Optax's step count) on the default backend's device: the accelerator. Such
    an array then sits outside the lesson's mesh, is computed in the
    accelerator's numerics, and is missing from the lesson's per-device memory
    and checkpoints. Setting ``jax_default_device`` keeps it on the lesson's
    first device. ``jax.devices()`` and ``jax.default_backend()`` still name
    the accelerator; ``with jax.default_device(devices[0]):`` does the same
    for one block of code.

    Returns:
        The device made the default, or None where the default backend's
        first device is one of ``devices`` (a CPU-only host, several GPUs or
        chips) and nothing changed.
    """
    import jax

    first = start_backend()[0]
    if any(device is first for device in devices):
        return None
    jax.config.update("jax_default_device", devices[0])
    return devices[0]


def _label(devices: list, simulated: bool) -> str:
    kind = devices[0].device_kind
    if simulated:
        return f"{len(devices)} simulated CPU devices"  # the start banner says they share the cores, once
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
    switched off in the probe, and the probe starts JAX as the lessons do
    (:func:`start_backend`), so a backend that cannot start gives the
    course's one-line message.

    Raises:
        DeviceSetupError: no backend could start (for example
            ``JAX_PLATFORMS=cuda`` without a GPU); the message names the
            setting and the fix, without JAX's traceback.
        RuntimeError: the probe failed otherwise (the message holds its stderr).
    """
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    code = "import jax\nfrom dpcourse.devices import start_backend\nstart_backend()\nprint(jax.default_backend())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
    if out.returncode != 0:
        from dpcourse.backend.xlaflags import describe_abort

        flags = describe_abort(out.stderr)
        if flags:
            raise DeviceSetupError(flags)
        marker = "DeviceSetupError: "
        last = [line for line in out.stderr.splitlines() if marker in line]
        if last:
            raise DeviceSetupError(last[-1].split(marker, 1)[1].strip())
        raise RuntimeError(f"Could not start JAX to find its backend:\n{out.stderr.strip()[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def outside_mesh():
    """Run the enclosed one-device work with no mesh in context, then restore the mesh.

    Notebook 03 teaches that ``jax.set_mesh(mesh)`` may also be called
    without ``with``: the mesh is then global, and every later ``jax.jit``
    call checks its arguments against it, so a step on one device's arrays
    fails with ``ValueError: Received incompatible devices for jitted
    computation ... context mesh with device ids [0..7]`` (JAX 0.10.2 and
    0.12.0.1). The course's one-device helpers
    (:func:`dpcourse.placement.place_single_device`, a one-device
    :func:`dpcourse.bench.benchmark`) run inside this context;
    ``with jax.set_mesh(None):`` clears the mesh in JAX 0.10 to 0.12.
    """
    import jax

    if jax.sharding.get_abstract_mesh().empty:
        yield
        return
    with jax.set_mesh(None):
        yield
