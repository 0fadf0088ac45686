"""dpcourse.gpu_compile.notebook: the lessons' GPU cell, with and without the gpu-compile extra."""

from __future__ import annotations

from dpcourse.gpu_compile import mocked
from dpcourse.gpu_compile import notebook as gp


def test_notebook_gpu_cell_says_how_to_get_the_extra_in_one_line(monkeypatch, capsys):
    from dpcourse.gpu_compile import targets as gpu_targets

    monkeypatch.setattr(
        gpu_targets, "extra_missing", lambda: "jax-cuda12-plugin is not installed. Install: make gpu-compile"
    )
    monkeypatch.setattr(mocked, "gpu_unavailable_reason", lambda: "no NVIDIA GPU here (stand-in)")
    assert gp.show_gpu_placement("smoke", "cpu") == []
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "make gpu-compile" in out[0]


def test_notebook_gpu_cell_compiles_without_a_gpu_when_the_extra_is_there(monkeypatch):
    from dpcourse.gpu_compile import targets as gpu_targets

    asked = {}
    monkeypatch.setattr(gpu_targets, "extra_missing", lambda: None)
    monkeypatch.setattr(gp, "show_compilers", lambda profile, steps, **kw: asked.update(kw) or ["r"])
    assert gp.show_gpu_placement("smoke", "cpu", disable_passes=(gp.PASS_NAME,)) == ["r"]
    assert asked["cpu_devices"] is None and asked["counts"] == (8,) and asked["disable_passes"] == (gp.PASS_NAME,)
    gp.show_gpu_placement("smoke", "gpu")
    assert asked["cpu_devices"] == 8  # on a GPU machine the CPU's answer is compiled too
