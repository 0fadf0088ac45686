"""GPU and TPU targets and their extras: which targets, which text for which jaxlib, what is missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dpcourse.cross_compile import compile as deviceless
from dpcourse.cross_compile import targets as gpu_targets

PASS = "while-loop-all-reduce-code-motion"


def test_targets_and_the_approximate_l4():
    assert set(gpu_targets.GPU_TARGETS) == {"h100_sxm", "h200", "l4"}
    l4 = gpu_targets.target("L4")
    assert l4.approximate and "approximate" in l4.label and "approximate" in l4.devices_label(2)
    text = gpu_targets.config_text("l4")
    assert "core_count: 58" in text and "memory_bandwidth: 300000000000" in text and "minor: 9" in text
    assert not gpu_targets.target("h200").approximate
    with pytest.raises(ValueError, match="h100_sxm, h200, l4, v5e_2x4"):
        gpu_targets.target("a100")
    with pytest.raises(ValueError, match="Unknown GPU target 'v5e_2x4': use one of h100_sxm, h200, l4.$"):
        gpu_targets.config_text("v5e_2x4")


def test_tpu_targets_are_slices_with_their_chip_counts_under_one_interface():
    assert set(gpu_targets.TARGETS) == set(gpu_targets.GPU_TARGETS) | set(gpu_targets.TPU_TARGETS)
    v5e = gpu_targets.target("v5e:2x4")
    assert v5e is gpu_targets.target("V5E_2X4") and (v5e.platform, v5e.topology, v5e.chips) == ("tpu", "v5e:2x4", 8)
    assert v5e.label == "TPU v5e 2x4" and v5e.devices_label(8) == "8 x TPU v5e (2x4 slice)"
    assert [t.chips for t in gpu_targets.TPU_TARGETS.values()] == [8, 16, 8, 64, 256]
    assert all(t.platform == "gpu" and t.chips == 0 for t in gpu_targets.GPU_TARGETS.values())


def test_the_libtpu_wanted_is_the_one_jaxs_tpu_extra_names():
    lines = ['requests; extra == "tpu"', 'libtpu==0.0.42.*; extra == "tpu"', "numpy>=1.26"]
    assert gpu_targets.libtpu_wanted(lines) == "0.0.42"
    assert gpu_targets.libtpu_wanted(["libtpu==0.0.50.*; extra == 'tpu'"]) == "0.0.50"
    assert gpu_targets.libtpu_wanted(["numpy"]) is None
    # The pinned JAX and the newest: requirements-tpu-compile*.txt name what their tpu extra takes.
    root = Path(__file__).resolve().parents[3]
    for name in ("requirements-tpu-compile.txt", "requirements-tpu-compile-newest.txt"):
        pins = [ln for ln in (root / name).read_text().splitlines() if ln.startswith("libtpu==")]
        assert len(pins) == 1, name
    # This environment's JAX: its tpu extra's libtpu is the one its requirements file pins.
    for jax_pins, extra in (
        ("requirements.txt", "requirements-tpu-compile.txt"),
        ("requirements-newest.txt", "requirements-tpu-compile-newest.txt"),
    ):
        if f"jax=={gpu_targets._installed('jax')}\n" in (root / jax_pins).read_text():
            assert f"libtpu=={gpu_targets.libtpu_wanted()}\n" in (root / extra).read_text(), extra


def test_a_missing_or_wrong_libtpu_is_named_with_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("DPCOURSE_TPU_COMPILE_PATH", str(tmp_path))
    monkeypatch.setattr(gpu_targets, "libtpu_wanted", lambda: "0.0.42")
    monkeypatch.setattr(gpu_targets, "_installed", lambda d, p="gpu": None if d == "libtpu" else "0.10.2")
    reason = gpu_targets.extra_missing("tpu")
    assert reason.startswith("libtpu is not installed. Install the TPU-compile extra: make tpu-compile")
    assert reason.endswith("pip install --no-deps --target <environment>/tpu-compile libtpu==0.0.42")
    monkeypatch.setattr(gpu_targets, "_installed", lambda d, p="gpu": "0.0.40" if d == "libtpu" else "0.10.2")
    assert gpu_targets.extra_missing("tpu").startswith("libtpu is 0.0.40, not the 0.0.42 that JAX 0.10.2 takes")
    monkeypatch.setattr(gpu_targets, "_installed", lambda d, p="gpu": "0.0.42" if d == "libtpu" else "0.10.2")
    assert "without its libtpu.so" in gpu_targets.extra_missing("tpu")
    (tmp_path / "libtpu").mkdir()
    (tmp_path / "libtpu" / "libtpu.so").write_bytes(b"")
    assert gpu_targets.extra_missing("tpu") is None
    with pytest.raises(ValueError, match="use 'gpu' or 'tpu'"):
        gpu_targets.extra_missing("xpu")


def test_jaxlib_010_gets_the_text_without_the_newer_field():
    assert "collective_memory_granularity" in gpu_targets.config_text("h200", "0.12.0.1")
    old = gpu_targets.config_text("h200", "0.10.2")
    assert "collective_memory_granularity" not in old and "core_count: 132" in old


def test_vendored_files_keep_their_attribution():
    folder = Path(gpu_targets.__file__).parent / "configs"
    notice = (folder / "NOTICE.md").read_text()
    assert "Apache License, Version" in notice and "openxla/xla" in notice
    for name in ("h200.txtpb", "h100_sxm.txtpb"):
        assert (folder / name).read_text().startswith("# From openxla/xla")


def test_missing_libdevice_is_named_before_anything_compiles(monkeypatch):
    monkeypatch.setattr(gpu_targets, "libdevice_path", lambda: None)
    reason = gpu_targets.extra_missing()
    assert reason and "nvidia-cuda-nvcc-cu12" in reason and "libdevice" in reason and "make gpu-compile" in reason
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("no worker may start"))
    (res,) = deviceless.compile_jobs([deviceless.Job("gpu", "h200", 2, "smoke")])
    assert res.steps == {} and "libdevice" in res.error and res.label == "compiled for 2 x H200 without a GPU"


def test_a_plugin_of_another_version_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_targets, "_installed", lambda d: "0.10.2" if d == "jaxlib" else "0.10.1")
    assert "jax-cuda12-plugin is 0.10.1, not jaxlib's 0.10.2" in gpu_targets.extra_missing()


def test_worker_env_is_cpu_only_with_the_extra_on_its_path_and_passes_off(monkeypatch, tmp_path):
    monkeypatch.setenv(gpu_targets.EXTRA_PATH_ENV, str(tmp_path))
    jobs = [deviceless.Job("cpu", "cpu", 8, "smoke")]
    env = deviceless.worker_env(jobs, (PASS,), base={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert env["JAX_PLATFORMS"] == "cpu" and env["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] == "1"
    assert env["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=8 --xla_disable_hlo_passes={PASS}"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)
