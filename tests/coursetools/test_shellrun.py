"""coursetools.shellrun: a notebook executed in IPython's shell keeps its outputs, and stops at the first error."""

from __future__ import annotations

import datetime
import socket

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from coursetools import shellrun


@pytest.fixture(autouse=True)
def _no_shell_left_behind():
    """The in-process runs make the worker's IPython shell; later tests in the worker must not find it.

    ``get_ipython()`` would return it, and code that behaves differently in IPython (a note shown with
    ``display`` instead of printed, the global-mesh guard) would then fail tests that expect a plain
    process: seen in ``make test`` when this file ran before them in one worker.
    """
    yield
    if shellrun._CLASSES is not None:
        shellrun._CLASSES[0].clear_instance()


def _notebook(*sources: str):
    return new_notebook(cells=[new_markdown_cell("# title"), *(new_code_cell(s) for s in sources)])


def test_outputs_land_in_their_cells_in_order(tmp_path):
    nb = _notebook(
        "import sys\nprint('a'); print('b', file=sys.stderr); print('c')",
        "from IPython.display import HTML, display\ndisplay(HTML('<b>x</b>'))\n40 + 2",
        "value = 3\nvalue;",
    )
    outcome = shellrun.execute(nb, tmp_path)
    assert outcome == {"error_cell": None, "error": None, "interrupted": False}
    first, second, third = (c for c in nb.cells if c.cell_type == "code")
    assert [(o.output_type, o.name, o.text) for o in first.outputs] == [
        ("stream", "stdout", "a\n"),
        ("stream", "stderr", "b\n"),
        ("stream", "stdout", "c\n"),
    ]
    assert [o.output_type for o in second.outputs] == ["display_data", "execute_result"]
    assert second.outputs[0].data["text/html"] == "<b>x</b>" and second.outputs[1].data["text/plain"] == "42"
    assert third.outputs == [] and first.execution_count < second.execution_count < third.execution_count


def test_each_cell_keeps_when_it_started_and_ended_as_nbclient_records_it(tmp_path):
    nb = _notebook("import time\ntime.sleep(0.2)", "1 + 1")
    shellrun.execute(nb, tmp_path)
    first, second = (c for c in nb.cells if c.cell_type == "code")
    spans = []
    for cell in (first, second):
        timing = cell.metadata["execution"]
        start, end = (
            datetime.datetime.fromisoformat(timing[key].replace("Z", "+00:00"))
            for key in ("iopub.execute_input", "shell.execute_reply")
        )
        spans.append((start, end))
    assert (spans[0][1] - spans[0][0]).total_seconds() >= 0.2
    assert spans[0][1] <= spans[1][0] <= spans[1][1]


def test_the_first_error_stops_the_run_with_its_cell_and_traceback(tmp_path):
    nb = _notebook("x = 1", "raise ValueError('the lesson says why\\nsecond line')", "print('never')")
    outcome = shellrun.execute(nb, tmp_path)
    assert outcome["error_cell"] == 2 and outcome["error"] == "ValueError: the lesson says why"
    error = nb.cells[2].outputs[-1]
    assert error.output_type == "error" and error.ename == "ValueError" and error.traceback
    assert nb.cells[3].outputs == []


def test_it_opens_no_socket(tmp_path, monkeypatch):
    """A TPU host refuses every socket but a Unix one: the shell needs none (a kernel does)."""

    def refuse(family=-1, *args, **kwargs):
        if family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(97, "Address family not supported by protocol")
        return real(family, *args, **kwargs)

    real = socket.socket
    monkeypatch.setattr(socket, "socket", refuse)
    nb = _notebook("print(sum(range(4)))")
    assert shellrun.execute(nb, tmp_path)["error"] is None
    assert nb.cells[1].outputs[0].text == "6\n"


@pytest.mark.slow
def test_a_fresh_process_writes_the_executed_notebook_and_its_result(tmp_path):
    nb = _notebook("import os\nprint(os.getcwd())", "1 / 0")
    out = tmp_path / "executed.ipynb"
    outcome = shellrun.run_in_process(nb, tmp_path, out)
    assert outcome["error_cell"] == 2 and outcome["error"].startswith("ZeroDivisionError")
    assert outcome["peak_device_bytes"] is None  # JAX never started
    executed = nbformat.read(out, as_version=4)
    assert executed.cells[1].outputs[0].text.strip() == str(tmp_path)


def test_a_process_that_dies_is_named_with_its_status(tmp_path):
    nb = _notebook("import os, sys\nprint('last words', file=sys.__stderr__, flush=True)\nos._exit(3)")
    outcome = shellrun.run_in_process(nb, tmp_path, tmp_path / "out.ipynb")
    assert outcome["error"] == "ProcessError: the notebook's process ended with status 3. Its last message: last words"
    assert outcome["error_cell"] is None and not outcome["interrupted"]
