"""coursetools.tpucheck (make tpu-check): refusals, the plan, the budget and the results file, on the CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from coursetools import compare, timings, tpucheck
from coursetools.gpucheck import Step
from coursetools.paths import ROOT

V5E = {"platform": "tpu", "device_kind": "TPU v5 lite", "count": 1, "memory_bytes": 16_911_433_728}


def test_without_a_tpu_it_refuses_in_one_sentence_and_runs_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tpucheck, "probe_tpu", lambda: {**V5E, "platform": "cpu", "device_kind": "cpu"})
    monkeypatch.setattr(tpucheck.subprocess, "Popen", lambda *a, **k: pytest.fail("a step was run"))
    assert tpucheck.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tpu-check needs a TPU") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_chip_held_by_another_process_is_named_with_what_to_do():
    held = {"error": "RuntimeError: Internal error when accessing libtpu multi-process lockfile"}
    text = tpucheck.refusal(held)
    assert text.startswith("another process holds the TPU") and "then run make tpu-check again" in text
    assert tpucheck.refusal(V5E) is None


def test_the_probe_of_this_machine_names_its_backend():
    probe = tpucheck.probe_tpu()  # the CPU here: the check would refuse
    assert probe["platform"] == "cpu" and tpucheck.refusal(probe).startswith("tpu-check needs a TPU")


def test_the_dry_run_lists_the_command_and_starts_no_jax(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tpucheck, "probe_tpu", lambda: pytest.fail("JAX was started"))
    assert tpucheck.main(["--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "coursetools run --profile full --kernel shell" in out and not list(tmp_path.iterdir())


def test_the_results_file_is_named_as_the_baselines_are():
    assert tpucheck.results_name("TPU v5 lite", "0.10.2") == "tpu-v5-lite-full-jax0.10.2.json"
    assert tpucheck.results_name("TPU v6e", "0.12.0") == "tpu-v6e-full-jax0.12.0.json"


def _fake_plan(out: Path, wall_s: float = 0.0) -> list[Step]:
    runner = json.loads((ROOT / "baselines" / "cpu-jax0.10.2.json").read_text())
    for nb in runner["notebooks"]:
        nb["peak_device_bytes"] = 3 * 2**30
    target = out / "lessons" / "results.json"
    write = (
        f"import pathlib, time; time.sleep({wall_s}); p = pathlib.Path({str(target)!r}); "
        f"p.parent.mkdir(parents=True, exist_ok=True); p.write_text({json.dumps(runner)!r})"
    )
    return [Step("lessons", [sys.executable, "-c", write], "lessons")]


def test_a_check_writes_a_results_file_that_compare_and_timings_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tpucheck, "probe_tpu", lambda: V5E)
    monkeypatch.setattr(tpucheck, "plan", lambda out: _fake_plan(out))
    assert tpucheck.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (path,) = tmp_path.glob("tpu-v5-lite-full-jax*.json")
    payload = json.loads(path.read_text())
    check = payload["tpu_check"]
    assert check["passed"] and check["tpus"] == ["TPU v5 lite"] and payload["machine"]["tpus"] == ["TPU v5 lite"]
    assert check["steps"][0]["exit_status"] == 0 and "peak chip MiB" in out and "3,072" in out
    assert compare.compare(payload, payload, threshold=0.1).exit_code == 0
    lessons = [nb["notebook"] for nb in payload["notebooks"]]
    # The record and the lessons' Time lines read it (this machine's own load is not what is tested here).
    entry = timings._run_entry(path, lessons, allow_busy=True)
    assert timings._machine_words(entry["machine"]) == "1 x TPU v5 lite"


def test_the_budget_stops_the_lessons_and_the_check_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tpucheck, "probe_tpu", lambda: V5E)
    monkeypatch.setattr(tpucheck, "plan", lambda out: _fake_plan(out, wall_s=30))
    assert tpucheck.main(["--out", str(tmp_path), "--budget-s", "1"]) == 1
    assert "stopped at the time budget" in capsys.readouterr().out


def _part(notebooks: list[str], created: str, wall_s: float = 100.0, status: str = "passed", **check) -> dict:
    return {
        "schema": 1,
        "profile": "full",
        "created": created,
        "commit": "abc1234",
        "machine": {"tpus": ["TPU v5 lite"]},
        "notebooks": [{"notebook": n, "status": status, "wall_s": 10.0} for n in notebooks],
        "records": [{"notebook": n, "metric": "m", "value": 1} for n in notebooks],
        "tpu_check": {
            "tpus": ["TPU v5 lite"],
            "jax_version": "0.10.2",
            "jaxlib_version": "0.10.2",
            "libtpu_version": "0.0.42.1",
            "budget_s": 500.0,
            "wall_s": wall_s,
            "steps": [{"name": "lessons", "argv": [], "exit_status": 0, "wall_s": wall_s, "timed_out": False}],
            "passed": False,
            "only": notebooks,
            **check,
        },
    }


def test_a_check_run_in_parts_joins_into_the_whole_courses_file(tmp_path, capsys, monkeypatch):
    lessons = ["01_setup", "02_baseline", "09_performance"]
    later = _part(["09_performance"], "2026-12-06T11:18:00+00:00", wall_s=260.0)
    earlier = _part(["02_baseline", "01_setup"], "2026-12-06T11:10:00+00:00")
    joined = tpucheck.join_parts([later, earlier], lessons)
    assert [nb["notebook"] for nb in joined["notebooks"]] == lessons and joined["created"] == earlier["created"]
    assert [r["notebook"] for r in joined["records"]] == lessons
    check = joined["tpu_check"]
    assert check["passed"] and check["wall_s"] == 360.0 and check["budget_s"] == 1000.0 and "only" not in check
    assert [p["notebooks"] for p in check["parts"]] == [["02_baseline", "01_setup"], ["09_performance"]]
    assert not tpucheck.join_parts([later, _part(["01_setup"], "2026-12-06T11:00:00+00:00")], lessons)["tpu_check"][
        "passed"
    ]  # 02 never ran
    failed = _part(["01_setup", "02_baseline"], "2026-12-06T11:00:00+00:00", status="failed")
    assert not tpucheck.join_parts([later, failed], lessons)["tpu_check"]["passed"]
    files = []
    for i, part in enumerate((earlier, later)):
        files.append(tmp_path / f"part{i}.json")
        files[-1].write_text(json.dumps(part))
    monkeypatch.setattr(tpucheck, "_course_lessons", lambda: lessons)
    assert tpucheck.main(["--join", *map(str, files), "--out", str(tmp_path / "out")]) == 0
    assert "2 parts joined" in capsys.readouterr().out
    (tmp_path / "a_file").write_text("")
    assert tpucheck.main(["--join", *map(str, files), "--out", str(tmp_path / "a_file" / "out")]) == 2
    assert capsys.readouterr().err.startswith("error: cannot write the joined results into")
    (written,) = (tmp_path / "out").glob("tpu-v5-lite-full-jax0.10.2.json")
    assert json.loads(written.read_text())["tpu_check"]["passed"]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"commit": "def5678"}, "different commit"),
        ({"notebooks": [{"notebook": "01_setup", "status": "passed", "wall_s": 1.0}]}, "01_setup is in two parts"),
        ({"tpu_check": None}, "part 2: the top level: 'tpu_check' is a required property, so it is not a results"),
        ({"tpu_check": {"tpus": ["TPU v5 lite"]}}, "part 2: tpu_check: 'jax_version' is a required property"),
        ({"notebooks": [{"wall_s": 1.0}]}, "part 2: notebooks/0: 'notebook' is a required property"),
        # Fields of the wrong type: each one sentence naming the field (five tracebacks before).
        ({"notebooks": [{"notebook": "02_baseline", "status": "passed", "wall_s": "10"}]}, r"notebooks/0/wall_s: '10'"),
        ({"notebooks": ["02_baseline"]}, r"part 2: notebooks/0: '02_baseline' is not of type 'object'"),
        ({"tpu_check": {**_part([], "")["tpu_check"], "tpus": "TPU v5 lite"}}, r"tpu_check/tpus: 'TPU v5 lite' is not"),
        ({"tpu_check": {**_part([], "")["tpu_check"], "tpus": []}}, r"tpu_check/tpus: \[\] should be non-empty"),
        ({"tpu_check": {**_part([], "")["tpu_check"], "budget_s": None}}, "tpu_check/budget_s: None is not of type"),
        ({"tpu_check": {**_part([], "")["tpu_check"], "steps": [{"name": "lessons"}]}}, "tpu_check/steps/0: 'exit_"),
        ({"tpu_check": {**_part([], "")["tpu_check"], "steps": 3}}, "tpu_check/steps: 3 is not of type 'array'"),
        ({"created": 20261206}, "part 2: created: 20261206 is not of type 'string', 'null'"),
    ],
)
def test_parts_of_different_checks_are_refused_and_nothing_is_written(tmp_path, capsys, change, said):
    one = _part(["01_setup"], "2026-12-06T11:00:00+00:00")
    other = {**_part(["02_baseline"], "2026-12-06T11:10:00+00:00"), **change}
    if other["tpu_check"] is None:
        del other["tpu_check"]
    with pytest.raises(ValueError, match=said):
        tpucheck.join_parts([one, other], ["01_setup", "02_baseline"])
    paths = []
    for i, part in enumerate((one, other)):
        paths.append(tmp_path / f"p{i}.json")
        paths[-1].write_text(json.dumps(part))
    assert tpucheck.main(["--join", *map(str, paths), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and not (tmp_path / "out").exists()
    if said.startswith("part 2: "):  # the command names the file
        assert err.startswith(f"error: {paths[1]}: ")
    with pytest.raises(ValueError, match="two parts or more"):
        tpucheck.join_parts([one])


@pytest.mark.parametrize(
    ("text", "said"),
    [("{not json", "cannot be read as JSON (Expecting property name"), ("NaN", "NaN is not a measured")],
)
def test_a_part_that_is_not_json_is_refused_in_one_sentence(tmp_path, capsys, text, said):
    one, other = tmp_path / "one.json", tmp_path / "other.json"
    one.write_text(json.dumps(_part(["01_setup"], "2026-12-06T11:00:00+00:00")))
    other.write_text(text)
    assert tpucheck.main(["--join", str(one), str(other), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {other}: ") and said in err and err.count("\n") == 1


def test_the_lessons_no_part_ran_are_named_with_the_command_that_runs_them(tmp_path, capsys, monkeypatch):
    lessons = ["01_setup", "02_baseline", "03_mesh", "09_performance"]
    monkeypatch.setattr(tpucheck, "_course_lessons", lambda: lessons)
    files = []
    for i, names in enumerate((["01_setup"], ["09_performance"])):
        files.append(tmp_path / f"part{i}.json")
        files[-1].write_text(json.dumps(_part(names, f"2026-12-06T11:0{i}:00+00:00")))
    assert tpucheck.main(["--join", *map(str, files), "--out", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "tpu-check FAILED" in out
    assert (
        "tpu-check: no part ran 02_baseline, 03_mesh: run them as one more part "
        "(python -m coursetools.tpucheck --notebooks 02 03) and join again." in out
    )
    (written,) = (tmp_path / "out").glob("*.json")
    assert json.loads(written.read_text())["tpu_check"]["missing"] == ["02_baseline", "03_mesh"]
