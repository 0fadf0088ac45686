"""Which lessons the browser test may show from notebook-test's executed copies (no browser needed)."""

from __future__ import annotations

import json
import os
import time

from lessons import executed_copy


def _lesson(path, cells, kernel="python3"):
    nb = {
        "cells": cells,
        "metadata": {"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return path


def _code(source, count=None, outputs=()):
    return {"cell_type": "code", "metadata": {}, "source": source, "execution_count": count, "outputs": list(outputs)}


def _pair(tmp_path, executed_cells, source_cells=None):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "run").mkdir()
    lesson = _lesson(tmp_path / "notebooks" / "04_sharding.ipynb", source_cells or [_code("x = 1"), _code("x")])
    old = time.time() - 3600
    os.utime(lesson, (old, old))
    _lesson(tmp_path / "run" / "04_sharding.ipynb", executed_cells, kernel="dpcourse-0123456789")
    return lesson, tmp_path / "run"


def test_a_current_copy_is_used_with_the_lessons_own_kernel(tmp_path):
    out = {"output_type": "execute_result", "data": {"text/plain": "1"}, "metadata": {}, "execution_count": 2}
    lesson, run = _pair(tmp_path, [_code("x = 1", 1), _code("x", 2, [out])])
    executed, why = executed_copy(lesson, run)
    assert executed is not None, why
    assert executed["metadata"]["kernelspec"]["name"] == "python3"  # not nbmake's own kernel name
    assert executed["cells"][1]["outputs"] == [out]


def test_a_copy_of_other_cells_is_not_used(tmp_path):
    lesson, run = _pair(tmp_path, [_code("x = 2", 1), _code("x", 2)])
    executed, why = executed_copy(lesson, run)
    assert executed is None and "other cells" in why


def test_a_copy_with_a_cell_that_did_not_run_is_not_used(tmp_path):
    lesson, run = _pair(tmp_path, [_code("x = 1", 1), _code("x")])
    executed, why = executed_copy(lesson, run)
    assert executed is None and "code cell 2 did not run" in why


def test_a_copy_older_than_the_lesson_is_not_used(tmp_path):
    lesson, run = _pair(tmp_path, [_code("x = 1", 1), _code("x", 2)])
    os.utime(lesson, None)  # the lesson changed after the run
    os.utime(run / lesson.name, (time.time() - 60, time.time() - 60))
    executed, why = executed_copy(lesson, run)
    assert executed is None and "older than the last change" in why


def test_no_folder_or_no_copy_says_so(tmp_path):
    lesson, run = _pair(tmp_path, [_code("x = 1", 1), _code("x", 2)])
    assert executed_copy(lesson, None)[1].startswith("no executed copies given")
    (run / lesson.name).unlink()
    executed, why = executed_copy(lesson, run)
    assert executed is None and why.startswith("no executed copy at")


def test_a_broken_copy_is_not_used(tmp_path):
    lesson, run = _pair(tmp_path, [_code("x = 1", 1), _code("x", 2)])
    (run / lesson.name).write_text("{not json")
    executed, why = executed_copy(lesson, run)
    assert executed is None and "cannot be read" in why


def test_a_copy_older_than_a_data_file_of_the_package_is_not_used(tmp_path):
    """Not only .py files: lesson 10 compiles for the GPU target descriptions (.txtpb) under dpcourse/."""
    lesson, run = _pair(tmp_path, [_code("x = 1", 1), _code("x", 2)])
    package = tmp_path / "dpcourse"
    (package / "gpu_target_configs").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    old = time.time() - 1800
    os.utime(package / "__init__.py", (old, old))
    os.utime(run / lesson.name, (old + 60, old + 60))
    assert executed_copy(lesson, run, package)[0] is not None  # the copy is newer than every file
    (package / "gpu_target_configs" / "h200.txtpb").write_text("gpu_device_info {}")  # changed after the run
    executed, why = executed_copy(lesson, run, package)
    assert executed is None and "older than the last change" in why
