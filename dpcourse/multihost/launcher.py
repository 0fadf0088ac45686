"""Start N local worker processes of a multi-process JAX run, watch them, and explain how they failed.

The local side of notebook 08: :func:`launch_local` runs
``python -m dpcourse.multihost.worker`` once per process on this machine,
each with its own ``DPCOURSE_*`` environment (:func:`worker_env`) and K
simulated CPU devices, with process 0's coordinator on a Unix-domain socket in
the run's own folder, which no other user of the machine may enter
(:func:`dpcourse.multihost.ports.private_coordinator`), and gloo's connections
on loopback (IPv4, or IPv6 with ``host="::1"``). It bounds the whole run in time, ends
every process it started when one fails, and names the failed process and
the likely cause (:class:`WorkerFailed`, :class:`LaunchTimeout`,
``CoordinatorPortInUse``). ``python -m dpcourse.multihost.launcher`` is its command
line. What each worker runs is :mod:`dpcourse.multihost.worker`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpcourse import devices as _devices
from dpcourse.backend.xlaflags import check_xla_flags
from dpcourse.multihost import heartbeat as progress
from dpcourse.multihost import parent, reaper
from dpcourse.multihost.distributed import (
    COLLECTIVES_HOST_ENV,
    COORDINATOR_ENV,
    INIT_TIMEOUT_ENV,
    JAX_BIND_ENV,
    NUM_PROCESSES_ENV,
    PROCESS_ID_ENV,
    READY_COUNT_ENV,
    READY_DIR_ENV,
    DistributedSetupError,
    format_coordinator_address,
    relative_diff,
)
from dpcourse.multihost.elastic import read_arrays
from dpcourse.multihost.failures import (
    DiskFull,
    busy_note,
    diagnose,
    disk_full_sentence,
    first_cause,
    load_factor,
    output_tail,
    port_taken,
    too_busy_message,
)
from dpcourse.multihost.plan import check_savable_split
from dpcourse.multihost.ports import (
    PrivateNetwork,
    TcpUnavailable,
    check_port_free,
    free_port,
    private_coordinator,
    private_network,
    run_folder,
    tcp_unavailable,
    unix_sockets_available,
)
from dpcourse.multihost.worker import add_run_options, single_process_reference
from dpcourse.train import check_global_batch, max_abs_diff

# A run given a TCP port for its coordinator uses this machine's network, where every user can reach that port.
SHARED_BY_CHOICE = PrivateNetwork(
    reason="its coordinator was given a TCP port, which every user of this machine can reach"
)
# Launches tried with a freshly picked coordinator port when the one picked was taken before process 0 bound it.
PORT_ATTEMPTS = 3


class LaunchError(RuntimeError):
    """A local multi-process launch failed; every process it started has been ended.

    Attributes:
        exit_codes: exit status of every launched process, by process id
            (negative: ended by that signal).
        pids: operating-system process ids, by process id.
        stderr_tails: the last lines of each process's stderr.
        wall_s: seconds from the first start to the end of the last process.
    """

    def __init__(
        self,
        message: str,
        exit_codes: dict[int, int],
        pids: dict[int, int],
        stderr_tails: dict[int, str],
        wall_s: float,
    ):
        super().__init__(message)
        self.exit_codes = exit_codes
        self.pids = pids
        self.stderr_tails = stderr_tails
        self.wall_s = wall_s


class WorkerFailed(LaunchError):
    """A worker process exited with a non-zero status (``process_id`` names it).

    ``port_in_use`` is true when the coordinator could not listen on its port.
    """

    def __init__(self, message: str, process_id: int, port_in_use: bool = False, **kwargs):
        super().__init__(message, **kwargs)
        self.process_id = process_id
        self.port_in_use = port_in_use


class LaunchTimeout(LaunchError):
    """The workers did not all finish within the launcher's time limit."""


@dataclass
class LaunchResult:
    """A finished local multi-process run.

    Attributes:
        wall_s: seconds from starting the first process to the end of the last.
        n_processes: processes launched; devices_per_process: simulated CPU
            devices in each.
        summary: process 0's ``result.json`` (see :func:`train_worker`).
        params: process 0's final parameters, float32 host arrays.
        first_moment: process 0's AdamW first moment after step 1, ``(1 -
            b1) x`` the first gradient (host arrays, shaped like ``params``).
        stdout, stderr: each process's output, by process id.
        env: the ``DPCOURSE_*`` variables each process was given, by process id.
        port: the coordinator's TCP port (0: it listened on a Unix-domain socket, the default).
        shared_network: why the processes shared this machine's loopback with its other users
            (None: they ran in a network of their own, :func:`dpcourse.multihost.ports.private_network`).
    """

    wall_s: float
    n_processes: int
    devices_per_process: int
    summary: dict
    params: dict[str, np.ndarray]
    first_moment: dict[str, np.ndarray] = field(default_factory=dict)
    stdout: dict[int, str] = field(default_factory=dict)
    stderr: dict[int, str] = field(default_factory=dict)
    env: dict[int, dict[str, str]] = field(default_factory=dict)
    port: int = 0
    shared_network: str | None = None


def _strip_cpu_count_flag(flags: str) -> str:
    return " ".join(t for t in flags.split() if not t.startswith(_devices.CPU_COUNT_FLAG + "="))


def worker_env(
    process_id: int,
    num_processes: int,
    coordinator: str,
    init_timeout_s: int,
    base: dict[str, str] | None = None,
    collectives_host: str = "127.0.0.1",
    ready_dir: str | os.PathLike | None = None,
    ready_count: int | None = None,
) -> dict[str, str]:
    """The environment of one local worker process.

    The ``DPCOURSE_*`` variables of the module docstring, the coordinator
    kept where it was given (``unix:`` from :func:`dpcourse.multihost.ports.private_coordinator`: this
    user's only), gloo on ``collectives_host`` (loopback, not the host name's address, which may face the network),
    JAX's SIGTERM handler off, CPU only (local workers share this machine's cores; on
    a GPU workstation they would otherwise all claim the same GPUs), and no
    CPU device count inherited from this process's ``XLA_FLAGS`` (each
    worker sets its own).
    """
    env = dict(os.environ if base is None else base)
    env.update(
        {
            COORDINATOR_ENV: coordinator,
            NUM_PROCESSES_ENV: str(num_processes),
            PROCESS_ID_ENV: str(process_id),
            INIT_TIMEOUT_ENV: str(init_timeout_s),
            COLLECTIVES_HOST_ENV: collectives_host.strip("[]"),
            JAX_BIND_ENV: coordinator,
            "JAX_PLATFORMS": "cpu",
            # JAX's preemption service catches SIGTERM (so that a preempted job can
            # checkpoint first); local workers have nothing to save, and SIGTERM
            # must end them at once.
            "JAX_ENABLE_PREEMPTION_SERVICE": "false",
            "PYTHONUNBUFFERED": "1",
            "XLA_FLAGS": _strip_cpu_count_flag(env.get("XLA_FLAGS", "")),
        }
    )
    env.pop("JAX_NUM_CPU_DEVICES", None)
    env.pop("DPCOURSE_RESULTS", None)  # workers never record into the notebook's results
    if ready_dir is not None and ready_count:  # join only once every process has imported JAX
        env.update({READY_DIR_ENV: str(ready_dir), READY_COUNT_ENV: str(ready_count)})
    return env


def launch_local(
    n_processes: int = 2,
    devices_per_process: int = 4,
    *,
    profile: str | None = None,
    steps: int = 3,
    data_source: str | None = None,
    global_batch: int | None = None,
    num_processes: int | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    timeout_s: float = 120.0,
    init_timeout_s: int = 20,
    fail_process: int | None = None,
    fail_at_step: int | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    save_every: int | None = None,
    process_ids: Sequence[int] | None = None,
    check_port: bool = True,
) -> LaunchResult:
    """Run :func:`train_worker` as ``n_processes`` local processes x ``devices_per_process`` CPU devices.

    Each process is ``python -m dpcourse.multihost.worker`` with its own
    ``DPCOURSE_*`` environment (:func:`worker_env`); process 0 runs the
    coordinator on a Unix-domain socket in the run's own folder (mode 0700:
    no other user of the machine can connect to it), or on ``host:port``
    when a ``port`` is given; collectives between processes use gloo, on ``host``.
    Whatever happens (a worker fails, the time limit passes, an interrupt),
    every process started here is ended before this function returns or
    raises: SIGTERM to its process group, SIGKILL 3 s later.

    Args:
        n_processes: processes to start (>= 1).
        devices_per_process: simulated CPU devices in each (>= 1).
        profile: config profile of the workers (None: ``$DPCOURSE_PROFILE``/automatic).
        steps: training steps.
        data_source: ``"real"``, ``"synthetic"`` or ``"auto"``; pass the source
            of the run you will compare with, so both use the same data.
        global_batch: examples per step over all devices (default:
            ``per_device_batch x n_processes x devices_per_process``).
        num_processes: the process count the workers are told (default
            ``n_processes``; another value shows what a mismatch does).
        port: a TCP port for the coordinator on ``host`` (any user of the machine can
            connect to it, and the run shares the machine's network). None (default): a Unix-domain socket only this user can reach;
            where the platform has none, a free TCP port, picked again, up to
            :data:`PORT_ATTEMPTS` launches in all, when another program takes it before
            process 0 listens on it.
        host: the loopback address gloo listens on (and a TCP coordinator): ``127.0.0.1``
            (default) or ``::1`` (IPv6, with or without brackets).
        timeout_s: limit for the whole run, in seconds (for each launch, when a picked port was taken).
        init_timeout_s: how long each worker waits for the coordinator and the
            others to join (``initialization_timeout``); below ``timeout_s``.
        fail_process: make this process exit with an error right after it
            joined (to see how failures are handled), or at ``fail_at_step``.
        checkpoint_dir, save_every: resume from and save to this folder
            (notebook 11; see :func:`dpcourse.multihost.worker.train_worker`).
        process_ids: ids of the processes to start (default ``0 ..
            n_processes - 1``); leaving out 0 shows an unreachable coordinator.
        check_port: check that the port is free before launching.

    Returns:
        A :class:`LaunchResult`.

    Raises:
        XlaFlagsError: ``XLA_FLAGS`` holds a token XLA would end the workers on (a ValueError).
        ValueError: counts or ``steps`` < 1, ``init_timeout_s`` < 1 or >= ``timeout_s``, a ``port``
            outside 1..65535, a failure or saves the run would never make, process ids
            outside ``0 .. num_processes - 1`` or repeated, several processes of one device
            each with a ``checkpoint_dir`` (no save completes then), or a global
            batch that does not divide by ``n_processes x devices_per_process``
            (checked before anything starts).
        CoordinatorPortInUse: ``port`` is taken (checked before anything starts).
        DistributedSetupError: ``host`` is not an address of this machine
            (``::1`` where IPv6 is off, say).
        TcpUnavailable: this machine lets no process open a TCP socket (a
            DistributedSetupError; checked before anything starts).
        WorkerFailed: a worker exited with an error; the message names it,
            gives the likely cause and the tail of its stderr.
        LaunchTimeout: the run did not finish within ``timeout_s``.
        DiskFull: the disk of the temp folder filled up (a RuntimeError, said in one sentence).
    """
    if n_processes < 1 or devices_per_process < 1:
        raise ValueError(
            f"Need n_processes >= 1 and devices_per_process >= 1, got {n_processes} and {devices_per_process}."
        )
    num_processes = n_processes if num_processes is None else num_processes
    launched = list(range(n_processes)) if process_ids is None else [int(i) for i in process_ids]
    if len(set(launched)) != len(launched) or not launched or not all(0 <= i < num_processes for i in launched):
        raise ValueError(
            f"process_ids {launched} must be distinct ids in 0..{num_processes - 1} (num_processes={num_processes})."
        )
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    if not init_timeout_s >= 1 or not timeout_s > 0:  # `not >=` also refuses NaN
        raise ValueError(
            f"init_timeout_s must be >= 1 second and timeout_s positive, got {init_timeout_s} and {timeout_s}."
        )
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535 (or None: a free one), got {port}.")
    if init_timeout_s >= timeout_s:
        raise ValueError(
            f"init_timeout_s ({init_timeout_s}) must be below timeout_s ({timeout_s}) so that a "
            "worker waiting for the others gives up before the launcher does."
        )
    if (fail_process is not None and fail_process not in launched) or (
        fail_at_step is not None and (fail_process is None or not 0 <= fail_at_step < steps)
    ):
        raise ValueError(
            f"fail_process={fail_process} and fail_at_step={fail_at_step} never fail this run of steps={steps} and "
            f"processes {launched}: give a launched process and no step, or a step below steps, for example "
            f"fail_process={launched[-1]}, fail_at_step={steps - 1}."
        )
    if save_every is not None and (checkpoint_dir is None or not save_every >= 1):
        raise ValueError(f"save_every={save_every} saves nothing: give a checkpoint_dir and 1 or more steps.")
    if global_batch is not None:
        check_global_batch(global_batch, n_processes * devices_per_process)
    check_savable_split(num_processes, devices_per_process, checkpoint_dir)
    # The workers inherit XLA_FLAGS (less the device count): a bad token would end every one of them.
    check_xla_flags(_strip_cpu_count_flag(os.environ.get("XLA_FLAGS", "")))
    private = port is None and unix_sockets_available()
    picked = port is None and not private
    reason = tcp_unavailable(host)
    if reason:
        raise TcpUnavailable(reason)
    if port is not None and check_port:
        check_port_free(host, port)
    command = [
        sys.executable,
        "-m",
        "dpcourse.multihost.worker",
        "--steps",
        str(steps),
        "--cpu-devices",
        str(devices_per_process),
    ]
    for flag, value in (
        ("--profile", profile),
        ("--data-source", data_source),
        ("--global-batch", global_batch),
        ("--fail-process", fail_process),
        ("--fail-at-step", fail_at_step),
        ("--checkpoint-dir", checkpoint_dir),
        ("--save-every", save_every),
    ):
        if value is not None:
            command += [flag, str(value)]

    for attempt in range(1, PORT_ATTEMPTS + 1):
        run_port = None if private else free_port(host) if picked else port
        try:
            return _run_workers(
                command, host, run_port, launched, num_processes, devices_per_process, init_timeout_s, timeout_s
            )
        except KeyboardInterrupt:  # the stop button: every process was ended on the way out
            sys.stderr.write("Interrupted: every process this launch started has been ended.\n")
            raise
        except OSError as err:  # the launcher's own writes and reads in its temp folder
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(disk_full_sentence(tempfile.gettempdir())) from None
            raise
        except WorkerFailed as err:
            # A port picked here is free when picked, but process 0 binds it only after JAX's import
            # (seconds): another program may take it meanwhile. Then pick again; a port the caller
            # chose is theirs to change.
            if not (picked and err.port_in_use and attempt < PORT_ATTEMPTS):
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _run_workers(
    command: list[str],
    host: str,
    port: int | None,
    launched: list[int],
    num_processes: int,
    devices_per_process: int,
    init_timeout_s: int,
    timeout_s: float,
) -> LaunchResult:
    """Start ``command`` once per id in ``launched``, the coordinator on ``host:port`` (None: a Unix-domain
    socket in the run's folder); watch and end them."""
    procs: dict[int, subprocess.Popen] = {}
    envs: dict[int, dict[str, str]] = {}
    with (
        run_folder("dpcourse-multihost-") as tmp,  # mode 0700: this user's only
        private_network() if port is None else contextlib.nullcontext(SHARED_BY_CHOICE) as network,
    ):
        folder = Path(tmp)
        ready = folder / "ready"
        ready.mkdir()
        coordinator = private_coordinator(folder) if port is None else format_coordinator_address(host, port)
        # Closed in the `finally` below, after the workers are gone.
        logs = {i: (open(folder / f"stdout.{i}", "w+"), open(folder / f"stderr.{i}", "w+")) for i in launched}  # noqa: SIM115
        start = time.monotonic()
        failed: tuple[int, int] | None = None
        timed_out, all_ready_at, starting_limit = False, None, timeout_s
        try:
            for i in launched:
                env = worker_env(i, num_processes, coordinator, init_timeout_s, None, host, ready, len(launched))
                env[progress.PROGRESS_ENV] = str(folder / f"progress.{i}")
                env[parent.PARENT_ENV] = str(os.getpid())  # each process ends with this one (a kernel killed)
                said = (COORDINATOR_ENV, COLLECTIVES_HOST_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV, INIT_TIMEOUT_ENV)
                envs[i] = {k: env[k] for k in said}
                out, err = logs[i]
                procs[i] = reaper.start_process(
                    network.prefix + command + ["--out", str(folder / "out")], env, out, err
                )
            started, stuck = time.time(), None
            while True:
                codes = {i: p.poll() for i, p in procs.items()}
                alive = {i for i, c in codes.items() if c is None}
                seen = {i: progress.read(folder / f"progress.{i}", i, procs[i].pid, started) for i in procs}
                stuck = progress.culprit(seen, alive, progress.WATCH_STALE_S)
                bad = [(i, c) for i, c in codes.items() if c not in (None, 0)]
                if bad or (stuck is not None and len(alive) > 1):
                    failed = bad[0] if bad else None
                    break
                if all(c == 0 for c in codes.values()):
                    break
                # The time limit counts from when every process has imported JAX and can report; until then
                # a start-up bound that grows with the machine's load (a busy machine starts Python slowly).
                if all_ready_at is None and len(list(ready.glob("ready.*"))) >= len(launched):
                    all_ready_at = time.monotonic()
                if all_ready_at is None:
                    starting_limit = max(starting_limit, timeout_s * load_factor())
                    timed_out = time.monotonic() - start > starting_limit
                else:
                    timed_out = time.monotonic() - all_ready_at > timeout_s
                if timed_out:
                    break
                time.sleep(0.2)
            stuck = progress.culprit(seen, alive)  # a victim's failure is blamed on the one it waited for
        finally:
            stuck_pids = reaper.end_all(procs)
            wall_s = time.monotonic() - start
            texts = {}
            for i, (out, err) in logs.items():
                out.seek(0)
                err.seek(0)
                texts[i] = (out.read(), err.read())
                out.close()
                err.close()
        exit_codes = {i: p.returncode for i, p in procs.items()}
        pids = {i: p.pid for i, p in procs.items()}
        tails = {i: output_tail(texts[i][1]) for i in texts}
        details = dict(exit_codes=exit_codes, pids=pids, stderr_tails=tails, wall_s=wall_s)
        not_ended = reaper.stuck_message(stuck_pids)
        if stuck is not None and (failed is None or failed[0] != stuck.process_id):
            message = progress.stopped_message(
                stuck, num_processes, wall_s, pids[stuck.process_id], failed and failed[0]
            )
            raise WorkerFailed(
                f"{message}{not_ended}\n--- stderr of process {stuck.process_id} (last lines) ---\n"
                f"{tails[stuck.process_id] or '(empty)'}",
                process_id=stuck.process_id,
                **details,
            )
        if failed is not None:
            failed = first_cause(failed, exit_codes, texts)
            i, code = failed
            cause = diagnose(texts[i][1], code, i, launched, num_processes, coordinator, init_timeout_s)
            raise WorkerFailed(
                f"Worker process {i} of {num_processes} failed (exit status {code}) after {wall_s:.1f} s. {cause} "
                f"Every process was ended (exit statuses {exit_codes}).{not_ended}\n--- stderr of process {i} (last lines) ---\n"
                f"{tails[i] or '(empty)'}",
                process_id=i,
                port_in_use=port_taken(texts[i][1]),
                **details,
            )
        if timed_out:
            ready_n = len(list(ready.glob("ready.*")))
            said = (
                too_busy_message(wall_s, ready_n, len(launched))
                if all_ready_at is None and starting_limit > timeout_s
                else progress.timeout_message(seen, alive, timeout_s, pids) + busy_note()
            )
            raise LaunchTimeout(
                f"{said} Every process was ended (exit statuses "
                f"{exit_codes}).{not_ended}\n"
                + "\n".join(f"--- process {i} ---\n{tails[i] or '(empty)'}" for i in tails),
                **details,
            )
        result_file = folder / "out" / "result.json"
        if not result_file.exists():
            raise WorkerFailed(
                f"Process 0 exited cleanly but wrote no result.json.\n{tails.get(0, '')}", process_id=0, **details
            )
        summary = json.loads(result_file.read_text())
        params, first_moment = (
            read_arrays(folder / "out" / "params.npz"),
            read_arrays(folder / "out" / "first_moment.npz"),
        )
    return LaunchResult(
        wall_s=wall_s,
        n_processes=len(launched),
        devices_per_process=devices_per_process,
        summary=summary,
        params=params,
        first_moment=first_moment,
        stdout={i: t[0] for i, t in texts.items()},
        stderr={i: t[1] for i, t in texts.items()},
        env=envs,
        port=port or 0,
        shared_network=network.reason,
    )


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _launch_main(args: argparse.Namespace) -> int:
    n_devices = args.processes * args.devices_per_process
    result = launch_local(
        args.processes,
        args.devices_per_process,
        host=args.host,
        profile=args.profile,
        steps=args.steps,
        data_source=args.data_source,
        global_batch=args.global_batch,
        port=args.port,
        timeout_s=args.timeout_s,
        init_timeout_s=args.init_timeout_s,
        checkpoint_dir=args.checkpoint_dir,
        save_every=args.save_every,
    )
    print(output_tail(result.stdout[0]))
    print(f"wall time of the {args.processes}-process run: {result.wall_s:.1f} s")
    if args.compare:
        _devices.setup_devices(n_devices)
        import jax

        have = len(jax.devices("cpu"))
        if have < n_devices:
            print(
                f"error: --compare needs {n_devices} CPU devices in this process for the single-process "
                f"reference, but JAX has {have} (XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} wins). "
                "Unset the device count in XLA_FLAGS or raise it.",
                file=sys.stderr,
            )
            return 2
        reference, _, first_moment = single_process_reference(
            args.profile, args.steps, jax.devices("cpu")[:n_devices], result.summary["data_source"], args.global_batch
        )
        print(
            f"max |param diff| vs one process with {n_devices} devices: "
            f"{max_abs_diff(reference, result.params):.3g}; first-step gradients, relative: "
            f"{relative_diff(first_moment, result.first_moment):.3g}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m dpcourse.multihost.launcher [--processes N] [--devices-per-process K] ...``."""
    parser = argparse.ArgumentParser(prog="python -m dpcourse.multihost.launcher", description=__doc__.split("\n")[0])
    add_run_options(parser)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices-per-process", type=int, default=4)
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="a TCP port for the coordinator, open to every user of this machine "
        "(default: a Unix-domain socket only you can reach)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="loopback address for gloo (and a --port): 127.0.0.1 (default) or ::1"
    )
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--init-timeout-s", type=int, default=20)
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also train in this process on the same number of devices and print the difference",
    )
    args = parser.parse_args(argv)
    if args.profile == "auto":
        args.profile = None
    try:
        return _launch_main(args)
    except (LaunchError, DistributedSetupError, DiskFull, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # launch_local said so in one line
        return 130


if __name__ == "__main__":
    sys.exit(main())
