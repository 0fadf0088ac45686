"""tools/plan_workshop.py (make plan-workshop): node and GPU counts from the z2jh profiles, cost only from given prices."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "plan_workshop.py"
spec = importlib.util.spec_from_file_location("plan_workshop", SCRIPT)
plan_workshop = importlib.util.module_from_spec(spec)
sys.modules["plan_workshop"] = plan_workshop
spec.loader.exec_module(plan_workshop)


def test_allocatable_follows_gkes_reservations():
    # e2-standard-8: 8 vCPU, 32 GiB -> CPU reserved 60+10+2x5 m = 0.08... plus 4 x 2.5 m; memory 3.56 GiB + 100 MiB.
    cpu, mem = plan_workshop.allocatable(8, 32)
    assert cpu == pytest.approx(8 - 0.06 - 0.01 - 0.01 - 0.01)
    assert mem == pytest.approx(32 - (1 + 0.8 + 0.8 + 16 * 0.06) - 100 / 1024)


def test_profiles_come_from_the_config():
    found = plan_workshop.profiles()
    assert set(found) == {"cpu", "shared-l4", "two-l4"}
    assert found["cpu"].gpus == 0 and found["shared-l4"].gpus == 1 and found["two-l4"].gpus == 2


def test_24_learners_half_cpu_half_shared():
    rows = {r.slug: r for r in plan_workshop.plan(24, {"cpu": 0.5, "shared-l4": 0.5})}
    assert rows["cpu"].learners == 12 and rows["shared-l4"].learners == 12
    assert rows["shared-l4"].per_node == 8  # 2 L4 x 4 clients, and CPU and memory allow it
    assert rows["shared-l4"].nodes == 2 and rows["shared-l4"].gpus == 4
    assert rows["cpu"].nodes == 4 and rows["cpu"].gpus == 0
    # terraform's fixed GPU pool (gpu_node_count >= 1) adds a node with 2 L4 even without two-L4 learners.
    forced = rows[plan_workshop.FORCED]
    assert (forced.learners, forced.nodes, forced.gpus) == (0, 1, 2)
    assert sum(r.nodes for r in rows.values()) == 7 and sum(r.gpus for r in rows.values()) == 6


def test_two_l4_learners_get_a_node_each_and_the_hub_keeps_a_cpu_node():
    rows = {r.slug: r for r in plan_workshop.plan(3, {"two-l4": 1.0})}
    assert rows["two-l4"].nodes == 3 and rows["two-l4"].gpus == 6
    assert rows["cpu"].nodes == 1 and rows["cpu"].learners == 0


def test_bad_mix_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="add up to 0.9"):
        plan_workshop.plan(10, {"cpu": 0.9})
    with pytest.raises(ValueError, match="unknown profile"):
        plan_workshop.plan(10, {"gpu": 1.0})


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_no_price_no_cost():
    result = run("--learners", "24")
    assert result.returncode == 0, result.stderr
    assert "price not given" in result.stdout and "not measured" in result.stdout
    assert "$" not in result.stdout


def test_given_prices_are_used_and_labelled_as_the_instructors():
    result = run(
        "--learners", "24", "--price", "e2-standard-8=0.5", "--price", "g2-standard-24=2", "--price-date", "2026-12-01"
    )
    assert result.returncode == 0, result.stderr
    assert "| total | 24 | | | 7 | 6 | 8.00 |" in result.stdout  # 4 x 0.5 + 2 x 2 + the forced GPU node x 2
    assert "gpu_node_count >= 1" in result.stdout
    assert "instructor's input, dated 2026-12-01" in result.stdout


def test_the_guides_table_is_the_tools_output():
    result = run("--learners", "24")
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    guide = (ROOT / "docs" / "instructor.md").read_text()
    assert "\n".join(table) in guide, "docs/instructor.md: paste the table of `make plan-workshop LEARNERS=24` again"


def fake_run(folder, name, profile, created, peaks, kind="peak_rss_bytes"):
    notebooks = [{"notebook": nb, "status": "passed", kind: int(gib * 2**30)} for nb, gib in peaks.items()]
    (folder / name).write_text(
        json.dumps({"schema": 1, "created": created, "profile": profile, "notebooks": notebooks})
    )


def test_memory_comes_from_the_newest_baseline_that_measured_it(tmp_path):
    fake_run(tmp_path, "old.json", "cpu", "2026-11-01", {"02_baseline": 9.0})
    fake_run(tmp_path, "new.json", "cpu", "2026-12-01", {"02_baseline": 1.5, "09_performance": 2.25})
    fake_run(tmp_path, "smoke.json", "smoke", "2026-12-02", {"02_baseline": 0.5})
    (tmp_path / "timings.json").write_text('{"runs": []}')
    peak = plan_workshop.measured_peak("peak_rss_bytes", "cpu", tmp_path)
    assert (peak.gib, peak.notebook, peak.source) == (2.25, "09_performance", str(tmp_path / "new.json"))
    notes = plan_workshop.memory_notes(plan_workshop.profiles(), tmp_path)
    assert "measured: 2.25 GiB (09_performance" in notes[0]
    assert notes[1].startswith("GPU memory per learner: not measured")


def test_without_a_measured_figure_the_plan_says_its_memory_is_an_estimate(tmp_path):
    assert plan_workshop.measured_peak("peak_rss_bytes", "cpu", tmp_path) is None
    assert "is an estimate" in plan_workshop.memory_notes(plan_workshop.profiles(), tmp_path)[0]


def test_the_hubs_memory_requests_hold_the_largest_measured_lesson():
    peak = plan_workshop.measured_peak("peak_rss_bytes", "cpu")
    assert peak is not None, "baselines/ has no cpu run with peak memory: run the cpu profile and copy results.json"
    for slug, profile in plan_workshop.profiles().items():
        assert profile.memory_gib >= peak.gib, (
            f"{slug} requests {profile.memory_gib} GiB; {peak.notebook} peaked at {peak.gib:.2f}"
        )


def test_every_lesson_of_the_course_has_a_measured_peak():
    peaks = plan_workshop.measured_peaks("peak_rss_bytes", "cpu")
    missing = [name for name in plan_workshop.course_lessons() if name not in peaks]
    assert not missing, (
        f"no cpu baseline measures {missing}: run them with --profile cpu, copy results.json to baselines/"
    )


def test_a_lesson_run_alone_adds_its_peak_and_the_plan_names_lessons_not_measured(tmp_path):
    fake_run(tmp_path, "course.json", "cpu", "2026-12-01", {"01_setup": 0.5, "10_sharded": 1.5})
    fake_run(tmp_path, "one.json", "cpu", "2026-12-04", {"11_checkpoint": 3.0})
    peaks = plan_workshop.measured_peaks("peak_rss_bytes", "cpu", tmp_path)
    assert {n: m.gib for n, m in peaks.items()} == {"01_setup": 0.5, "10_sharded": 1.5, "11_checkpoint": 3.0}
    assert plan_workshop.measured_peak("peak_rss_bytes", "cpu", tmp_path).notebook == "11_checkpoint"
    lessons = ["01_setup", "10_sharded", "11_checkpoint", "12_next"]
    notes = plan_workshop.memory_notes(plan_workshop.profiles(), tmp_path, lessons)
    assert "measured: 3.00 GiB (11_checkpoint" in notes[0] and "Not measured, so possibly larger: 12_next" in notes[0]


def test_the_guides_memory_table_is_the_baselines():
    guide = (ROOT / "docs" / "instructor.md").read_text()
    for name, measured in plan_workshop.measured_peaks("peak_rss_bytes", "cpu").items():
        row = f"| {name} | {measured.gib:.2f} GiB |"
        assert row in guide, f"docs/instructor.md: the memory row {row} is missing or differs from the baseline"
        assert f"`{measured.source}`" in guide, f"docs/instructor.md: name {measured.source} beside the memory table"
    peak = plan_workshop.measured_peak("peak_rss_bytes", "cpu")
    assert f"peaked at\n  {peak.gib:.2f} GiB" in guide


def test_the_plan_reads_the_gpu_sharing_from_the_hubs_shared_profile(tmp_path):
    import yaml

    config = yaml.safe_load((ROOT / "deploy" / "hub" / "config.yaml").read_text())
    shared = next(e for e in config["singleuser"]["profileList"] if e["slug"] == "shared-l4")
    selector = shared["kubespawner_override"]["node_selector"]
    selector.update({plan_workshop.SHARING_LABELS[0]: "mps", plan_workshop.SHARING_LABELS[1]: "8"})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert plan_workshop.gpu_sharing(tmp_path / "config.yaml") == ("mps", 8)
