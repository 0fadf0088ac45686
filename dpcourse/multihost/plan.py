"""Plan notebook 08's local multi-process run: the process split (one that can save, for 11) and the workers' compilation cache.

The reference run in the notebook's kernel needs as many CPU devices as the
processes hold together, so the split is chosen from the CPU devices the
kernel has (2 x 4 with the course's 8). Worker processes compile the same
step on every launch; JAX's persistent compilation cache
(``jax_compilation_cache_dir``, environment ``JAX_COMPILATION_CACHE_DIR``)
lets later launches load it from disk instead.
"""

from __future__ import annotations

import os
import stat
import tempfile
import warnings
from pathlib import Path

MAX_DEVICES = 8  # the lesson's default: 2 processes x 4 devices
MAX_PROCESSES = 4  # each process starts Python and JAX: more is slow on a laptop
CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


class UnsavableSplit(ValueError):
    """Several processes of one device each were given a checkpoint folder: no save would complete."""

    lasting = True  # every retry fails the same way (the worker exits with 78: a GKE Job fails at once)


def check_savable_split(n_processes: int, local_devices: int, checkpoint_dir) -> None:
    """Refuse a checkpointed run of several processes with one device each, which no save completes.

    Tried with JAX 0.10.2 and orbax-checkpoint 0.12.8 on CPU: 2 x 1 and 4 x 1
    fail every save inside Orbax ("the input arrays must have one shard
    each"), while 2 x 2, 2 x 4 and 4 x 2 save and resume.

    Raises:
        UnsavableSplit: ``checkpoint_dir`` is given, ``n_processes`` > 1 and ``local_devices`` == 1 (a ValueError).
    """
    if checkpoint_dir is not None and n_processes > 1 and local_devices == 1:
        raise UnsavableSplit(
            f"{n_processes} processes with one device each cannot save a checkpoint (every save fails inside "
            'Orbax: "the input arrays must have one shard each"): give each process at least 2 devices '
            "(fewer processes), or run without a checkpoint directory."
        )


def _fix_hint(available: int) -> str:
    suggestion = choose_split(available) if available >= 2 else None
    values = (
        f"set N_PROCESSES = {suggestion[0]} and DEVICES_PER_PROCESS = {suggestion[1]} (or None for both, "
        "to let the notebook choose)"
        if suggestion
        else "restart the kernel with at least 2 CPU devices (dpcourse.devices.setup_devices(8) before any JAX call)"
    )
    return (
        f"This kernel has {available} CPU device(s) for the single-process reference run: {values}, "
        f"or raise the device count (XLA_FLAGS=--xla_force_host_platform_device_count={MAX_DEVICES}) "
        "and restart the kernel."
    )


def choose_split(
    available: int, n_processes: int | None = None, devices_per_process: int | None = None
) -> tuple[int, int]:
    """``(n_processes, devices_per_process)`` for a local multi-process run on ``available`` CPU devices.

    With neither given: the largest device count up to 8 that splits over
    2, 3 or 4 processes (fewest processes first): 8 -> 2 x 4, 6 -> 2 x 3,
    4 -> 2 x 2, 3 -> 3 x 1, 2 -> 2 x 1, 5 -> 2 x 2, 7 -> 2 x 3. With one
    given, the other is the most that fits; with both, they are checked.

    Raises:
        ValueError: fewer than 2 CPU devices, a value < 1, fewer than 2
            processes, or a split needing more devices than ``available``;
            the message says which values to set.
    """
    for name, value in (("n_processes", n_processes), ("devices_per_process", devices_per_process)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}.")
    if n_processes is not None and n_processes < 2:
        raise ValueError(f"A multi-process run needs at least 2 processes, got {n_processes}.")
    if available < 2:
        raise ValueError(f"Need at least 2 CPU devices, have {available}. {_fix_hint(available)}")
    if n_processes is None and devices_per_process is None:
        for used in range(min(available, MAX_DEVICES), 1, -1):
            for processes in range(2, MAX_PROCESSES + 1):
                if used % processes == 0:
                    return processes, used // processes
    if n_processes is None:
        n_processes = available // devices_per_process
        if n_processes < 2:
            raise ValueError(
                f"DEVICES_PER_PROCESS = {devices_per_process} leaves room for {n_processes} process(es) on "
                f"{available} CPU devices. {_fix_hint(available)}"
            )
    if devices_per_process is None:
        devices_per_process = available // n_processes
        if devices_per_process < 1:
            raise ValueError(
                f"N_PROCESSES = {n_processes} is more than {available} CPU devices. {_fix_hint(available)}"
            )
    if n_processes * devices_per_process > available:
        raise ValueError(
            f"N_PROCESSES x DEVICES_PER_PROCESS = {n_processes} x {devices_per_process} = "
            f"{n_processes * devices_per_process} devices, more than the {available} here. {_fix_hint(available)}"
        )
    return n_processes, devices_per_process


def _private_temp_cache() -> Path:
    """A compilation cache folder of this user's in the temp folder, closed to others (mode 0700).

    Compiled programs are loaded and run: a folder another user made (or
    can write) is never used; a fresh one is made instead.
    """
    folder = Path(tempfile.gettempdir()) / f"dpcourse-jax-compilation-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077:
            return folder
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="dpcourse-jax-compilation-"))


def worker_cache_env(cache_dir: str | os.PathLike | None = None, environ: dict | None = None) -> dict[str, str]:
    """Set the persistent compilation cache for worker processes started from ``environ``.

    Workers inherit this process's environment, and JAX reads
    ``JAX_COMPILATION_CACHE_DIR`` when it is imported. The minimum compile
    time to cache (``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``, JAX's
    default 1 s) is set to 0 unless already set, as the lesson's step
    compiles in under a second on CPU. Values the learner set are kept.

    Where the home folder cannot hold the cache (``HOME`` unset, or ``/``, or
    read-only), the cache goes to a folder of this user's in the temp folder
    instead, and a warning says so in one sentence.

    Returns:
        The variables now set (name -> value); ``environ`` (default
        ``os.environ``) is updated in place.

    Raises:
        OSError: the folder the caller or ``JAX_COMPILATION_CACHE_DIR`` named cannot be made (the message names it).
    """
    environ = os.environ if environ is None else environ
    environ.setdefault(MIN_COMPILE_TIME_ENV, "0")
    chosen = cache_dir if cache_dir is not None else environ.get(CACHE_ENV)
    if chosen is not None:
        environ.setdefault(CACHE_ENV, str(chosen))
        try:
            Path(environ[CACHE_ENV]).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise type(err)(
                err.errno,
                f"The compilation cache folder {environ[CACHE_ENV]} cannot be made ({err.strerror}); set "
                f"{CACHE_ENV} to a folder you can write, or unset it",
            ) from None
        return {name: environ[name] for name in (CACHE_ENV, MIN_COMPILE_TIME_ENV)}
    try:
        folder = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
        folder = folder / ".cache" / "dpcourse" / "jax-compilation"
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError, KeyError) as err:
        fallback = _private_temp_cache()
        reason = getattr(err, "strerror", None) or str(err)
        warnings.warn(
            f"The home folder ({environ.get('HOME') or 'HOME unset'}) cannot hold the compilation cache ({reason}): "
            f"it is in {fallback} instead; set HOME or {CACHE_ENV} to a folder you can write to keep it.",
            stacklevel=2,
        )
        folder = fallback
    environ[CACHE_ENV] = str(folder)
    return {name: environ[name] for name in (CACHE_ENV, MIN_COMPILE_TIME_ENV)}
