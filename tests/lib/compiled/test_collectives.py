"""Tests of dpcourse.compiled.collectives: where the compiled program puts its all-reduces (CPU compiler).

Two parts: the HLO reader on small hand-written programs (exact counts,
bytes, loop placement), and the facts notebooks 04 and 05 teach, measured
on real compiled steps with 8 simulated CPU devices at smoke size with
JAX 0.10.2:

- ``jax.jit`` of the plain step on sharded arrays: the shared block's
  gradient is all-reduced INSIDE the backward scan (block_repeats times per
  step), the other gradients once, outside;
- ``make_shard_map_step``, ``make_device_axis_step`` and ``make_pmap_step``:
  one all-reduce of the whole gradient (and the two metrics) per step,
  outside every loop.

These are the CPU compiler's placements (the same with JAX 0.12.0.1); GPU
compilers may place the plain step's reduction elsewhere (see
``dpcourse.cross_compile.mocked`` and notebook 04). If a JAX or XLA upgrade changes
these, the tests say so: the notebooks' explanations must then be
revisited, not just the numbers.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import model, train
from dpcourse.compiled import collectives
from dpcourse.compiled.collectives import parse_hlo, shape_bytes, split_computations
from dpcourse.config import make_config
from dpcourse.costs import gradient_bytes

UPGRADE_HINT = (
    "The compiled program changed (JAX/XLA upgrade?): update notebooks 04/05, "
    "which explain where the all-reduce goes, and these expectations."
)

# --------------------------------------------------------------------------
# Hand-written HLO

ADD = """
%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %x, f32[] %y)
}
"""

LOOP_PROGRAM = (
    ADD
    + """
%body (param: (s32[], f32[16,16])) -> (s32[], f32[16,16]) {
  %param = (s32[], f32[16,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%param), index=0
  %g = f32[16,16]{1,0} get-tuple-element(%param), index=1
  %all-reduce.1 = f32[16,16]{1,0} all-reduce(%g), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[16,16]{1,0}) tuple(%next, %all-reduce.1)
}

%cond (param.1: (s32[], f32[16,16])) -> pred[] {
  %param.1 = (s32[], f32[16,16]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%param.1), index=0
  %n = s32[] constant(12)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main (a: f32[16,16], b: f32[100]) -> (f32[16,16], f32[100], f32[400]) {
  %a = f32[16,16]{1,0} parameter(0)
  %b = f32[100]{0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[16,16]{1,0}) tuple(%zero, %a)
  %while.1 = (s32[], f32[16,16]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"12"}}
  %out = f32[16,16]{1,0} get-tuple-element(%while.1), index=1
  %all-reduce-start.2 = f32[100]{0} all-reduce-start(%b), channel_id=2, replica_groups={{0,1,2,3}}, to_apply=%add
  %all-reduce-done.2 = f32[100]{0} all-reduce-done(%all-reduce-start.2)
  %all-gather.3 = f32[400]{0} all-gather(%all-reduce-done.2), channel_id=3, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %r = (f32[16,16]{1,0}, f32[100]{0}, f32[400]{0}) tuple(%out, %all-reduce-done.2, %all-gather.3)
}
"""
)


def by_name(report):
    return {c.name: c for c in report.collectives}


def test_parse_hlo_counts_kinds_bytes_and_loop_placement():
    report = parse_hlo(LOOP_PROGRAM)
    found = by_name(report)
    assert set(found) == {"all-reduce.1", "all-reduce-start.2", "all-gather.3"}
    assert report.count == 3  # the async pair start/done is one transfer

    in_loop = found["all-reduce.1"]
    assert (in_loop.kind, in_loop.computation, in_loop.bytes) == ("all-reduce", "body", 16 * 16 * 4)
    assert in_loop.in_loop and in_loop.runs_per_step == 12
    assert in_loop.bytes_per_step == 12 * 1024

    start = found["all-reduce-start.2"]
    assert (start.kind, start.bytes, start.in_loop, start.runs_per_step) == ("all-reduce", 400, False, 1)
    gather = found["all-gather.3"]
    assert (gather.kind, gather.bytes, gather.in_loop, gather.runs_per_step) == ("all-gather", 1600, False, 1)

    assert len(report.of_kind("all-reduce")) == 2
    assert report.in_loop_count == 1
    assert report.runs_per_step == 12 + 1 + 1
    assert report.bytes_per_step == 12 * 1024 + 400 + 1600


def test_rows_for_the_notebook_table():
    rows = {r["instruction"]: r for r in parse_hlo(LOOP_PROGRAM).rows()}
    assert rows["all-reduce.1"] == {
        "kind": "all-reduce",
        "instruction": "all-reduce.1",
        "bytes": 1024,
        "inside loop": "yes",
        "runs per step": 12,
        "bytes per step": 12288,
    }
    assert rows["all-gather.3"]["inside loop"] == "no"


NESTED_PROGRAM = (
    ADD
    + """
%inner_body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %v = f32[8]{0} get-tuple-element(%p), index=1
  %i = s32[] get-tuple-element(%p), index=0
  %ar = f32[8]{0} all-reduce(%v), to_apply=%add
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %ar)
}

%inner_cond (p.1: (s32[], f32[8])) -> pred[] {
  %p.1 = (s32[], f32[8]{0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

%outer_body (q: (s32[], f32[8])) -> (s32[], f32[8]) {
  %q = (s32[], f32[8]{0}) parameter(0)
  ROOT %w = (s32[], f32[8]{0}) while(%q), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"4"}}
}

%outer_cond (q.1: (s32[], f32[8])) -> pred[] {
  %q.1 = (s32[], f32[8]{0}) parameter(0)
  ROOT %c.1 = pred[] constant(true)
}

%unknown_body (u: (s32[], f32[2])) -> (s32[], f32[2]) {
  %u = (s32[], f32[2]{0}) parameter(0)
  %uv = f32[2]{0} get-tuple-element(%u), index=1
  %ui = s32[] get-tuple-element(%u), index=0
  %cp = f32[2]{0} collective-permute(%uv), source_target_pairs={{0,1},{1,0}}
  ROOT %ut = (s32[], f32[2]{0}) tuple(%ui, %cp)
}

ENTRY %main (a: (s32[], f32[8]), b: (s32[], f32[2])) -> (s32[], f32[8]) {
  %a = (s32[], f32[8]{0}) parameter(0)
  %b = (s32[], f32[2]{0}) parameter(1)
  %loop = (s32[], f32[2]{0}) while(%b), condition=%outer_cond, body=%unknown_body
  ROOT %outer = (s32[], f32[8]{0}) while(%a), condition=%outer_cond, body=%outer_body, backend_config={"known_trip_count":{"n":"3"}}
}
"""
)


def test_nested_loops_multiply_and_unknown_trip_counts_say_so():
    report = parse_hlo(NESTED_PROGRAM)
    found = by_name(report)
    assert found["ar"].in_loop and found["ar"].runs_per_step == 3 * 4
    assert found["ar"].bytes_per_step == 12 * 32
    permute = found["cp"]
    assert permute.kind == "collective-permute" and permute.in_loop
    assert permute.runs_per_step is None and permute.bytes_per_step is None
    assert report.runs_per_step is None and report.bytes_per_step is None  # never a made-up total
    assert {r["instruction"]: r["runs per step"] for r in report.rows()}["cp"] == "unknown"


def test_program_without_collectives_reports_none():
    text = "ENTRY %main (a: f32[4]) -> f32[4] {\n  ROOT %a = f32[4]{0} parameter(0)\n}\n"
    report = parse_hlo(text)
    assert report.count == 0 and report.runs_per_step == 0 and report.bytes_per_step == 0


def test_text_that_is_not_hlo_is_an_error():
    with pytest.raises(ValueError, match="No HLO computation"):
        parse_hlo("def step(params): ...")


@pytest.mark.parametrize(
    "type_text, expected",
    [
        ("f32[32,32]{1,0}", 4096),
        ("(f32[32,32]{1,0}, f32[32]{0})", 4224),
        ("bf16[10]{0}", 20),
        ("pred[3]", 3),
        ("f32[]", 4),
        ("(s32[], f64[2])", 4 + 16),
    ],
)
def test_shape_bytes(type_text, expected):
    assert shape_bytes(type_text) == expected


# --------------------------------------------------------------------------
# Real compiled steps: 8 simulated CPU devices, smoke size

CFG = make_config("smoke")
N = 8
GLOBAL_BATCH = CFG.per_device_batch * N
BLOCK_GRAD_BYTES = (CFG.width * CFG.width + CFG.width) * 4  # w_block + b_block, float32
METRICS_BYTES_MAX = 16  # loss and accuracy: two float32 scalars (8 bytes), some slack


@functools.cache
def compiled_report(form: str):
    optimizer = train.make_optimizer(CFG)
    params = model.init_params(CFG)
    opt_state = optimizer.init(params)
    x = np.zeros((GLOBAL_BATCH, 784), np.float32)
    y = np.zeros((GLOBAL_BATCH,), np.int32)
    devs = jax.devices("cpu")[:N]
    if form == "pmap":
        step = train.make_pmap_step(CFG, optimizer, devices=devs)
        return collectives.collective_report(
            step,
            train.replicate(params, devs),
            train.replicate(opt_state, devs),
            train.split_for_pmap(x, N),
            train.split_for_pmap(y, N),
        )
    if form == "single":
        step = jax.jit(train.make_train_step(CFG, optimizer))
        return collectives.collective_report(step, *jax.device_put((params, opt_state, x, y), devs[0]))
    mesh = Mesh(np.array(devs), ("data",))
    step = jax.jit(
        {
            "jit": lambda: train.make_train_step(CFG, optimizer),
            "shard_map": lambda: train.make_shard_map_step(CFG, optimizer, mesh),
            "device_axis": lambda: train.make_device_axis_step(CFG, optimizer, N),
        }[form]()
    )
    params, opt_state = jax.device_put((params, opt_state), NamedSharding(mesh, P()))
    return collectives.collective_report(
        step,
        params,
        opt_state,
        jax.device_put(x, NamedSharding(mesh, P("data", None))),
        jax.device_put(y, NamedSharding(mesh, P("data"))),
    )


def describe(report) -> str:
    return "; ".join(f"{c.kind} {c.bytes} B in_loop={c.in_loop} runs={c.runs_per_step}" for c in report.collectives)


def test_single_device_step_has_no_collective():
    report = compiled_report("single")
    assert report.count == 0, describe(report)


def test_jit_on_sharded_arrays_all_reduces_inside_the_backward_loop():
    report = compiled_report("jit")
    assert [c.kind for c in report.collectives] == ["all-reduce", "all-reduce"], (
        f"{UPGRADE_HINT} Got: {describe(report)}"
    )
    inside = [c for c in report.collectives if c.in_loop]
    outside = [c for c in report.collectives if not c.in_loop]
    assert len(inside) == 1 and len(outside) == 1, f"{UPGRADE_HINT} Got: {describe(report)}"
    # The shared block's gradient, all-reduced once per block repeat.
    assert inside[0].runs_per_step == CFG.block_repeats, f"{UPGRADE_HINT} Got: {describe(report)}"
    assert inside[0].bytes == BLOCK_GRAD_BYTES, f"{UPGRADE_HINT} Got: {describe(report)}"
    # Everything else (input and output layers, metrics) once, after the loop.
    rest = gradient_bytes(CFG) - BLOCK_GRAD_BYTES
    assert rest < outside[0].bytes <= rest + METRICS_BYTES_MAX, f"{UPGRADE_HINT} Got: {describe(report)}"
    assert outside[0].runs_per_step == 1
    # So the step moves more than one gradient's worth: the cost notebook 04 shows.
    assert report.bytes_per_step > gradient_bytes(CFG)


@pytest.mark.parametrize("form", ["shard_map", "device_axis", "pmap"])
def test_explicit_forms_reduce_once_per_step_outside_any_loop(form):
    report = compiled_report(form)
    assert report.count == 1, f"{form}: {UPGRADE_HINT} Got: {describe(report)}"
    (only,) = report.collectives
    assert only.kind == "all-reduce" and not only.in_loop and only.runs_per_step == 1, (
        f"{form}: {UPGRADE_HINT} Got: {describe(report)}"
    )
    # The whole gradient plus the two metrics, once.
    assert gradient_bytes(CFG) < only.bytes <= gradient_bytes(CFG) + METRICS_BYTES_MAX, (
        f"{form}: {UPGRADE_HINT} Got: {describe(report)}"
    )
    assert report.bytes_per_step == only.bytes


def test_split_computations_names_the_entry_and_keeps_each_body():
    text = "HloModule m\n\nadd {\n  a = f32[] parameter(0)\n}\n\nENTRY main (p: f32[]) -> f32[] {\n  p = f32[] parameter(0)\n  ROOT r = f32[] add(p, p)\n}\n"
    text = text.replace("add {", "add (x: f32[]) -> f32[] {")
    comps, entry = split_computations(text)
    assert entry == "main"
    assert list(comps) == ["add", "main"]
    assert comps["main"][-1].strip().startswith("ROOT r")


def test_split_computations_refuses_text_without_hlo():
    with pytest.raises(ValueError, match="compiled.as_text"):
        split_computations("not a program")
