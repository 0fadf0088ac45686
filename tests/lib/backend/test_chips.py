"""Tests of dpcourse.backend.chips: the holder of a host's TPU chips named in one sentence; what runs where."""

from __future__ import annotations

import os

import pytest

from dpcourse import devices
from dpcourse.backend import chips

ABORTED = (
    "Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with pid 4242. "
    "Not attempting to load libtpu.so in this process."
)
# What a second program got on a one-chip host here (libtpu could not find the holder).
LOCKFILE_ERROR = (
    "Unable to initialize backend 'tpu': ABORTED: Internal error when accessing libtpu multi-process lockfile. "
    'Run "$ sudo rm /tmp/libtpu_lockfile".'
)


def _fake_proc(tmp_path, pid=4242, cmdline=b"python\0-m\0ipykernel_launcher\0-f\0kernel-1.json\0"):
    proc = tmp_path / "proc"
    (proc / str(pid) / "fd").mkdir(parents=True)
    (proc / str(pid) / "cmdline").write_bytes(cmdline)
    return proc


def test_the_holder_named_by_libtpu_is_given_with_its_command_line(tmp_path):
    proc = _fake_proc(tmp_path)
    said = chips.held_message(ABORTED, proc=str(proc), lockfile=str(tmp_path / "none"))
    assert said.startswith(
        "The TPU chips of this host are held by process 4242 (`python -m ipykernel_launcher -f kernel-1.json`), "
        "and one process at a time can use them: shut down that notebook's kernel"
    )
    assert "kill 4242" in said and said.endswith("JAX_PLATFORMS=cpu, set before Python starts.")
    assert "\n" not in said


def test_without_a_pid_the_holder_is_found_from_the_lock(tmp_path):
    proc = _fake_proc(tmp_path, pid=777, cmdline=b"python\0other.py\0")
    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.write_text("")
    inode = os.stat(lockfile).st_ino
    (proc / "locks").write_text(
        f"1: FLOCK  ADVISORY  WRITE 12 00:2e:999 0 EOF\n2: POSIX  ADVISORY  WRITE 777 08:01:{inode} 0 EOF\n"
    )
    said = chips.held_message(LOCKFILE_ERROR, proc=str(proc), lockfile=str(lockfile))
    assert "held by process 777 (`python other.py`)" in said


def test_without_a_pid_or_lock_the_holder_is_found_from_its_open_chip_file(tmp_path):
    proc = _fake_proc(tmp_path, pid=31)
    os.symlink("/dev/vfio/0", proc / "31" / "fd" / "7")
    said = chips.held_message(LOCKFILE_ERROR, proc=str(proc), lockfile=str(tmp_path / "none"))
    assert "held by process 31 (" in said


def test_a_holder_that_cannot_be_found_is_said_so(tmp_path):
    said = chips.held_message(LOCKFILE_ERROR, proc=str(tmp_path), lockfile=str(tmp_path / "none"))
    assert "held by another process (libtpu could not name it; `lsof -w /dev/accel0`" in said
    assert "end that process" in said and "\n" not in said


def test_other_errors_are_not_called_held():
    assert chips.held_message("RuntimeError: Unable to initialize backend 'cuda': no GPU") is None


def test_a_kernel_that_finds_the_chips_held_stops_with_that_sentence():
    """start_backend's error (DeviceSetupError) is the sentence, for a lesson's or 01's first JAX cell."""
    said = devices.backend_failure_message(RuntimeError(ABORTED))
    assert said.startswith("The TPU chips of this host are held by process 4242")


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ("1 x TPU v5 lite", "8 simulated CPU devices", True, 1, 1),
            "One-device work runs on 1 x TPU v5 lite, the multi-device lessons on 8 simulated CPU devices "
            "(placement and correctness, not speed).",
        ),
        (
            ("1 x TPU v5 lite", "8 x TPU v5 lite", False, 8, 8),
            "One-device work runs on 1 x TPU v5 lite, the multi-device lessons on 8 x TPU v5 lite.",
        ),
        (
            ("1 x TPU v5 lite", "8 simulated CPU devices", True, 1, 8),
            "One-device work runs on 1 x TPU v5 lite, the multi-device lessons on 8 simulated CPU devices "
            "(placement and correctness, not speed); this kernel sees 1 of this host's 8 TPU chips "
            "(TPU_VISIBLE_DEVICES or TPU_CHIPS_PER_PROCESS_BOUNDS limit it, or another process holds the rest: restart the "
            "kernel without them to use every chip).",
        ),
        (
            ("1 x cpu", None, False, 1, 0),
            "One-device work runs on 1 x cpu and the multi-device lessons cannot run here: they need 2 or more "
            "devices.",
        ),
    ],
)
def test_what_runs_where_in_one_sentence(args, expected):
    assert chips.what_runs_where(*args) == expected


def test_chips_on_the_host_are_counted_from_their_device_files(tmp_path):
    for i in range(8):
        (tmp_path / str(i)).write_text("")
    assert chips.host_chip_count((str(tmp_path / "accel[0-9]*"), str(tmp_path / "[0-9]*"))) == 8
    assert chips.host_chip_count((str(tmp_path / "none*"),)) == 0


def test_this_kernel_is_described(cpu_devices):
    import jax

    said = chips.describe()
    assert said.startswith(f"One-device work runs on 1 x {jax.devices()[0].device_kind}, the multi-device lessons on")
    assert "\n" not in said


def test_a_kernel_that_fell_back_to_the_cpu_from_a_held_chip_is_told(cpu_devices, monkeypatch):
    """JAX's built-in TPU backend fails quietly: the held chip's error is only recorded, and JAX runs on the CPU."""
    from jax._src import xla_bridge

    monkeypatch.setattr(xla_bridge, "_backend_errors", {"tpu": ABORTED}, raising=False)
    with pytest.raises(devices.DeviceSetupError) as err:
        chips.describe()
    assert str(err.value).startswith(
        "JAX started on the CPU, not on this host's TPU chips: the TPU chips of this host are held by process 4242"
    )


def _fewer_than_two(min_devices=2):
    raise devices.DeviceSetupError("This lesson needs at least 2 devices; JAX sees 1 cpu device(s)")


def test_a_cpu_kernel_with_one_device_is_told_the_lessons_run_on_their_own_simulated_devices(cpu_devices, monkeypatch):
    """A plain Python on a CPU machine (one CPU device) said the multi-device lessons "cannot run here"."""
    import jax

    monkeypatch.setattr(devices, "lesson_devices", _fewer_than_two)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    said = chips.describe()
    assert "cannot run here" not in said
    assert said.endswith(
        "the multi-device lessons on simulated CPU devices that each lesson sets up as it starts (placement "
        f"and correctness, not speed; this kernel started JAX with {len(jax.devices('cpu'))})."
    )


def test_a_device_count_fixed_below_two_in_xla_flags_is_what_keeps_them_from_running(cpu_devices, monkeypatch):
    monkeypatch.setattr(devices, "lesson_devices", _fewer_than_two)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    said = chips.describe()
    assert said.endswith(
        "cannot run here: your XLA_FLAGS sets --xla_force_host_platform_device_count=1; raise it to 2 or more, "
        "or remove it."
    )
