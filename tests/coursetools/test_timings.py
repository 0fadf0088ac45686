"""Tests of coursetools.timings: the lessons' time lines and the README's times come from a measured record."""

from __future__ import annotations

import json

import pytest

from coursetools import timings

MACHINE = {
    "cpu": "AMD EPYC",
    "cores": 2,
    "memory_gib": 23.5,
    "gpus": [],
    "load_average_start": [0.9, 0.8, 0.5],
    "load_average_end": [2.5, 1.7, 1.3],
}


def results_json(tmp_path, profile, walls):
    payload = {
        "profile": profile,
        "created": "2026-12-01T20:30:00+00:00",
        "commit": "abc1234",
        "machine": MACHINE,
        "notebooks": [{"notebook": n, "status": "passed", "wall_s": w} for n, w in walls.items()],
        "records": [{"jax_version": "0.10.2"}],
    }
    path = tmp_path / f"{profile}.json"
    path.write_text(json.dumps(payload))
    return path


def test_every_lesson_and_the_readme_say_what_the_committed_record_says():
    """time lines drifted from what was measured (05 said 20-40 s, took 60-68 s)."""
    assert timings.check() == [], "run `python -m coursetools timings --update` after measuring"


def test_the_record_names_the_machine_its_load_and_the_commit_of_each_run():
    record = timings.load_record()
    assert record["runs"], "baselines/timings.json holds no measured run"
    for run in record["runs"]:
        assert run["commit"] and run["machine"]["cores"] and run["machine"]["load_average_start"]


def test_update_writes_the_record_the_time_lines_and_the_readme(tmp_path):
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    lesson = lessons / "05_shard_map.py"
    lesson.write_text("# # title\n#\n# **Time** (measured): `smoke` 15\n# to 20 seconds.\n#\n# Next paragraph.\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{timings.BEGIN}\nold\n{timings.END}\nrest\n")
    record = tmp_path / "timings.json"
    smoke = results_json(tmp_path, "smoke", {"05_shard_map": 61.4})
    cpu = results_json(tmp_path, "cpu", {"05_shard_map": 66.0})
    changed = timings.update([cpu, smoke], 959, record, lessons, readme, sync=False)
    assert set(changed) == {lesson, readme}
    text = lesson.read_text()
    assert "15\n# to 20" not in text and "# Next paragraph." in text
    start = text.index("# **Time")
    paragraph = text[start : text.index("\n#\n", start)]
    assert all(len(x) <= 100 for x in paragraph.splitlines())  # fits a 1280 px screen
    line = " ".join(x.removeprefix("# ") for x in paragraph.splitlines())
    assert "1-2 min with `smoke`, 1-2 min with `cpu`, on a 2-core CPU" in line
    # The build machine's details stay in the record; its load, and what more load does, are said.
    assert "commit" not in line and "AMD EPYC" not in line
    assert "measured; other work slows it" in line and "0.9" not in line  # the load stays in baselines/
    block = readme.read_text()
    assert "`make test`: 16 minutes (959 s" in block and block.endswith("rest\n")
    # A second update with the same figures changes nothing; check agrees.
    assert timings.update([], None, record, lessons, readme, sync=False) == []


def test_a_results_file_without_the_machine_is_refused(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"profile": "cpu", "notebooks": [], "records": []}))
    with pytest.raises(ValueError, match="no machine record"):
        timings.update([path], None, tmp_path / "t.json", tmp_path, tmp_path / "README.md", sync=False)


def test_make_test_is_recorded_with_the_load_before_it_started_or_says_it_is_unknown(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"{timings.BEGIN}\n{timings.END}\n")
    record = tmp_path / "timings.json"
    timings.update([], 1908, record, tmp_path, readme, sync=False, make_test_load_start=[0.5, 0.4, 0.3])
    assert "(1908 s;" in readme.read_text() and "load average 0.5 at the start" in readme.read_text()
    timings.update([], 1908, record, tmp_path, readme, sync=False)  # recorded after the fact: start unknown
    assert "(not recorded at the start)" in readme.read_text()
    assert json.loads(record.read_text())["make_test"]["machine"]["load_average_start"] is None


def test_a_make_test_measured_elsewhere_keeps_the_load_read_as_it_ended(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"{timings.BEGIN}\n{timings.END}\n")
    record = tmp_path / "timings.json"
    timings.update(
        [],
        1298,
        record,
        tmp_path,
        readme,
        sync=False,
        make_test_load_start=[0.64, 2.89, 3.14],
        make_test_load_end=[2.72, 4.25, 4.09],
    )
    assert "load average 0.64 at the start, 2.72 at the end" in readme.read_text()
    assert json.loads(record.read_text())["make_test"]["machine"]["load_average_end"] == [2.72, 4.25, 4.09]


@pytest.mark.parametrize("flag", ["--load-start", "--load-end"])
def test_a_load_average_that_is_not_three_numbers_is_refused_before_anything_is_written(flag, capsys, monkeypatch):
    monkeypatch.setattr(timings, "update", lambda *a, **k: pytest.fail("nothing may be written"))
    assert timings.main(["--make-test-seconds", "1298", flag, "0.64 high"]) == 2
    assert "three load averages" in capsys.readouterr().err


def test_a_commit_that_is_not_in_the_repository_is_refused_before_anything_is_written(capsys, monkeypatch):
    monkeypatch.setattr(timings, "update", lambda *a, **k: pytest.fail("nothing may be written"))
    assert timings.main(["--make-test-seconds", "1298", "--commit", "no-such-commit"]) == 2
    assert "no commit of this repository" in capsys.readouterr().err


def test_the_commit_a_run_measured_is_recorded_rather_than_this_checkouts(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"{timings.BEGIN}\n{timings.END}\n")
    record = tmp_path / "timings.json"
    timings.update([], 1298, record, tmp_path, readme, sync=False, make_test_commit="abc1234")
    assert "commit abc1234," in readme.read_text()


@pytest.mark.parametrize(
    "argv",
    [
        ["--make-test-seconds", "-5"],
        ["--make-test-seconds", "0"],
        ["--make-test-seconds", "inf"],
        ["--make-test-seconds", "nan"],
        ["--make-test-seconds", "1298", "--load-start", "nan -1 inf"],
        ["--load-end", "1 2 3"],
        ["--commit", "HEAD"],
        ["--update", "--load-start", "1 2 3"],
    ],
)
def test_an_impossible_time_or_a_load_without_a_time_is_refused_before_anything_is_written(argv, capsys, monkeypatch):
    monkeypatch.setattr(timings, "update", lambda *a, **k: pytest.fail("nothing may be written"))
    assert timings.main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_a_readme_without_its_time_block_fails_before_the_record_is_written(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no block here\n")
    record = tmp_path / "timings.json"
    with pytest.raises(ValueError):
        timings.update([], 1298, record, tmp_path, readme, sync=False)
    assert not record.exists() and readme.read_text() == "no block here\n"


def test_a_run_says_whether_it_compiled_for_gpus_without_one():
    """04, 09 and 10 compile for GPUs only with the extra installed: a time without those compiles says so."""
    assert "GPU-compile" not in timings._machine_text(MACHINE)  # recorded before the field existed
    assert "with the GPU-compile extra" in timings._machine_text({**MACHINE, "gpu_compile_extra": True})
    without = timings._machine_text({**MACHINE, "gpu_compile_extra": False})
    assert "without the GPU-compile extra (no GPU compiles)" in without
    said = {
        (g, t): timings._machine_text({**MACHINE, "gpu_compile_extra": g, "tpu_compile_extra": t})
        for g in (True, False)
        for t in (True, False)
    }
    assert "with the GPU- and TPU-compile extras" in said[True, True]
    assert "with the GPU-compile extra only" in said[True, False]
    assert "with the TPU-compile extra only" in said[False, True]
    assert "without the compile extras (no GPU or TPU compiles)" in said[False, False]


def test_machine_info_records_the_extra(monkeypatch):
    from dpcourse.cross_compile import targets as gpu_targets

    monkeypatch.setattr(gpu_targets, "extra_missing", lambda p="gpu": f"the {p} extra is not installed")
    info = timings.machine_info()
    assert info["gpu_compile_extra"] is False and info["tpu_compile_extra"] is False
    monkeypatch.setattr(gpu_targets, "extra_missing", lambda p="gpu": None if p == "tpu" else "missing")
    info = timings.machine_info()
    assert info["gpu_compile_extra"] is False and info["tpu_compile_extra"] is True
    monkeypatch.setattr(gpu_targets, "extra_missing", lambda p="gpu": None)
    assert timings.machine_info()["gpu_compile_extra"] is True


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "under 30 s"),
        (29.9, "under 30 s"),
        (30, "under 1 min"),
        (61, "1-2 min"),
        (299, "2-5 min"),
        (900, "over 10 min"),
    ],
)
def test_a_time_line_gives_a_bucket_so_a_new_timing_seldom_touches_a_lesson(seconds, words):
    assert timings.time_bucket(seconds) == words


def test_timing_again_within_the_buckets_rewrites_the_record_and_readme_only(tmp_path):
    record = {
        "runs": [
            {
                "profile": "smoke",
                "machine": {"cores": 2, "gpus": []},
                "notebooks": {"04_x": {"wall_s": 24, "status": "passed"}},
            }
        ]
    }
    again = {
        "runs": [
            {
                "profile": "smoke",
                "machine": {"cores": 2, "gpus": []},
                "notebooks": {"04_x": {"wall_s": 27, "status": "passed"}},
            }
        ]
    }
    assert timings.time_line("04_x", record) == timings.time_line("04_x", again)


def test_a_tpu_run_gets_its_own_machine_in_the_line_and_replaces_only_tpu_runs():
    cpu = {
        "profile": "cpu",
        "machine": {"cores": 2, "gpus": []},
        "notebooks": {"09_x": {"wall_s": 34, "status": "passed"}},
    }
    tpu = {
        "profile": "full",
        "machine": {"cores": 13, "gpus": [], "tpus": ["TPU v5 lite"]},
        "notebooks": {"09_x": {"wall_s": 150, "status": "passed"}},
    }
    gpu = {
        "profile": "full",
        "machine": {"cores": 8, "gpus": ["NVIDIA H200"]},
        "notebooks": {"09_x": {"wall_s": 50, "status": "passed"}},
    }
    line = timings.time_line("09_x", {"runs": [cpu, tpu]})
    assert line == (
        "# **Time**: under 1 min with `cpu`, on a 2-core CPU; 2-5 min with `full`, on 1 x TPU v5 lite\n"
        "# (measured; the run's details are in `baselines/timings.json`)."
    )
    runs = timings.merge_runs([cpu, tpu], [gpu], ["09_x"])
    assert runs == [cpu, tpu, gpu]  # a GPU's full run does not replace the TPU's
    assert timings.merge_runs(runs, [dict(tpu)], ["09_x"]) == [cpu, gpu, tpu]


def _course(tmp_path, stems=("05_shard_map", "06_model")):
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    for stem in stems:
        (lessons / f"{stem}.py").write_text("# # title\n#\n# **Time.** Not measured yet.\n#\n# Next.\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"{timings.BEGIN}\n{timings.END}\n")
    return lessons, readme


def _snapshot(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda p: p.update(notebooks=["05_shard_map"]), "notebooks/0: '05_shard_map' is not of type 'object'"),
        (lambda p: p.update(notebooks="05_shard_map"), "notebooks: '05_shard_map' is not of type 'array'"),
        (lambda p: p.update(records=["0.10.2"]), "records/0: '0.10.2' is not of type 'object'"),
        (lambda p: p["notebooks"][0].update(wall_s=-40), "notebooks/0/wall_s: -40 is less than or equal to"),
        (lambda p: p["notebooks"][0].update(wall_s="61"), "notebooks/0/wall_s: '61' is not of type 'number'"),
        (lambda p: p["notebooks"][0].pop("status"), "notebooks/0: 'status' is a required property"),
        (lambda p: p.update(machine="2 cores"), "machine: '2 cores' is not of type 'object'"),
        (lambda p: p.update(notebooks=[]), "notebooks: [] should be non-empty"),
    ],
)
def test_a_malformed_results_file_is_named_in_one_sentence_and_nothing_is_written(tmp_path, change, says, capsys):
    lessons, readme = _course(tmp_path)
    path = results_json(tmp_path, "smoke", {"05_shard_map": 61.4})
    payload = json.loads(path.read_text())
    change(payload)
    path.write_text(json.dumps(payload))
    record = tmp_path / "timings.json"
    before = _snapshot(tmp_path)
    with pytest.raises(ValueError, match="not a results.json the runner writes") as err:
        timings.update([path], None, record, lessons, readme, sync=False)
    assert says in str(err.value) and "\n" not in str(err.value)
    assert _snapshot(tmp_path) == before and not record.exists()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_wall_time_that_is_not_a_number_is_refused(tmp_path, constant, capsys, monkeypatch):
    lessons, readme = _course(tmp_path)
    path = results_json(tmp_path, "smoke", {"05_shard_map": 61.4})
    path.write_text(path.read_text().replace("61.4", constant))
    real = timings.update  # the command's own path, writing into tmp_path only
    monkeypatch.setattr(
        timings,
        "update",
        lambda results, seconds, **kw: real(results, seconds, tmp_path / "timings.json", lessons, readme, False, **kw),
    )
    assert timings.main(["--update", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{constant} is not a measured number" in err and "Traceback" not in err
    assert not (tmp_path / "timings.json").exists()


def test_a_run_of_some_lessons_updates_only_theirs(tmp_path):
    lessons, readme = _course(tmp_path)
    record = tmp_path / "timings.json"
    whole = results_json(tmp_path, "smoke", {"05_shard_map": 61.4, "06_model": 200.0})
    timings.update([whole], None, record, lessons, readme, sync=False)
    one = tmp_path / "one.json"
    payload = json.loads(whole.read_text())
    payload.update(commit="def5678", notebooks=[{"notebook": "06_model", "status": "passed", "wall_s": 20.0}])
    one.write_text(json.dumps(payload))
    timings.update([one], None, record, lessons, readme, sync=False)
    runs = json.loads(record.read_text())["runs"]
    # One line per profile: the lesson timed alone sits in the earlier run with its own commit.
    assert [(r["commit"], sorted(r["notebooks"])) for r in runs] == [("abc1234", ["05_shard_map", "06_model"])]
    assert runs[0]["notebooks"]["06_model"]["commit"] == "def5678"
    assert runs[0]["notebooks"]["06_model"]["wall_s"] == 20.0
    assert "measured alone: 06_model at commit def5678" in readme.read_text()
    assert "1-2 min with `smoke`" in (lessons / "05_shard_map.py").read_text()  # kept, not erased
    assert "under 30 s with `smoke`" in (lessons / "06_model.py").read_text()
    # A run of every lesson again replaces both.
    timings.update([whole], None, record, lessons, readme, sync=False)
    assert [r["commit"] for r in json.loads(record.read_text())["runs"]] == ["abc1234"]


def test_runs_of_other_profiles_are_kept():
    cpu = {"profile": "cpu", "notebooks": {"05_shard_map": {"wall_s": 66.0, "status": "passed"}}}
    smoke = {"profile": "smoke", "notebooks": {"05_shard_map": {"wall_s": 61.0, "status": "passed"}}}
    assert timings.merge_runs([cpu], [smoke], ["05_shard_map"]) == [smoke, cpu]


def test_a_folder_given_for_a_results_file_is_named(tmp_path, capsys):
    with pytest.raises(ValueError, match="is a folder: give the results.json in it"):
        timings.read_results(tmp_path)


@pytest.mark.parametrize("text", ["{", '{"runs": "smoke"}', '{"runs": [{"profile": "smoke"}]}', "[]"])
def test_a_damaged_record_is_named_in_one_sentence_and_not_overwritten(tmp_path, text):
    lessons, readme = _course(tmp_path)
    record = tmp_path / "timings.json"
    record.write_text(text)
    path = results_json(tmp_path, "smoke", {"05_shard_map": 61.4})
    with pytest.raises(ValueError, match="restore it with git checkout"):
        timings.update([path], None, record, lessons, readme, sync=False)
    assert record.read_text() == text


def test_a_lesson_timed_alone_says_its_own_commit_and_load_in_the_readme():
    machine = {"cpu": "AMD EPYC", "cores": 2, "memory_gib": 23.5, "gpus": [], "load_average_start": [0.2, 0, 0]}
    alone = {"wall_s": 65.2, "status": "passed", "commit": "abc1234", "load_average_start": [2.56, 6, 8]}
    run = {
        "profile": "smoke",
        "commit": "60d8087",
        "jax": ["0.10.2"],
        "machine": {**machine, "load_average_end": [1, 1, 1]},
    }
    run["notebooks"] = {"10_sharded": {"wall_s": 20.0, "status": "passed"}, "11_checkpoint": alone}
    block = timings.readme_block({"runs": [run]})
    assert "85 s of notebook time for 2 notebooks" in block
    assert "measured alone: 11_checkpoint at commit abc1234, load average 2.56 at its start" in block


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            lambda p: p["notebooks"].append({"notebook": "99_made_up", "status": "passed", "wall_s": 3.0}),
            "'99_made_up' is not one of the course's lessons (05_shard_map to 06_model)",
        ),
        (lambda p: p.update(solutions=True), "this run had the exercises' solutions filled in (--solutions)"),
        (lambda p: p.update(cpu_devices=3), "this run forced 3 CPU devices (XLA_FLAGS), not the lessons' own 8"),
        (lambda p: p.update(solutions=True, cpu_devices=3), "solutions filled in"),
    ],
)
def test_a_run_that_is_not_the_course_as_a_learner_runs_it_is_refused_and_nothing_is_written(tmp_path, change, says):
    lessons, readme = _course(tmp_path)
    record = tmp_path / "timings.json"
    timings.update([results_json(tmp_path, "smoke", {"06_model": 20.0})], None, record, lessons, readme, sync=False)
    path = results_json(tmp_path, "smoke", {"06_model": 2.0})
    payload = json.loads(path.read_text())
    change(payload)
    path.write_text(json.dumps(payload))
    before = _snapshot(tmp_path)
    with pytest.raises(ValueError) as err:
        timings.update([path], None, record, lessons, readme, sync=False)
    said = str(err.value)
    assert says in said and "nothing was recorded" in said and "\n" not in said
    assert _snapshot(tmp_path) == before  # lesson 06's measured 20 s stays


@pytest.mark.parametrize("devices", [None, 8])
def test_a_run_at_the_lessons_own_devices_without_solutions_is_recorded(tmp_path, devices):
    import inspect

    from dpcourse import devices as dpdevices

    assert inspect.signature(dpdevices.setup_devices).parameters["n_cpu_devices"].default == timings.LESSON_CPU_DEVICES
    lessons, readme = _course(tmp_path)
    path = results_json(tmp_path, "smoke", {"06_model": 20.0})
    path.write_text(json.dumps({**json.loads(path.read_text()), "solutions": False, "cpu_devices": devices}))
    timings.update([path], None, tmp_path / "timings.json", lessons, readme, sync=False)
    assert json.loads((tmp_path / "timings.json").read_text())["runs"][0]["notebooks"]["06_model"]["wall_s"] == 20.0


def test_a_copy_without_git_takes_its_commit_from_the_environment(monkeypatch):
    monkeypatch.setattr(timings, "ROOT", timings.Path("/"))  # no repository there
    monkeypatch.delenv("DPCOURSE_COMMIT", raising=False)
    assert timings.course_commit() is None
    monkeypatch.setenv("DPCOURSE_COMMIT", "abc1234")
    assert timings.course_commit() == "abc1234"


def test_a_commit_given_in_the_environment_beats_a_copys_stale_git(monkeypatch):
    monkeypatch.delenv("DPCOURSE_COMMIT", raising=False)
    assert timings.course_commit()  # this repository's own
    monkeypatch.setenv("DPCOURSE_COMMIT", "6cde9e2")  # what was sent, whatever the copy's .git says
    assert timings.course_commit() == "6cde9e2"


@pytest.mark.parametrize(("status", "seconds"), [("failed", 36.55), ("interrupted", 19.4)])
def test_a_lesson_that_stopped_gives_no_time_bucket(status, seconds):
    """A real v5e run: 12 was interrupted at the check's budget after 19.4 s, which says nothing of a whole run."""
    tpu = {
        "profile": "full",
        "machine": {"cores": 13, "gpus": [], "tpus": ["TPU v5 lite"]},
        "notebooks": {"12_x": {"wall_s": seconds, "status": status}},
    }
    line = timings.time_line("12_x", {"runs": [tpu]})
    assert f"{status} with `full` after {seconds:.0f}\u00a0s, on 1 x TPU v5 lite" in line
    assert "under" not in line


def test_the_readme_names_the_lessons_that_did_not_run_to_the_end():
    run = {
        "profile": "full",
        "commit": "5074165",
        "jax": ["0.10.2"],
        "machine": {"cores": 13, "gpus": [], "tpus": ["TPU v5 lite"]},
        "notebooks": {"10_x": {"wall_s": 20.0, "status": "passed"}, "11_x": {"wall_s": 30.0, "status": "failed"}},
    }
    run["notebooks"]["10_x"].update(timed="on 8 simulated CPU devices", profile="cpu")
    block = timings.readme_block({"runs": [run]})
    # What ran: the TPU host's command (no kernel starts there), and the lesson that ran another workload.
    assert "- `make tpu-check` with the `full` profile: 50 s of notebook time for 2 notebooks, 1 of them not" in block
    assert "(11_x failed); 10 ran the `cpu` workload on 8 simulated CPU devices (" in block


def test_update_refuses_a_run_measured_on_a_busy_machine_unless_told(tmp_path, capsys):
    """A run at load average 8.7 on 2 cores rewrote the lessons' Time lines; now it is refused, naming the figure."""
    lessons, readme = _course(tmp_path)
    record = tmp_path / "timings.json"
    path = results_json(tmp_path, "smoke", {"06_model": 20.0})
    busy = {**MACHINE, "load_average_end": [4.0, 8.7, 5.3]}
    path.write_text(json.dumps({**json.loads(path.read_text()), "machine": busy}))
    texts = {p: p.read_text() for p in (*lessons.iterdir(), readme)}
    with pytest.raises(ValueError, match=r"load average of 8.7 as it ended on a 2-core machine \(above 4\)"):
        timings.update([path], None, record, lessons, readme, sync=False)
    assert not record.exists() and all(p.read_text() == t for p, t in texts.items())
    timings.update([path], None, record, lessons, readme, sync=False, allow_busy=True)
    assert json.loads(record.read_text())["runs"][0]["machine"]["load_average_end"][1] == 8.7
    assert timings.main(["--update", str(path)]) == 2  # refused before the course's own record is read
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} was measured at a load average of 8.7") and err.count("\n") == 1
    assert "--allow-busy" in err


def test_a_make_test_started_on_a_busy_machine_is_refused_unless_told(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"{timings.BEGIN}\n{timings.END}\n")
    record = tmp_path / "timings.json"
    busy = dict(make_test_load_start=[5.2, 4.0, 3.0])
    with pytest.raises(ValueError, match=r"make test \(1481 s\) was measured at a load average of 5.2 as it started"):
        timings.update([], 1481, record, tmp_path, readme, sync=False, **busy)
    assert not record.exists()
    timings.update([], 1481, record, tmp_path, readme, sync=False, allow_busy=True, **busy)
    assert json.loads(record.read_text())["make_test"]["seconds"] == 1481


def test_a_lesson_that_ran_a_part_of_itself_says_which_in_its_time_line(tmp_path):
    """Lesson 13 on a host that opens no TCP socket runs section 4 alone: its time is that part's, and says so."""
    lessons, readme = _course(tmp_path)
    path = results_json(tmp_path, "smoke", {"06_model": 20.0, "05_shard_map": 10.0})
    payload = json.loads(path.read_text())
    note = {"metric": "timed_part", "value": "section 4 alone: no TCP", "notebook": "06_model", "unit": "note"}
    path.write_text(json.dumps({**payload, "records": [*payload.get("records", []), note]}))
    timings.update([path], None, tmp_path / "timings.json", lessons, readme, sync=False)
    run = json.loads((tmp_path / "timings.json").read_text())["runs"][0]
    assert run["notebooks"]["06_model"]["timed"] == "section 4 alone: no TCP"
    assert "timed" not in run["notebooks"]["05_shard_map"]
    assert "under 30 s with `smoke` (section 4 alone: no TCP), on" in (lessons / "06_model.py").read_text()


def test_a_lesson_a_chip_host_ran_on_simulated_cpu_devices_says_so_and_names_the_profile_it_ran(tmp_path):
    """Lesson 12's Time line said "under 1 min with `full`, on 1 x TPU v5 lite": it ran `cpu` on CPU devices."""
    lessons, readme = _course(tmp_path)
    path = results_json(tmp_path, "full", {"06_model": 40.0, "05_shard_map": 20.0})
    payload = json.loads(path.read_text())
    on = {"jax_version": "0.10.2", "unit": "ms"}
    records = [
        {**on, "notebook": "06_model", "metric": "a", "backend": "cpu", "device_count": 8, "profile": "cpu"},
        {**on, "notebook": "06_model", "metric": "b", "backend": "cpu", "device_count": 1, "profile": "cpu"},
        {**on, "notebook": "05_shard_map", "metric": "a", "backend": "tpu", "device_count": 1, "profile": "full"},
        {**on, "notebook": "05_shard_map", "metric": "b", "backend": "cpu", "device_count": 8, "profile": "cpu"},
    ]
    chip = {**MACHINE, "tpus": ["TPU v5 lite"]}
    path.write_text(json.dumps({**payload, "machine": chip, "records": records}))
    timings.update([path], None, tmp_path / "timings.json", lessons, readme, sync=False)
    run = json.loads((tmp_path / "timings.json").read_text())["runs"][0]
    assert run["notebooks"]["06_model"] == {
        "wall_s": 40.0,
        "status": "passed",
        "timed": "on 8 simulated CPU devices",
        "profile": "cpu",
    }
    assert "timed" not in run["notebooks"]["05_shard_map"]  # the chip ran part of it: its own profile
    text = " ".join((lessons / "06_model.py").read_text().replace("# ", "").split())
    assert "under 1 min with `cpu` (on 8 simulated CPU devices), on 1 x TPU v5 lite" in text
    assert "with `full`" in " ".join((lessons / "05_shard_map.py").read_text().replace("# ", "").split())
