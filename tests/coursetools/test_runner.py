"""Tests of coursetools.runner: the headless course runner (``python -m coursetools run``).

Kernel-starting tests build tiny notebooks with nbformat in a temporary
folder and run them for real with nbclient (marked ``slow``: a kernel
takes a few seconds to start).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from coursetools import runner
from dpcourse.record import RESULTS_ENV


def write_notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


# --------------------------------------------------------------------------
# find_notebooks


@pytest.fixture()
def course_dir(tmp_path):
    for name in ("03_mesh", "01_setup", "02_baseline", "README", "x1_draft"):
        (tmp_path / f"{name}.ipynb").write_text("{}")
    (tmp_path / "02_baseline.py").write_text("# jupytext pair")
    return tmp_path


def names(paths):
    return [p.name for p in paths]


def test_find_notebooks_lists_numbered_notebooks_in_order(course_dir):
    assert names(runner.find_notebooks(course_dir)) == ["01_setup.ipynb", "02_baseline.ipynb", "03_mesh.ipynb"]


@pytest.mark.parametrize(
    "only, expected",
    [
        (["03"], ["03_mesh.ipynb"]),
        (["02_baseline"], ["02_baseline.ipynb"]),
        (["03_mesh.ipynb"], ["03_mesh.ipynb"]),
        (["03", "01"], ["01_setup.ipynb", "03_mesh.ipynb"]),  # course order, not argument order
        (["01", "01_setup"], ["01_setup.ipynb"]),  # no duplicates
    ],
)
def test_find_notebooks_filters(course_dir, only, expected):
    assert names(runner.find_notebooks(course_dir, only)) == expected


def test_unknown_notebook_name_lists_the_valid_ones(course_dir):
    with pytest.raises(FileNotFoundError) as err:
        runner.find_notebooks(course_dir, ["04_sharding"])
    message = str(err.value)
    assert "'04_sharding'" in message
    assert "01_setup, 02_baseline, 03_mesh" in message


def test_folder_without_notebooks_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="No numbered notebooks"):
        runner.find_notebooks(tmp_path)


@pytest.mark.slow
def test_the_cli_runs_the_copy_a_path_names(course_dir, tmp_path, capsys):
    from coursetools.cli import main

    other = tmp_path / "other"
    other.mkdir()
    marker = tmp_path / "marker.txt"
    write_notebook(other / "01_setup.ipynb", f"open({str(marker)!r}, 'w').write('the copy ran')")
    out = tmp_path / "out"
    code = main(
        ["run", "--notebook-dir", str(course_dir), "--notebooks", str(other / "01_setup.ipynb")]
        + ["--profile", "smoke", "--out", str(out)]
    )
    assert code == 0, capsys.readouterr().err
    assert marker.read_text() == "the copy ran"
    (run,) = json.loads((out / "results.json").read_text())["notebooks"]
    assert run["notebook"] == "01_setup" and run["status"] == "passed"


def test_cli_unknown_notebook_exits_2_without_starting_kernels(course_dir, capsys):
    from coursetools.cli import main

    code = main(
        [
            "run",
            "--notebook-dir",
            str(course_dir),
            "--notebooks",
            "99",
            "--profile",
            "smoke",
            "--out",
            str(course_dir / "out"),
        ]
    )
    assert code == 2
    assert "No notebook matches '99'" in capsys.readouterr().err
    assert not (course_dir / "out").exists()


def test_cli_rejects_an_unknown_profile(course_dir, capsys):
    from coursetools.cli import main

    with pytest.raises(SystemExit) as err:
        main(["run", "--notebook-dir", str(course_dir), "--profile", "huge"])
    assert err.value.code == 2
    assert "full" in capsys.readouterr().err  # argparse lists the choices


# --------------------------------------------------------------------------
# Running real kernels


@pytest.mark.slow
def test_run_notebook_passing(tmp_path):
    src = tmp_path / "nbs"
    src.mkdir()
    nb = write_notebook(src / "01_ok.ipynb", "x = 6 * 7", "open('ran_here.txt', 'w').write('yes')\nprint(x)")
    out = tmp_path / "out"
    out.mkdir()
    run = runner.run_notebook(nb, out, out / "records.jsonl", profile="smoke", cell_timeout_s=60)
    assert (run.notebook, run.status, run.error_cell, run.error) == ("01_ok", "passed", None, None)
    assert run.output == "01_ok.ipynb" and run.wall_s > 0
    # The kernel's peak resident memory is measured (an IPython kernel holds tens of MiB at least).
    assert run.peak_rss_bytes is not None and run.peak_rss_bytes > 20 * 1024 * 1024
    executed = nbformat.read(out / "01_ok.ipynb", as_version=4)
    assert executed.cells[1].outputs[0]["text"] == "42\n"
    assert (src / "ran_here.txt").exists()  # the kernel runs in the notebook's folder


@pytest.mark.slow
def test_run_notebook_failing_names_the_cell_and_the_error(tmp_path):
    nb = write_notebook(
        tmp_path / "02_bad.ipynb",
        "a = 1",
        "raise ValueError('boom in the second cell')",
        "open('never.txt', 'w').write('ran')",
    )
    out = tmp_path / "out"
    out.mkdir()
    run = runner.run_notebook(nb, out, out / "records.jsonl", profile=None, cell_timeout_s=60)
    assert run.status == "failed"
    assert run.error_cell == 1  # 0-based index among all cells
    assert "ValueError" in run.error and "boom in the second cell" in run.error
    assert not (tmp_path / "never.txt").exists()  # execution stopped at the error
    executed = nbformat.read(out / "02_bad.ipynb", as_version=4)
    assert executed.cells[1].outputs[-1]["ename"] == "ValueError"  # saved with the traceback


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["ipykernel", "shell"])
def test_run_course_passes_profile_and_recorder_to_the_kernel(tmp_path, monkeypatch, kernel):
    monkeypatch.setenv("DPCOURSE_PROFILE", "cpu")  # the runner must override, then restore it
    nb = write_notebook(
        tmp_path / "07_rec.ipynb",
        "import os\n"
        "from dpcourse import record as results\n"
        "results.set_context(notebook='07_rec', profile=os.environ['DPCOURSE_PROFILE'], data_source='synthetic',\n"
        "                    backend='cpu', device_kind='cpu', device_count=8, jax_version='test')\n"
        "results.record('examples_per_s', 1234.5, 'examples/s')\n"
        "results.record('final_loss', float('nan'), '')",
    )
    # A relative output folder, as `python -m coursetools run` uses by default
    # (results/<profile>/): the kernel runs in the notebook's folder, so the
    # records file must still land in the output folder.
    monkeypatch.chdir(tmp_path)
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    nb = nb.rename(nb_dir / nb.name)
    out = tmp_path / "results" / "smoke"
    payload = runner.run_course("smoke", [nb], Path("results") / "smoke", cell_timeout_s=120, kernel=kernel)

    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk == payload
    assert payload["schema"] == runner.SCHEMA_VERSION and payload["profile"] == "smoke"
    assert payload["created"]
    (nb_run,) = payload["notebooks"]
    assert nb_run == {
        "notebook": "07_rec",
        "status": "passed",
        "wall_s": nb_run["wall_s"],
        "error_cell": None,
        "error_code_cell": None,
        "error": None,
        "output": "07_rec.ipynb",
        "peak_rss_bytes": nb_run["peak_rss_bytes"],
        "peak_gpu_bytes": None,  # no GPU here
        "peak_device_bytes": None,  # recorded by the shell kernel only
    }
    assert nb_run["peak_rss_bytes"] > 20 * 1024 * 1024  # a kernel's resident memory, measured
    first, second = payload["records"]
    assert first == {
        "notebook": "07_rec",
        "metric": "examples_per_s",
        "value": 1234.5,
        "unit": "examples/s",
        "profile": "smoke",
        "data_source": "synthetic",
        "backend": "cpu",
        "device_kind": "cpu",
        "device_count": 8,
        "jax_version": "test",
    }
    assert second["value"] == "nan"
    assert (out / "07_rec.ipynb").exists()
    # The runner's process environment is as it was.
    assert os.environ["DPCOURSE_PROFILE"] == "cpu"
    assert RESULTS_ENV not in os.environ


def test_print_summary_shows_status_and_records(tmp_path, capsys):
    payload = {
        "notebooks": [
            {"notebook": "01_setup", "status": "passed", "wall_s": 3.2, "error_cell": None, "error": None},
            {"notebook": "02_baseline", "status": "failed", "wall_s": 1.0, "error_cell": 4, "error": "boom"},
        ],
        "records": [
            {
                "notebook": "01_setup",
                "metric": "examples_per_s",
                "value": 1234.5,
                "unit": "examples/s",
                "profile": "smoke",
                "data_source": "synthetic",
                "backend": "cpu",
                "device_kind": "cpu",
                "device_count": 8,
                "jax_version": "0.10.2",
            }
        ],
    }
    runner.print_summary(payload, tmp_path, figures=True)
    text = capsys.readouterr().out
    for piece in ("01_setup", "passed", "02_baseline", "FAILED", "boom", "examples_per_s", "1234", "synthetic"):
        assert piece in text
    # The pass/fail table comes last, so that a long list of figures does not scroll it away.
    assert text.index("Recorded figures") < text.index("Course run")
    # Without --figures (the default), one line says where the figures are instead of the table.
    runner.print_summary(payload, tmp_path)
    text = capsys.readouterr().out
    assert "examples_per_s" not in text and "figures.txt" in text and "--figures" in text
    assert text.rstrip().splitlines()[-1].startswith("Executed notebooks")


def test_the_summary_needs_no_optional_package(tmp_path, monkeypatch, capsys):
    """without rich the runner died in its own summary (No module named 'rich')."""
    for name in ("rich", "rich.console", "rich.table", "tqdm", "tqdm.auto"):
        monkeypatch.setitem(sys.modules, name, None)  # importing any of them now fails
    payload = {
        "notebooks": [{"notebook": "03_mesh", "status": "failed", "wall_s": 2.0, "error_code_cell": 3, "error": "E"}],
        "records": [],
    }
    runner.print_summary(payload, tmp_path)
    assert re.search(r"03_mesh +FAILED +2\.0 +code cell 3 +E", capsys.readouterr().out)
    assert [p.stem for p in runner._progress([tmp_path / "01_a.ipynb"])] == ["01_a"]


@pytest.mark.slow
def test_failure_reports_the_exception_line_and_the_code_cell_a_learner_counts(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# title"),
        nbformat.v4.new_code_cell("a = 1"),
        nbformat.v4.new_markdown_cell("text"),
        nbformat.v4.new_code_cell("raise RuntimeError('first line\\nsecond line')"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "01_x.ipynb")
    out = tmp_path / "out"
    out.mkdir()
    run = runner.run_notebook(tmp_path / "01_x.ipynb", out, out / "records.jsonl", profile=None, cell_timeout_s=60)
    assert run.error == "RuntimeError: first line"  # type and first line, no colour codes
    assert (run.error_cell, run.error_code_cell) == (3, 2)


@pytest.mark.parametrize("kind", ["file", "notebook folder"])
def test_an_unusable_output_folder_is_refused_before_anything_runs(tmp_path, kind):
    nb = write_notebook(tmp_path / "01_x.ipynb", "a = 1")
    out = tmp_path / "taken" if kind == "file" else tmp_path
    if kind == "file":
        out.write_text("")
    with pytest.raises(runner.OutputFolderError):
        runner.run_course("smoke", [nb], out)
    assert not (tmp_path / "01_x.ipynb").read_text().count('"outputs": [\n     {')  # source untouched


@pytest.mark.slow
def test_ctrl_c_stops_the_run_saves_results_and_leaves_no_kernel(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path / "nbs"
    folder.mkdir()
    started = tmp_path / "kernel-started.txt"
    write_notebook(folder / "01_slow.ipynb", f"import time; open({str(started)!r}, 'w').close(); time.sleep(60)")
    write_notebook(folder / "02_never.ipynb", "open('ran.txt', 'w').write('x')")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coursetools",
            "run",
            "--profile",
            "smoke",
            "--notebook-dir",
            str(folder),
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Wait until the kernel is inside its sleep(60) cell (on a loaded machine a kernel
    # can take many seconds to start), not for a fixed time.
    deadline = time.time() + 120
    while time.time() < deadline and not started.exists():
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    payload = json.loads((out / "results.json").read_text())
    assert [(r["notebook"], r["status"]) for r in payload["notebooks"]] == [("01_slow", "interrupted")]
    assert not (tmp_path / "ran.txt").exists()
    left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.strip()
    assert not left


# --------------------------------------------------------------------------
# The kernels' interpreter


@pytest.mark.slow
def test_kernels_use_the_runners_interpreter_whatever_kernelspec_is_installed(tmp_path, monkeypatch):
    # A "python3" kernelspec on JUPYTER_PATH that starts another program (here one that
    # exits at once, as a Python without JAX would fail) must not be used.
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {"argv": ["/bin/sh", "-c", "exit 3", "{connection_file}"], "display_name": "other", "language": "python"}
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    src = tmp_path / "nbs"
    src.mkdir()
    nb = write_notebook(src / "01_which.ipynb", "import sys\nprint(sys.executable)")
    out = tmp_path / "out"
    out.mkdir()
    run = runner.run_notebook(nb, out, out / "records.jsonl", profile="smoke", cell_timeout_s=60)
    assert run.status == "passed", run.error
    executed = nbformat.read(out / "01_which.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"].strip() == sys.executable


def test_kernel_argv_is_this_interpreter():
    assert runner.kernel_argv()[:3] == [sys.executable, "-m", "ipykernel_launcher"]
    assert "{connection_file}" in runner.kernel_argv()


def test_a_missing_ipykernel_stops_the_run_before_any_kernel_naming_the_interpreter(tmp_path, monkeypatch, capsys):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ipykernel" else real_find_spec(name, *a)
    )
    with pytest.raises(runner.KernelSetupError) as err:
        runner.check_kernel_interpreter()
    assert sys.executable in str(err.value) and "pip install -r requirements.txt" in str(err.value)
    assert "ipykernel" in str(err.value)

    from coursetools.cli import main

    src = tmp_path / "nbs"
    src.mkdir()
    write_notebook(src / "01_x.ipynb", "x = 1")
    code = main(["run", "--notebook-dir", str(src), "--profile", "smoke", "--out", str(tmp_path / "out")])
    assert code == 2
    assert "lacks ipykernel" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_no_such_kernel_says_what_to_install():
    from jupyter_client.kernelspec import NoSuchKernel

    text = runner._error_text(NoSuchKernel("python3"))
    assert "No such kernel named python3" in text
    assert "pip install ipykernel" in text and sys.executable in text


def _fake_runs(monkeypatch):
    """run_notebook without a kernel: each notebook 'passes' at once."""

    def fake(path, out_dir, results_file, profile, cell_timeout_s, on_cell=None, solutions=False, kernel="ipykernel"):
        return runner.NotebookRun(path.stem, "passed", 0.0, output=path.name)

    monkeypatch.setattr(runner, "run_notebook", fake)


def test_a_subset_run_keeps_the_results_of_the_notebooks_it_does_not_repeat(tmp_path, monkeypatch, capsys):
    _fake_runs(monkeypatch)
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    one, nine = nbs / "01_a.ipynb", nbs / "09_b.ipynb"
    out = tmp_path / "out"
    out.mkdir()
    full = {
        "schema": 1,
        "created": "2026-11-30T18:00:00+00:00",
        "notebooks": [{"notebook": "01_a", "status": "passed"}, {"notebook": "09_b", "status": "passed"}],
        "records": [{"notebook": "01_a", "metric": "throughput", "value": 1.0}],
    }
    (out / "results.json").write_text(json.dumps(full))

    runner.run_course("smoke", [nine], out)

    kept = out / "results.2026-11-30T18-00-00-00-00.json"
    assert json.loads(kept.read_text()) == full  # nothing of the full run is lost
    assert [nb["notebook"] for nb in json.loads((out / "results.json").read_text())["notebooks"]] == ["09_b"]
    assert str(kept) in capsys.readouterr().err

    runner.run_course("smoke", [nine], out)  # the same notebooks again: a plain replacement
    assert sorted(p.name for p in out.glob("results*.json")) == [
        "results.2026-11-30T18-00-00-00-00.json",
        "results.json",
    ]

    (out / "results.json").write_text("{not json")
    runner.run_course("smoke", [one, nine], out)
    assert (out / "results.unreadable.json").read_text() == "{not json"


@pytest.mark.parametrize("value", ["0", "-5"])
def test_cli_refuses_a_cell_timeout_that_is_not_positive(course_dir, capsys, value):
    from coursetools.cli import main

    out = course_dir / "out"
    code = main(
        ["run", "--notebook-dir", str(course_dir), "--profile", "smoke", "--out", str(out), "--cell-timeout", value]
    )
    assert code == 2
    assert "--cell-timeout must be a positive number of seconds" in capsys.readouterr().err
    assert not out.exists()


# --------------------------------------------------------------------------
# why a kernel died


def test_a_dead_kernel_says_out_of_memory_only_for_a_kill():
    xla = "F1201 parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: --not_a_flag"
    text = runner.dead_kernel_text(1, "some log\n" + xla)
    assert "--not_a_flag" in text and "XLA_FLAGS" in text and "memory" not in text
    assert "out-of-memory killer" in runner.dead_kernel_text(-9, "")
    assert "memory" not in runner.dead_kernel_text(-11, "") and "SIGSEGV" in runner.dead_kernel_text(-11, "")
    assert "memory" not in runner.dead_kernel_text(3, "boom") and "boom" in runner.dead_kernel_text(3, "boom")


@pytest.mark.slow
def test_a_bad_flag_set_inside_a_notebook_is_reported_as_such_not_as_memory(tmp_path):
    nb = write_notebook(
        tmp_path / "01_x.ipynb",
        "import os\nos.environ['XLA_FLAGS'] = '--not_a_flag'\nos.environ['JAX_PLATFORMS'] = 'cpu'",
        "import jax\njax.devices()",
    )
    out = tmp_path / "out"
    out.mkdir()
    run = runner.run_notebook(nb, out, out / "records.jsonl", profile=None, cell_timeout_s=300)
    assert run.status == "failed" and run.error_code_cell == 2
    assert "--not_a_flag" in run.error and "XLA_FLAGS" in run.error and "memory" not in run.error
    assert nbformat.read(out / "01_x.ipynb", as_version=4).cells  # the executed notebook is whole


def test_a_client_that_cannot_be_made_leaves_the_callers_environment_as_it_was(tmp_path, monkeypatch):
    """The kernel's settings (profile, results file, strict exercises) are the caller's again after any failure."""
    nb = write_notebook(tmp_path / "01_x.ipynb", "x = 1")
    keys = ("DPCOURSE_PROFILE", runner.RESULTS_ENV, runner.STRICT_ENV)
    for key in keys:
        monkeypatch.delenv(key, raising=False)

    def broken():
        raise RuntimeError("no kernel manager here")

    monkeypatch.setattr(runner, "_kernel_manager_class", broken)
    with pytest.raises(RuntimeError, match="no kernel manager here"):
        runner.run_notebook(nb, tmp_path, tmp_path / "records.jsonl", "smoke", 60, solutions=True)
    assert {key: os.environ.get(key) for key in keys} == dict.fromkeys(keys)


def test_a_full_disk_in_a_lesson_still_leaves_a_results_json_naming_the_notebook_and_why(tmp_path, monkeypatch):
    """A small disk: the reserve fits, then a lesson fills it; results.json is written in the reserve's room."""
    import errno

    from coursetools import outfolder

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    nb = write_notebook(nbs / "09_performance.ipynb", "pass")
    out = tmp_path / "out"
    budget = runner.RESERVE_BYTES + 1000  # the disk: the reserve and a little more

    def used() -> int:
        return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())

    real_write = outfolder._write_file

    def small_disk(path, data):
        if used() + len(data) > budget:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_write(path, data)

    def lesson_fills_the_disk(path, out_dir, *args, **kwargs):
        (out_dir / "09_performance_trace.bin").write_bytes(b"x" * (budget - used()))  # the trace took the rest
        return runner.NotebookRun(path.stem, "failed", 1.0, error="OSError: [Errno 28] No space left on device")

    monkeypatch.setattr(outfolder, "_write_file", small_disk)
    monkeypatch.setattr(runner, "run_notebook", lesson_fills_the_disk)
    monkeypatch.setattr(runner, "check_kernel_interpreter", lambda: sys.executable)
    with pytest.raises(runner.DiskFullError) as err:
        runner.run_course("smoke", [nb], out)
    assert "results.json there says which notebook stopped and why" in str(err.value)
    (run,) = json.loads((out / "results.json").read_text())["notebooks"]
    assert run["notebook"] == "09_performance" and "No space left on device" in run["error"]
    assert not (out / runner.RESERVE_FILE).exists()


def _disk_that_fails(monkeypatch, fails):
    """outfolder's writes fail with ENOSPC where ``fails(path)`` says so; notebooks "pass" without a kernel."""
    import errno

    from coursetools import outfolder

    real_write = outfolder._write_file

    def write(path, data):
        if fails(Path(path)):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_write(path, data)

    monkeypatch.setattr(outfolder, "_write_file", write)
    monkeypatch.setattr(runner, "run_notebook", lambda path, *a, **k: runner.NotebookRun(path.stem, "passed", 1.0))
    monkeypatch.setattr(runner, "check_kernel_interpreter", lambda: sys.executable)


@pytest.mark.parametrize("full_at", ["the run lock", "the reserve"])
def test_a_disk_full_from_the_start_does_not_point_at_a_results_json_that_is_not_there(tmp_path, monkeypatch, full_at):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    nb = write_notebook(nbs / "01_a.ipynb", "pass")
    out = tmp_path / "out"
    _disk_that_fails(monkeypatch, lambda path: full_at == "the run lock" or runner.RESERVE_FILE in path.name)
    with pytest.raises(runner.DiskFullError) as err:
        runner.run_course("smoke", [nb], out)
    said = str(err.value)
    assert "Nothing of this run could be recorded there;" in said and "says which" not in said
    assert not (out / "results.json").exists()


def test_a_disk_that_fills_after_some_notebooks_says_which_ones_results_json_holds(tmp_path, monkeypatch):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    first, second = write_notebook(nbs / "01_a.ipynb", "pass"), write_notebook(nbs / "02_b.ipynb", "pass")
    out = tmp_path / "out"
    results: list[Path] = []

    def full_after_the_first_results(path: Path) -> bool:
        if path.name.startswith(".results.json."):
            results.append(path)
        return len(results) > 1  # the first results.json fits, then nothing

    _disk_that_fails(monkeypatch, full_after_the_first_results)
    with pytest.raises(runner.DiskFullError) as err:
        runner.run_course("smoke", [first, second], out)
    said = str(err.value)
    assert "results.json there holds the 1 notebook(s) run before the disk filled (01_a); the rest" in said
    assert [nb["notebook"] for nb in json.loads((out / "results.json").read_text())["notebooks"]] == ["01_a"]


def test_results_json_says_whether_the_solutions_were_in_and_the_cpu_devices_forced(tmp_path, monkeypatch):
    from coursetools import timings

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    nb = write_notebook(nbs / "01_a.ipynb", "pass")
    _disk_that_fails(monkeypatch, lambda path: False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=3")
    payload = runner.run_course("smoke", [nb], tmp_path / "out", solutions=True)
    assert payload["solutions"] is True and payload["cpu_devices"] == 3
    assert timings.read_results(tmp_path / "out" / "results.json")["cpu_devices"] == 3  # of the record's schema
    monkeypatch.delenv("XLA_FLAGS")
    assert runner.run_course("smoke", [nb], tmp_path / "out")["cpu_devices"] is None


def test_a_full_disk_elsewhere_is_the_notebook_s_failure_not_blamed_on_the_out_folder(tmp_path, monkeypatch):
    """Lesson 11 with a full temporary folder: the runner blamed --out, which had room."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    nb = write_notebook(nbs / "11_checkpoint.ipynb", "pass")
    out = tmp_path / "out"
    said = "CheckpointError: Could not copy a to /tmp/b: no room left (No space left on device). Free space ..."

    def temp_disk_full(path, out_dir, *args, **kwargs):
        return runner.NotebookRun(path.stem, "failed", 1.0, error=said)

    monkeypatch.setattr(runner, "run_notebook", temp_disk_full)
    monkeypatch.setattr(runner, "check_kernel_interpreter", lambda: sys.executable)
    payload = runner.run_course("smoke", [nb], out)  # no DiskFullError naming --out
    (run,) = payload["notebooks"]
    assert run["status"] == "failed" and run["error"] == said
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".room")) == []


def test_a_kernel_that_never_answers_points_to_the_shell_kernel(monkeypatch):
    """Loopback down or TCP refused: the kernel's sockets never connect; the runner names --kernel shell."""
    from dpcourse.multihost import ports

    err = RuntimeError("Kernel didn't respond in 60 seconds")
    monkeypatch.setattr(ports, "tcp_unavailable", lambda host="127.0.0.1": "This machine's loopback is down.")
    said = runner._error_text(err)
    assert "and here this machine's loopback is down." in said and "Run with --kernel shell" in said
    monkeypatch.setattr(ports, "tcp_unavailable", lambda host="127.0.0.1": None)
    assert "a busy machine can also delay it" in runner._error_text(err)


@pytest.mark.slow
def test_a_kernel_that_never_answers_ends_in_the_runner_s_sentence_without_a_traceback_at_exit(tmp_path):
    """nbclient's clean-up at exit, registered before the kernel starts, failed under the runner's last line."""
    nb = write_notebook(tmp_path / "01_a.ipynb", "pass")
    args = ", ".join(repr(str(p)) for p in (nb, tmp_path, tmp_path / "r.jsonl"))
    program = (
        "import sys, nbclient\nfrom pathlib import Path\nfrom coursetools import runner\n"
        "runner.kernel_argv = lambda: [sys.executable, '-c', 'import time; time.sleep(30)', '{connection_file}']\n"
        "nbclient.NotebookClient.startup_timeout = 3\n"
        f"print(runner.run_notebook(*map(Path, [{args}]), 'smoke', 30).error)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert "Kernel didn't respond in 3 seconds" in done.stdout and "Traceback" not in done.stderr, done.stderr[-2000:]
