"""Tests of coursetools.pairs: `make sync` never loses an edit, on temp copies of a pair."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from coursetools import pairs

ROOT = Path(__file__).resolve().parents[2]
PAIR = "03_mesh"


@pytest.fixture()
def folder(tmp_path):
    shutil.copy(ROOT / "jupytext.toml", tmp_path / "jupytext.toml")  # the pairing, as in the repository
    for suffix in (".py", ".ipynb"):
        shutil.copy(ROOT / "notebooks" / f"{PAIR}{suffix}", tmp_path / f"{PAIR}{suffix}")
    return tmp_path


def edit_py(folder: Path, old: str, new: str) -> None:
    path = folder / f"{PAIR}.py"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def edit_ipynb_cell(folder: Path, index: int, line: str) -> str:
    """Append ``line`` to code cell number ``index`` (0-based among code cells) of the .ipynb."""
    path = folder / f"{PAIR}.ipynb"
    nb = json.loads(path.read_text())
    cell = [c for c in nb["cells"] if c["cell_type"] == "code"][index]
    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    cell["source"] = source + "\n" + line
    path.write_text(json.dumps(nb, indent=1))
    return line


def first_markdown_line(folder: Path) -> str:
    return next(line for line in (folder / f"{PAIR}.py").read_text().splitlines() if line.startswith("# # "))


def test_both_files_edited_is_refused_naming_both_and_keeping_both_edits(folder, capsys):
    pairs.sync(folder)  # in sync; records the state
    title = first_markdown_line(folder)
    edit_py(folder, title, title + " (py edit)")
    os.utime(folder / f"{PAIR}.py", (1, 1))  # the older file: jupytext alone would overwrite it
    edit_ipynb_cell(folder, 1, "ipynb_edit = 1")
    with pytest.raises(pairs.PairConflict) as err:
        pairs.sync(folder)
    message = str(err.value)
    assert f"{PAIR}.py" in message and f"{PAIR}.ipynb" in message
    assert "(py edit)" in (folder / f"{PAIR}.py").read_text()
    assert "ipynb_edit = 1" in (folder / f"{PAIR}.ipynb").read_text()

    from coursetools.cli import main

    assert main(["sync", "--notebook-dir", str(folder)]) == 1
    err_text = capsys.readouterr().err
    assert f"{folder / PAIR}.py and {folder / PAIR}.ipynb" in err_text
    assert "(py edit)" in (folder / f"{PAIR}.py").read_text()
    assert "ipynb_edit = 1" in (folder / f"{PAIR}.ipynb").read_text()


def test_an_edit_in_the_older_ipynb_is_kept_and_copied_to_the_py(folder):
    pairs.sync(folder)
    edit_ipynb_cell(folder, 1, "from_the_notebook = 2")
    os.utime(folder / f"{PAIR}.ipynb", (1, 1))  # older than the .py
    [status] = pairs.sync(folder)
    assert status.action == "from ipynb"
    assert "from_the_notebook = 2" in (folder / f"{PAIR}.py").read_text()
    assert "from_the_notebook = 2" in (folder / f"{PAIR}.ipynb").read_text()
    assert [s.action for s in pairs.sync(folder)] == ["in sync"]


def test_an_ipynb_edit_is_kept_when_the_py_looks_as_new_as_now(folder):
    """A .py stamped a moment ahead (a whole-second file system, a copy from a machine whose clock is ahead):
    stamping the source with "now" left it older, jupytext took the .py, and the notebook's edit was lost."""
    import time

    pairs.sync(folder)
    edit_ipynb_cell(folder, 1, "from_the_notebook = 3")
    os.utime(folder / f"{PAIR}.ipynb", (1, 1))
    ahead = time.time() + 0.5
    os.utime(folder / f"{PAIR}.py", (ahead, ahead))
    [status] = pairs.sync(folder)
    assert status.action == "from ipynb"
    assert "from_the_notebook = 3" in (folder / f"{PAIR}.py").read_text()
    assert "from_the_notebook = 3" in (folder / f"{PAIR}.ipynb").read_text()


def test_an_edit_in_the_py_reaches_the_ipynb(folder):
    pairs.sync(folder)
    edit_py(folder, first_markdown_line(folder), "# # A new title")
    os.utime(folder / f"{PAIR}.py", (1, 1))
    [status] = pairs.sync(folder)
    assert status.action == "from py"
    assert "A new title" in (folder / f"{PAIR}.ipynb").read_text()


def test_outputs_saved_in_the_ipynb_are_not_an_edit(folder):
    pairs.sync(folder)
    path = folder / f"{PAIR}.ipynb"
    nb = json.loads(path.read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
    code["execution_count"] = 3
    path.write_text(json.dumps(nb, indent=1))
    edit_py(folder, first_markdown_line(folder), "# # Edited after running")
    assert [s.action for s in pairs.sync(folder)] == ["from py"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_without_a_sync_record_the_committed_version_is_the_baseline(folder):
    def git(*args):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
            cwd=folder,
            check=True,
            capture_output=True,
        )

    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "pair")
    title = first_markdown_line(folder)
    edit_py(folder, title, title + " (py edit)")
    edit_ipynb_cell(folder, 1, "ipynb_edit = 1")
    assert not (folder / pairs.STATE_NAME).exists()
    with pytest.raises(pairs.PairConflict):
        pairs.sync(folder)


def test_a_folder_without_notebooks_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="No numbered notebooks"):
        pairs.sync(tmp_path)


def test_a_damaged_ipynb_is_named_and_nothing_is_written(folder, capsys):
    pairs.sync(folder)
    (folder / f"{PAIR}.ipynb").write_text("{\n")  # e.g. a half-written save
    py_before = (folder / f"{PAIR}.py").read_text()
    with pytest.raises(pairs.UnreadableNotebook, match=f"{PAIR}.ipynb cannot be read as a notebook"):
        pairs.sync(folder)
    assert (folder / f"{PAIR}.py").read_text() == py_before

    from coursetools.cli import main

    assert main(["sync", "--notebook-dir", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and "git checkout" in err
