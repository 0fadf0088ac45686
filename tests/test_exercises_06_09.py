"""Checkers of lessons 06 to 09: the solution passes, known wrong answers get their message, untouched is not attempted."""

import math

import jax
import numpy as np
import pytest

from dpcourse import costs, model
from dpcourse.bench import BenchResult, SweepPoint
from dpcourse.config import make_config
from dpcourse.exercises import lesson06, lesson07, lesson08, lesson09
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, UNAVAILABLE, WRONG

CFG = make_config("smoke")


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


# 06 ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_06_1_split_keys_pass_on_any_device_count(n):
    expect(lesson06.per_device_keys(lambda seed: jax.random.split(jax.random.key(seed), n), n), CORRECT)
    raw = lambda seed: jax.random.split(jax.random.PRNGKey(seed), n)  # noqa: E731 - legacy uint32 keys
    expect(lesson06.per_device_keys(raw, n), CORRECT)


def test_06_1_wrong_answers():
    n = 4
    copied = lambda seed: jax.numpy.stack([jax.random.key(seed)] * n)  # noqa: E731
    expect(lesson06.per_device_keys(copied, n), WRONG, "same key")
    half = lambda seed: jax.numpy.concatenate([jax.random.split(jax.random.key(seed), 2)] * 2)  # noqa: E731
    expect(lesson06.per_device_keys(half, n), WRONG, "Only 2 of 4")
    counter = iter(range(1000))
    fresh = lambda seed: jax.random.split(jax.random.key(next(counter)), n)  # noqa: E731
    expect(lesson06.per_device_keys(fresh, n), WRONG, "same seed gave different masks")
    fixed = lambda seed: jax.random.split(jax.random.key(0), n)  # noqa: E731
    expect(lesson06.per_device_keys(fixed, n), WRONG, "must come from the seed")
    expect(lesson06.per_device_keys(lambda seed: jax.random.key(seed), n), BAD_INPUT, "shape (4,)")
    expect(lesson06.per_device_keys(lambda seed: np.arange(4.0), n), BAD_INPUT, "PRNG keys")
    expect(lesson06.per_device_keys(..., n), NOT_ATTEMPTED)


def test_06_2_bytes_per_device():
    ref = 3 * 4 * model.param_count(CFG) + 4
    expect(lesson06.bytes_per_device(ref, CFG, 8), CORRECT)
    expect(lesson06.bytes_per_device(4 * model.param_count(CFG), CFG, 8), WRONG, "parameters only")
    expect(lesson06.bytes_per_device(ref / 8, CFG, 8), WRONG, "full copy on every device")
    expect(lesson06.bytes_per_device(ref * 8, CFG, 8), WRONG, "total over all 8")
    expect(lesson06.bytes_per_device(ref / 4, CFG, 8), WRONG, "values, not bytes")
    expect(lesson06.bytes_per_device(None, CFG, 8), NOT_ATTEMPTED)


# 07 ---------------------------------------------------------------------------


def _point(batch, ms):
    result = BenchResult(
        label=f"b{batch}",
        n_devices=8,
        global_batch=batch,
        compile_s=0.1,
        ms_per_step=ms,
        examples_per_s=batch / (ms / 1e3),
        final_loss=2.0,
        final_accuracy=0.1,
    )
    return SweepPoint(batch, "ok", result=result)


POINTS = [SweepPoint(12, "skipped", "does not divide"), _point(32, 3.0), _point(64, 4.0), _point(128, 6.0)]


def test_07_1_plateau():
    a, b = 2.0e-3, 1.0 / 32 * 1e-3  # through (32, 3 ms) and (128, 6 ms)
    expect(lesson07.plateau((1 / b, 9 * a / b), POINTS), CORRECT)
    expect(lesson07.plateau((1 / b, a / b), POINTS), WRONG, "half the plateau")
    expect(lesson07.plateau((1 / b / 1e3, 9 * a / b), POINTS), WRONG, "off by 1000")
    expect(lesson07.plateau((128 / 6e-3, 9 * a / b), POINTS), WRONG, "largest size")
    expect(lesson07.plateau((None, None), POINTS), WRONG, "there is a plateau")
    expect(lesson07.plateau(32000.0, POINTS), BAD_INPUT, "tuple of 2")
    expect(lesson07.plateau(..., POINTS), NOT_ATTEMPTED)
    flat = [_point(32, 3.0), _point(64, 2.5)]
    expect(lesson07.plateau((None, None), flat), CORRECT)
    expect(lesson07.plateau((1e4, 100), flat), WRONG, "(None, None)")
    expect(lesson07.plateau((None, None), POINTS[:2]), UNAVAILABLE)


def test_07_2_allreduce():
    grad = costs.gradient_bytes(CFG)
    ref = 1.5 * grad / 32e9 * 1e3
    expect(lesson07.allreduce_ms(ref, CFG), CORRECT)
    expect(lesson07.allreduce_ms(grad / 32e9 * 1e3, CFG), WRONG, "sends the gradient once")
    expect(lesson07.allreduce_ms(ref / 1e3, CFG), WRONG, "in seconds")
    expect(lesson07.allreduce_ms(ref * 8, CFG), WRONG, "bits versus bytes")
    expect(lesson07.allreduce_ms(4 * grad / 32e9 * 1e3, CFG), WRONG, "every device's whole gradient")
    expect(lesson07.allreduce_ms(ref / 4, CFG), WRONG, "values, not bytes")
    expect(lesson07.allreduce_ms(..., CFG), NOT_ATTEMPTED)


# 08 ---------------------------------------------------------------------------


def _contiguous(x, pid, num_processes, per_process):
    rows = x.shape[0] // num_processes
    return x[pid * rows : (pid + 1) * rows]


def test_08_1_local_batch():
    expect(lesson08.local_batch(_contiguous), CORRECT)
    expect(lesson08.local_batch(lambda x, pid, p, d: x), WRONG, "whole global batch")
    expect(lesson08.local_batch(lambda x, pid, p, d: x[pid::p]), WRONG, "Interleaved")
    per_device = lambda x, pid, p, d: x[pid * (x.shape[0] // (p * d)) :][: x.shape[0] // (p * d)]  # noqa: E731
    expect(lesson08.local_batch(per_device), WRONG, "one device's rows")
    swapped = lambda x, pid, p, d: _contiguous(x, p - 1 - pid, p, d)  # noqa: E731
    expect(lesson08.local_batch(swapped), WRONG, "rows of process")
    expect(lesson08.local_batch(lambda x, pid, p, d: [0, 1]), BAD_INPUT, "array of rows")
    expect(lesson08.local_batch(lambda x, pid: x), BAD_INPUT, "TypeError")
    expect(lesson08.local_batch(None), NOT_ATTEMPTED)


def test_08_1_reference_matches_the_lessons_mesh(cpu_devices):
    # The reference rows are those process_rows reads from a sharding over devices in process order.
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(cpu_devices), ("data",))
    index_map = NamedSharding(mesh, P("data")).devices_indices_map((16,))
    for pid in range(2):  # 2 "processes" of 4 devices
        rows = set()
        for d in cpu_devices[4 * pid : 4 * pid + 4]:
            rows.update(range(16)[index_map[d][0]])
        assert sorted(rows) == list(lesson08.reference_rows(pid, 2, 4, 16))


def test_08_2_valid_global_batch():
    expect(lesson08.valid_global_batch((104, 52), 2, 4), CORRECT)
    expect(lesson08.valid_global_batch((102, 34), 3, 2), CORRECT)
    expect(lesson08.valid_global_batch((100, 50), 2, 4), WRONG, "local devices but not by all 8")
    expect(lesson08.valid_global_batch((101, 50), 2, 4), WRONG, "does not divide by the 8")
    expect(lesson08.valid_global_batch((112, 56), 2, 4), WRONG, "not the smallest")
    expect(lesson08.valid_global_batch((104, 104), 2, 4), WRONG, "No process loads the whole")
    expect(lesson08.valid_global_batch((104, 13), 2, 4), WRONG, "per-device batch")
    expect(lesson08.valid_global_batch(104, 2, 4), BAD_INPUT, "tuple of 2")
    expect(lesson08.valid_global_batch(..., 2, 4), NOT_ATTEMPTED)


# 09 ---------------------------------------------------------------------------


def test_09_1_ridge_batch():
    w, ridge = 1024, 200.0
    ref = lesson09.ridge_batch_reference(w, ridge, 2)
    assert abs(lesson09.matmul_intensity(ref, w, w, 2) - ridge) < 1e-9 * ridge  # the batch sits on the ridge
    expect(lesson09.ridge_batch(ref, w, ridge), CORRECT)
    expect(lesson09.ridge_batch(math.ceil(ref), w, ridge), CORRECT)
    expect(lesson09.ridge_batch(lesson09.ridge_batch_reference(w, ridge, 4), w, ridge), WRONG, "4 bytes per value")
    f32_with_2_bytes = lesson09.ridge_batch_reference(w, ridge, 2)
    expect(lesson09.ridge_batch(f32_with_2_bytes, w, ridge, 4), WRONG, "float32 takes 4")
    expect(
        lesson09.ridge_batch(lesson09.ridge_batch_reference(w, 2 * ridge, 2), w, ridge), WRONG, "multiply-accumulate"
    )
    expect(lesson09.ridge_batch(400 * w / (2 * w - 400), w, ridge), WRONG, "output")
    expect(lesson09.ridge_batch(math.inf, w, ridge), WRONG, "some batch reaches it")
    expect(lesson09.ridge_batch(3 * ref, w, ridge), WRONG, "about 3x too large")
    expect(lesson09.ridge_batch(math.inf, 256, ridge), CORRECT)  # W / 2 = 128 FLOP/byte < 200: never
    expect(lesson09.ridge_batch(500, 256, ridge), WRONG, "math.inf")
    expect(lesson09.ridge_batch("big", w, ridge), BAD_INPUT, "got str")
    expect(lesson09.ridge_batch(ref, w, None), UNAVAILABLE)
    expect(lesson09.ridge_batch(..., w, ridge), NOT_ATTEMPTED)


def test_09_2_rungs():
    measured = {"scan float32": 0.21, "scan unroll": 0.32, "bfloat16": 0.55, "larger batch": 0.61}
    expect(lesson09.rungs_reaching(["bfloat16", "larger batch"], measured, 0.5), CORRECT)
    expect(
        lesson09.rungs_reaching(["scan unroll", "bfloat16", "larger batch"], measured, 0.5), WRONG, "below the target"
    )
    expect(lesson09.rungs_reaching(["larger batch"], measured, 0.5), WRONG, "also reaches")
    expect(lesson09.rungs_reaching(["fp8"], measured, 0.5), BAD_INPUT, "Unknown rung")
    expect(lesson09.rungs_reaching("bfloat16", measured, 0.5), BAD_INPUT, "list of rung names")
    expect(lesson09.rungs_reaching([], {"a": None}, 0.5), UNAVAILABLE)
    with_failed = {**measured, "larger batch": None}
    expect(lesson09.rungs_reaching(["bfloat16"], with_failed, 0.5), CORRECT)
    expect(lesson09.rungs_reaching(["bfloat16", "larger batch"], with_failed, 0.5), WRONG, "failed")
    expect(lesson09.rungs_reaching(..., measured, 0.5), NOT_ATTEMPTED)
