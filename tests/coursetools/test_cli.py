"""coursetools.cli: one command line for the toolkit, reachable from any folder of this environment."""

import subprocess
import sys

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
