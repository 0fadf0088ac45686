"""Tests of dpcourse.perf.ladder: notebook 09's rungs run, stay correct, and fail softly."""

import jax
import numpy as np
import pytest

from dpcourse import data, model, placement, train
from dpcourse.config import make_config
from dpcourse.perf import ladder

CFG = make_config("smoke").with_overrides(warmup_steps=1, repeats=1, steps=2, n_batches=2)


@pytest.fixture(scope="module")
def dataset():
    return data.load_fashion_mnist("synthetic", limit=256)


@pytest.fixture(scope="module")
def cpu0():
    return jax.devices("cpu")[0]


def test_default_rungs_are_the_issues_ladder():
    rungs = ladder.default_rungs(CFG)
    assert [(r.block_unroll, r.compute_dtype) for r in rungs] == [
        (1, "float32"),
        (CFG.block_repeats, "float32"),  # unroll 8 capped at the 2 repeats of smoke
        ("full", "float32"),
        (1, "bfloat16"),
        ("full", "bfloat16"),
        ("full", "bfloat16"),
        ("full", "bfloat16"),
    ]
    assert [r.global_batch for r in rungs] == [CFG.ladder_global_batch] * 5 + [CFG.ladder_large_batch] * 2
    assert [r.block_backward for r in rungs] == ["autodiff"] * 6 + ["pallas"]
    assert len({r.name for r in rungs}) == len(rungs)  # record names are unique
    full = ladder.default_rungs(make_config("full"))
    assert full[1].name == "scan_unroll8_f32" and full[-1].global_batch == 8192
    assert full[-1].name == "pallas_bf16_batch8192"


def test_gradient_error_reads_adams_first_moment():
    reference = {"w": np.array([1.0, 2.0]), "b": np.array([4.0])}
    same = {"w": 0.1 * reference["w"], "b": 0.1 * reference["b"]}  # mu = (1 - 0.9) g
    assert ladder.gradient_error(same, reference) == pytest.approx(0.0, abs=1e-12)
    off = {"w": 0.1 * reference["w"], "b": np.array([0.1 * 5.0])}  # b 25 % off
    assert ladder.gradient_error(off, reference) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="all zeros"):
        ladder.gradient_error(same, {"w": np.zeros(2), "b": np.ones(1)})


def test_the_kernel_rung_trains_like_its_twin(dataset, cpu0):
    init = model.init_params(CFG)
    rungs = ladder.default_rungs(CFG)[-2:]  # JAX's backward pass, then the Pallas kernel's
    runs = ladder.run_ladder(rungs, CFG, dataset, cpu0, init, progress=False)
    assert [r.status for r in runs] == ["ok", "ok"]
    twin, kernel = runs
    np.testing.assert_allclose(kernel.result.final_loss, twin.result.final_loss, rtol=0.02)


def test_rung_config_validates():
    with pytest.raises(ValueError, match="compute_dtype"):
        ladder.Rung("x", "x", 1, "float16", 8).config(CFG)


@pytest.fixture(scope="module")
def scan_and_unrolled(dataset, cpu0):
    init = model.init_params(CFG)
    rungs = ladder.default_rungs(CFG)
    return init, ladder.run_ladder([rungs[0], rungs[2]], CFG, dataset, cpu0, init, progress=False)


def test_the_ladder_compiles_its_rungs_side_by_side(scan_and_unrolled):
    _, runs = scan_and_unrolled
    assert [r.result.compile_kind for r in runs] == ["cold, compiled beside the others"] * 2
    assert all(r.result.compile_s > 0 for r in runs)


def test_a_compile_that_failed_fails_its_rung(dataset, cpu0):
    boom = RuntimeError("RESOURCE_EXHAUSTED: compile ran out of memory")
    r = ladder.run_rung(ladder.default_rungs(CFG)[0], CFG, dataset, cpu0, model.init_params(CFG), boom)
    assert r.status == "failed" and r.reason.startswith("RuntimeError: RESOURCE_EXHAUSTED")


def test_mfu_divides_by_the_peak_the_device_is_found_with(scan_and_unrolled, monkeypatch):
    """A chip that find_peak knows (a TPU once its figures are listed) gets its MFU; an unknown one none."""
    from dpcourse import costs

    _, (scan, _) = scan_and_unrolled
    chip = costs.DevicePeak("a test chip", 197e12, 197e12, 197e12, "ICI", 1e11, "a test figure")
    monkeypatch.setattr(costs, "find_peak", lambda kind: chip if kind == "TPU v5 lite" else None)
    achieved = costs.achieved_flops_per_s(CFG, scan.rung.global_batch, scan.result.ms_per_step)
    assert scan.mfu_datasheet(CFG, "TPU v5 lite") == pytest.approx(achieved / 197e12)
    assert scan.mfu_datasheet(CFG, "TPU v9") is None


def test_a_rung_is_measured_with_the_harness_and_keeps_its_program(scan_and_unrolled):
    _, (scan, _) = scan_and_unrolled
    assert scan.status == "ok" and scan.reason == ""
    assert scan.result.global_batch == CFG.ladder_global_batch and scan.result.n_devices == 1
    assert scan.result.steps == CFG.warmup_steps + CFG.repeats * CFG.steps
    assert " while(" in scan.compiled.as_text()  # the executable the harness compiled, kept by its probe
    assert scan.program_bytes > 0
    assert scan.peak_bytes is None  # CPUs report no memory stats
    assert scan.mfu_datasheet(CFG, "cpu") is None  # no datasheet peak for CPUs


def test_unrolled_rung_ends_where_the_scan_rung_ends(scan_and_unrolled, cpu0):
    init, (scan, unrolled) = scan_and_unrolled
    steps = scan.result.steps
    param_tol, grad_tol = train.equivalence_tolerances("cpu", CFG.learning_rate, steps)
    assert train.max_abs_diff(scan.final_params, unrolled.final_params) <= param_tol
    batches = placement.place_single_device(
        CFG, data.load_fashion_mnist("synthetic", limit=256), cpu0, train.make_optimizer(CFG), init, 16
    ).batches
    _, _, s1 = ladder.run_steps(scan.compiled, CFG, cpu0, init, batches, 1)
    _, _, s2 = ladder.run_steps(unrolled.compiled, CFG, cpu0, init, batches, 1)
    diff, scale = train.first_step_gradient_diff(s1, s2)
    assert diff / scale <= grad_tol


def test_fraction_of_ceiling_uses_the_rungs_dtype(scan_and_unrolled):
    from dpcourse import costs
    from dpcourse.perf import ceilings

    _, (scan, _) = scan_and_unrolled
    measured = {"float32 default": ceilings.Ceiling("float32 default", "ok", rate=1e9)}
    expected = costs.achieved_flops_per_s(CFG, scan.rung.global_batch, scan.result.ms_per_step) / 1e9
    assert scan.fraction_of_ceiling(CFG, measured) == pytest.approx(expected)
    assert scan.fraction_of_ceiling(CFG, {}) is None


def test_a_failing_rung_is_recorded_with_its_reason(dataset, cpu0, monkeypatch):
    def oom(*args, **kwargs):
        raise MemoryError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8 GiB")

    monkeypatch.setattr(placement, "place_single_device", oom)
    r = ladder.run_rung(ladder.default_rungs(CFG)[-1], CFG, dataset, cpu0, model.init_params(CFG))
    assert r.status == "failed"
    assert r.reason.startswith("MemoryError: RESOURCE_EXHAUSTED")
    assert r.result is None and r.mfu_datasheet(CFG, "NVIDIA H200") is None


def test_run_steps_is_a_reproducible_training_run(scan_and_unrolled, dataset, cpu0):
    init, (scan, _) = scan_and_unrolled
    batches = placement.place_single_device(CFG, dataset, cpu0, train.make_optimizer(CFG), init, 16).batches
    a, p1, _ = ladder.run_steps(scan.compiled, CFG, cpu0, init, batches, 3)
    b, p2, _ = ladder.run_steps(scan.compiled, CFG, cpu0, init, batches, 3)
    assert a == b and len(a) == 3
    assert train.max_abs_diff(p1, p2) == 0.0


def test_memory_helpers_report_none_when_the_backend_does_not():
    assert ladder.program_bytes(object()) is None

    class Gpu:
        def memory_stats(self):
            return {"peak_bytes_in_use": 123, "bytes_limit": 456}

    assert ladder.device_peak_bytes(Gpu()) == 123


# The first 10 losses measured on one TPU v5e (JAX 0.10.2, full profile, synthetic data, batch 4096).
TPU_F32 = [2.3017, 2.2968, 2.2840, 2.2493, 2.7124, 2.2261, 2.2592, 2.2697, 2.2671, 2.2680]
TPU_BF16 = [2.3018, 2.2979, 2.2876, 2.2612, 3.0098, 2.2248, 2.2585, 2.2696, 2.2688, 2.2704]


def test_a_loss_jump_is_reported_not_held_to_the_tolerance():
    gap = ladder.loss_curve_gap(TPU_BF16, TPU_F32)
    assert gap.largest == pytest.approx(0.2974) and gap.step_of_largest == 4
    assert gap.jump_at_largest == pytest.approx(2.7124 - 2.2493)
    assert gap.median == pytest.approx(0.0015) and gap.median <= ladder.bf16_loss_tolerance(min(TPU_F32))
    off = [1.03 * v for v in TPU_F32]  # a wrong cast or loss: 3 % off at every step
    assert ladder.loss_curve_gap(off, TPU_F32).median > ladder.bf16_loss_tolerance(min(TPU_F32))
    with pytest.raises(ValueError, match="same length"):
        ladder.loss_curve_gap([1.0], [1.0, 2.0])


def test_bf16_tolerance_is_two_percent_of_the_loss():
    assert ladder.bf16_loss_tolerance(2.0) == pytest.approx(0.04)
    assert ladder.bf16_loss_tolerance(-1.0) == pytest.approx(0.02)


def test_single_device_sweep_records_each_size_and_survives_a_failure(dataset, cpu0, monkeypatch):
    real = ladder.run_rung

    def flaky(rung, *args):
        if rung.global_batch == 32:
            return ladder.RungResult(rung, "failed", "MemoryError: out of memory")
        return real(rung, *args)

    monkeypatch.setattr(ladder, "run_rung", flaky)
    cfg = CFG.with_overrides(block_unroll="full")
    points = ladder.sweep_single_device(cfg, dataset, cpu0, model.init_params(cfg), (8, 32), progress=False)
    assert [(p.global_batch, p.status) for p in points] == [(8, "ok"), (32, "failed")]
    assert points[0].result.global_batch == 8 and points[0].result.n_devices == 1
    assert "out of memory" in points[1].reason


def test_a_sweep_takes_the_sizes_the_ladder_measured_as_they_are(dataset, cpu0, monkeypatch, scan_and_unrolled):
    _, (_, unrolled) = scan_and_unrolled
    monkeypatch.setattr(ladder, "run_rung", lambda *a, **k: pytest.fail("a measured size ran again"))
    cfg = CFG.with_overrides(block_unroll="full")
    size = unrolled.rung.global_batch
    points = ladder.sweep_single_device(
        cfg, dataset, cpu0, model.init_params(cfg), (size,), progress=False, measured={size: unrolled.result}
    )
    assert points[0].result is unrolled.result


def test_a_rung_stopped_by_a_foreign_global_mesh_stops_the_ladder_with_the_sentence(dataset, cpu0, monkeypatch):
    from dpcourse.backend.mesh_guard import ForeignMeshError

    def refused(*args, **kwargs):
        raise ValueError("Received incompatible devices for jitted computation")

    monkeypatch.setattr(placement, "place_single_device", refused)
    foreign = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    with jax.set_mesh(foreign), pytest.raises(ForeignMeshError, match=r"stopped under it \(ValueError\)"):
        ladder.run_rung(ladder.default_rungs(CFG)[-1], CFG, dataset, cpu0, model.init_params(CFG))


def test_the_compiles_say_what_they_do_and_the_stop_button_ends_them_in_one_line(dataset, cpu0, monkeypatch, capsys):
    first = ladder.default_rungs(CFG)[:1]
    ladder.compile_rungs(first, CFG, dataset, cpu0, model.init_params(CFG), progress=True)
    out = capsys.readouterr().out
    assert out.startswith("compiling scan_f32 ...\n") and "  scan_f32 compiled in " in out

    def stop_button(*args, **kwargs):  # pressed while the caller waits for the compiles
        raise KeyboardInterrupt

    monkeypatch.setattr(ladder.queue.Queue, "get", stop_button)
    with pytest.raises(KeyboardInterrupt) as stop:
        ladder.compile_rungs(first, CFG, dataset, cpu0, model.init_params(CFG))
    assert stop.value._render_traceback_() == [
        "KeyboardInterrupt: stopped; the compiles already started finish in the background. Run the cell again."
    ]
