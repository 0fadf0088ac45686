"""``make lab`` as a learner starts it, from a fresh clone: their work is kept, the clone stays clean.

One module-wide server: ``make lab`` run in a ``git clone`` of this
repository's committed HEAD (the clone's own origin is a second clone, so the
tests can publish a course update), with ``VENV`` pointing at the running
environment (``-o`` tells make not to reinstall it). Nothing is copied into
the lab's folder by hand. The token is read from what ``make lab`` prints.
Only the user's Jupyter folders (config, data, runtime, settings) are
temporary, as a learner's own ``~/.jupyter`` would be; the one user setting,
``expose_app_in_browser``, lets the tests read the notebook's model.

In order, on the same clone:

1. at 1280 x 800 with the file browser open, each lesson is listed once and
   no name is cut;
2. an edit of a code cell and of an exercise answer in 05, saved, closed and
   reopened under every name the file browser shows for 05, is there;
   ``git status --porcelain`` is clean;
3. a course update (a commit changing 05 and adding a lesson) pulls cleanly;
   ``workspace update`` keeps the learner's 05, brings the new lesson, and the
   new 05 can be opened beside theirs;
4. ``make reset LESSON=05`` and ``make reset`` keep the old copies in ``old/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import labpage
import pytest
from labserver import ROOT, LabServer, LabServerError, port_is_free

PORTS = range(8891, 8896)
LESSON = "05_shard_map"
MARK_CODE = "# learner: my own line in the first code cell"
MARK_ANSWER = "psum_factors = (8, 1)  # learner's answer"
pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("make") is None, reason="needs git, make")

GIT_ENV = {
    "GIT_AUTHOR_NAME": "course",
    "GIT_AUTHOR_EMAIL": "course@localhost",
    "GIT_COMMITTER_NAME": "course",
    "GIT_COMMITTER_EMAIL": "course@localhost",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, capture_output=True, text=True)
    assert done.returncode == 0, f"git {' '.join(args)} in {cwd}: {done.stdout}{done.stderr}"
    return done.stdout


class MakeLab(LabServer):
    """``make lab`` in ``clone``, on one of ``PORTS``; the token comes from its output."""

    def __init__(self, clone: Path, venv: Path) -> None:
        super().__init__(lessons=clone / "notebooks", profile="smoke")
        self.clone, self.venv = clone, venv
        self.root = clone / "workspace"
        self.start_dir = clone
        self.token = ""

    def _prepare(self) -> None:
        for name in ("config", "data", "runtime", "settings", "workspaces", "ipython"):
            (self.workdir / name).mkdir(exist_ok=True)
        setting = json.dumps({"LabApp": {"expose_app_in_browser": True}})
        for name in ("jupyter_server_config.json", "jupyter_lab_config.json"):
            (self.workdir / "config" / name).write_text(setting)

    def environment(self) -> dict[str, str]:
        env = super().environment()
        for name in ("JUPYTER_TOKEN", "JUPYTER_CONFIG_PATH", "DPCOURSE_WORKSPACE", "VIRTUAL_ENV"):
            env.pop(name, None)
        return env

    def command(self, port: int) -> list[str]:
        return self.make("lab", f"LAB_PORT={port}")

    def make(self, *args: str) -> list[str]:
        return ["make", "-s", "--no-print-directory", "-o", f"{self.venv}/.installed", *args, f"VENV={self.venv}"]

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            found = re.search(rf"127\.0\.0\.1:{self.port}/lab\?token=([0-9a-f]+)", self.log_tail(50_000))
            if found:
                self.token = found[1]
                try:
                    if self.get("/api/status")[0] == 200:
                        return True
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
            time.sleep(0.3)
        return False

    def run_make(self, *args: str) -> str:
        done = subprocess.run(
            self.make(*args), cwd=self.clone, env=self.environment(), capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"make {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """(origin, clone, server): the course's origin, the learner's clone, ``make lab`` running in it."""
    base = tmp_path_factory.mktemp("learner")
    origin, clone = base / "origin", base / "clone"
    git("clone", "-q", str(ROOT), str(origin), cwd=base)
    git("clone", "-q", str(origin), str(clone), cwd=base)
    server = MakeLab(clone, Path(sys.executable).parent.parent)
    free = [p for p in PORTS if port_is_free(p)]
    if not free:
        pytest.fail(f"none of the ports {PORTS.start}-{PORTS.stop - 1} is free")
    server.preferred_port = free[0]
    try:
        server.start(attempts=1)
    except LabServerError as err:
        server.cleanup()
        pytest.fail(str(err))
    try:
        yield origin, clone, server
    finally:
        server.cleanup()


def lab_page(page, server, workspace: str):
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(labpage.lab_url(server.url, server.token, workspace=workspace))
    labpage.wait_for_lab(page)


def cell_sources(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]


def test_1_make_lab_serves_one_copy_per_lesson_with_legible_names(page, learner):
    origin, clone, server = learner
    text = server.log_tail(50_000)
    assert re.search(r"workspace \S+/workspace: \d+ lessons \(\d+ copied in\)", text), text[-2000:]
    lab_page(page, server, "names")
    lessons = sorted(p.stem for p in (clone / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    listed = labpage.listed_names(page)
    assert sorted(n for n in listed if n[:2].isdigit()) == [f"{n}.ipynb" for n in lessons], listed
    assert "results" in listed
    assert page.locator(".jp-FileBrowser:visible").count() == 1, "the file browser is not open"
    cut = labpage.cut_names(page)
    assert cut == [], f"names cut at 1280 px with the file browser open: {cut}"
    assert git("status", "--porcelain", cwd=clone) == ""


def test_2_an_edit_saved_in_the_lab_is_there_under_every_name(page, learner):
    origin, clone, server = learner
    name = f"{LESSON}.ipynb"
    lab_page(page, server, "edit")
    try:
        labpage.open_from_browser(page, name)
        cells = json.loads((server.root / name).read_text())["cells"]
        code = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
        answer = next(i for i, c in enumerate(cells) if "exercise" in c.get("metadata", {}).get("tags", []))
        labpage.type_into_cell(page, name, code, MARK_CODE + "\n")
        labpage.type_into_cell(page, name, answer, MARK_ANSWER, replace=True)
        labpage.save(page, name)
        labpage.close_all(page)
        server.shutdown_kernels()
        on_disk = cell_sources(server.root / name)
        assert on_disk[code].startswith(MARK_CODE) and on_disk[answer] == MARK_ANSWER
        page.reload()
        labpage.wait_for_lab(page)
        names = [n for n in labpage.listed_names(page) if n.startswith(LESSON)]
        assert names == [name], f"the file browser shows 05 as {names}"
        for shown in names:
            labpage.open_from_browser(page, shown)
            sources = [c.source for c in labpage.code_cells(page, shown)]
            assert any(s.startswith(MARK_CODE) for s in sources), f"{shown}: the code cell edit is gone"
            assert MARK_ANSWER in sources, f"{shown}: the exercise answer is gone"
            labpage.close_all(page)
    finally:
        server.shutdown_kernels()
    assert not list(server.root.glob("*.py")), "a .py twin appeared in the workspace"
    assert git("status", "--porcelain", cwd=clone) == ""


def test_3_a_course_update_reaches_the_learner_and_keeps_their_05(page, learner):
    origin, clone, server = learner
    mine = (server.root / f"{LESSON}.ipynb").read_text()
    assert MARK_ANSWER in mine, "test 2 did not leave the learner's edit"
    # The course: 05 gets a new cell, a lesson is added (the .py twin too, as in notebooks/).
    nb = json.loads((origin / "notebooks" / f"{LESSON}.ipynb").read_text())
    nb["cells"].append({"cell_type": "markdown", "id": "upd05", "metadata": {}, "source": ["New in the course: 05."]})
    (origin / "notebooks" / f"{LESSON}.ipynb").write_text(json.dumps(nb, indent=1) + "\n")
    for suffix in (".ipynb", ".py"):
        shutil.copy(origin / "notebooks" / f"01_setup{suffix}", origin / "notebooks" / f"10_added{suffix}")
    git("add", "-A", cwd=origin)
    git("commit", "-q", "-m", "course update: 05 changed, 10 added", cwd=origin)
    git("pull", "-q", "--ff-only", cwd=clone)
    done = subprocess.run(
        [sys.executable, "-m", "coursetools", "workspace", "update"],
        cwd=clone,
        env=server.environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (server.root / f"{LESSON}.ipynb").read_text() == mine
    beside = sorted(p.relative_to(server.root).as_posix() for p in server.root.glob(f"updates/*/{LESSON}.ipynb"))
    assert len(beside) == 1 and beside[0] in done.stdout, done.stdout
    folder = beside[0].split("/")[1]
    lab_page(page, server, "update")
    try:
        listed = labpage.listed_names(page)
        assert "10_added.ipynb" in listed and "updates" in listed, listed
        labpage.open_folder(page, "updates")
        labpage.open_folder(page, folder)
        cut = labpage.cut_names(page)
        assert cut == [], f"names cut at 1280 px with the file browser open: {cut}"
        labpage.open_from_browser(page, f"{LESSON}.ipynb", path=beside[0])
        assert "New in the course: 05." in labpage.all_sources(page, beside[0])
        labpage.close_all(page, discard=True)
        page.goto(labpage.lab_url(server.url, server.token, workspace="update-2"))
        labpage.wait_for_lab(page)
        labpage.open_from_browser(page, f"{LESSON}.ipynb")
        assert MARK_ANSWER in [c.source for c in labpage.code_cells(page, f"{LESSON}.ipynb")]
        labpage.close_all(page, discard=True)
    finally:
        server.shutdown_kernels()
    assert git("status", "--porcelain", cwd=clone) == ""


def test_4_reset_one_lesson_and_all_keeps_the_old_copies(page, learner):
    origin, clone, server = learner
    mine = (server.root / f"{LESSON}.ipynb").read_text()
    out = server.run_make("reset", "LESSON=05")
    old = server.root / "old"
    kept = list(old.glob(f"*/{LESSON}.ipynb"))
    assert [p.read_text() for p in kept if p.read_text() == mine], f"the learner's 05 is not in old/: {out}"
    assert MARK_ANSWER not in (server.root / f"{LESSON}.ipynb").read_text()
    before = len(list(old.rglob("*.ipynb")))
    server.run_make("reset")
    lessons = list((clone / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert len(list(old.rglob("*.ipynb"))) == before + len(lessons)
    lab_page(page, server, "reset")
    assert "old" in labpage.listed_names(page)
    labpage.open_folder(page, "old")
    stamps = labpage.listed_names(page)
    assert len(stamps) == 2, f"old/ should hold one folder per reset: {stamps}"
    labpage.open_folder(page, stamps[0])
    assert f"{LESSON}.ipynb" in labpage.listed_names(page)
    cut = labpage.cut_names(page)
    assert cut == [], f"names cut at 1280 px with the file browser open: {cut}"
    assert git("status", "--porcelain", cwd=clone) == ""


def test_5_make_edit_pairs_the_maintainers_notebooks(learner):
    """``make edit`` as started: saving a notebooks/ .ipynb through the server writes its .py too."""
    origin, clone, server = learner
    editor = MakeLab(clone, server.venv)
    editor.command = lambda port: editor.make("edit", f"LAB_PORT={port}")
    free = [p for p in PORTS if port_is_free(p)]
    editor.preferred_port = free[0]
    editor.root = clone
    try:
        try:
            editor.start(attempts=1)
        except LabServerError as err:
            pytest.fail(str(err))
        status, body = editor.get("/api/contents/notebooks/03_mesh.ipynb")
        assert status == 200, body[:300]
        model = json.loads(body)
        model["content"]["cells"][0]["source"] += "\n\nA maintainer's sentence."
        request = urllib.request.Request(
            f"{editor.url}/api/contents/notebooks/03_mesh.ipynb",
            data=json.dumps({"type": "notebook", "format": "json", "content": model["content"]}).encode(),
            method="PUT",
            headers={"Authorization": f"token {editor.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
        assert "A maintainer's sentence." in (clone / "notebooks" / "03_mesh.py").read_text()
        assert "A maintainer's sentence." in (clone / "notebooks" / "03_mesh.ipynb").read_text()
    finally:
        editor.cleanup()
        git("checkout", "--", "notebooks", cwd=clone)
