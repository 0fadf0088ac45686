"""coursetools.choose: lesson names select lessons; a path the user gives is the notebook that runs."""

from __future__ import annotations

import pytest

from coursetools import choose


@pytest.fixture()
def course_dir(tmp_path):
    folder = tmp_path / "course"
    folder.mkdir()
    for name in ("03_mesh", "01_setup", "02_baseline"):
        (folder / f"{name}.ipynb").write_text("{}")
    (folder / "02_baseline.py").write_text("# jupytext pair")
    return folder


def test_a_path_to_a_notebook_selects_that_file_not_the_lesson_of_its_name(course_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "01_setup.ipynb").write_text("{}")
    chosen = choose.find_notebooks(course_dir, [str(other / "01_setup.ipynb")])
    assert chosen == [(other / "01_setup.ipynb").resolve()]


def test_a_lesson_name_still_selects_the_lesson_when_no_such_file_is_here(course_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert choose.find_notebooks(course_dir, ["01_setup.ipynb"]) == [course_dir / "01_setup.ipynb"]


@pytest.mark.parametrize("given", ["other/01_setup.ipynb", "nowhere/09_performance.ipynb"])
def test_a_missing_path_is_an_error_naming_it(course_dir, tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        choose.find_notebooks(course_dir, [given])
    assert f"No notebook at {given!r}" in str(err.value) and "does not exist" in str(err.value)


def test_a_path_that_is_not_a_notebook_is_refused_with_the_reason(course_dir):
    with pytest.raises(FileNotFoundError, match=r"not a notebook.*02_baseline\.ipynb"):
        choose.find_notebooks(course_dir, [str(course_dir / "02_baseline.py")])
    with pytest.raises(FileNotFoundError, match="is a folder"):
        choose.find_notebooks(course_dir, [str(course_dir) + "/"])


def test_a_copy_and_the_lesson_of_the_same_file_name_are_refused_together(course_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "01_setup.ipynb").write_text("{}")
    with pytest.raises(FileNotFoundError, match="same file name"):
        choose.find_notebooks(course_dir, ["01", str(other / "01_setup.ipynb")])
