"""GPU target descriptions and the GPU-compile extra: which targets, which text for which jaxlib, what is missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dpcourse.cross_compile import compile as deviceless
from dpcourse.cross_compile import targets as gpu_targets

PASS = "while-loop-all-reduce-code-motion"


def test_targets_and_the_approximate_l4():
    assert set(gpu_targets.TARGETS) == {"h100_sxm", "h200", "l4"}
    l4 = gpu_targets.target("L4")
    assert l4.approximate and "approximate" in l4.label and "approximate" in l4.devices_label(2)
    text = gpu_targets.config_text("l4")
    assert "core_count: 58" in text and "memory_bandwidth: 300000000000" in text and "minor: 9" in text
    assert not gpu_targets.target("h200").approximate
    with pytest.raises(ValueError, match="h100_sxm, h200, l4"):
        gpu_targets.target("a100")


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
