"""A stored GPU compile shown in a lesson is read with the sizes of the profile it was compiled at, not the run's.

Lesson 10 run with the ``cpu`` profile without the GPU-compile extra shows
the ``smoke`` compile ``make placement`` stored; its figures once mixed the
stored bytes with the ``cpu`` model's ("0% of the gradient ... the other
100% once after the loop") and section 7 skipped the comparison with no
reason given. Here sections 6 and 7's cells run as the lesson writes them,
on the stored results, with a ``cpu`` run's names around them.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path

import jupytext
import pytest

from dpcourse import config, costs, model
from dpcourse.compiled import census
from dpcourse.cross_compile import notebook as gpu_notebook
from dpcourse.cross_compile import steps as sharded_steps
from dpcourse.sharded import forms as sharded

ROOT = Path(__file__).resolve().parents[2]


def _cells(stem: str, *marks: str) -> list[str]:
    cells = [c.source for c in jupytext.read(ROOT / "notebooks" / f"{stem}.py").cells if c.cell_type == "code"]
    found = []
    for mark in marks:
        match = [src for src in cells if mark in src]
        assert len(match) == 1, f"{stem}: no single cell holds {mark!r}: update this test"
        found.append(match[0])
    return found


def _lesson_10_names(profile: str, n: int) -> dict:
    from jax.sharding import PartitionSpec as P

    cfg = config.make_config(profile)
    params = model.init_params(cfg)
    lesson = ROOT / "notebooks" / "10_sharded.py"
    accum_k = int(re.search(r"^ACCUM_K = (\d+)", lesson.read_text(), re.M).group(1))
    min_shard = int(re.search(r"^MIN_SHARD_ELEMENTS = (\d+)", lesson.read_text(), re.M).group(1))
    jobs = [gpu_notebook.deviceless.Job("gpu", t, n, profile) for t in ("h200", "l4")]
    stored = gpu_notebook.find_stored(jobs, sharded_steps.SHARDED_STEPS)
    assert stored and any(r.profile != profile for r in stored), [r.profile for r in stored]
    names = dict(cfg=cfg, params=params, n=n, ACCUM_K=accum_k, MIN_SHARD_ELEMENTS=min_shard, P=P, math=math)
    names.update(config=config, costs=costs, model=model, census=census, sharded=sharded, display=print)
    names.update(sharded_steps=sharded_steps, gpu_results=stored)
    names["plan"] = sharded.shard_specs(params, n, min_elements=min_shard)
    return names


@pytest.mark.parametrize("profile", ["cpu", "full"])
def test_lesson_10_reads_a_stored_smoke_compile_with_the_smoke_sizes(profile):
    from dpcourse import show

    names = _lesson_10_names(profile, 8)
    names["show"] = show
    names["links"] = None
    figures, predicted, compared = _cells("10_sharded", "def sizes_of(", "pred_rows = []", "res_pred = pred")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for source in (figures, predicted, compared):
            exec(compile(source, "<lesson 10 cell>", "exec"), names)
    printed = out.getvalue()
    for res in names["gpu_results"]:
        leaves = model.init_params(config.make_config(res.profile))
        share = (leaves["w_block"].nbytes + leaves["b_block"].nbytes) / sum(a.nbytes for a in leaves.values())
        said = "this run's sizes" if res.profile == profile else f"the {res.profile} profile's sizes, as compiled"
        assert f"{res.label} ({said}" in printed and f"{share:.0%} of the gradient" in printed, printed
        if res.profile != profile:
            assert f"{res.label}: compiled for the {res.profile} profile on 8 GPUs" in printed, printed
    assert "not compared" not in printed, printed
    # Like with like, the smoke compile's bytes agree with the smoke prediction where the program is placed
    # as predicted: replicated DP's all-reduce is within 10%.
    assert re.search(r"replicated DP:\n.*\n    sent [\d,]+ B, predicted [\d,]+: [\d.]+x, within 10%", printed), printed
