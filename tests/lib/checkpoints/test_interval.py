"""dpcourse.checkpoints.interval: Young's and Daly's checkpoint intervals, the time lost per failure, the goodput."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from dpcourse.checkpoints import interval

MINUTE, HOUR = 60.0, 3600.0


def test_young_is_the_square_root_of_twice_save_times_mtbf():
    # sqrt(2 x 300 s x 86,400 s) = sqrt(51,840,000) = 7,200 s: 120 min for a 5 min save and a 24 h MTBF.
    assert interval.young_interval_s(5 * MINUTE, 24 * HOUR) == pytest.approx(7200.0, rel=1e-12)
    assert interval.young_interval_s(0.0, 24 * HOUR) == 0.0


@pytest.mark.parametrize(
    ("mtbf_s", "paper_min", "worked_s"),
    [
        # Daly (2006), figures 3 to 5: delta = 5 min; M = 24 h, 6 h, 15 min give 117, 57 and 9.1 min.
        # By hand, 24 h: x = 300 / 172,800; 7,200 x (1 + 0.0416667 / 3 + 0.00173611 / 9) - 300 = 7,001.39 s.
        (24 * HOUR, 117, 7001.389),
        # 6 h: 3,600 x (1 + 0.0833333 / 3 + 0.00694444 / 9) - 300 = 3,402.78 s.
        (6 * HOUR, 57, 3402.778),
        # 15 min: 734.847 x (1 + 0.408248 / 3 + (1 / 6) / 9) - 300 = 548.457 s.
        (15 * MINUTE, 9.1, 548.457),
    ],
)
def test_daly_gives_the_papers_own_examples(mtbf_s, paper_min, worked_s):
    tau = interval.daly_interval_s(5 * MINUTE, mtbf_s)
    assert tau == pytest.approx(worked_s, abs=0.01)  # worked by hand to 3 decimals
    assert round(tau / MINUTE, 1 if paper_min < 10 else 0) == paper_min
    assert interval.optimal_interval_s(5 * MINUTE, mtbf_s) == tau


def test_daly_takes_the_mtbf_once_a_save_outlasts_twice_the_mtbf():
    assert interval.daly_interval_s(2000.0, 900.0) == 900.0
    assert interval.daly_interval_s(1800.0, 900.0) == 900.0


def test_young_and_daly_agree_where_a_save_is_short_and_part_where_it_is_long():
    short = interval.daly_interval_s(1.0, 24 * HOUR) / interval.young_interval_s(1.0, 24 * HOUR)
    long = interval.daly_interval_s(600.0, 900.0) / interval.young_interval_s(600.0, 900.0)
    assert abs(short - 1) < 0.01
    assert abs(long - 1) > 0.3


def test_the_docstrings_gap_between_young_and_daly_is_the_settings_own():
    # The module's docstring gives each setting's two intervals and their gap: 0.09% and 2.5%.
    for setting, young_s, daly_s, gap in (
        (interval.gke_spot_l4(24 * HOUR), 222.5, 222.3, 0.0009),
        (interval.llama3_405b(), 854.0, 833.0, 0.025),
    ):
        young = interval.young_interval_s(setting.save_s, setting.mtbf_s)
        daly = setting.optimal_interval_s()
        assert round(young, 1 if young < 300 else 0) == young_s and round(daly, 1 if daly < 300 else 0) == daly_s
        assert (young - daly) / young == pytest.approx(gap, abs=0.0005)
        x = setting.save_s / (2 * setting.mtbf_s)
        assert (young - daly) / young == pytest.approx(2 / 3 * x**0.5, rel=0.05)
        assert f"{young_s:g} s against {daly_s:g} s" in " ".join(interval.__doc__.split())


def test_a_failure_costs_half_a_period_and_the_restart():
    # (100 s of training + 2 s of saving) / 2 + 10 s of restart = 61 s.
    assert interval.time_lost_per_failure_s(100.0, 2.0, 10.0) == 61.0
    assert interval.time_lost_per_failure_s(0.0, 0.0, 0.0) == 0.0


def test_the_goodput_is_dalys_complete_model():
    # M = 1,000 s, tau = 100 s, no save, no restart: 100 / (1,000 x (e^0.1 - 1)) = 100 / 105.1709 = 0.950833.
    assert interval.goodput(100.0, 0.0, 0.0, 1000.0) == pytest.approx(0.950833, abs=1e-6)
    # A restart of M ln 2 doubles every segment's expected time: half the goodput.
    assert interval.goodput(100.0, 0.0, 1000.0 * math.log(2), 1000.0) == pytest.approx(0.950833 / 2, abs=1e-6)


def test_for_short_periods_the_goodput_is_one_less_the_saves_and_the_time_lost_per_failure():
    tau, save, restart, mtbf = 60.0, 0.3, 5.0, 24 * HOUR
    first_order = 1 - save / (tau + save) - interval.time_lost_per_failure_s(tau, save, restart) / mtbf
    assert interval.goodput(tau, save, restart, mtbf) == pytest.approx(first_order, abs=1e-5)


def test_the_optimal_interval_is_the_best_goodput_to_within_a_hair():
    save, restart, mtbf = 5 * MINUTE, 10 * MINUTE, 6 * HOUR
    best = interval.goodput(interval.daly_interval_s(save, mtbf), save, restart, mtbf)
    for tau in (600.0, 1800.0, 3000.0, 3300.0, 3500.0, 3600.0, 4000.0, 7200.0):
        assert interval.goodput(tau, save, restart, mtbf) <= best + 1e-6


def test_an_mtbf_from_a_count_of_failures():
    # 54 days = 4,665,600 s over 419 interruptions.
    assert interval.mtbf_from_count_s(419, 54 * 86_400) == pytest.approx(11_135.0835, abs=1e-4)
    with pytest.raises(ValueError, match="whole number of failures"):
        interval.mtbf_from_count_s(0, 100.0)
    with pytest.raises(ValueError, match="whole number of failures"):
        interval.mtbf_from_count_s(2.5, 100.0)


def test_an_interval_in_steps_is_whole_and_at_least_one():
    assert interval.interval_steps(120.0, 0.5) == 240
    assert interval.interval_steps(0.1, 0.5) == 1
    with pytest.raises(ValueError, match="step time"):
        interval.interval_steps(10.0, 0.0)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: interval.young_interval_s(-1.0, 10.0), "save_s is a time in seconds >= 0"),
        (lambda: interval.daly_interval_s(1.0, 0.0), "mean time between failures"),
        (lambda: interval.daly_interval_s(1.0, math.inf), "mean time between failures"),
        (lambda: interval.time_lost_per_failure_s(1.0, 1.0, math.nan), "restart_s is a time"),
        (lambda: interval.goodput(0.0, 1.0, 1.0, 100.0), "checkpoint interval must be > 0"),
        (lambda: interval.gke_spot_l4(-5.0), "mean time between failures"),
        (lambda: interval.llama3_405b(restart_s=-1.0), "restart_s is a time"),
    ],
)
def test_bad_input_says_what_to_give(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_the_large_job_reads_its_figures_from_the_llama3_paper():
    job = interval.llama3_405b()
    assert job.mtbf_s == pytest.approx(11_135.0835, abs=1e-4)
    # 16,384 x 4 GB / 2 TB/s = 32.768 s.
    assert job.save_s == pytest.approx(32.768, abs=1e-9)
    assert job.restart_s == 0.0
    # sqrt(2 x 32.768 x 11,135.08) x (1 + sqrt(x) / 3 + x / 9) - 32.768 with x = 32.768 / 22,270.17: 832.55 s,
    # worked to two decimals.
    assert job.optimal_interval_s() == pytest.approx(832.55, abs=0.01)
    assert job.goodput() == interval.goodput(job.optimal_interval_s(), job.save_s, 0.0, job.mtbf_s)
    assert "419 unexpected interruptions" in job.sources[2]
    assert "no save time" in job.sources[0]
    assert "upper bound" not in job.sources[1] and "raises the goodput" in job.sources[1]


def test_the_gke_node_takes_its_mtbf_as_an_assumption_and_says_so():
    node = interval.gke_spot_l4(24 * HOUR)
    assert node.save_s == interval.LESSON11_SAVE_S
    assert node.restart_s == interval.GKE_INSTALL_S == 300.0
    assert "an assumption" in node.sources[2] and "MTBF 24 h" in node.sources[2]
    assert "lesson 11" in node.sources[0] and "without the wait for a new Spot VM" in node.sources[1]
    # Young's sqrt(2 x 0.28642 x 86,400) = 222.47 s; Daly's x (1 + 0.001288 / 3 + ...) - 0.28642 = 222.28 s
    # (worked to two decimals, hence the tolerance): a save every 3.7 minutes of training.
    assert node.optimal_interval_s() == pytest.approx(222.28, abs=0.01)
    given = interval.gke_spot_l4(6 * HOUR, restart_s=600.0, save_s=2.0)
    assert given.sources[0].endswith("given") and given.sources[1].endswith("given")


def test_the_lesson_11_save_is_the_recorded_one():
    baseline = Path(__file__).resolve().parents[3] / "baselines" / "cpu-jax0.10.2-11_checkpoint.json"
    records = json.loads(baseline.read_text())["records"]
    (recorded,) = [r["value"] for r in records if r["metric"] == "sync_save_s"]
    assert recorded == interval.LESSON11_SAVE_S


def test_the_gke_shutdown_share_fits_in_the_spot_notice():
    assert interval.GKE_SPOT_POD_SHUTDOWN_S < interval.SPOT_NOTICE_S == interval.KUBERNETES_DEFAULT_GRACE_S


def test_the_table_has_one_row_per_setting_with_the_figures_it_computes():
    node, job = interval.gke_spot_l4(24 * HOUR), interval.llama3_405b()
    rows = interval.table_rows([node, job])
    assert [r["setting"] for r in rows] == [node.name, job.name]
    first = rows[0]
    assert first["MTBF (h)"] == 24.0 and first["restart (s)"] == 300.0
    assert first["Daly's interval (s)"] == node.optimal_interval_s()
    assert first["Young's interval (s)"] == interval.young_interval_s(node.save_s, node.mtbf_s)
    # Half of (222.28 s + 0.286 s), plus the 300 s restart: 411.28 s.
    assert first["lost per failure (s)"] == pytest.approx(411.28, abs=0.01)
    assert first["goodput"] == node.goodput()
    # Llama 3 with no restart counted: 92.5%, beside the paper's "higher than 90% effective training time".
    assert rows[1]["goodput"] == pytest.approx(0.9252, abs=1e-4)
    with pytest.raises(ValueError, match="at least one Setting"):
        interval.table_rows([])


def test_the_goodput_matches_a_simulation_of_the_failures_it_models():
    """Poisson failures during work, saves and restarts alike; each sends the segment back to its start."""
    rng = random.Random(13)
    mtbf, tau, save, restart, segments = 100.0, 50.0, 5.0, 10.0, 20_000
    wall = 0.0
    for _ in range(segments):
        while (failure := rng.expovariate(1 / mtbf)) < tau + save:
            wall += failure
            while (again := rng.expovariate(1 / mtbf)) < restart:
                wall += again
            wall += restart
        wall += tau + save
    # Expected: 50 / (100 x e^0.1 x (e^0.55 - 1)) = 50 / 81.04 = 0.617.
    assert interval.goodput(tau, save, restart, mtbf) == pytest.approx(0.61700, abs=1e-5)
    # A segment's wall time has a standard deviation of about 42 s around its 81 s mean: over 20,000 segments
    # the mean's relative standard error is 0.37%, so 2% is over 5 of them (and the first-order 0.534 is far out).
    assert segments * tau / wall == pytest.approx(interval.goodput(tau, save, restart, mtbf), rel=0.02)
