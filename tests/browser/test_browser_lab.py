"""The lab as the course configures it (``jupyter/``), checked in a real Chromium.

- Without the token: the login page, and 403 from the contents API.
- A lesson's ``.py`` clicked in the file browser opens as the notebook.
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


def test_a_lesson_py_opens_as_the_notebook_without_news_prompt(page, lab, screenshots):
    lesson = lesson_names()[0]
    py_name, ipynb = f"{lesson}.py", lab.root / f"{lesson}.ipynb"
    page.goto(labpage.lab_url(lab.url, lab.token, workspace="open-py"))
    labpage.wait_for_lab(page)
    page.locator(".jp-DirListing-item", has_text=py_name).first.dblclick()
    try:
        labpage.wait_for_kernel(page, py_name)
        opened = labpage.state(page, py_name)
        assert opened["isNotebook"], f"{py_name} opened, but not as a notebook: {opened}"
        cells_in_pair = len(json.loads(ipynb.read_text())["cells"])
        assert opened["cells"] == cells_in_pair, (
            f"{py_name} shows {opened['cells']} cells, the pair has {cells_in_pair}"
        )
        assert page.locator(".jp-FileEditor:visible").count() == 0
        # The kernel the lab started has the course's memory setting.
        env = labpage.kernel_execute(page, py_name, "import os; print(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))")
        assert env.strip() == "false", f"kernel XLA_PYTHON_CLIENT_PREALLOCATE={env.strip()!r}"
        # By now the lab has been up for seconds: the news prompt would show.
        page.wait_for_timeout(1000)
        assert page.get_by_text("Jupyter news").count() == 0, "the Jupyter news prompt is shown"
        page.screenshot(path=str(screenshots / "open-py-as-notebook.png"))
    finally:
        lab.shutdown_kernels()
