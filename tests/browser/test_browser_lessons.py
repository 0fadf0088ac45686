"""Every lesson in JupyterLab in a real Chromium, as a learner sees it.

For each ``notebooks/NN_name.ipynb``, in turn in one lab (loaded once by
its address, each lesson then opened there and closed after its checks):
check that no cell raised or printed a traceback, that every code cell ran,
and that the lesson's key output (``lessons.KEY_OUTPUT``) is on the page;
then, at 1280 x 800 with the file browser open, measure every cell for
sideways scrolling (checked by ``test_lesson_fits_1280x800``, which reuses
the visit). Lessons with controls (ipywidgets sliders and buttons, as in 07)
must show them with readable labels, take a slider change and a button
press, and show the result. A screenshot of each lesson is saved under
``results/browser/``.

How a lesson gets its outputs: in ``make test``, the unit layer's plain
passes have just executed every lesson (the same smoke profile, as ``make
notebook-test`` runs them) and kept the copies; ``make browser-test`` names their folder in
``$DPCOURSE_EXECUTED_LESSONS``, and a lesson whose copy is current (the same
cells) is opened with those outputs instead of being run a second time. The
lessons in ``lessons.LIVE_LESSONS`` (07, for its controls), and any
lesson without a current copy, are run here from the Run menu (Run > Run All
Cells, then wait until the kernel is idle).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import labpage
import pytest
from labserver import NOTEBOOKS, lesson_names
from lessons import EXECUTED_ENV, LIVE_LESSONS, executed_copy, key_output

LESSON_TIMEOUT_S = float(os.environ.get("DPCOURSE_BROWSER_LESSON_TIMEOUT_S", "300"))
# Lessons whose every cell must fit 1280 x 800 with the file browser open: all
# of them. Lessons with code lines over 100 characters fail until shortened.
WIDTH_LESSONS = lesson_names()
RUNS: dict[str, labpage.LessonRun] = {}  # each lesson's run, reused by the width check
EXECUTED = Path(os.environ[EXECUTED_ENV]) if os.environ.get(EXECUTED_ENV) else None


def _controls_07(page, path: str, run: labpage.LessonRun, changed: dict) -> None:
    """07: the comparison in the output area is for the per-device batch the slider now shows."""
    if "per-device batch" not in changed:
        run.problem("07: no 'per-device batch' slider to change")
        return
    n = labpage.kernel_execute(page, path, "print(n)").strip()
    if not n.isdigit():
        run.problem(f"07: could not read the device count from the kernel (got {n!r})")
        return
    text = labpage.output_widget_text(page)
    global_batch = int(changed["per-device batch"]) * int(n)
    if "global batch" not in text or not re.search(rf"\b{global_batch}\b", text):
        run.problem(
            f"07: after setting the per-device batch to {changed['per-device batch']} and pressing the button, "
            f"the output area does not show global batch {global_batch} ({n} devices); it shows: {text[:400]!r}"
        )


CONTROL_CHECKS = {"07_sweep": _controls_07}


def exercise_controls(page, lesson: str, path: str, run: labpage.LessonRun) -> None:
    """Check the lesson's widgets: readable labels; move each slider one step; press each button."""
    root = page.locator(".jp-NotebookPanel:visible")
    sliders = root.locator(".widget-slider")
    buttons = root.locator("button.widget-button")
    if sliders.count() == 0 and buttons.count() == 0:
        return
    run.notes.append(f"{sliders.count()} slider(s), {buttons.count()} button(s)")
    run.controls_cell = page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.content.widgets"
        ".findIndex((cell) => cell.node.querySelector('.widget-slider, .widget-button'))"
    )
    for label in labpage.widget_labels(page):
        if label["cut"]:
            run.problem(
                f"widget label {label['text']!r} is cut off ({label['shown']} px shown, {label['needed']} px needed): "
                "give the control style={'description_width': 'initial'}"
            )
    changed = {}
    for i in range(sliders.count()):
        slider = sliders.nth(i)
        name = slider.locator(".widget-label").text_content().strip()
        handle = slider.get_by_role("slider")
        before = handle.get_attribute("aria-valuenow")
        handle.focus()
        handle.press("ArrowRight")
        page.wait_for_timeout(300)
        after = handle.get_attribute("aria-valuenow")
        if after == before:
            handle.press("ArrowLeft")  # at its maximum: step down instead
            page.wait_for_timeout(300)
            after = handle.get_attribute("aria-valuenow")
        if after == before:
            run.problem(f"slider {name!r} did not move (stays at {before})")
        changed[name] = str(int(float(after)))
    if not labpage.output_widget_text(page).strip():
        run.notes.append("output area empty before the button press")
    for i in range(buttons.count()):
        buttons.nth(i).click()
        if not labpage.wait_kernel_busy_then_idle(page, path, LESSON_TIMEOUT_S):
            run.problem(f"the kernel stayed busy after pressing {buttons.nth(i).text_content()!r}")
    shown = labpage.output_widget_text(page)
    if buttons.count() and not shown.strip():
        run.problem("pressing the button left the output area empty")
    if labpage.TRACEBACK in shown:
        run.problem(f"the output area shows an error: {shown.strip()[-400:]}")
    check = CONTROL_CHECKS.get(lesson)
    if check is not None:
        check(page, path, run, changed)


def run_lesson(
    page,
    lab,
    lesson: str,
    screenshots,
    timeout_s: float = LESSON_TIMEOUT_S,
    executed: dict | None = None,
    in_open_lab: bool | None = None,
) -> labpage.LessonRun:
    """Open ``lesson`` (by its address, or in the lab ``page`` shows), run all cells from the menu (or show ``executed``), check it.

    ``executed`` (a notebook with outputs, from :func:`lessons.executed_copy`)
    is written over the workspace's copy and opened as it is, with no run.
    ``in_open_lab``: True, ``page`` already shows this lab with no document
    open, and the lesson is opened there, not by loading the lab again; True
    or False, the lesson is closed at the end, so the page can show the next.
    Returns the run with every problem found; its screenshot is saved whether
    or not there are problems (at the first failing cell if there is one).
    """
    path = f"{lesson}.ipynb"
    run = labpage.LessonRun(lesson)
    start = time.monotonic()
    page.set_viewport_size({"width": 1280, "height": 800})
    page.js_errors = []
    try:
        if executed is not None:
            (lab.root / path).write_text(json.dumps(executed), encoding="utf-8")
        if in_open_lab:
            page.evaluate("(path) => { window.jupyterapp.commands.execute('docmanager:open', {path}); }", path)
        else:
            page.goto(labpage.lab_url(lab.url, lab.token, path, workspace=f"lesson-{lesson}"))
            labpage.wait_for_lab(page)
        labpage.wait_for_kernel(page, path)
        run.notes.append(f"lab and kernel ready after {time.monotonic() - start:.1f} s")
        if executed is None:
            labpage.run_all_from_menu(page)
            ran = time.monotonic()
            final = labpage.wait_until_run(page, path, timeout_s)
            run.notes.append(f"run all {time.monotonic() - ran:.1f} s")
        else:
            final = {"timed_out": False, "status": "idle"}
        if not final["timed_out"]:
            labpage.wait_rendered(page, path)
        cells = labpage.code_cells(page, path)
        run.cells = cells
        if final["timed_out"]:
            busy = next((c for c in cells if not c.count), None)
            run.problem(f"still running after {timeout_s:.0f} s (kernel {final.get('status')})", busy)
        elif final.get("status") != "idle":
            run.problem(f"kernel ended in state {final.get('status')!r} (it died or restarted)")
        labpage.check_cells(run, cells)
        text = labpage.notebook_text(page, path)
        for expected in key_output(lesson):
            if expected not in text:
                run.problem(f"key output {expected!r} is not on the page")
        if not run.problems:
            exercise_controls(page, lesson, path, run)
        labpage.show_file_browser(page)
        run.overflow = labpage.horizontal_overflow(page, path)
    except Exception as err:  # noqa: BLE001 (reported with the screenshot below)
        run.problem(f"the browser run stopped: {type(err).__name__}: {str(err).splitlines()[0][:500]}")
    finally:
        run.seconds = time.monotonic() - start
        run.notes += [f"page error: {err}" for err in getattr(page, "js_errors", [])]
        run.screenshot = str(screenshots / f"{lesson}.png")
        try:
            if run.problem_cell is not None:
                labpage.scroll_to_cell(page, path, run.problem_cell)
            elif run.controls_cell is not None:
                labpage.scroll_to_cell(page, path, run.controls_cell)
            elif key_output(lesson):
                labpage.scroll_to_text(page, path, key_output(lesson)[0])
            page.screenshot(path=run.screenshot)
        except Exception as err:  # noqa: BLE001
            run.notes.append(f"screenshot failed: {err}")
        if in_open_lab is not None:
            try:
                labpage.close_all(page, discard=True)  # the lesson closed before its kernel ends
            except Exception as err:  # noqa: BLE001
                run.problem(f"closing the lesson failed: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
        lab.shutdown_kernels()
    return run


def visit(page, lab, lesson: str, screenshots, in_open_lab: bool | None = None) -> labpage.LessonRun:
    """The lesson in the browser: its current executed copy when there is one (not a live lesson), else a run."""
    executed, why = (
        (None, "a live lesson") if lesson in LIVE_LESSONS else executed_copy(NOTEBOOKS / f"{lesson}.ipynb", EXECUTED)
    )
    run = run_lesson(page, lab, lesson, screenshots, executed=executed, in_open_lab=in_open_lab)
    run.notes.insert(0, f"shown from the {why}" if executed is not None else f"run in the browser ({why})")
    return run


@pytest.mark.parametrize("lesson", lesson_names())
def test_lesson_in_the_browser(lab_page, lab, screenshots, lesson):
    run = RUNS[lesson] = visit(lab_page["page"], lab, lesson, screenshots, in_open_lab=lab_page["open"])
    lab_page["open"] = not run.problems
    print(f"{lesson}: {run.seconds:.1f} s in the browser; {'; '.join(run.notes)}")
    assert not run.problems, run.report()


def test_with_executed_copies_every_lesson_but_the_live_ones_is_shown_from_them():
    """In make test the copies exist and are current: only LIVE_LESSONS run a second time."""
    if EXECUTED is None:
        pytest.skip(f"{EXECUTED_ENV} is not set: every lesson runs in the browser")
    stale = {}
    for lesson in lesson_names():
        if lesson not in LIVE_LESSONS:
            executed, why = executed_copy(NOTEBOOKS / f"{lesson}.ipynb", EXECUTED)
            if executed is None:
                stale[lesson] = why
    assert not stale, f"lessons run again because their executed copy is missing or old: {stale}"


@pytest.mark.parametrize("lesson", WIDTH_LESSONS)
def test_lesson_fits_1280x800(page, lab, screenshots, lesson):
    """After Run All: no cell's input or output area scrolls sideways at 1280 x 800, file browser open."""
    run = RUNS.get(lesson) or visit(page, lab, lesson, screenshots)
    assert run.overflow is not None, f"{lesson}: the width was not measured: {run.report()}"
    assert not run.overflow, (
        f"{lesson}: cells that need sideways scrolling at 1280 x 800 with the file browser open:\n"
        + labpage.describe_overflow(run.overflow)
    )


def test_a_failing_lesson_is_reported_with_its_cell_and_error(page, lab, screenshots):
    """A lesson that raises: the failure names the lesson, the cell and the error; the screenshot is kept."""
    lesson = "99_raises"
    notebook = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": "# A lesson that fails"},
            {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": "x = 1"},
            {
                "cell_type": "code",
                "metadata": {},
                "execution_count": None,
                "outputs": [],
                "source": "raise ValueError('per-device batch must divide the global batch')",
            },
            {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": "y = 2"},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (lab.root / f"{lesson}.ipynb").write_text(json.dumps(notebook))
    shot = screenshots / f"{lesson}.png"
    shot.unlink(missing_ok=True)
    try:
        run = run_lesson(page, lab, lesson, screenshots, timeout_s=120)
    finally:
        (lab.root / f"{lesson}.ipynb").unlink()
    report = run.report()
    assert "Lesson 99_raises failed" in report
    assert "cell 3 `raise ValueError" in report
    assert "ValueError: per-device batch must divide the global batch" in report
    # The cell after the error never ran: reported as the error, not as a second problem.
    assert len(run.problems) == 1, report
    assert shot.exists() and shot.stat().st_size > 0
    shot.unlink()
