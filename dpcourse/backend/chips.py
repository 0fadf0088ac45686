"""A host's TPU chips: which process holds them, how many this kernel sees, and what runs where, in one sentence.

One process at a time may open a host's TPU chips. libtpu takes a lock on
``/tmp/libtpu_lockfile`` when it starts; a second process (another
notebook's kernel, a probe, a test's subprocess) then fails with ``ABORTED:
The TPU is already in use by process with pid N. Not attempting to load
libtpu.so in this process.``, or, when libtpu cannot find that process,
``Internal error when accessing libtpu multi-process lockfile``
(xla/stream_executor/tpu/tpu_initialize_util.cc in openxla/xla, which finds
the holder as this module does: a process with ``/dev/accel0`` or
``/dev/vfio/0`` open). :func:`held_message` turns either into one sentence
naming the holder and what to do; :func:`what_runs_where` says in one
sentence where a lesson's one-device and multi-device parts run (notebook 01,
docs/tpu.md).
"""

from __future__ import annotations

import glob
import os
import re

LOCKFILE = "/tmp/libtpu_lockfile"
# The files libtpu looks for in other processes' open files (tpu_initialize_util.cc, GetTpuDriverFile).
CHIP_FILES = ("/dev/accel0", "/dev/vfio/0")
# One file per chip: /dev/accel0.. or /dev/vfio/0.. (the two libtpu looks for, above).
# The variables that give a process a subset of the chips: TPU_VISIBLE_DEVICES and
# TPU_CHIPS_PER_PROCESS_BOUNDS (skye's gist tpu_topology_env_vars.py, a JAX developer's; tpu_initialize_util.cc).
CHIP_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")
_HELD = re.compile(
    r"TPU is already in use by (?:process with pid (?P<pid>\d+)|another process)|libtpu multi-process lockfile"
)


def is_held_error(text: str) -> bool:
    """Whether ``text`` (an exception's message, a process's stderr) is libtpu refusing chips another process holds."""
    return bool(_HELD.search(text or ""))


def _lock_holder(lockfile: str, locks: str) -> int | None:
    """The pid holding a POSIX lock on ``lockfile``, read from ``/proc/locks`` (None where either is unreadable)."""
    try:
        inode = os.stat(lockfile).st_ino
        lines = open(locks).read().splitlines()  # noqa: SIM115 - a short read of a kernel file
    except OSError:
        return None
    for line in lines:  # "1: POSIX  ADVISORY  WRITE 4242 00:2e:1234 0 EOF"
        fields = line.split()
        if len(fields) < 6 or fields[1] != "POSIX" or not fields[4].isdigit() or int(fields[4]) == os.getpid():
            continue
        if fields[5].rsplit(":", 1)[-1] == str(inode):
            return int(fields[4])
    return None


def _fd_holder(proc: str, chip_files: tuple[str, ...]) -> int | None:
    """Another process with one of ``chip_files`` open (only processes of this user can be read)."""
    for entry in sorted(glob.glob(os.path.join(proc, "[0-9]*", "fd", "*"))):
        pid = int(entry.split(os.sep)[-3])
        if pid == os.getpid():
            continue
        try:
            if os.readlink(entry) in chip_files:
                return pid
        except OSError:
            continue
    return None


def command_line(pid: int, proc: str = "/proc") -> str | None:
    """The command line of process ``pid``, or None where it has ended or cannot be read."""
    try:
        raw = open(os.path.join(proc, str(pid), "cmdline"), "rb").read()  # noqa: SIM115
    except OSError:
        return None
    words = [w.decode(errors="replace") for w in raw.split(b"\0") if w]
    return " ".join(words)[:200] or None


def chip_holder(
    text: str = "", lockfile: str = LOCKFILE, proc: str = "/proc", chip_files: tuple[str, ...] = CHIP_FILES
) -> int | None:
    """The pid of the process holding the chips: from libtpu's message, its lock, or the open chip files; else None."""
    match = _HELD.search(text or "")
    if match and match.group("pid"):
        return int(match.group("pid"))
    return _lock_holder(lockfile, os.path.join(proc, "locks")) or _fd_holder(proc, chip_files)


def held_message(text: str, **where) -> str | None:
    """One sentence for a kernel that found the TPU chips held by another process, or None for any other error.

    ``where`` passes :func:`chip_holder`'s paths (tests give stand-ins).
    """
    if not is_held_error(text):
        return None
    pid = chip_holder(text, **where)
    if pid is None:
        who = "another process (libtpu could not name it; `lsof -w /dev/accel0` or `lsof -w /dev/vfio/0` can)"
        end = "end that process"
    else:
        cmd = command_line(pid, where.get("proc", "/proc"))
        who = f"process {pid}" + (f" (`{cmd}`)" if cmd else "")
        end = f"end the process (kill {pid})"
    return (
        f"The TPU chips of this host are held by {who}, and one process at a time can use them: shut down "
        f"that notebook's kernel (Kernel > Shut Down Kernel in JupyterLab) or {end}, then restart this kernel; "
        "or run this kernel on the CPU with JAX_PLATFORMS=cpu, set before Python starts."
    )


def host_chip_count(globs: tuple[str, ...] = CHIP_GLOBS) -> int:
    """TPU chips on this host, counted from their device files (0 on a machine without TPU chips)."""
    for pattern in globs:
        found = glob.glob(pattern)
        if found:
            return len(found)
    return 0


def what_runs_where(
    one_device: str,
    multi_label: str | None,
    multi_simulated: bool,
    seen: int,
    on_host: int,
    why_not: str = "they need 2 or more devices",
) -> str:
    """One sentence: where one-device work and the multi-device lessons run, and chips this kernel does not see.

    Args:
        one_device: the default backend's first device, as ``"1 x TPU v5 lite"``.
        multi_label: the multi-device lessons' devices (:func:`dpcourse.devices.lesson_devices`'s
            label), or None where they cannot run here (``why_not`` says why).
        multi_simulated: whether those are simulated CPU devices.
        seen: the default backend's devices in this kernel.
        on_host: TPU chips on this host (:func:`host_chip_count`; 0 where there are none).
    """
    if multi_label is None:
        multi = f"and the multi-device lessons cannot run here: {why_not}"
    else:
        multi = f"the multi-device lessons on {multi_label}"
        if multi_simulated:
            multi += " (placement and correctness, not speed)"
    sentence = f"One-device work runs on {one_device}{' ' if multi_label is None else ', '}{multi}"
    if on_host > seen:
        sentence += (
            f"; this kernel sees {seen} of this host's {on_host} TPU chips (TPU_VISIBLE_DEVICES or "
            "TPU_CHIPS_PER_PROCESS_BOUNDS limit it, or another process holds the rest: restart the kernel "
            "without them to use every chip)"
        )
    return sentence + "."


def _quiet_tpu_error() -> str | None:
    """The held-chip sentence for a TPU backend that JAX failed to start and recorded without raising, else None.

    JAX 0.10 registers its built-in TPU backend to fail quietly
    (``fail_quietly=True`` in jax/_src/xla_bridge.py): where that one is
    used, a held chip leaves the kernel on the CPU with the error only in
    ``xla_bridge._backend_errors`` (private).
    """
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - no JAX
        return None
    recorded = getattr(xla_bridge, "_backend_errors", {}) or {}
    return held_message(str(recorded.get("tpu", "")))


def describe() -> str:
    """Start JAX (as :func:`dpcourse.devices.start_backend`) and say what runs where in one sentence (notebook 01).

    Raises:
        DeviceSetupError: no backend could start; where another process holds
            the TPU chips, the message names it and what to do (:func:`held_message`).
    """
    import jax

    from dpcourse import devices

    default = devices.start_backend()
    first = default[0]
    quiet = _quiet_tpu_error()
    if quiet and first.platform != "tpu":  # JAX fell back to the CPU without a word
        raise devices.DeviceSetupError(
            f"JAX started on the CPU, not on this host's TPU chips: {quiet[0].lower()}{quiet[1:]}"
        )
    why_not = "they need 2 or more devices"
    try:
        multi = devices.lesson_devices(2)
        label, simulated = multi.label, multi.simulated
    except devices.DeviceSetupError:
        # This kernel started JAX with fewer than 2 CPU devices, but each lesson asks for its own
        # simulated ones before JAX starts (devices.setup_devices): only a count the user fixed in
        # XLA_FLAGS, which wins over the lessons' own, keeps them from it.
        fixed = devices._flag_value(os.environ.get("XLA_FLAGS", ""), devices.CPU_COUNT_FLAG)
        if fixed is not None and fixed != devices._appended and not (fixed.isdigit() and int(fixed) >= 2):
            label, simulated = None, False
            why_not = f"your XLA_FLAGS sets {devices.CPU_COUNT_FLAG}={fixed}; raise it to 2 or more, or remove it"
        else:
            count = len(jax.devices("cpu"))
            label = (
                "simulated CPU devices that each lesson sets up as it starts (placement and correctness, "
                f"not speed; this kernel started JAX with {count})"
            )
            simulated = False  # said in the label already
    on_host = host_chip_count() if first.platform == "tpu" else 0
    return what_runs_where(f"1 x {first.device_kind}", label, simulated, len(default), on_host, why_not)
