"""The lab as the course configures it (``jupyter/``), checked in a real Chromium.

- Without the token: the login page, and 403 from the contents API.
- Each lesson is listed once (``NN_name.ipynb``, no ``.py`` twin); a double
  click opens it as a notebook, whose kernel runs in the workspace.
- No "Jupyter news" prompt; the settings come from the repository.
- Kernels start with ``XLA_PYTHON_CLIENT_PREALLOCATE=false``.
"""

from __future__ import annotations

import json

import labpage
from labserver import lesson_names


def test_without_the_token_the_lab_shows_its_login_page(page, lab):
    page.goto(f"{lab.url}/lab")
    page.wait_for_load_state("domcontentloaded")
    assert "/login" in page.url, f"expected the login page, got {page.url}"
    assert page.locator("input[type=password]").count() >= 1
    assert "token" in page.locator("body").inner_text().lower()
    assert page.locator(".jp-LabShell").count() == 0
    status, _ = lab.get("/api/contents", token=False)
    assert status == 403
    status, body = lab.get("/api/contents")  # the same request with the token
    assert status == 200 and "01_setup.ipynb" in body


def test_settings_come_from_the_repository(lab):
    """The course's overrides are the defaults the lab serves (a learner's own settings still win)."""
    status, body = lab.get("/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
    assert status == 200
    viewers = json.loads(body)["schema"]["properties"]["defaultViewers"]["default"]
    assert viewers.get("python") == "Jupytext Notebook"
    status, body = lab.get("/lab/api/settings/@jupyterlab/apputils-extension:notification")
    assert status == 200
    props = json.loads(body)["schema"]["properties"]
    assert props["fetchNews"]["default"] == "false"
    assert props["checkForUpdates"]["default"] is False


def test_each_lesson_is_listed_once_and_opens_as_a_notebook_without_news_prompt(page, lab, screenshots):
    lesson = lesson_names()[0]
    name = f"{lesson}.ipynb"
    page.goto(labpage.lab_url(lab.url, lab.token, workspace="open-lesson"))
    labpage.wait_for_lab(page)
    listed = labpage.listed_names(page)
    assert sorted(n for n in listed if n[:2].isdigit()) == [f"{n}.ipynb" for n in lesson_names()], listed
    page.locator(".jp-DirListing-item", has_text=name).first.dblclick()
    try:
        labpage.wait_for_kernel(page, name)
        opened = labpage.state(page, name)
        assert opened["isNotebook"], f"{name} opened, but not as a notebook: {opened}"
        assert opened["cells"] == len(json.loads((lab.root / name).read_text())["cells"])
        # The kernel the lab started has the course's memory setting, and runs in the workspace.
        code = "import os; print(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE')); print(os.getcwd())"
        env, cwd = labpage.kernel_execute(page, name, code).split()
        assert env == "false", f"kernel XLA_PYTHON_CLIENT_PREALLOCATE={env!r}"
        assert cwd == str(lab.root), f"the kernel runs in {cwd}, not in the workspace {lab.root}"
        # By now the lab has been up for seconds: the news prompt would show.
        page.wait_for_timeout(1000)
        assert page.get_by_text("Jupyter news").count() == 0, "the Jupyter news prompt is shown"
        page.screenshot(path=str(screenshots / "open-lesson.png"))
    finally:
        lab.shutdown_kernels()


def _notebook(*sources: str) -> dict:
    cells = [
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": s} for s in sources
    ]
    kernelspec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    return {"cells": cells, "metadata": {"kernelspec": kernelspec}, "nbformat": 4, "nbformat_minor": 5}


def test_the_width_check_passes_100_characters_and_catches_more(page, lab):
    """At 1280 x 800 with the file browser open, a 100-character line fits; a 130-character one is caught (stream output wraps, so it never scrolls)."""
    name = "98_widths.ipynb"
    fits = "x = " + "1" * 96
    too_wide = "y = " + "2" * 126
    (lab.root / name).write_text(json.dumps(_notebook(fits, too_wide)))
    page.set_viewport_size({"width": 1280, "height": 800})
    try:
        page.goto(labpage.lab_url(lab.url, lab.token, name, workspace="widths"))
        labpage.wait_for_lab(page)
        labpage.wait_for_kernel(page, name)
        labpage.run_all_from_menu(page)
        labpage.wait_until_run(page, name, 60)
        labpage.show_file_browser(page)
        found = labpage.horizontal_overflow(page, name)
        assert [(f["cell"], f["where"]) for f in found] == [(2, "input")], labpage.describe_overflow(found)
    finally:
        lab.shutdown_kernels()
        (lab.root / name).unlink()


# The lesson's own content in the lab: its rendered text and its outputs. JupyterLab's own
# widgets are left out: axe-core 4.14.1 finds, in JupyterLab 4 itself, ARIA attributes its
# toolbar buttons may not carry, CodeMirror editors without an accessible name, the windowed
# notebook list without list items and the headings' collapse buttons without text; none
# of those is the course's to change.
LESSON_CONTENT = (".jp-MarkdownCell .jp-RenderedMarkdown", ".jp-OutputArea-output")
JUPYTERLAB_OWN = (".jp-collapseHeadingButton",)


def test_a_lesson_view_has_no_serious_or_critical_accessibility_violation(page, lab):
    """axe-core (pinned in tools/site/package-lock.json) on a lesson's text and outputs as the lab shows them."""
    from axe import missing, severe_violations

    if missing():
        raise AssertionError(missing())
    name = next(f"{n}.ipynb" for n in lesson_names() if n.startswith("04_"))
    page.set_viewport_size({"width": 1280, "height": 800})
    try:
        page.goto(labpage.lab_url(lab.url, lab.token, name, workspace="accessibility"))
        labpage.wait_for_lab(page)
        labpage.wait_rendered(page, name)
        assert page.locator(LESSON_CONTENT[0]).count() > 0, f"{name}: no rendered text to check"
        found = severe_violations(page, include=LESSON_CONTENT, exclude=JUPYTERLAB_OWN)
        assert not found, f"{name} in the lab:\n" + "\n".join(found)
    finally:
        lab.shutdown_kernels()
