"""coursetools.cli: one command line for the toolkit, reachable from any folder of this environment."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coursetools import cli


def test_the_command_line_names_each_command(capsys):
    try:
        cli.main(["--help"])
    except SystemExit as done:
        assert done.code == 0
    text = capsys.readouterr().out
    for command in ("run", "compare", "sync", "workspace", "timings"):
        assert command in text


def test_python_m_coursetools_runs_from_a_folder_outside_the_repository(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "coursetools", "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0 and "workspace" in proc.stdout, proc.stderr


@pytest.mark.parametrize("port", ["99999", "0", "-1"])
def test_lab_port_refuses_a_port_outside_tcps_range_in_one_line(port, capsys):
    from coursetools.cli import main as cli_main

    assert cli_main(["lab-port", "--port", port]) == 2
    err = capsys.readouterr().err
    assert "--port takes a TCP port from 1 to 65535" in err and "Traceback" not in err


def test_lab_port_refuses_a_profile_that_is_not_the_course_s_and_takes_one_that_is(capsys):
    assert cli.main(["lab-port", "--port", "1", "--profile", "smok"]) == 2
    assert capsys.readouterr().err == (
        "error: PROFILE=smok is not one of the course's profiles (full, cpu, smoke, auto); give one of those "
        "(make lab PROFILE=smoke), or none for auto.\n"
    )
    assert cli.main(["lab-port", "--port", "99999", "--profile", "Smoke"]) == 2  # the profile passed, the port did not
    assert "--port takes" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_lab_gives_its_profile_to_the_lab_s_kernels():
    """`make lab PROFILE=smoke` was silently ignored: only DPCOURSE_PROFILE=smoke make lab reached the kernels."""
    root = Path(__file__).resolve().parents[2]
    venv = Path(sys.executable).parent.parent
    plan = subprocess.run(
        ["make", "-n", "--no-print-directory", "lab", "PROFILE=smoke", f"VENV={venv}"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
    )

    def words(line, profile):  # the recipe's line as the shell splits it, with LAB_PROFILE as make exports it
        said = subprocess.run(["sh", "-c", f'set -- {line}; printf "%s\\n" "$@"'], env={"LAB_PROFILE": profile},
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        return said.stdout.splitlines()

    lines = plan.stdout.splitlines()
    (port,) = [line for line in lines if "lab-port" in line]
    assert plan.returncode == 0 and words(port, "smoke")[-2:] == ["--profile", "smoke"], plan
    (serve,) = [line for line in lines if "jupyter lab" in line]
    assert "DPCOURSE_PROFILE=smoke" in words(serve.split("jupyter lab")[0], "smoke")
    assert "DPCOURSE_PROFILE=smoke" not in words(serve.split("jupyter lab")[0], "")
    assert "--profile" not in words(port, "")


def test_check_collectives_names_a_bad_xla_flags_token_before_starting_jax(monkeypatch, capsys):
    from dpcourse.backend import health

    monkeypatch.setenv("XLA_FLAGS", "\u2014xla_gpu_all_reduce_combine_threshold_bytes=4096")
    monkeypatch.setattr(health, "check_collectives", lambda **k: pytest.fail("the probe started"))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check-collectives"])
    assert exit_.value.code == 2 and "em dash" in capsys.readouterr().err


def test_run_takes_the_kernel_and_refuses_an_unknown_one(monkeypatch, capsys):
    from coursetools import runner

    seen = {}
    monkeypatch.setattr(runner, "run_course", lambda *a, **k: seen.update(k) or {"notebooks": [], "records": []})
    monkeypatch.setattr(runner, "print_summary", lambda *a, **k: None)
    assert cli.main(["run", "--profile", "smoke", "--kernel", "shell", "--notebooks", "03"]) == 0
    assert seen["kernel"] == "shell"
    with pytest.raises(SystemExit):
        cli.main(["run", "--kernel", "zmq"])
    assert "invalid choice: 'zmq'" in capsys.readouterr().err
