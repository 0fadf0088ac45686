"""Tests of coursetools.outfolder and the runner's use of it: results never mixed, half-written or lost."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import nbformat
import pytest

from coursetools import outfolder, runner


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    nbformat.write(nb, path)
    return path


@pytest.mark.timeout(60)
def test_a_second_run_into_the_same_folder_is_refused_naming_the_folder_and_the_run(tmp_path):
    """The issue's example: two runs a second apart into one --out both exited 0 and mixed their results."""
    nb = write_notebook(tmp_path / "01_x.ipynb", "a = 1")
    out = tmp_path / "out"
    out.mkdir()
    code = (
        "import sys, time; from coursetools import outfolder; "
        "outfolder.acquire_lock(sys.argv[1], 'python -m coursetools run'); print('held', flush=True); time.sleep(60)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = out / outfolder.LOCK_NAME
        with pytest.raises(outfolder.FolderInUse) as err:
            runner.run_course("smoke", [nb], out)
        text = str(err.value)
        assert str(out) in text and f"process {holder.pid}" in text and "python -m coursetools run" in text
        assert "another --out" in text
        assert not (out / "results.json").exists() and not (out / "01_x.ipynb").exists()
        assert json.loads(lock.read_text())["pid"] == holder.pid  # the holder's lock is untouched
    finally:
        holder.kill()
        holder.wait(timeout=30)


@pytest.mark.parametrize("pid", ["dead", "this"])
def test_a_stale_lock_from_a_killed_run_does_not_block(tmp_path, pid):
    """Also one that names this very process: a restart in a container has the killed run's pid."""
    out = tmp_path / "out"
    out.mkdir()
    pid = dead_pid() if pid == "dead" else os.getpid()
    (out / outfolder.LOCK_NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
    lock = outfolder.acquire_lock(out, "test")
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    outfolder.release_lock(lock)
    assert not lock.exists()


def test_a_lock_from_another_host_is_not_judged_and_says_how_to_clear_it(tmp_path):
    (tmp_path / outfolder.LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    with pytest.raises(outfolder.FolderInUse) as err:
        outfolder.acquire_lock(tmp_path)
    assert "elsewhere" in str(err.value) and "delete" in str(err.value)


def test_only_one_of_two_racing_takers_gets_the_lock(tmp_path):
    first = outfolder.acquire_lock(tmp_path)
    with pytest.raises(outfolder.FolderInUse):
        outfolder.acquire_lock(tmp_path)  # same pid: refused too (a run inside a run)
    outfolder.release_lock(first)
    assert outfolder.acquire_lock(tmp_path).exists()


def fill_disk_after(monkeypatch, n_bytes: int):
    """Make every write through outfolder._write_file write ``n_bytes`` and then fail with ENOSPC."""

    def full(path, data):
        with open(path, "wb") as fh:
            fh.write(data[:n_bytes])
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(outfolder, "_write_file", full)


def test_a_full_disk_leaves_the_old_file_whole_and_no_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    outfolder.write_json_atomic(target, {"old": True})
    fill_disk_after(monkeypatch, 5)
    with pytest.raises(outfolder.DiskFullError) as err:
        outfolder.write_json_atomic(target, {"new": True})
    assert str(tmp_path) in str(err.value) and "No space left" in str(err.value)
    assert json.loads(target.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


@pytest.mark.slow
def test_a_full_disk_during_a_run_is_one_short_error_and_leaves_nothing_corrupt(tmp_path, monkeypatch, capsys):
    """The issue's example: ~50 lines of tracebacks, a truncated notebook, a 0-byte temp file, a stale results.json."""
    from coursetools.cli import main

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "01_a.ipynb", "a = 1")
    write_notebook(nbs / "02_b.ipynb", "b = 2")
    out = tmp_path / "out"
    fill_disk_after(monkeypatch, 100)
    monkeypatch.setattr(runner, "acquire_lock", lambda folder, command="": folder / outfolder.LOCK_NAME)
    code = main(["run", "--profile", "smoke", "--notebook-dir", str(nbs), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(out) in lines[0] and "No space left" in lines[0]
    assert "Traceback" not in err
    for path in out.iterdir():  # nothing half-written: no temporary file, every notebook and JSON parses
        assert not path.name.endswith(".tmp"), path
        if path.suffix in (".ipynb", ".json"):
            json.loads(path.read_text())
