"""Tests of dpcourse.perf.single_device: single-device measurements go to the GPU when there is one."""

from dataclasses import dataclass

import jax

from dpcourse.perf import single_device


@dataclass
class FakeDevice:
    platform: str
    device_kind: str


def test_cpu_machine_measures_on_the_cpu_with_the_cpu_profile():
    m = single_device.measurement_device()
    assert m.device == jax.devices()[0] and m.device.platform == "cpu"
    assert m.cfg.profile == "cpu"
    assert m.label.startswith("1 x ") and "cpu workload" in m.label


def test_one_gpu_machine_measures_on_the_gpu_with_the_full_workload(monkeypatch):
    gpu = FakeDevice("gpu", "NVIDIA H200")
    monkeypatch.setattr(jax, "devices", lambda *a: [gpu])
    m = single_device.measurement_device()
    assert m.device is gpu
    assert m.cfg.profile == "full"
    assert m.label == "1 x NVIDIA H200 (gpu), full workload"
    # an explicit profile still wins
    assert single_device.measurement_device("smoke").cfg.profile == "smoke"


def test_banner_says_which_part_ran_where():
    gpu = single_device.MeasurementDevice(
        FakeDevice("gpu", "NVIDIA H200"), None, "1 x NVIDIA H200 (gpu), full workload"
    )
    text = single_device.where_banner(gpu, "8 simulated CPU devices (share the same cores)", "cpu", True)
    assert "Single-device measurements ran on 1 x NVIDIA H200" in text
    assert "8 simulated CPU devices" in text and "cpu workload" in text
    assert "CPU compiler" in text
    cpu = single_device.MeasurementDevice(FakeDevice("cpu", "cpu"), None, "1 x cpu (cpu), cpu workload")
    assert "CPU compiler" not in single_device.where_banner(cpu, "8 simulated", "cpu", True)
