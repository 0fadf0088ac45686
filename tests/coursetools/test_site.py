"""coursetools.site: which executed lessons the website may show, failures that stop it, the notes it adds."""

from __future__ import annotations

import json
import time

import nbformat
import pytest

from coursetools import site


def _lesson(path, cells=("# 05 · A lesson\n\n**Goal.** Learn one thing. Then more.", "x = 1"), outputs=None):
    nb = nbformat.v4.new_notebook()
    for i, src in enumerate(cells):
        cell = nbformat.v4.new_code_cell(src) if i else nbformat.v4.new_markdown_cell(src)
        if i and outputs:
            cell.outputs = outputs
        nb.cells.append(cell)
    nbformat.write(nb, path)
    return path


def _runner_run(folder, status, created="2030-01-01T00:00:00+00:00", records=()):
    folder.mkdir(exist_ok=True)
    payload = {"schema": 1, "created": created, "profile": "cpu", "notebooks": status, "records": list(records)}
    (folder / "results.json").write_text(json.dumps(payload))
    return site.load_run(folder)


def _entry(name, status="passed", error=None, cell=None):
    return {"notebook": name, "status": status, "error": error, "error_cell": cell, "error_code_cell": cell}


def test_current_copy_is_chosen_and_an_edited_lesson_is_not(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    lesson = _lesson(src / "05_x.ipynb")
    run = _runner_run(tmp_path / "run", [_entry("05_x")])
    _lesson(run.folder / "05_x.ipynb")
    nb, why = site.check_lesson(lesson, run, changed=0.0)
    assert nb is not None and why is None
    _lesson(lesson, cells=("# 05 · A lesson", "x = 2"))
    nb, why = site.check_lesson(lesson, run, changed=0.0)
    assert nb is None and "another version of the lesson" in why


def test_a_run_older_than_the_sources_is_not_current(tmp_path):
    lesson = _lesson(tmp_path / "05_x.ipynb")
    run = _runner_run(tmp_path / "run", [_entry("05_x")], created="2020-01-01T00:00:00+00:00")
    _lesson(run.folder / "05_x.ipynb")
    nb, why = site.check_lesson(lesson, run, changed=time.time())
    assert nb is None and "older than the last change" in why


def test_a_timed_out_lesson_stops_the_build_naming_lesson_cell_and_timeout(tmp_path):
    lesson = _lesson(tmp_path / "05_x.ipynb")
    error = "CellTimeoutError: the cell ran longer than 60 s (--cell-timeout)"
    run = _runner_run(tmp_path / "run", [_entry("05_x", "failed", error, 3)])
    _lesson(run.folder / "05_x.ipynb")
    with pytest.raises(site.SiteBuildError, match=r"lesson 05_x timed out at code cell 3 .*longer than 60 s"):
        site.check_lesson(lesson, run, changed=0.0)


def test_a_failed_lesson_says_failed(tmp_path):
    message = site.failure_message("05_x", _entry("05_x", "failed", "ValueError: bad", 2))
    assert message.startswith("lesson 05_x failed at code cell 2") and "ValueError: bad" in message


def test_an_error_output_in_an_nbmake_copy_stops_the_build(tmp_path):
    lesson = _lesson(tmp_path / "05_x.ipynb")
    run_dir = tmp_path / "nbmake"
    run_dir.mkdir()
    err = nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="division by zero", traceback=[])
    _lesson(run_dir / "05_x.ipynb", outputs=[err])
    run = site.load_run(run_dir, profile="smoke")
    assert run.kind == "nbmake" and run.profile == "smoke"
    with pytest.raises(site.SiteBuildError, match="lesson 05_x failed at code cell 1: ZeroDivisionError"):
        site.check_lesson(lesson, run, changed=0.0)


def test_title_and_goal_come_from_the_lesson_opening(tmp_path):
    nb = nbformat.read(_lesson(tmp_path / "05_x.ipynb"), as_version=4)
    assert site.lesson_title(nb) == "05 · A lesson"
    assert site.lesson_goal(nb) == "Learn one thing."


def test_gpu_figures_sit_beside_this_runs_with_device_and_commit(tmp_path):
    (tmp_path / "README.md").write_text("| `gpu.json` | one H200 | JAX 0.11.2, course commit 3dd0d13 | full |\n")
    rec = {"notebook": "02_b", "metric": "step_ms", "unit": "ms", "profile": "full", "backend": "gpu"}
    gpu = dict(rec, value=11.08, device_kind="NVIDIA H200", device_count=1, jax_version="0.11.2")
    (tmp_path / "gpu.json").write_text(json.dumps({"profile": "full", "created": "x", "records": [gpu]}))
    runs = site.baseline_runs(tmp_path)
    assert runs[0]["commit"] == "3dd0d13" and runs[0]["device"] == "NVIDIA H200"
    ours = dict(rec, value=40.5, backend="cpu", device_kind="cpu", device_count=8, profile="cpu")
    run = site.Run(tmp_path, "cpu", 0.0, "runner", records=[ours])
    text = site.gpu_section("02_b", run, runs)
    assert "commit `3dd0d13`" in text and "| step_ms | ms | 11.08 | 1 x NVIDIA H200 | 40.5 | 8 x cpu |" in text
    assert "none of these figures was measured on the GPU" not in text
    assert site.gpu_section("03_c", run, runs) is None
    cpu_there = dict(gpu, notebook="04_d", backend="cpu", device_kind="cpu", device_count=8)
    runs[0]["records"].append(cpu_there)
    assert "none of these figures was measured on the GPU" in site.gpu_section("04_d", run, runs)


def test_missing_vendor_files_say_to_run_npm_ci(tmp_path):
    with pytest.raises(site.SiteBuildError, match="npm ci"):
        site.copy_vendor(tmp_path / "node_modules", tmp_path / "out")


def test_no_run_fails_naming_the_lessons_without_a_current_copy(tmp_path, capsys):
    src = tmp_path / "notebooks"
    src.mkdir()
    _lesson(src / "05_x.ipynb")
    code = site.main(["--src", str(tmp_path / "s"), "--notebooks", str(src), "--no-run", "--run-out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "make site: FAILED: 1 lesson(s) have no current executed copy (--no-run)" in err
    assert f"site: no executed lessons to reuse (none in {tmp_path / 'cpu'})" in err
    assert "no run given" not in err and "running" not in err


def test_without_a_run_make_site_says_it_runs_the_lessons_first(tmp_path, capsys, monkeypatch):
    src = tmp_path / "notebooks"
    src.mkdir()
    _lesson(src / "05_x.ipynb")

    def no_runner(lessons, profile, out, timeout):
        raise site.SiteBuildError("stopped here by the test")

    monkeypatch.setattr(site, "run_lessons", no_runner)
    argv = ["--src", str(tmp_path / "s"), "--notebooks", str(src), "--run-out", str(tmp_path), "--run", "nowhere"]
    assert site.main(argv) == 1
    err = capsys.readouterr().err
    assert "site: no executed lessons to reuse (none in nowhere, " in err
    assert f"site: running 1 lesson(s) with the cpu profile into {tmp_path / 'cpu'} first" in err


def test_stage_writes_lessons_with_their_note_downloads_guides_and_table(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    lesson = _lesson(notebooks / "05_x.ipynb")
    rec = {"notebook": "05_x", "metric": "m", "value": 1.0, "unit": "s", "profile": "cpu", "backend": "cpu"}
    rec.update(device_kind="cpu", device_count=8, jax_version="0.10.2")
    run = _runner_run(tmp_path / "run", [_entry("05_x")], records=[rec])
    _lesson(run.folder / "05_x.ipynb")
    pages, docs = tmp_path / "pages", tmp_path / "docs"
    pages.mkdir()
    docs.mkdir()
    (pages / "index.md").write_text("# Course\n")
    (docs / "guide.md").write_text("# Guide\n")
    chosen, missing = site.choose([lesson], [run], 0.0)
    assert not missing
    src = tmp_path / "src"
    site.stage(src, [lesson], chosen, [], "abc1234", pages=pages, docs=docs)
    nb = nbformat.read(src / "lessons" / "05_x.ipynb", as_version=4)
    note = nb.cells[1].source
    assert "`cpu` profile" in note and "commit **`abc1234`**" in note and "JAX 0.10.2" in note
    assert "<../download/05_x.ipynb>" in note and (src / "download" / "05_x.ipynb").exists()
    assert (src / "guides" / "guide.md").exists() and (src / "index.md").exists()
    assert "[05 · A lesson](lessons/05_x.ipynb) | Learn one thing. |" in (src / "_lessons.md").read_text()


def test_coloured_blocks_get_text_that_can_be_read_on_their_background():
    # WCAG's examples: black on white is 21:1; white on #d6616b (a device colour of
    # jax.debug.visualize_array_sharding) is below 4.5:1, black on it above.
    assert round(site.contrast("000000", "ffffff"), 1) == 21.0
    assert site.contrast("ffffff", "d6616b") < 4.5 < site.contrast("000000", "d6616b")
    span = "color: #ffffff; text-decoration-color: #ffffff; background-color: #{}"
    html = f'<span style="{span.format("d6616b")}">CPU 1</span><span style="{span.format("393b79")}">CPU 0</span>'
    fixed = site.readable_colours(html)
    assert "color: #000000; text-decoration-color: #000000; background-color: #d6616b" in fixed
    assert span.format("393b79") in fixed  # white on dark blue already reads


def test_an_image_gets_its_alt_text_from_the_figure_s_own_text_and_never_from_a_bare_repr():
    described = {
        "outputs": [{"data": {"image/png": "iVBOR", "text/plain": ["Throughput: global batch ", "from 1 to 2."]}}]
    }
    site.image_alt(described)
    assert described["metadata"]["mystnb"]["image"]["alt"] == "Throughput: global batch from 1 to 2."
    bare = {"outputs": [{"data": {"image/png": "iVBOR", "text/plain": "<Figure size 640x480 with 1 Axes>"}}]}
    site.image_alt(bare)
    assert "metadata" not in bare


def test_make_site_names_a_bad_xla_flags_token_before_running_a_lesson(tmp_path, capsys, monkeypatch):
    src = tmp_path / "notebooks"
    src.mkdir()
    _lesson(src / "05_x.ipynb")
    monkeypatch.setenv("XLA_FLAGS", "\u2014xla_gpu_all_reduce_combine_threshold_bytes=4096")
    monkeypatch.setattr(site, "run_lessons", lambda *a: pytest.fail("a lesson was run"))
    argv = ["--src", str(tmp_path / "s"), "--notebooks", str(src), "--run-out", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        site.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "em dash" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "says"), [(["--profile", "nosuch"], "is not a profile"), (["--cell-timeout", "0"], "positive")]
)
def test_make_site_refuses_a_bad_profile_or_time_limit_before_running_a_lesson(
    argv, says, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(site, "run_lessons", lambda *a: pytest.fail("a lesson was run"))
    with pytest.raises(SystemExit) as exit_:
        site.main(["--src", str(tmp_path / "s"), "--run-out", str(tmp_path), *argv])
    assert exit_.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_stage_publishes_a_streams_final_state(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    lesson = _lesson(notebooks / "05_x.ipynb")
    run = _runner_run(tmp_path / "run", [_entry("05_x")])
    # tqdm in a kernel: one stream output per update, each starting with a carriage return
    parts = ["\rx:   0%| 0/2", "\rx:  50%| 1/2", "\rx: 100%| 2/2", "\n", "done\n"]
    _lesson(run.folder / "05_x.ipynb", outputs=[nbformat.v4.new_output("stream", name="stderr", text=t) for t in parts])
    chosen, _ = site.choose([lesson], [run], 0.0)
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "index.md").write_text("# Course\n")
    site.stage(tmp_path / "src", [lesson], chosen, [], "abc1234", pages=pages, docs=tmp_path / "none")
    nb = nbformat.read(tmp_path / "src" / "lessons" / "05_x.ipynb", as_version=4)
    texts = [o.text for c in nb.cells for o in c.get("outputs", []) if o.output_type == "stream"]
    assert texts == ["x: 100%| 2/2\ndone\n"], texts
