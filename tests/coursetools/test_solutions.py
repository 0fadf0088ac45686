"""Exercise cells in the lessons, their solutions beside the course, and the run with solutions."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import jupytext
import nbformat
import pytest

from coursetools import runner, solutions
from dpcourse.exercises import base

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
LESSONS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if "02" <= p.stem[:2] <= "13")


def _nb(stem):
    return nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)


def _exercises(stem):
    """The lesson and its exercise cells (``{id: cell index}``); every lesson 02-11 has some."""
    nb = _nb(stem)
    cells = solutions.exercise_cells(nb)
    assert cells, f"{stem} has no exercise cells"
    return nb, cells


def test_every_lesson_02_to_11_has_exercises():
    for stem in LESSONS:
        assert 2 <= len(solutions.exercise_cells(_nb(stem))) <= 3, stem


@pytest.mark.parametrize("stem", LESSONS)
def test_every_exercise_has_a_solution_and_every_solution_an_exercise(stem):
    nb = _nb(stem)
    assert solutions.fill_solutions(nb, stem) == len(solutions.exercise_cells(_nb(stem)))


@pytest.mark.parametrize("stem", LESSONS)
def test_exercises_are_a_section_at_the_end_left_untouched_and_solutions_are_not_in_the_lesson(stem):
    nb, cells = _exercises(stem)
    heading = max(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and "## Exercises" in c.source)
    learned = max(i for i, c in enumerate(nb.cells) if "## What you learned" in c.source)
    assert learned < heading < min(cells.values())
    text = (NOTEBOOKS / f"{stem}.py").read_text()
    for ident, index in cells.items():
        code = [line for line in nb.cells[index].source.splitlines() if line.strip() and not line.startswith("#")]
        assert code and all(re.match(r"^\w+ = \.\.\.", line) for line in code), f"{ident} is not left at `...`"
    for ident, source in solutions.read_solutions(stem).items():
        body = [line.strip() for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        # The signature is given in the exercise; no line of the working code should be.
        leaked = [line for line in body if len(line) > 25 and not line.startswith("def ") and line in text]
        assert not leaked, f"{ident}: solution lines in the lesson: {leaked}"


@pytest.mark.parametrize("stem", LESSONS)
def test_each_exercise_is_checked_by_its_own_checker(stem):
    nb, cells = _exercises(stem)
    module = importlib.import_module(f"dpcourse.exercises.lesson{stem[:2]}")
    for ident, index in cells.items():
        following = next(c for c in nb.cells[index + 1 :] if c.cell_type == "code")
        called = re.search(r"^check\.(\w+)\(", following.source, flags=re.M)
        assert called, f"{ident}: the cell after the exercise should call check.<checker>(...)"
        assert getattr(module, called.group(1)).exercise == ident


@pytest.mark.parametrize("lesson", ["02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12", "13"])
def test_every_checker_reports_not_attempted_for_an_untouched_answer(lesson):
    module = importlib.import_module(f"dpcourse.exercises.lesson{lesson}")
    checkers = [f for f in vars(module).values() if callable(f) and hasattr(f, "exercise")]
    assert 2 <= len(checkers) <= 3
    for check in checkers:
        assert check(...).status == base.NOT_ATTEMPTED
        assert check(None).status == base.NOT_ATTEMPTED


def _course(tmp_path, solution_text):
    nbs, sols = tmp_path / "nbs", tmp_path / "solutions"
    nbs.mkdir()
    sols.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    ex = nbformat.v4.new_code_cell("answer = ...  # your answer")
    ex.metadata["tags"] = ["exercise", "ex01_1"]
    nb.cells = [
        ex,
        nbformat.v4.new_code_cell(
            f"import os\nassert os.environ.get('{base.STRICT_ENV}') == '1'\nassert answer == 42, answer"
        ),
    ]
    nbformat.write(nb, nbs / "01_x.ipynb")
    (sols / "01_x.py").write_text(solution_text)
    return nbs / "01_x.ipynb", sols


def test_fill_solutions_names_missing_and_orphan_solutions(tmp_path):
    path, sols = _course(tmp_path, '# %% tags=["ex01_2"]\nanswer = 42\n')
    with pytest.raises(solutions.SolutionError, match=r"without a solution.*ex01_1.*without an exercise cell.*ex01_2"):
        solutions.fill_solutions(nbformat.read(path, as_version=4), "01_x", sols)


def test_write_solved_fills_in_and_keeps_the_source(tmp_path):
    path, sols = _course(tmp_path, '# %% tags=["ex01_1"]\nanswer = 6 * 7\n')
    written = solutions.write_solved([path], tmp_path / "solved", sols)
    assert [p.name for p in written] == ["01_x.ipynb"]
    assert nbformat.read(written[0], as_version=4).cells[0].source == "answer = 6 * 7"
    assert nbformat.read(path, as_version=4).cells[0].source.startswith("answer = ...")


def test_run_again_appends_every_code_cell_but_the_parameters_after_the_last():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("PROFILE = 'cpu'", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_markdown_cell("## 1. Train"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("del x"),
    ]
    assert solutions.run_again(nb) == 2
    assert [c.source for c in nb.cells[4:]] == ["Every code cell again, after the last one.", "x = 1", "del x"]


@pytest.mark.slow
def test_run_with_solutions_fills_them_in_and_checks_strictly(tmp_path, monkeypatch):
    path, sols = _course(tmp_path, '# %% tags=["ex01_1"]\nanswer = 6 * 7\n')
    monkeypatch.setattr(solutions, "SOLUTIONS_DIR", sols)
    out = tmp_path / "out"
    out.mkdir()
    run = runner.run_notebook(path, out, out / "records.jsonl", "smoke", 60, solutions=True)
    assert run.status == "passed", run.error
    plain = runner.run_notebook(path, out, out / "records.jsonl", "smoke", 60)
    assert plain.status == "failed"  # without solutions the answer stays `...` and strict mode is off
    assert base.STRICT_ENV not in __import__("os").environ


def test_cli_solutions_refuses_missing_solutions_before_starting_kernels(tmp_path, monkeypatch, capsys):
    from coursetools.cli import main

    path, sols = _course(tmp_path, "# no solution cells\n")
    monkeypatch.setattr(solutions, "SOLUTIONS_DIR", sols)
    code = main(
        ["run", "--solutions", "--notebook-dir", str(path.parent), "--profile", "smoke", "--out", str(tmp_path / "o")]
    )
    assert code == 2
    assert "ex01_1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_solution_files_are_valid_percent_notebooks():
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py")):
        cells = [c for c in jupytext.read(path, fmt="py:percent").cells if solutions.cell_id(c)]
        assert cells, path
        for cell in cells:
            compile(cell.source, f"{path.name}:{solutions.cell_id(cell)}", "exec")


def test_the_command_line_fills_only_the_notebooks_named_and_refuses_one_that_is_absent(tmp_path, capsys):
    out = tmp_path / "solved"
    assert solutions.main(["--out", str(out), "--notebooks", str(NOTEBOOKS / "02_baseline.ipynb")]) == 0
    assert [p.name for p in out.iterdir()] == ["02_baseline.ipynb"]
    missing = tmp_path / "03_nowhere.ipynb"
    assert solutions.main(["--out", str(tmp_path / "other"), "--notebooks", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err and not (tmp_path / "other").exists()


def test_make_test_runs_every_lesson_solved_once_in_each_environment():
    # make test runs no solutions-test: the unit layer's whole-lesson runs (tests/lessons/variants.py, solved,
    # strict, every cell again on the pinned JAX) run each lesson solved, 04-12 under a global mesh, the others
    # with their own mesh; each environment gets one alternation of the mesh kinds.
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "lessons"))
    from variants import plan

    for setting in ("alternating-from-Auto", "alternating-from-Explicit"):
        mesh_runs, solved = plan(setting)
        lessons = [v.lesson for v in [*mesh_runs, *solved]]
        assert sorted(lessons) == sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")), setting


@pytest.mark.parametrize("where", ["under_a_file", "the_sources"])
def test_an_output_folder_that_cannot_be_used_is_one_sentence_before_any_work(where, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(solutions, "write_solved", lambda *a: pytest.fail("worked before checking"))
    (tmp_path / "a_file").write_text("")
    out = tmp_path / "a_file" / "solved" if where == "under_a_file" else runner_notebooks()
    assert solutions.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out") and "Traceback" not in err


def runner_notebooks() -> Path:
    from coursetools.paths import NOTEBOOKS

    return NOTEBOOKS
