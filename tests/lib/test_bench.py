"""Tests of dpcourse.bench: the benchmark's bookkeeping and the sweep that survives failures.

No timing is asserted (the machine is shared); only the counts, the
arithmetic between the reported figures and the control flow.
"""

import statistics

import jax
import jax.numpy as jnp
import pytest

from dpcourse import bench as bench_module
from dpcourse.bench import BenchResult, SweepPoint, benchmark, compile_step, sweep


@jax.jit
def counting_step(params, opt_state, x, y):
    """A trivial step: counts its calls in opt_state; loss is the batch's sum."""
    return params + 1.0, opt_state + 1, {"loss": jnp.sum(x), "accuracy": jnp.mean(y == 0)}


def two_batches():
    # Batch 0 sums to 0, batch 1 to 8: the final loss tells which batch ran last.
    return [(jnp.zeros(8), jnp.zeros(8, jnp.int32)), (jnp.ones(8), jnp.ones(8, jnp.int32))]


def run(warmup_steps=2, repeats=3, steps=4, batches=None):
    return benchmark(
        counting_step,
        jnp.float32(0.0),
        jnp.int32(0),
        batches or two_batches(),
        warmup_steps=warmup_steps,
        repeats=repeats,
        steps=steps,
        label="trivial",
        n_devices=1,
        global_batch=8,
    )


def test_benchmark_runs_warmup_plus_repeats_times_steps():
    result, params, opt_state = run(warmup_steps=2, repeats=3, steps=4)
    assert isinstance(result, BenchResult)
    assert result.steps == 2 + 3 * 4
    assert int(opt_state) == 14 and float(params) == 14.0  # state threaded through every step
    assert len(result.repeat_ms_per_step) == 3


def test_benchmark_figures_are_consistent():
    result, _, _ = run()
    assert result.ms_per_step == statistics.median(result.repeat_ms_per_step)
    assert result.ms_per_step > 0 and result.compile_s > 0
    # examples/s and ms/step describe the same measurement (float64 arithmetic).
    assert result.examples_per_s == pytest.approx(8 / (result.ms_per_step / 1000.0), rel=1e-12)
    assert (result.label, result.n_devices, result.global_batch) == ("trivial", 1, 8)


def test_benchmark_reports_the_last_steps_metrics():
    # 14 steps over two batches: the last (index 13) used batch 1.
    result, _, _ = run(warmup_steps=2, repeats=3, steps=4)
    assert result.final_loss == 8.0 and result.final_accuracy == 0.0
    # 13 steps: the last (index 12) used batch 0.
    result, _, _ = run(warmup_steps=1, repeats=3, steps=4)
    assert result.final_loss == 0.0 and result.final_accuracy == 1.0


def test_benchmark_without_warmup():
    result, _, opt_state = run(warmup_steps=0, repeats=1, steps=1)
    assert result.steps == 1 and int(opt_state) == 1


def test_as_dict_holds_every_field():
    result, _, _ = run(repeats=1, steps=1)
    d = result.as_dict()
    assert d["steps"] == result.steps and d["examples_per_s"] == result.examples_per_s
    assert set(d) == {
        "label",
        "n_devices",
        "global_batch",
        "compile_s",
        "ms_per_step",
        "examples_per_s",
        "final_loss",
        "final_accuracy",
        "repeat_ms_per_step",
        "steps",
        "compile_kind",
    }


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batches=[]), "at least one batch"),
        (dict(repeats=0), "repeats >= 1"),
        (dict(steps=0), "steps >= 1"),
        (dict(warmup_steps=-1), "warmup_steps >= 0"),
    ],
)
def test_benchmark_rejects_bad_arguments(kwargs, match):
    args = dict(warmup_steps=1, repeats=1, steps=1, batches=two_batches())
    args.update(kwargs)
    batches = args.pop("batches")
    with pytest.raises(ValueError, match=match):
        benchmark(
            counting_step, jnp.float32(0.0), jnp.int32(0), batches, label="x", n_devices=1, global_batch=8, **args
        )


def test_compile_step_returns_a_callable_executable():
    compiled, seconds, kind = compile_step(counting_step, jnp.float32(0.0), jnp.int32(0), *two_batches()[1])
    assert seconds > 0 and kind in ("cold", "warm")
    params, opt_state, metrics = compiled(jnp.float32(0.0), jnp.int32(0), *two_batches()[1])
    assert float(params) == 1.0 and float(metrics["loss"]) == 8.0


def fresh_program(k: float):
    """A jitted function that no other test compiles (its own name and constant)."""

    def step(params, opt_state, x, y):
        return params * k + jnp.sum(x), opt_state + 1, {"loss": jnp.sum(x) * k, "accuracy": jnp.mean(y == 0)}

    step.__name__ = step.__qualname__ = f"fresh_step_{round(k * 1e4)}"
    return jax.jit(step)


ARGS = (jnp.float32(0.0), jnp.int32(0), jnp.ones(8), jnp.zeros(8, jnp.int32))


@pytest.fixture
def no_persistent_cache():
    """No persistent compilation cache, whatever the environment set (make test shares one)."""
    saved = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    yield
    jax.config.update("jax_compilation_cache_dir", saved)


def test_first_compile_in_the_process_is_cold_and_a_recompile_is_warm(no_persistent_cache):
    step = fresh_program(1.2345)
    _, _, first = compile_step(step, *ARGS)
    _, _, second = compile_step(step, *ARGS)
    assert (first, second) == ("cold", "warm")


def test_a_step_that_already_ran_compiles_warm():
    # jax.clear_caches() does not make a recompile cold.
    step = fresh_program(2.3456)
    step(*ARGS)
    compiled, seconds, kind = compile_step(step, *ARGS)
    assert kind == "warm" and seconds > 0
    assert float(compiled(*ARGS)[0]) == 8.0


def test_another_shape_of_a_compiled_function_is_not_called_cold():
    step = fresh_program(3.4567)
    step(*ARGS)
    jax.clear_caches()  # even with JAX's caches empty, XLA's may still hold parts of it
    longer = (jnp.float32(0.0), jnp.int32(0), jnp.ones(16), jnp.zeros(16, jnp.int32))
    assert compile_step(step, *longer)[2] == "warm"


def test_with_a_persistent_cache_a_first_compile_is_not_called_cold(tmp_path, no_persistent_cache):
    saved = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    try:
        assert bench_module.compile_kind("never-seen") == "persistent cache on"
    finally:
        jax.config.update("jax_compilation_cache_dir", saved)
    assert bench_module.compile_kind("never-seen") == "cold"
    bench_module._compiled_here.add("seen")
    assert bench_module.compile_kind("seen") == "warm"


def test_benchmark_labels_its_compile():
    step = fresh_program(4.5678)
    step(*ARGS)
    result, _, _ = benchmark(
        step, *ARGS[:2], [ARGS[2:]], warmup_steps=0, repeats=1, steps=1, label="x", n_devices=1, global_batch=8
    )
    assert result.compile_kind == "warm"


# --------------------------------------------------------------------------
# sweep()


def fake_result(size):
    return BenchResult("fake", 8, size, 0.1, 1.0, size * 1000.0, 2.0, 0.5, [1.0], 3)


def test_sweep_skips_fails_and_goes_on_with_cleanup_after_each_run():
    log = []

    def run_one(size):
        log.append(f"run {size}")
        if size == 32:
            raise RuntimeError(
                "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB.\nSecond line of XLA's message"
            )
        return fake_result(size)

    points = sweep([12, 32, 64], 8, run_one, cleanup=lambda: log.append("cleanup"), progress=False)
    assert [p.global_batch for p in points] == [12, 32, 64]
    assert [p.status for p in points] == ["skipped", "failed", "ok"]

    skipped, failed, ok = points
    assert "12 does not divide by 8 devices" in skipped.reason and "8 or 16" in skipped.reason
    assert skipped.result is None
    assert failed.reason.startswith("RuntimeError: RESOURCE_EXHAUSTED: Out of memory")
    assert "Second line" not in failed.reason  # one line in the table
    assert failed.result is None
    assert ok.result == fake_result(64) and ok.reason == ""

    # The failing size did not stop the sweep; buffers were freed after every
    # size that ran, before the next one started (a skipped size allocates nothing).
    assert log == ["run 32", "cleanup", "run 64", "cleanup"]


def test_sweep_failure_without_message_names_the_exception():
    def run_one(size):
        raise MemoryError()

    (point,) = sweep([8], 8, run_one, progress=False)
    assert point.status == "failed" and point.reason == "MemoryError: MemoryError"


def test_sweep_keyboard_interrupt_stops_but_still_cleans_up():
    cleaned = []

    def run_one(size):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep([8, 16], 8, run_one, cleanup=lambda: cleaned.append(True), progress=False)
    assert cleaned == [True]


def test_sweep_skips_non_positive_sizes_and_works_without_cleanup():
    points = sweep([0, 16], 8, fake_result, progress=False)
    assert [p.status for p in points] == ["skipped", "ok"]
    assert isinstance(points[1], SweepPoint) and points[1].result.global_batch == 16


def test_sweep_progress_goes_to_stdout_not_the_red_stderr_box(capsys):
    sweep([8, 16], 8, fake_result)
    out, err = capsys.readouterr()
    assert "sweep" in out and "2/2" in out
    assert "sweep" not in err


def test_results_table_says_whether_each_compile_was_cold_or_warm():
    from dpcourse import show as display

    cold = BenchResult("a", 1, 8, 0.5, 1.0, 8000.0, 2.0, 0.5, [1.0], 3, compile_kind="cold")
    warm = BenchResult("b", 1, 8, 0.1, 1.0, 8000.0, 2.0, 0.5, [1.0], 3, compile_kind="warm")
    text = str(display.records_table([cold, warm], "synthetic"))
    assert "cold" in text and "warm" in text


def test_sweep_sizes_are_rounded_to_the_device_count():
    from dpcourse.bench import sizes_for_devices

    # 3 devices: none of the cpu profile's sizes divides; each becomes the nearest multiple
    assert sizes_for_devices((256, 512, 1024, 2048, 4096), 3) == (
        [255, 513, 1023, 2049, 4095],
        ["256 -> 255", "512 -> 513", "1024 -> 1023", "2048 -> 2049", "4096 -> 4095"],
    )
    assert sizes_for_devices((256, 512), 8) == ([256, 512], [])  # already valid: unchanged
    assert sizes_for_devices((2, 12, 13), 6) == ([6, 12], ["2 -> 6", "13 -> 12"])  # at least n; no duplicates


def test_sweep_runs_without_tqdm(monkeypatch):
    """an optional package (the progress bar) missing does not stop the lesson."""
    import sys

    monkeypatch.setitem(sys.modules, "tqdm", None)
    points = sweep([8, 16], 8, fake_result, progress=True)
    assert [p.status for p in points] == ["ok", "ok"]


def test_a_sweep_stopped_by_a_foreign_global_mesh_stops_with_the_sentence(cpu_devices):
    """Every size would fail the same way under a mesh the learner set: one sentence, not a table of failures."""
    from dpcourse.backend.mesh_guard import ForeignMeshError

    one_device = jax.device_put(jnp.ones(8, jnp.float32), cpu_devices[0])
    foreign = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    with jax.set_mesh(foreign), pytest.raises(ForeignMeshError, match=r"A global mesh \{'data': 4, 'model': 2\}"):
        sweep([8, 16], 8, lambda size: jax.jit(lambda a: a * 2)(one_device), progress=False)
