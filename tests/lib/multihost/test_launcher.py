"""dpcourse.multihost.launcher: several local processes reach the single-process result, and every failure is clear and bounded.

The slow tests start real worker processes (``python -m dpcourse.multihost.distributed
worker``), 2 x 4 simulated CPU devices joined by JAX's distributed runtime
over gloo, as notebook 08 does. Each one is bounded twice: by the
launcher's own time limit and by pytest-timeout. After every failure the
test checks that no process the launcher started is still alive.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from dpcourse import train
from dpcourse.multihost import distributed, failures, launcher, ports, worker
from dpcourse.train import max_abs_diff

PROFILE = "smoke"
STEPS = 3
# Synthetic data, always: no network access, and the same bytes in every process.
SOURCE = "synthetic"
# Same tolerance and reason as notebook 08: float32 sums in another order
# (gloo between processes vs XLA in one process) differ by about 1e-7; a
# process training on the wrong rows moves weights by about 2 x lr = 6e-4.
MULTIHOST_TOL = 1e-5
# A failing run must end well within this (seconds), init timeout included: far below the launcher's
# own time limit (LIMIT_S), so a run that ends within it was stopped by the failure it detected, not by
# the limit. Most of it is two JAX imports, 5 s on a quiet 2-core machine and over 20 s on a loaded one.
BOUND_S = 60
LIMIT_S = 150


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _our_workers() -> list[int]:
    """Worker processes that this test process started and that still exist (Linux /proc)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and "dpcourse.multihost.worker" in cmdline:
            found.append(int(entry.name))
    return found


def assert_every_process_ended(err: launcher.LaunchError) -> None:
    assert err.exit_codes and all(code is not None for code in err.exit_codes.values()), err.exit_codes
    assert not [pid for pid in err.pids.values() if _alive(pid)], "a worker outlived the launcher"
    if Path("/proc").is_dir():
        assert _our_workers() == []


# ---------------------------------------------------------------------------
# Fast checks: no process started
# ---------------------------------------------------------------------------


def test_worker_env_sets_its_own_devices_and_keeps_other_flags():
    base = {
        "XLA_FLAGS": "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=8",
        "JAX_NUM_CPU_DEVICES": "8",
        "DPCOURSE_RESULTS": "/tmp/records.jsonl",
        "PATH": "/usr/bin",
    }
    env = launcher.worker_env(1, 2, "127.0.0.1:5000", 20, base=base)
    assert env["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
    assert "JAX_NUM_CPU_DEVICES" not in env and "DPCOURSE_RESULTS" not in env
    assert (env["DPCOURSE_COORDINATOR"], env["DPCOURSE_NUM_PROCESSES"], env["DPCOURSE_PROCESS_ID"]) == (
        "127.0.0.1:5000",
        "2",
        "1",
    )
    assert env["JAX_PLATFORMS"] == "cpu" and env["JAX_COORDINATOR_BIND_ADDRESS"] == "127.0.0.1:5000"


def test_port_taken_is_refused_before_anything_starts():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(distributed.CoordinatorPortInUse, match=f"port {port} on 127.0.0.1 is already in use"):
            launcher.launch_local(2, 4, profile=PROFILE, port=port)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_a_host_without_tcp_is_refused_in_one_sentence_before_any_process_starts(monkeypatch, no_internet_sockets):
    import subprocess

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started on a host without TCP")

    no_internet_sockets()
    monkeypatch.setattr(subprocess, "Popen", no_process)
    with pytest.raises(ports.TcpUnavailable, match=r"^This machine lets no process open a TCP socket.*\[Errno 97\]"):
        launcher.launch_local(2, 2, profile="smoke", steps=1)


def test_a_host_that_is_not_local_is_refused_before_any_process_starts():
    """The port checks themselves are in tests/lib/multihost/test_ports.py; here the launcher passes their errors on."""
    port = launcher.free_port("127.0.0.1")
    for host in ("192.0.2.1", "no-such-host.invalid"):  # TEST-NET-1: never a local address
        with pytest.raises(distributed.DistributedSetupError) as info:
            launcher.launch_local(2, 2, profile=PROFILE, host=host, port=port)
        assert not isinstance(info.value, distributed.CoordinatorPortInUse)


def test_ipv6_host_without_ipv6_is_refused_clearly(no_ipv6):
    """Where IPv6 is switched off, binding ::1 fails with EADDRNOTAVAIL: a clear error, not "in use"."""
    for port in (None, 8476):
        with pytest.raises(distributed.DistributedSetupError, match="IPv6 may be switched off") as info:
            launcher.launch_local(2, 2, profile=PROFILE, host="::1", port=port)
        assert not isinstance(info.value, distributed.CoordinatorPortInUse)


def test_indivisible_global_batch_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="Global batch 60 does not divide evenly over 8 devices.*56 or 64"):
        launcher.launch_local(2, 4, profile=PROFILE, global_batch=60)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(process_ids=[0, 0]), "distinct"),
        (dict(process_ids=[2]), "distinct ids in 0..1"),
        (dict(init_timeout_s=30, timeout_s=10), "must be below timeout_s"),
        (dict(n_processes=0), "n_processes >= 1"),
        (dict(steps=0), "steps must be >= 1"),
        (dict(init_timeout_s=-1), "init_timeout_s must be >= 1"),
        (dict(timeout_s=0), "timeout_s positive"),
        (dict(port=99999), "port must be in 1..65535"),
        (dict(port=0), "port must be in 1..65535"),
        (dict(fail_process=2), r"never fail this run of steps=3 .* fail_process=1, fail_at_step=2\.$"),
        (dict(fail_process=1, fail_at_step=3), "never fail this run"),
        (dict(fail_at_step=1), "never fail this run"),
        (dict(save_every=2), "save_every=2 saves nothing: give a checkpoint_dir"),
        # Every save failed inside Orbax with "one shard each", at every step: refused before anything starts.
        (dict(devices_per_process=1, checkpoint_dir="ckpt"), "2 processes with one device each cannot save"),
        (dict(n_processes=4, devices_per_process=1, checkpoint_dir="ckpt"), "4 processes with one device each"),
    ],
)
def test_bad_launch_arguments_are_refused(kwargs, fragment):
    args = dict(n_processes=2, devices_per_process=4, profile=PROFILE)
    args.update(kwargs)
    with pytest.raises(ValueError, match=fragment):
        launcher.launch_local(**args)


# ---------------------------------------------------------------------------
# Real processes
# ---------------------------------------------------------------------------


def _listening_ports(pid: int) -> list[int]:
    """TCP ports that process ``pid`` listens on, read from its own network's /proc tables (its sockets' inodes)."""
    try:
        inodes = {os.readlink(f).removeprefix("socket:[").rstrip("]") for f in Path(f"/proc/{pid}/fd").iterdir()}
    except OSError:
        return []
    found = []
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        found += [
            int(r.split()[1].rsplit(":", 1)[1], 16) for r in rows if r.split()[3] == "0A" and r.split()[9] in inodes
        ]
    return found


def _probe_while_running(launch, deadline_s: float, other_user) -> dict:
    """Run ``launch`` in a thread; once its coordinator and gloo listen, another user tries to reach them."""
    import glob
    import threading

    box, started = {}, time.time()
    worker = threading.Thread(target=lambda: box.setdefault("run", launch()), daemon=True)
    worker.start()
    probe = {"skipped": "the run ended before its coordinator and gloo could be probed"}
    while worker.is_alive() and time.time() - started < deadline_s:
        sockets = [
            p
            for p in glob.glob(os.path.join(ports.run_parent(), "dpcourse-multihost-*", "coordinator.sock"))
            if os.stat(p).st_mtime >= started - 1
        ]
        listening = {pid: _listening_ports(pid) for pid in _our_workers()}
        ports_seen = sorted({port for found in listening.values() for port in found})
        if sockets and len(listening) == 2 and all(listening.values()):
            probe = {"socket": sockets[0], "ports": ports_seen, **other_user(sockets[0], ports_seen)}
            break
        time.sleep(0.1)
    worker.join(LIMIT_S)
    probe["run"] = box.get("run")
    return probe


@pytest.fixture(scope="module")
def two_process_run(other_user, tmp_path_factory):
    """The run, started as a learner whose $TMPDIR's name a URI and a shell read specially (ports.run_folder)."""
    import tempfile

    start = time.perf_counter()
    odd = str(tmp_path_factory.mktemp("a %41?#: \u00e9"))

    def launch():
        return launcher.launch_local(2, 4, profile=PROFILE, steps=STEPS, data_source=SOURCE, timeout_s=LIMIT_S)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", odd)
        patch.setattr(tempfile, "tempdir", odd)
        if os.geteuid() == 0 and hasattr(os, "fork"):  # root can be another user: the room's learner B
            probe = _probe_while_running(launch, LIMIT_S, other_user)
            run = probe.pop("run")
            assert run is not None, "the run did not finish (its error is in the thread's output above)"
        else:
            run, probe = launch(), {"skipped": "only root can act as another user (make test runs as root in CI)"}
    run.other_user_probe = probe
    print(
        f"\n2 processes x 4 CPU devices ({PROFILE}, {STEPS} steps): {run.wall_s:.1f} s launcher wall time, "
        f"{time.perf_counter() - start:.1f} s in total; another user's probe: {probe}"
    )
    return run


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(300)
def test_another_user_cannot_reach_the_run_s_coordinator_or_its_gloo_ports(two_process_run):
    """Learner B of a shared room, during learner A's lesson-08 run: the coordinator refuses B, gloo is out of reach.

    The coordinator's Unix-domain socket lies in a folder of A's that only A may enter (mode 0700), so B's
    connect fails with EACCES before a byte is sent: B cannot join, read the key-value store or end the run.
    Gloo listens on loopback inside the run's own network namespace, where the machine allows one: B's
    connect to those ports reaches nothing. Without one (``shared_network`` says why), B can connect to
    gloo's ports; docs/instructor.md says what that allows.
    """
    run = two_process_run
    coordinator = run.env[0]["DPCOURSE_COORDINATOR"]
    assert coordinator.startswith("unix:") and run.env[0]["DPCOURSE_COLLECTIVES_HOST"] == "127.0.0.1"
    probe = run.other_user_probe
    if "skipped" in probe:
        pytest.skip(probe["skipped"])
    assert probe["socket"] == coordinator.removeprefix("unix:")
    assert probe["coordinator"] == "PermissionError", probe
    assert probe["ports"], "the probe found no gloo port to try"
    if run.shared_network is None:
        assert set(probe["gloo"].values()) == {"ConnectionRefusedError"}, probe
    else:
        assert set(probe["gloo"].values()) == {"connected"}, (run.shared_network, probe)
    assert run.summary["replicas_agree"]


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(300)
def test_two_processes_reach_the_single_process_parameters(two_process_run, cpu_devices):
    run = two_process_run
    reference, losses, first_moment = worker.single_process_reference(PROFILE, STEPS, cpu_devices, SOURCE)
    assert max_abs_diff(reference, run.params) < MULTIHOST_TOL
    # AdamW's update hides a gradient off by a factor; its first moment shows it.
    assert distributed.relative_diff(first_moment, run.first_moment) < train.GRAD_REL_TOL
    # Losses are means over the same global batch: they agree to float32 rounding.
    np.testing.assert_allclose(run.summary["losses"], losses, rtol=1e-5)
    assert run.summary["num_processes"] == 2 and run.summary["global_devices"] == 8
    assert run.summary["replicas_agree"] is True
    assert not _our_workers()


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(300)
def test_each_process_loads_only_its_half_and_only_process_0_prints(two_process_run):
    run = two_process_run
    global_batch = run.summary["global_batch"]
    layout = sorted(run.summary["layout"], key=lambda r: r["process"])
    assert [r["rows"] for r in layout] == [[0, global_batch // 2], [global_batch // 2, global_batch]]
    assert all(len(r["devices"]) == 4 for r in layout)
    assert "replicas agree: yes" in run.stdout[0]
    assert run.stdout[1] == ""  # not even Gloo's connection notices, which go to stderr
    assert "[Gloo]" not in run.stdout[0]
    for i in (0, 1):
        assert f"[process {i}/2] 4 local of 8 global devices" in run.stderr[i]


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(200)
def test_a_worker_that_dies_is_named_and_every_process_ends():
    start = time.perf_counter()
    with pytest.raises(launcher.WorkerFailed) as info:
        launcher.launch_local(2, 4, profile=PROFILE, data_source=SOURCE, fail_process=1, timeout_s=LIMIT_S)
    err = info.value
    assert time.perf_counter() - start < BOUND_S
    assert err.process_id == 1 and err.exit_codes[1] == distributed.WORKER_FAILURE_EXIT
    assert "Worker process 1 of 2 failed" in str(err) and "injected failure" in str(err)
    # Process 0 was waiting in the all-reduce for process 1: the launcher ended it.
    assert err.exit_codes[0] != 0
    assert_every_process_ended(err)


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(200)
def test_port_taken_after_the_check_is_reported_by_process_0():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(launcher.WorkerFailed) as info:
            launcher.launch_local(
                2, 4, profile=PROFILE, data_source=SOURCE, port=port, check_port=False, timeout_s=LIMIT_S
            )
    err = info.value
    assert err.process_id == 0 and "already in use" in str(err) and err.port_in_use
    assert_every_process_ended(err)


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(300)
def test_a_picked_port_taken_before_process_0_listens_is_picked_again(monkeypatch):
    """free_port's port is free when picked; another program may bind it in the seconds before process 0 does."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        picks = [taken]
        real_free_port = launcher.free_port

        def free_port(host="127.0.0.1"):
            picks.append(real_free_port(host))
            return picks.pop(0)

        monkeypatch.setattr(launcher, "free_port", free_port)
        run = launcher.launch_local(2, 2, profile=PROFILE, steps=1, data_source=SOURCE, timeout_s=LIMIT_S)
    assert run.port != taken and run.summary["num_processes"] == 2


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(200)
def test_process_count_mismatch_fails_in_bounded_time():
    start = time.perf_counter()
    with pytest.raises(launcher.WorkerFailed) as info:
        launcher.launch_local(
            2, 4, profile=PROFILE, data_source=SOURCE, num_processes=3, init_timeout_s=3, timeout_s=LIMIT_S
        )
    elapsed = time.perf_counter() - start
    err = info.value
    assert elapsed < BOUND_S, f"a mismatch took {elapsed:.0f} s to fail"
    assert "num_processes=3, but only 2 process(es) were launched" in str(err)
    assert "DEADLINE_EXCEEDED" in str(err)
    assert_every_process_ended(err)


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(200)
def test_unreachable_coordinator_fails_in_bounded_time():
    start = time.perf_counter()
    with pytest.raises(launcher.WorkerFailed) as info:
        # Only process 1 starts: nothing listens where the coordinator should be.
        launcher.launch_local(
            2, 4, profile=PROFILE, data_source=SOURCE, process_ids=[1], init_timeout_s=3, timeout_s=LIMIT_S
        )
    elapsed = time.perf_counter() - start
    err = info.value
    assert elapsed < BOUND_S, f"an unreachable coordinator took {elapsed:.0f} s to fail"
    assert err.process_id == 1 and "could not be reached within 3 s" in str(err)
    assert_every_process_ended(err)


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(200)
def test_the_time_limit_ends_every_process():
    with pytest.raises(launcher.LaunchTimeout) as info:
        launcher.launch_local(2, 4, profile=PROFILE, data_source=SOURCE, timeout_s=1.5, init_timeout_s=1)
    err = info.value
    # The limit counts from when every process has imported JAX; before that, a bound that grows with the
    # machine's load, past which a busy machine is said to be too busy (a re-run will do).
    quiet = "The run was still going at the 2 s limit" in str(err) and "Raise timeout_s" in str(err)
    busy = str(err).startswith("The machine was too busy to start the run") and "a re-run will do" in str(err)
    assert quiet or busy, str(err)
    assert_every_process_ended(err)


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(300)
@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_two_processes_over_ipv6_loopback():
    run = launcher.launch_local(2, 2, profile=PROFILE, steps=2, data_source=SOURCE, host="::1", timeout_s=LIMIT_S)
    assert run.env[0]["DPCOURSE_COORDINATOR"].startswith("unix:") and run.port == 0
    assert run.env[0]["DPCOURSE_COLLECTIVES_HOST"] == "::1"  # gloo's connections go over IPv6 loopback
    assert run.summary["num_processes"] == 2 and run.summary["global_devices"] == 4
    assert run.summary["replicas_agree"] is True


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(200)
def test_command_line_refuses_an_indivisible_batch_before_starting(capsys):
    assert launcher.main(["--processes", "2", "--devices-per-process", "4", "--global-batch", "60"]) == 1
    assert "error: Global batch 60 does not divide evenly over 8 devices" in capsys.readouterr().err


def test_output_tail_drops_gloo_notices_even_when_split_across_lines():
    # Seen in a CI run: gloo's C++ output and Python's interleaved, so the
    # notice's prefix ended one line and its rest began the next.
    text = (
        "[Gloo] Rank 0 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7\n"
        "step 1 done [Gloo] Rank\n"
        "4 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7\n"
        "    @     0x7f00deadbeef  (unknown)\n"
        "loss 2.30\n"
    )
    assert launcher.output_tail(text) == "step 1 done\nloss 2.30"
    assert launcher.output_tail("[Gloo] Rank\n4 is connected to 7 peer ranks.\n") == ""
    # Seen in a CI run: the split fell before the notice's last number, which was left alone on a line.
    split_late = "[Gloo] Rank 1 is connected to 7 peer ranks. Expected number of connected peer ranks is : \n7\n"
    assert launcher.output_tail(split_late) == ""
    assert launcher.output_tail("loss 7\n") == "loss 7"


def _stop_when(index: int, ready) -> None:
    """Patch the launcher's Popen so that worker ``index`` gets SIGSTOP once ``ready(folder)`` holds."""
    import threading

    real = launcher.subprocess.Popen

    def popen(command, *args, **kwargs):
        proc = real(command, *args, **kwargs)
        if kwargs.get("env", {}).get(distributed.PROCESS_ID_ENV) == str(index):
            folder = Path(kwargs["env"][launcher.progress.PROGRESS_ENV]).parent

            def stop():
                deadline = time.monotonic() + LIMIT_S
                while not ready(folder) and time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.05)
                proc.send_signal(signal.SIGSTOP)

            threading.Thread(target=stop, daemon=True).start()
        return proc

    return popen


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "n, index, when",
    [(3, 1, "start-up"), (2, 0, "mid-run")],
)
def test_a_stopped_process_is_named_not_its_victims(monkeypatch, n, index, when):
    def ready(folder):
        if when == "start-up":
            return True
        try:
            return "step" in (folder / f"progress.{index}").read_text()
        except OSError:
            return False

    monkeypatch.setattr(launcher.subprocess, "Popen", _stop_when(index, ready))
    start = time.perf_counter()
    with pytest.raises(launcher.WorkerFailed) as info:
        launcher.launch_local(n, 2, profile=PROFILE, steps=500, data_source=SOURCE, timeout_s=LIMIT_S)
    err = info.value
    assert time.perf_counter() - start < LIMIT_S - 10  # named by its state, not found by the time limit
    assert err.process_id == index, str(err)
    assert str(err).startswith(f"Worker process {index} of {n}") and "is stopped (state T" in str(err)
    assert "kill -CONT" in str(err)
    assert_every_process_ended(err)


def test_a_worker_s_one_sentence_error_is_the_cause_the_launcher_gives():
    stderr = "[process 1/2] loaded rows\n[process 1] error: The checkpoint directory /x cannot be used: /x is a file.\n"
    cause = failures.diagnose(stderr, 1, 1, [0, 1], 2, "127.0.0.1:1", 20)
    assert cause == "Process 1 stopped: The checkpoint directory /x cannot be used: /x is a file."


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(200)
def test_a_file_as_the_checkpoint_folder_ends_every_worker_in_seconds_naming_the_cause(tmp_path):
    # Before, both workers hung in Orbax's thread until the time limit, which advised raising it.
    (tmp_path / "file").write_text("not a folder")
    start = time.monotonic()
    with pytest.raises(launcher.WorkerFailed) as info:
        launcher.launch_local(
            2, 2, profile=PROFILE, data_source=SOURCE, checkpoint_dir=str(tmp_path / "file"), timeout_s=LIMIT_S
        )
    assert time.monotonic() - start < BOUND_S
    assert "stopped: The checkpoint directory" in str(info.value) and "is a file, not a folder" in str(info.value)
    assert "timeout_s" not in str(info.value)
    # The status the GKE Job fails at once on: every retry would be refused the same way.
    assert info.value.exit_codes[info.value.process_id] == distributed.UNUSABLE_CHECKPOINT_EXIT
    assert_every_process_ended(info.value)


def test_a_full_temp_disk_is_said_in_one_sentence_and_starts_nothing(monkeypatch):
    import errno
    import subprocess

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launcher.tempfile, "TemporaryDirectory", full)
    monkeypatch.setattr(subprocess, "Popen", no_process)
    with pytest.raises(launcher.DiskFull, match=r"^The disk that holds .* is full .*run again\.$"):
        launcher.launch_local(2, 2, profile=PROFILE, steps=1)


def test_a_worker_that_ran_out_of_disk_is_said_in_one_sentence():
    """Mid-run, /tmp fills: the worker's traceback is cut short; its last line still says errno 28."""
    stderr = 'Traceback (most recent call last):\n  File "worker.py", line 1\nOSError: [Errno 28] No space left on de'
    cause = failures.diagnose(stderr, 1, 0, [0, 1], 2, "unix:/tmp/x/coordinator.sock", 20)
    assert cause.startswith("The disk that holds the run's files") and cause.endswith("run again.")


def test_an_interrupted_launch_says_every_process_was_ended_and_stops(monkeypatch, capsys):
    def interrupted(*args, **kwargs):  # the stop button, while _run_workers ends its processes on the way out
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "_run_workers", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launcher.launch_local(2, 2, profile=PROFILE, steps=1)
    assert capsys.readouterr().err == "Interrupted: every process this launch started has been ended.\n"
    assert launcher.main(["--processes", "2", "--devices-per-process", "2", "--profile", "smoke"]) == 130
