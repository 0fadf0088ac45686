"""Tests of dpcourse.backend.xlaflags and of every path that checks XLA_FLAGS."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dpcourse.backend import xlaflags
from dpcourse.backend.xlaflags import XlaFlagsError, check_xla_flags, form_problems

EN_DASH = "\u2013xla_force_host_platform_device_count=8"
SPACE = "--xla_force_host_platform_device_count 8"


def test_an_en_dash_is_named_with_the_fix():
    (problem,) = form_problems(EN_DASH)
    assert "en dash" in problem and "'--xla_force_host_platform_device_count=8'" in problem


def test_a_value_after_a_space_is_named_with_the_fix():
    (problem,) = form_problems(SPACE)
    assert "'8'" in problem and "--xla_force_host_platform_device_count=8" in problem and "space" in problem


@pytest.mark.parametrize(
    "flags", ["", "--xla_force_host_platform_device_count=8", "--xla_cpu_enable_fast_math=false --xla_dump_to=/tmp/x"]
)
def test_well_formed_flags_pass_the_form_check(flags):
    assert form_problems(flags) == []


def test_a_word_that_is_not_a_flag_and_a_single_dash_are_named():
    assert "'8x'" in form_problems("8x")[0]
    assert "'-xla_cpu_enable_fast_math=false'" in form_problems("-xla_cpu_enable_fast_math=false")[0]


def test_the_message_says_it_is_xla_flags_and_how_to_fix_it():
    with pytest.raises(XlaFlagsError) as err:
        check_xla_flags(EN_DASH, probe=False)
    text = str(err.value)
    assert text.startswith(f"XLA_FLAGS={EN_DASH!r}") and "unset XLA_FLAGS" in text and "restart the kernel" in text


def test_only_the_courses_device_count_starts_no_probe(monkeypatch):
    monkeypatch.setattr(xlaflags, "probe_refusal", lambda flags: pytest.fail("probed"))
    check_xla_flags("--xla_force_host_platform_device_count=8")
    check_xla_flags("")


def test_a_good_value_is_probed_once_then_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(xlaflags.CACHE_ENV, str(tmp_path))
    calls = []
    monkeypatch.setattr(xlaflags, "probe_refusal", lambda flags: calls.append(flags) or (True, None))
    check_xla_flags("--xla_cpu_enable_fast_math=false")
    check_xla_flags("--xla_cpu_enable_fast_math=false")
    assert calls == ["--xla_cpu_enable_fast_math=false"]


def test_a_value_whose_probe_did_not_start_xla_is_not_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv(xlaflags.CACHE_ENV, str(tmp_path))
    calls = []
    monkeypatch.setattr(xlaflags, "probe_refusal", lambda flags: calls.append(flags) or (False, None))
    check_xla_flags("--xla_cpu_enable_fast_math=false")
    check_xla_flags("--xla_cpu_enable_fast_math=false")
    assert len(calls) == 2 and not (tmp_path / "xla-flags-checked.json").exists()


# What XLA printed for XLA_FLAGS=--xla_cpu_enable_fast_math=maybe (jaxlib 0.10.2), shortened: the
# two fatal lines, then its flag list (about 90 lines), one flag per line.
BAD_VALUE_STDERR = (
    "E1203 11:53:36.987102   28915 command_line_flags.cc:93] Couldn't interpret value maybe for flag "
    "xla_cpu_enable_fast_math.\n"
    "F1203 11:53:36.987168   28915 parse_flags_from_env.cc:220] Check failed: tsl::Flags::Parse(...) "
    "Flag parsing failed.\nusage: --xla_cpu_enable_fast_math=maybe\nFlags:\n"
    "\t--xla_cpu_enable_fast_math=false \tbool\tEnable unsafe fast-math optimizations in the CPU compiler.\n"
    "\t--xla_force_host_platform_device_count=1\tint32\tForce the host platform to pretend ...\n"
)


def test_a_value_xla_refuses_is_named_with_its_flag_xlas_line_and_the_fix():
    text = xlaflags.describe_abort(BAD_VALUE_STDERR)
    assert "'maybe'" in text and "--xla_cpu_enable_fast_math" in text
    assert "Couldn't interpret value maybe for flag xla_cpu_enable_fast_math." in text
    assert "--xla_cpu_enable_fast_math=true or --xla_cpu_enable_fast_math=false" in text
    assert "F1203" not in text and "tsl::Flags" not in text  # XLA's line without its log prefix or the abort


@pytest.mark.slow
def test_a_known_flag_with_a_bad_value_is_found_by_asking_xla_and_not_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv(xlaflags.CACHE_ENV, str(tmp_path))
    with pytest.raises(XlaFlagsError) as err:
        check_xla_flags("--xla_cpu_enable_fast_math=maybe")
    text = str(err.value)
    assert "'maybe'" in text and "Couldn't interpret value maybe" in text and "true or" in text
    assert not (tmp_path / "xla-flags-checked.json").exists()


@pytest.mark.slow
def test_the_runner_without_a_profile_names_a_device_count_xla_cannot_read(tmp_path, monkeypatch, capsys):
    from coursetools.cli import main

    monkeypatch.setenv(xlaflags.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=abc")
    monkeypatch.delenv("DPCOURSE_PROFILE", raising=False)
    assert main(["run", "--notebooks", "01", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "'abc'" in err and "takes a whole number" in err and "JAX_PLATFORMS" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_unknown_well_formed_flag_is_found_by_asking_xla(tmp_path, monkeypatch):
    monkeypatch.setenv(xlaflags.CACHE_ENV, str(tmp_path))
    with pytest.raises(XlaFlagsError) as err:
        check_xla_flags("--xla_force_host_platform_device_count=8 --not_a_flag")
    assert "--not_a_flag" in str(err.value) and "XLA does not know" in str(err.value)
    assert not (tmp_path / "xla-flags-checked.json").exists()  # a bad value is never cached as good


def test_xlas_own_abort_lines_are_recognised():
    line = "F1201 20:15:08.807997 14114 parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: --not_a_flag"
    assert xlaflags.unknown_flags_in(line) == "--not_a_flag"
    assert "--not_a_flag" in xlaflags.describe_abort("noise\n" + line)
    assert xlaflags.describe_abort("Killed") is None


@pytest.mark.slow
@pytest.mark.parametrize("flags", [EN_DASH, SPACE])
def test_setup_devices_refuses_a_malformed_token_and_appends_nothing(flags):
    code = (
        "import os\nfrom dpcourse.devices import DeviceSetupError, setup_devices\n"
        "try:\n    setup_devices(8)\nexcept DeviceSetupError as err:\n    print('REFUSED', err)\n"
        "print('FLAGS', repr(os.environ['XLA_FLAGS']))\n"
    )
    env = dict(os.environ, XLA_FLAGS=flags)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "REFUSED XLA_FLAGS=" in out.stdout and "--xla_force_host_platform_device_count=8" in out.stdout
    assert f"FLAGS {flags!r}" in out.stdout  # its own flag was not appended to the malformed one


def test_the_runner_refuses_a_malformed_token_before_any_kernel(tmp_path, monkeypatch, capsys):
    from coursetools.cli import main

    monkeypatch.setenv("XLA_FLAGS", SPACE)
    assert main(["run", "--profile", "smoke", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "XLA_FLAGS" in err and "--xla_force_host_platform_device_count=8" in err
    assert not (tmp_path / "out").exists()


def test_the_launcher_refuses_a_malformed_token_before_starting_workers(monkeypatch, capsys):
    from dpcourse.multihost import launcher

    monkeypatch.setenv("XLA_FLAGS", EN_DASH + " --xla_cpu_enable_fast_math=false")
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda *a, **k: pytest.fail("a worker was started"))
    assert launcher.main(["--processes", "2", "--devices-per-process", "2"]) == 1
    assert "en dash" in capsys.readouterr().err


@pytest.mark.slow
def test_jax_platforms_cuda_without_a_profile_is_one_line_not_a_traceback(tmp_path):
    """the `make course` path ended in a bare AssertionError."""
    env = dict(os.environ, JAX_PLATFORMS="cuda")
    env.pop("DPCOURSE_PROFILE", None)
    out = subprocess.run(
        [sys.executable, "-m", "coursetools", "run", "--notebooks", "01", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if out.returncode == 0:
        pytest.skip("this machine has a CUDA backend")
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "JAX_PLATFORMS='cuda'" in lines[0], out.stderr
    assert "Traceback" not in out.stderr and "AssertionError" not in out.stderr


def test_the_launcher_names_a_value_xla_refuses_before_starting_workers(monkeypatch, capsys, tmp_path):
    from dpcourse.multihost import launcher

    monkeypatch.setenv(xlaflags.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=maybe")
    refusal = xlaflags.refusal_in(BAD_VALUE_STDERR)  # what XLA says, as the probe would read it
    monkeypatch.setattr(xlaflags, "probe_refusal", lambda flags: (False, refusal))
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda *a, **k: pytest.fail("a worker was started"))
    assert launcher.main(["--processes", "2", "--devices-per-process", "2"]) == 1
    err = capsys.readouterr().err
    assert "'maybe'" in err and "--xla_cpu_enable_fast_math=true or" in err


EM_DASH = "\u2014xla_gpu_all_reduce_combine_threshold_bytes=4096"
BIG = "--xla_gpu_all_reduce_combine_threshold_bytes=big"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _tool(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _resume(argv):
    from dpcourse.checkpoints import resume

    return resume.main(["--dir", "unused", "--global-batch", "8", "--n-batches", "2", *argv])


def _mocked(argv):
    from dpcourse.cross_compile import notebook

    return notebook.main(["--report", "--profile", "smoke", *argv])


def _worker(argv):
    from dpcourse.multihost import worker

    return worker.main(argv)


def _clear_caches_check(argv):
    return _tool("clear_caches_check").main(argv)


# Every command that starts JAX or a compile, but the runner and the launcher (tested above) and
# make placement (tests/coursetools/test_compile_report.py).
COMMANDS = {"resume": _resume, "mocked": _mocked, "worker": _worker, "clear_caches_check": _clear_caches_check}


@pytest.mark.parametrize("flags", [EM_DASH, BIG], ids=["em-dash", "bad-value"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_names_a_bad_token_in_one_line_before_jax_starts(command, flags, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(xlaflags.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("XLA_FLAGS", flags)
    refusal = "XLA refuses the value 'big' of --xla_gpu_all_reduce_combine_threshold_bytes."
    monkeypatch.setattr(xlaflags, "probe_refusal", lambda flags: (False, refusal))  # what XLA says (tested above)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(SystemExit) as exit_:
        COMMANDS[command]([])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: XLA_FLAGS="), err
    assert ("em dash" if flags == EM_DASH else "--xla_gpu_all_reduce_combine_threshold_bytes") in err


@pytest.mark.parametrize("flags", [EM_DASH, BIG], ids=["em-dash", "bad-value"])
def test_a_lessons_gpu_compile_names_a_bad_token_and_starts_no_worker(flags, monkeypatch, tmp_path):
    from dpcourse.cross_compile import compile as deviceless
    from dpcourse.cross_compile import notebook

    monkeypatch.setenv(xlaflags.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("XLA_FLAGS", flags)
    monkeypatch.setattr(xlaflags, "probe_refusal", lambda flags: (False, "XLA refuses the value 'big'."))
    monkeypatch.setattr(deviceless.gpu_targets, "extra_missing", lambda platform="gpu": None)
    monkeypatch.setattr(notebook.gpu_targets, "extra_missing", lambda platform="gpu": None)
    monkeypatch.setattr(deviceless.subprocess, "Popen", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(XlaFlagsError, match="XLA_FLAGS="):  # lesson 10's background compile
        notebook.start_gpu_compile(deviceless.COURSE_STEPS, ("h200",), 8, "smoke")
    with pytest.raises(XlaFlagsError, match="XLA_FLAGS="):  # 04, 05 and 09's placement cells
        notebook.show_gpu_placement("smoke", "cpu")
    with pytest.raises(XlaFlagsError, match="XLA_FLAGS="):  # a CPU compile starts a worker too
        deviceless.compile_jobs([deviceless.Job("cpu", "cpu", 8, "smoke")])


def test_the_courses_own_device_count_and_passes_switched_off_start_no_probe(monkeypatch):
    from dpcourse.cross_compile import compile as deviceless

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    monkeypatch.setattr(xlaflags, "probe_refusal", lambda flags: pytest.fail("probed the course's own flags"))
    monkeypatch.setattr(deviceless, "PendingCompile", lambda *a: "started")
    assert deviceless.start_jobs([deviceless.Job("cpu", "cpu", 8, "smoke")], disable_passes=("p",)) == "started"


def test_a_compile_worker_that_xla_ended_says_which_token(monkeypatch):
    from dpcourse.cross_compile import compile as deviceless

    script = "import sys; sys.stderr.write(" + repr(BAD_VALUE_STDERR) + "); sys.exit(1)"
    job = deviceless.Job("cpu", "cpu", 2, "smoke")
    pending = deviceless.PendingCompile([job], [job], None, (), 60.0, [sys.executable, "-c", script])
    (result,) = pending.results()
    assert "XLA_FLAGS" in result.error and "'maybe'" in result.error


@pytest.mark.parametrize(
    ("argv", "says"), [(["--profile", "nosuch"], "is not a profile"), (["--rounds", "0"], "at least 1")]
)
def test_clear_caches_check_refuses_a_bad_argument_before_jax_starts(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        _clear_caches_check(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("name", ["capture_placement_hlo", "capture_schedule_hlo"])
def test_the_capture_tools_answer_help_and_refuse_a_bad_token_before_any_compile(name, monkeypatch, capsys):
    from dpcourse.cross_compile import compile as deviceless

    tool = _tool(name)
    monkeypatch.setattr(deviceless, "compile_jobs", lambda *a, **k: pytest.fail("compiled"))
    with pytest.raises(SystemExit) as exit_:
        tool.main(["--help"])
    assert exit_.value.code == 0 and "usage" in capsys.readouterr().out
    monkeypatch.setenv("XLA_FLAGS", EM_DASH)
    with pytest.raises(SystemExit) as exit_:
        tool.main([])
    assert exit_.value.code == 2 and "em dash" in capsys.readouterr().err
