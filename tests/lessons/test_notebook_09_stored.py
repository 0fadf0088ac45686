"""Notebook 09's section 7 and exercise 09.3 without the GPU-compile extra (the quick start's default).

They once printed one "not available" line, six silent cells under text that
reads their tables, and "Cannot check here" for every answer of 09.3, the
right one too. Here the section's cells and the exercise run as the lesson
writes them, with the extra reported missing: they show the stored compile,
labelled stored, and the checker judges answers against it.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import jupytext

from dpcourse import costs, show
from dpcourse.cross_compile import notebook as gpu_notebook
from dpcourse.cross_compile import targets as gpu_targets
from dpcourse.exercises.base import CORRECT, WRONG

ROOT = Path(__file__).resolve().parents[2]


def _section_7_and_09_3() -> list[str]:
    """Section 7's code cells (but the CPU comparison), then exercise 09.3's table cell."""
    cells = jupytext.read(ROOT / "notebooks" / "09_performance.py").cells
    heads = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## ")]
    start = next(i for i in heads if cells[i].source.startswith("## 7."))
    end = next(i for i in heads if i > start)
    # The section's last cell compares with section 6's CPU compile (not GPU, always shown): left out.
    section = [c.source for c in cells[start:end] if c.cell_type == "code" and "texts[cpu_key]" not in c.source]
    ex = next(i for i, c in enumerate(cells) if "09.3" in c.source and c.cell_type == "markdown")
    exercise = [c.source for c in cells[ex:] if c.cell_type == "code" and "tags" not in c.metadata]
    imports = next(c.source for c in cells if "lesson09 as check" in c.source)
    return [*section, imports, *exercise[:1]]


def test_section_7_without_the_extra_shows_the_stored_compile_and_09_3_checks_against_it(monkeypatch):
    monkeypatch.setattr(gpu_targets, "extra_missing", lambda: "jax-cuda12-plugin is not installed")
    names = {"SCHEDULES": True, "show": show, "costs": costs, "gpu_notebook": gpu_notebook, "display": print}
    with contextlib.redirect_stdout(out := io.StringIO()):
        for source in _section_7_and_09_3():
            exec(compile(source, "<notebook 09 cell>", "exec"), names)
    printed = out.getvalue()
    assert "Stored result (made by make placement, 20" in printed and "smoke profile" in printed, printed
    assert printed.count("8 x H200") >= 6, f"too few tables shown: {printed}"
    check, fractions = names["check"], names["fractions_09_3"]
    right = (costs.bound_for(fractions["plain"]), check.CHANGES[0])
    assert check.overlap_bound(right, fractions).status == CORRECT
    assert check.overlap_bound((right[0], check.CHANGES[1]), fractions).status == WRONG


def test_the_data_parallel_sections_fast_step_shows_the_stored_gpu_and_tpu_compiles(monkeypatch):
    """Without either extra (a Colab or Kaggle TPU host, a laptop): the stored compiles, labelled stored, with the
    model at the smoke profile's sizes they were compiled at, not the run's (the cell's two calls)."""
    from dpcourse import config
    from dpcourse.cross_compile import mocked
    from dpcourse.perf import report

    monkeypatch.setattr(gpu_targets, "extra_missing", lambda platform="gpu": f"no {platform} extra (stand-in)")
    monkeypatch.setattr(mocked, "gpu_unavailable_reason", lambda: "no NVIDIA GPU here (stand-in)")
    with contextlib.redirect_stdout(io.StringIO()):
        results = gpu_notebook.show_gpu_placement(
            "cpu", "tpu", steps={"fast": "dpcourse.cross_compile.steps:fast_jit_step"}
        )
    part = report.fast_step_part(results, config.make_config("cpu"))
    for where in ("8 x H200 without a GPU", "8 x TPU v5e (2x4 slice) without a TPU", "256 x TPU v6e (16x16 slice)"):
        at = next(i for i, ln in enumerate(part.lines) if ln.startswith(f"The fast step, compiled for {where}"))
        assert "stored (make placement, 20" in part.lines[at], part.lines[at]
        # Repeats unrolled: no loop; the bfloat16 gradients and the two float32 metrics, after the backward pass.
        # A temporaries figure of 0 is the compiler's, and the line says so (not a missing value shown as 0).
        assert re.match(
            r"  2 collective\(s\), 0 inside a loop, 53,020 bytes per step; temporaries ([1-9]|0 bytes \(the compiler's)",
            part.lines[at + 1],
        )
    caption = part.tables[-1][1]
    assert "(smoke profile, stored)" in caption and {"XLA, H200", "XLA, TPU v5e 2x4"} <= set(part.tables[-1][0][0])
