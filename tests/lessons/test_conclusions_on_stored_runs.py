"""Every conclusion a lesson prints from its numbers holds on the recorded results of every stored run.

The lessons write their conclusions with library functions that read the
run's own figures (``dpcourse.large_batch.readings`` and
``time_to_target`` for lesson 12). Here each stored run's records, every
profile the course keeps (``baselines/*.json``: ``smoke``, ``cpu``, and the
TPU chip's ``full`` run, whose multi-device lessons ran the ``cpu``
workload), and the ``smoke`` copies of ``make notebook-test`` when this
checkout has them (``build/notebook-test/records.jsonl``), are fed back to
those functions, and each sentence is checked against the numbers by
arithmetic of its own: a fixed sentence that one profile's numbers
contradict, or a verdict that names a winner inside the noise, fails here.
No lesson runs: the records are read and the tables rebuilt from them.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from pathlib import Path

import pytest

from dpcourse import config
from dpcourse.large_batch import batch_size, readings, time_to_target
from dpcourse.multihost import preemption

ROOT = Path(__file__).resolve().parents[2]
LESSON_12 = "12_batch_size"
STEPS = re.compile(r"^steps_to_target_(same|sqrt|linear)_(\d+)$")


def _stored_runs() -> dict[str, list[dict]]:
    """``"<file>: <notebook> (<profile>)" -> records`` for every stored run of a lesson."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for path in sorted((ROOT / "baselines").glob("*.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        for rec in payload.get("records", []) if isinstance(payload, dict) else []:
            runs[f"{path.name}: {rec['notebook']} ({rec['profile']})"].append(rec)
    executed = ROOT / "build" / "notebook-test" / "records.jsonl"
    if executed.is_file():  # make notebook-test's smoke copies, where this checkout ran them
        for line in executed.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                runs[f"notebook-test: {rec['notebook']} ({rec['profile']})"].append(rec)
    return dict(runs)


RUNS = _stored_runs()
LESSON_12_RUNS = {k: v for k, v in RUNS.items() if f": {LESSON_12} (" in k}


def test_every_profile_of_lesson_12_is_stored():
    profiles = {k.rsplit("(", 1)[1].rstrip(")") for k in LESSON_12_RUNS}
    assert {"smoke", "cpu"} <= profiles, f"stored lesson 12 runs: {sorted(LESSON_12_RUNS)}"


class Run12:
    """One stored run of lesson 12, its figures as the lesson had them."""

    def __init__(self, records: list[dict]):
        self.figures = {r["metric"]: r["value"] for r in records}
        self.profile = records[0]["profile"]
        self.devices = records[0]["device_count"]
        self.simulated = records[0]["backend"] == "cpu" and self.devices > 1
        self.steps: dict[tuple[str, int], int | None] = {}
        for metric, value in self.figures.items():
            if match := STEPS.match(metric):
                self.steps[match[1], int(match[2])] = int(value)
        self.sizes = sorted({b for _, b in self.steps})
        for rule in batch_size.LR_RULES:
            for b in self.sizes:
                self.steps.setdefault((rule, b), None)  # not recorded: not reached
        self.best = {
            b: min(v for (_, bb), v in self.steps.items() if bb == b and v is not None)
            for b in self.sizes
            if any(v is not None for (_, bb), v in self.steps.items() if bb == b)
        }
        self.fit = batch_size.TradeOff(
            self.figures["s_min"], self.figures["e_min"], self.figures.get("fit_worst_error", 0.0)
        )
        self.spread = self.figures["seed_spread"]
        self.b_dev = int(self.figures.get("per_device_batch", self.sizes[0] // self.devices))

    def tables(self) -> dict[tuple[str, str], list[dict]]:
        """Section 7's tables, rebuilt as the lesson builds them, from the recorded fit."""
        plan = batch_size.plan_for(self.profile)
        model_cfg = config.make_config(self.profile).with_overrides(width=plan.width, block_repeats=plan.block_repeats)
        full = config.make_config("full")
        counts = [2**k for k in range(1, int(math.log2(4 * self.sizes[-1] // self.b_dev)) + 1)]
        machines = [
            time_to_target.gpus("L4", "NVIDIA L4", counts),
            time_to_target.gpus("H200", "NVIDIA H200", counts),
            time_to_target.tpu_slices(
                "TPU v5e", "TPU v5 lite", [(2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16)]
            ),
        ]
        out = {}
        for workload, (cfg, per_device) in {
            "lesson": (model_cfg, self.b_dev),
            "full": (full, full.per_device_batch),
        }.items():
            for m in machines:
                out[workload, m.label] = time_to_target.rows(self.fit, per_device, m, cfg, self.sizes)
        return out


@pytest.fixture(params=sorted(LESSON_12_RUNS), scope="module")
def run12(request) -> Run12:
    return Run12(LESSON_12_RUNS[request.param])


def test_the_rules_sentence_names_a_winner_exactly_where_one_beats_the_others_beyond_the_spread(run12):
    text = readings.rules_sentence(run12.steps, batch_size.LR_RULES, run12.sizes, run12.spread)
    no_winner = text.split("No winner at ", 1)[1] if "No winner at " in text else ""
    for b in run12.sizes:
        reached = {r: run12.steps[r, b] for r in batch_size.LR_RULES if run12.steps[r, b] is not None}
        if not reached:
            continue
        least = min(reached.values())
        beaten = [c for c in reached.values() if c != least]
        leaders = [r for r, c in reached.items() if c == least]
        wins = (
            len(leaders) == 1
            and len(beaten) == len(reached) - 1
            and beaten
            and all(abs(c - least) / ((c + least) / 2) > run12.spread for c in beaten)
        )
        if wins:
            assert f'"{leaders[0]}" at' in text and f"{b:,} (" not in no_winner, (b, reached, text)
        else:
            assert f"{b:,} (" in no_winner, (b, reached, run12.spread, text)


def test_the_steps_sentence_reads_the_two_largest_batches(run12):
    text = readings.steps_sentence(run12.best, run12.fit.b_crit, run12.spread)
    small, large = sorted(run12.best)[-2:]
    before, after = run12.best[small], run12.best[large]
    moved = "fell" if after < before else "rose" if after > before else "stayed"
    assert f"the fewest steps {moved} from {before} to {after}" in text, text
    assert ("a doubling" in text) == (large == 2 * small), text
    beyond = abs(after - before) / ((after + before) / 2) > run12.spread
    assert ("within the seeds' spread" in text) == (not beyond), text


def test_the_scaling_sentence_reads_the_two_smallest_batches(run12):
    text = readings.scaling_sentence(run12.best)
    small, next_up = sorted(run12.best)[:2]
    share = run12.best[small] * small / next_up / run12.best[next_up]
    assert f"{share:.0%} of perfect scaling" in text
    assert ("on the perfect-scaling line" in text) == (share >= 0.9), text


def test_the_seeds_spread_is_the_recorded_seeds(run12):
    seeds = [v for k, v in run12.figures.items() if k.startswith("seed_steps_")]
    if not seeds:
        pytest.skip("this run recorded no seeds' steps (recorded before they were)")
    assert readings.seed_spread(seeds) == pytest.approx(run12.spread)


def test_section_7_rebuilds_the_recorded_verdicts_and_each_regime_holds(run12):
    """The What you learned claims: this lesson's step is mostly the all-reduce; the full workload's is compute."""
    for (workload, label), table in run12.tables().items():
        first = table[0]
        comm = first["all-reduce µs"] / (first["all-reduce µs"] + first["compute µs"])
        text = time_to_target.regime_sentence(table, run12.fit.b_crit, label, workload)
        best = time_to_target.fastest(table)
        assert f"the time is shortest at {best['devices']} devices" in text, text
        if workload == "lesson":
            assert comm >= 0.5, (label, first)
            assert "B_crit alone does not decide" in text, text
            recorded = run12.figures.get(f"devices_fastest_to_target_{label.replace(' ', '_')}")
        else:
            assert comm < 0.5, (label, first)
            if best is not table[-1]:  # the row after the shortest: the all-reduce's growth outweighs the steps' cut
                nxt = table[table.index(best) + 1]
                assert nxt["ms/step"] / best["ms/step"] > best["steps"] / nxt["steps"], (label, best, nxt)
                assert "decides where the time turns up, not B_crit alone" in text, text
            recorded = run12.figures.get(f"devices_fastest_to_target_full_workload_{label.replace(' ', '_')}")
        if recorded is not None and "fit_worst_error" in run12.figures:  # recorded with this rebuild's model
            assert recorded == best["devices"], (workload, label, recorded, best["devices"])
        reading = time_to_target.reading(table, label)
        assert f"shortest at {best['devices']} devices" in reading
        if best is table[-1]:
            drop = 1 - best["time to target ms"] / table[-2]["time to target ms"]
            assert ("it still falls there" in reading) == (drop >= time_to_target.LEVELLED), (drop, reading)
        else:
            assert all(r["time to target ms"] >= best["time to target ms"] for r in table), table


def test_the_measured_sentence_reads_the_recorded_step_times(run12):
    ms = {int(k.rsplit("_", 1)[1]): v for k, v in run12.figures.items() if k.startswith("ms_per_step_measured_")}
    if not ms:
        pytest.skip("this run recorded no measured step times (recorded before they were)")
    soon = {int(k.rsplit("_", 1)[1]): v for k, v in run12.figures.items() if k.startswith("time_to_target_s_measured_")}
    rows = [{"global batch": b, "ms/step": ms[b], "time to target s": soon.get(b)} for b in sorted(ms)]
    text = readings.measured_sentence(rows, run12.simulated)
    batch_x, time_x = rows[-1]["global batch"] / rows[0]["global batch"], rows[-1]["ms/step"] / rows[0]["ms/step"]
    assert ("about in proportion" in text) == (time_x >= 0.75 * batch_x), text
    assert ("hardly followed the batch" in text) == (time_x <= 1.25 and time_x < 0.75 * batch_x), text
    if soon:
        first = min(soon, key=soon.get)
        assert f"soonest at global batch {first:,}" in text, text
    assert ("only the step counts carry over" in text) == run12.simulated


# The other lessons whose conclusions a library function writes from recorded figures.


def _runs_of(notebook: str, *metrics: str) -> dict[str, dict[str, float]]:
    """``run -> {metric: value}`` for the stored runs of ``notebook`` that recorded every one of ``metrics``."""
    out = {}
    for key, records in RUNS.items():
        if f": {notebook} (" in key:
            figures = {r["metric"]: r["value"] for r in records}
            figures["device_count"] = records[0]["device_count"]
            figures["simulated"] = records[0]["backend"] == "cpu"
            if all(m in figures for m in metrics):
                out[key] = figures
    return out


SCALING_07 = _runs_of("07_sweep", "per_device_throughput_1", "per_device_throughput_n", "scaling_verdict")
FIT_07 = _runs_of("07_sweep", "fit_overhead", "fit_per_example", "sizes_ok")
SAVING_10 = _runs_of("10_sharded", "temp_bytes_dp_replicated", "temp_bytes_accum_scan")
SIZES_11 = _runs_of("11_checkpoint", "checkpoint_bytes_replicated", "checkpoint_bytes_fsdp")
HIDING_11 = _runs_of("11_checkpoint", "sync_save_s", "async_save_blocking_s", "async_save_hidden_s")
RESUMED_11 = _runs_of("11_checkpoint", "resume_max_abs_diff_replicated", "resume_max_abs_diff_fewer_devices")
LEARNED_13 = _runs_of("13_elastic", "preempted_steps_done_twice", "kill_to_seen_gone_s", "lost_in_allreduce_ended_s")


@pytest.mark.parametrize("key", sorted(SCALING_07))
def test_lesson_07_scaling_verdict_is_the_recorded_throughputs(key):
    from dpcourse import costs

    f = SCALING_07[key]
    n = f["device_count"]
    sc = costs.scaling(f["per_device_throughput_1"], f["per_device_throughput_n"] * n, n, f["simulated"])
    assert sc.verdict == f["scaling_verdict"], (key, sc)
    assert sc.efficiency == pytest.approx(f["scaling_efficiency"], rel=1e-6)


@pytest.mark.parametrize("key", sorted(FIT_07))
def test_lesson_07_judges_its_fit_from_the_recorded_sizes(key):
    """What you learned once said the throughput "fits" overhead + per-example time: two stored runs miss by 55-64%."""
    from dpcourse import costs

    f = FIT_07[key]
    ms = {int(m.rsplit("_", 1)[1]): v for m, v in f.items() if m.startswith("ms_per_step_global_batch_")}
    sizes = sorted(ms)
    fit = costs.fit_step_time(sizes, [ms[b] / 1000.0 for b in sizes])
    assert fit.overhead_s * 1e3 == pytest.approx(f["fit_overhead"], abs=1e-9)
    assert fit.per_example_s * 1e6 == pytest.approx(f["fit_per_example"], rel=1e-9)
    errors = [
        (fit.examples_per_s(b) - f[f"throughput_global_batch_{b}"]) / f[f"throughput_global_batch_{b}"] for b in sizes
    ]
    worst = max(errors, key=abs)
    text = costs.judge_fit(len(sizes), worst)
    assert f"{worst:+.1%}" in text and ("describes them well" in text) == (abs(worst) < 0.10), (key, text)


@pytest.mark.parametrize("key", sorted(SAVING_10))
def test_lesson_10_memory_saving_names_where_the_recorded_ratio_landed(key):
    from dpcourse.compiled import census

    lesson = (ROOT / "notebooks" / "10_sharded.py").read_text(encoding="utf-8")
    k = int(re.search(r"^ACCUM_K = (\d+)", lesson, re.M)[1])
    f = SAVING_10[key]
    ratio = f["temp_bytes_dp_replicated"] / f["temp_bytes_accum_scan"]
    text = census.memory_saving(int(f["temp_bytes_dp_replicated"]), int(f["temp_bytes_accum_scan"]), k)
    want = (
        "more than K"
        if ratio > 1.05 * k
        else "about K"
        if ratio >= 0.95 * k
        else "below K"
        if ratio > 1
        else "saved nothing"
    )
    assert want in text and (ratio <= 1 or f"{ratio:.2f}x less" in text), (key, ratio, text)


def test_lesson_10_cites_the_stored_cpu_runs_saving_as_it_was_recorded():
    """The text cites "the `cpu` profile's run on 8 devices measured 4.25 x with K = 4": every stored such run must."""
    lesson = " ".join((ROOT / "notebooks" / "10_sharded.py").read_text(encoding="utf-8").replace("#", " ").split())
    cited = re.search(r"`cpu` profile's run on (\d+) devices measured ([\d.]+) x with K = (\d+)", lesson)
    assert cited, "lesson 10 no longer cites a stored run's saving: update this test"
    devices, ratio = int(cited[1]), float(cited[2])
    stored = [f for k, f in SAVING_10.items() if k.endswith("(cpu)") and f["device_count"] == devices]
    assert stored, "no stored cpu run of lesson 10 on that many devices"
    for f in stored:
        assert round(f["temp_bytes_dp_replicated"] / f["temp_bytes_accum_scan"], 2) == ratio


@pytest.mark.parametrize("key", sorted(SIZES_11))
def test_lesson_11_forms_sentence_reads_the_recorded_sizes(key):
    from dpcourse.checkpoints import cost_sentences

    f = SIZES_11[key]
    sizes = {"replicated": int(f["checkpoint_bytes_replicated"]), "FSDP": int(f["checkpoint_bytes_fsdp"])}
    text = cost_sentences.forms_sentence(sizes)
    low, high = min(sizes.values()), max(sizes.values())
    assert text.endswith("on disk.") if low == high else f"{(high - low) / high:.2%} apart" in text, text


@pytest.mark.parametrize("key", sorted(LEARNED_13))
def test_lesson_13_what_you_learned_reads_the_recorded_run(key):
    """Its lines once said a loss between steps costs "no step" whatever the run did: each verdict is the record's."""
    f = LEARNED_13[key]
    preempted, killed, lost = preemption.learned(f)
    for twice, params, line in (("preempted", "preempted_resume", preempted), ("survivors", "survivors", killed)):
        n = int(f[f"{twice}_steps_done_twice"])
        assert ("no step done twice" in line) == (n == 0) and (n == 0 or f"{n} step" in line), (key, line)
        diff, tol = f.get(f"{params}_max_abs_param_diff"), f.get(f"{params}_max_abs_param_diff_tolerance")
        assert tol is None or (" within " in line) == (diff <= tol), (key, line)
    beat, seen = f.get("heartbeat_timeout_s"), f["kill_to_seen_gone_s"]
    assert beat is None or ("inside the" in killed) == (beat / 2 <= seen <= beat + 1), (key, killed)
    assert f"{f['lost_in_allreduce_ended_s']:.1f} s after the kill" in lost, (key, lost)
    assert preemption.learned({"timed_part": "section 4 alone"}) == []  # a run that measured no loss


@pytest.mark.parametrize("key", sorted(HIDING_11))
def test_lesson_11_hiding_lines_read_the_recorded_save(key):
    from dpcourse.checkpoints import cost_sentences

    f = HIDING_11[key]
    sync, hidden = f["sync_save_s"], f["async_save_hidden_s"]
    # Only the sum steps + save - total enters the verdict: steps of 0 s keep it.
    last = cost_sentences.hiding_lines(0.0, sync, f["async_save_blocking_s"], sync - hidden, 4)[-1]
    if 0 < hidden <= sync:
        assert f"hid {hidden:.3f} s" in last, (key, last)
    elif hidden <= 0:
        assert "nothing was hidden" in last, (key, last)
    else:
        assert "lasts on this machine" in last, (key, last)


@pytest.mark.parametrize("key", sorted(RESUMED_11))
def test_lesson_11_what_you_learned_on_resuming_holds_on_the_recorded_differences(key):
    """What you learned: bitwise where the arithmetic is the same (the same devices on the CPU), within rounding
    on another mesh or process count. A run recorded before its tolerances were: those of its backend."""
    from dpcourse import train
    from dpcourse.checkpoints import cost_sentences

    f, resumed = RESUMED_11[key], {}
    for k in (k for k in cost_sentences.RESUMED_AS if f"resume_max_abs_diff_{k}" in f):
        same = k in ("replicated", "fsdp") and f["simulated"]
        tolerance = f.get(
            f"resume_max_abs_diff_{k}_tolerance", 0.0 if same else train.equivalence_tolerances("cpu", 0, 0)[0]
        )
        resumed[k] = (f[f"resume_max_abs_diff_{k}"], tolerance)
    text = cost_sentences.resumed_sentence(resumed)
    assert "outside" not in text and "within rounding on half the devices" in text, (key, text)
    assert ("bitwise equal on replicated, the same devices, FSDP, the same devices;" in text) == f["simulated"], text


@pytest.mark.parametrize("profile", sorted(batch_size.PLANS))
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_the_regimes_what_you_learned_names_hold_at_every_profile_and_device_count(profile, n):
    """What you learned: "mostly the all-reduce (this lesson's small model)"; "mostly compute (the full's step)".

    The shares of the modelled step depend on the model and the per-device batch only, not on the fit, so
    every profile's plan is checked here, the `full` one too (no stored run of it: a single TPU chip runs
    this lesson's `cpu` workload on simulated devices), at the device counts make test runs the lesson on.
    """
    plan = batch_size.plan_for(profile)
    model_cfg = config.make_config(profile).with_overrides(width=plan.width, block_repeats=plan.block_repeats)
    full = config.make_config("full")
    fit = batch_size.TradeOff(50.0, 50.0 * 400, 0.0)
    b_dev = plan.global_batches[0] // n  # the lesson rounds the batches to multiples of n
    for machine in (
        time_to_target.gpus("L4", "NVIDIA L4", [2, 8, 64]),
        time_to_target.gpus("H200", "NVIDIA H200", [2, 8, 64]),
        time_to_target.tpu_slices("TPU v5e", "TPU v5 lite", [(2, 2), (2, 4), (16, 16)]),
    ):
        small = time_to_target.rows(fit, b_dev, machine, model_cfg, plan.global_batches)[0]
        assert small["all-reduce µs"] > small["compute µs"], (machine.label, small)
        big = time_to_target.rows(fit, full.per_device_batch, machine, full, plan.global_batches)[0]
        assert big["compute µs"] > big["all-reduce µs"], (machine.label, big)


# Lesson 09: its sentences from this run's numbers (dpcourse.perf.report), and the chip's figures its text quotes.

RUNS_09 = _runs_of("09_performance", "rung_scan_f32_status")
CHIP_09 = next(f for k, f in RUNS_09.items() if k.startswith("tpu-v5-lite") and k.endswith("(full)"))


@pytest.mark.parametrize("key", sorted(RUNS_09))
def test_lesson_09_reads_its_compile_column_and_sweep_from_the_run(key):
    from dpcourse.perf import report

    (text,) = report.unroll_sentence(f := RUNS_09[key])
    scan, unrolled = f["rung_scan_f32_compile_time"], f["rung_unrolled_f32_compile_time"]
    assert ("compile longer" in text) == (unrolled > scan) and ("compile shorter" in text) == (unrolled < scan)
    sweep = sorted((int(m.rsplit("batch", 1)[1]), v) for m, v in f.items() if m.startswith("fast_step_examples"))
    assert ("It fell" in report.sweep_sentence(dict(sweep))) == any(b[1] < a[1] for a, b in zip(sweep, sweep[1:]))


def test_lesson_09_has_a_stored_run_of_each_profile_and_its_compile_claims_hold_on_them():
    """Reading it: "48 s for `unrolled_f32` against 5 s for `scan_f32`" on the chip (each run's own: the test above)."""
    assert any(k.endswith("(smoke)") for k in RUNS_09) and any(k.endswith("(cpu)") for k in RUNS_09), sorted(RUNS_09)
    assert round(CHIP_09["rung_unrolled_f32_compile_time"]) == 48 and round(CHIP_09["rung_scan_f32_compile_time"]) == 5


@pytest.mark.parametrize(
    ("quoted", "number", "metric", "scale", "over"),
    [
        ("a bfloat16 ceiling of 189.7 TFLOP/s", "189.7", "ceiling_bfloat16", 1e-12, None),
        ("best step at 90 % of it", "90", "rung_pallas_bf16_batch8192_fraction_of_measured_ceiling", 100, None),
        ("kernels 4 % above the measured rate", "4", "breakdown_scan_f32_matmul_beyond_ms", -100, "_at_rate_ms"),
        ("53.7 ms per step for the scan", "53.7", "rung_scan_f32_ms_per_step", 1, None),
        ("23.7 fully unrolled", "23.7", "rung_unrolled_f32_ms_per_step", 1, None),
        ("global batch 8192 in 41.1 ms", "41.1", "rung_unrolled_bf16_batch8192_ms_per_step", 1, None),
        ("on the same TPU v5e, 38.7 ms per step", "38.7", "rung_pallas_bf16_batch8192_ms_per_step", 1, None),
        ("5.9 ms is what they took beyond it", "5.9", "breakdown_unrolled_bf16_batch8192_matmul_beyond_ms", 1, None),
        ("recorded 261 kernels with a matmul", "261", "rung_pallas_bf16_batch8192_matmul_kernels", 1, None),
        ("131 of them also computing the GELU", "131", "rung_pallas_bf16_batch8192_matmul_kernels_with_gelu", 1, None),
    ],
)
def test_lesson_09_quotes_the_chips_stored_run(quoted, number, metric, scale, over):
    lesson = " ".join((ROOT / "notebooks" / "09_performance.py").read_text(encoding="utf-8").replace("#", " ").split())
    value = CHIP_09[metric] * scale / (CHIP_09[metric.replace("_beyond_ms", over)] if over else 1)
    assert quoted in lesson and round(value, len(number.partition(".")[2])) == float(number), (quoted, value)
    gaps = [v for k, v in CHIP_09.items() if k.endswith("_gap_to_measured")]  # What you learned: "within 0.3 %"
    assert "(the stored chip runs: within 0.3 %" in lesson and gaps and max(gaps) <= 0.003


@pytest.mark.parametrize(
    ("dtype", "ceiling", "rung"),
    [("float32", "float32_default", "unrolled_f32"), ("bfloat16", "bfloat16", "unrolled_bf16")],
)
def test_lesson_09_roofline_bound_is_below_the_chips_steps_and_its_estimate_above(dtype, ceiling, rung):
    from dpcourse.perf import roofline

    c = config.make_config("full").with_overrides(compute_dtype=dtype)
    b = roofline.step_bound(c, 4096, CHIP_09[f"ceiling_{ceiling}"], CHIP_09["ceiling_memory_bandwidth"])
    assert b.overlap_s * 1e3 < CHIP_09[f"rung_{rung}_ms_per_step"] < b.serial_s * 1e3  # the TPU fuses the rest
