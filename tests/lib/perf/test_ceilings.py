"""Tests of dpcourse.perf.ceilings: the measured matmul rates and memory bandwidth of notebook 09."""

import jax
import pytest

from dpcourse.costs import find_peak
from dpcourse.perf import ceilings


@pytest.fixture(scope="module")
def cpu0():
    return jax.devices("cpu")[0]


@pytest.mark.parametrize("setting", list(ceilings.MATMUL_SETTINGS))
def test_matmul_rate_is_flops_over_time(setting, cpu0):
    c = ceilings.matmul_rate(64, setting, cpu0, warmup=1, repeats=1, steps=2)
    assert c.status == "ok" and c.reason == ""
    # rate = 2 n^3 FLOPs / seconds per call, whatever the speed
    assert c.rate == pytest.approx(2 * 64**3 / (c.ms_per_call / 1e3))


def test_memory_bandwidth_counts_one_read_and_one_write(cpu0):
    c = ceilings.memory_bandwidth(1000, cpu0, warmup=0, repeats=1, steps=1)
    assert c.status == "ok"
    assert c.rate == pytest.approx(8 * 1000 / (c.ms_per_call / 1e3))


def test_a_failing_measurement_is_recorded_not_raised(cpu0, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory\nmore detail")

    monkeypatch.setattr(ceilings, "time_calls", boom)
    c = ceilings.matmul_rate(8, "bfloat16", cpu0)
    assert c.status == "failed" and c.rate is None
    assert c.reason == "RuntimeError: RESOURCE_EXHAUSTED: out of memory"
    assert ceilings.memory_bandwidth(8, cpu0).status == "failed"


def test_measure_all_draws_one_pair_of_operands_per_size_on_the_device(cpu0, monkeypatch):
    drawn = []
    real = ceilings.random_operands

    def counting(n, device):
        drawn.append(n)
        a, b = real(n, device)
        assert a.shape == b.shape == (n, n) and a.dtype == b.dtype == jax.numpy.float32
        assert a.devices() == b.devices() == {device} and not bool((a == b).all())
        return a, b

    monkeypatch.setattr(ceilings, "random_operands", counting)
    out = ceilings.measure_all(16, cpu0, warmup=0, repeats=1, steps=1)
    assert drawn == [16, 32]  # shared by the three settings, not drawn three times
    assert list(out) == list(ceilings.MATMUL_SETTINGS) + ["memory bandwidth"]
    assert all(out[s].status == "ok" for s in ceilings.MATMUL_SETTINGS)


def test_operands_that_cannot_be_made_fail_every_setting_at_that_size_only(cpu0, monkeypatch):
    real = ceilings.random_operands

    def no_room_at_32(n, device):
        if n == 32:
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")
        return real(n, device)

    monkeypatch.setattr(ceilings, "random_operands", no_room_at_32)
    out = ceilings.measure_all(16, cpu0, warmup=0, repeats=1, steps=1)
    assert all(out[s].status == "ok" and out[s].size == 16 for s in ceilings.MATMUL_SETTINGS)
    out = ceilings.measure_all(32, cpu0, sizes=(32,), warmup=0, repeats=1, steps=1)
    assert all(out[s].reason == "RuntimeError: RESOURCE_EXHAUSTED: out of memory" for s in ceilings.MATMUL_SETTINGS)


def test_bad_arguments_raise(cpu0):
    with pytest.raises(ValueError, match="Valid: float32 highest, float32 default, bfloat16"):
        ceilings.matmul_rate(8, "tf32", cpu0)
    with pytest.raises(ValueError, match="n must be"):
        ceilings.matmul_rate(0, "bfloat16", cpu0)
    with pytest.raises(ValueError, match="n_values"):
        ceilings.memory_bandwidth(0, cpu0)
    with pytest.raises(ValueError, match="repeats"):
        ceilings.time_calls(lambda: 1, (), repeats=0)


def test_each_compute_dtype_has_its_ceiling_and_datasheet_precision():
    assert ceilings.ceiling_for("float32") == "float32 default"  # the step runs at default precision
    assert ceilings.ceiling_for("bfloat16") == "bfloat16"
    assert ceilings.datasheet_precision("float32") is None  # the device's float32 matmul: TF32 or a TPU's bf16
    assert find_peak("NVIDIA H200").peak(ceilings.datasheet_precision("float32")) == find_peak("NVIDIA H200").peak(
        "tf32"
    )
    assert find_peak("TPU v5 lite").peak(ceilings.datasheet_precision("float32")) == 197e12
    assert ceilings.datasheet_precision("bfloat16") == "bf16"
    with pytest.raises(ValueError, match="float32, bfloat16"):
        ceilings.ceiling_for("float16")


def test_each_setting_is_held_to_the_peak_of_what_it_runs_as():
    from dpcourse import costs

    h200 = costs.find_peak("NVIDIA H200")
    assert ceilings.datasheet_rate("float32 default", h200, "gpu") == (h200.peak("tf32"), "TF32 peak")
    assert ceilings.datasheet_rate("float32 highest", h200, "gpu") == (h200.peak("fp32"), "FP32 peak")
    chip = costs.DevicePeak("TPU v5e (test)", 0.0, 0.0, 197e12, "ICI", 1e11, "a test figure")
    assert ceilings.datasheet_rate("float32 default", chip, "tpu") == (197e12, "BF16 peak")
    assert ceilings.datasheet_rate("float32 highest", chip, "tpu") == (197e12 / 6, "BF16 peak / 6")
    assert ceilings.datasheet_rate("bfloat16", None, "tpu") == (None, "")
    with pytest.raises(ValueError, match="Unknown matmul setting"):
        ceilings.datasheet_rate("float64", chip, "tpu")


def test_the_words_say_what_each_setting_runs_as_on_each_backend():
    assert "one pass" in ceilings.precision_words("tpu")["float32 default"]
    assert "6 bfloat16 passes" in ceilings.precision_words("tpu")["float32 highest"]
    assert "TF32" in ceilings.precision_words("gpu")["float32 default"]
    cpu = ceilings.precision_words("cpu")
    assert set(cpu) == set(ceilings.MATMUL_SETTINGS)
    assert cpu["bfloat16"].startswith("bfloat16") and "float32 could" in cpu["float32 default"]


def test_a_measurement_stopped_by_a_foreign_global_mesh_stops_with_the_sentence(cpu0):
    from dpcourse.backend.mesh_guard import ForeignMeshError

    foreign = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    with jax.set_mesh(foreign), pytest.raises(ForeignMeshError, match=r"stopped under it \(ValueError\)"):
        ceilings.matmul_rate(8, "float32 default", cpu0, warmup=0, repeats=1, steps=1)
