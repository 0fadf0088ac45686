"""dpcourse.compiled.loops: a loop's trip count, stated by XLA or read from its counter (TPU programs)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from dpcourse.compiled import collectives, hlo, loops
from dpcourse.compiled.collectives import split_computations

DATA = Path(__file__).resolve().parents[2] / "data"
TPU_VERSIONS = ("0.10.2", "0.12.0.1")


def tpu_program(step: str, version: str) -> str:
    """A program the TPU compiler wrote for a v5e 2x4 slice (tools/capture_placement_hlo.py --tpu)."""
    return gzip.decompress((DATA / f"hlo_tpu_{step}_smoke_v5e_2x4_jax{version}.txt.gz").read_bytes()).decode()


def program(cond_root: str, body_update: str, init: str = "constant(0)") -> str:
    """A loop in the TPU compiler's form: a counter in element 0 of the loop's tuple."""
    return f"""HloModule m

%cond (p: (s32[], f32[4])) -> pred[] {{
  %p = (s32[], f32[4]) parameter(0)
  %limit = s32[] constant(5)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] {cond_root}
}}

%body (q: (s32[], f32[4])) -> (s32[], f32[4]) {{
  %q = (s32[], f32[4]) parameter(0)
  %one = s32[] constant(2)
  %j = s32[] get-tuple-element(%q), index=0
  %next = s32[] {body_update}
  %x = f32[4] get-tuple-element(%q), index=1
  ROOT %t = (s32[], f32[4]) tuple(%next, %x)
}}

ENTRY %main (a: f32[4]) -> (s32[], f32[4]) {{
  %a = f32[4] parameter(0)
  %start = s32[] {init}
  %copy.1 = s32[] copy(%start)
  %init = (s32[], f32[4]) tuple(%copy.1, %a)
  ROOT %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
}}
"""


def trips(text: str) -> int | None:
    comps, entry = split_computations(text)
    line = next(ln for ln in comps[entry] if " while(" in ln)
    return loops.trip_count(line, comps[entry], comps)


def test_a_stated_trip_count_is_taken_as_xla_wrote_it():
    line = '  %w = (s32[]) while(%init), condition=%c, body=%b, backend_config={"known_trip_count":{"n":"7"}}'
    assert loops.trip_count(line, [], {}) == 7


@pytest.mark.parametrize(
    "cond, update, init, expected",
    [
        ("compare(%i, %limit), direction=LT", "add(%j, %one)", "constant(0)", 3),  # 0, 2, 4
        ("compare(%i, %limit), direction=LE", "add(%j, %one)", "constant(1)", 3),  # 1, 3, 5
        ("compare(%i, %limit), direction=LT", "add(%one, %j)", "constant(5)", 0),  # never runs
        ("compare(%i, %limit), direction=LT", "add(%j, %one)", "constant(-1)", 3),  # -1, 1, 3
    ],
)
def test_a_counter_fixes_the_trip_count(cond, update, init, expected):
    assert trips(program(f"{cond}", update, init)) == expected


@pytest.mark.parametrize(
    "cond, update, init",
    [
        ("compare(%i, %limit), direction=GT", "add(%j, %one)", "constant(0)"),  # not a count up
        ("compare(%i, %limit), direction=LT", "multiply(%j, %one)", "constant(1)"),  # not a step
        ("compare(%i, %limit), direction=LT", "add(%j, %one)", "parameter(1)"),  # start unknown
        ("compare(%i, %i), direction=LT", "add(%j, %one)", "constant(0)"),  # limit unknown
        ("compare(%i, %limit), direction=NE", "add(%j, %one)", "constant(0)"),  # 0, 2, 4, 6: never 5
    ],
)
def test_a_loop_whose_text_does_not_fix_its_count_is_unknown(cond, update, init):
    assert trips(program(cond, update, init)) is None


@pytest.mark.parametrize("version", TPU_VERSIONS)
def test_the_tpu_compilers_loops_state_no_count_and_their_counters_give_it(version):
    # The shared block's two repeats (smoke profile): the forward loop and the backward one.
    text = tpu_program("jit", version)
    assert "known_trip_count" not in text
    summary = hlo.summarize(text)
    assert (summary.while_loops, summary.trip_counts, summary.unknown_trip) == (2, (2, 2), False)
    # Gradient accumulation: the 4 microbatches, each holding both loops of the block.
    summary = hlo.summarize(tpu_program("accum_scan", version))
    assert (summary.trip_counts, summary.unknown_trip) == ((4, 2, 2), False)


@pytest.mark.parametrize("version", TPU_VERSIONS)
def test_the_tpu_compilers_matmuls_are_convolutions_without_spatial_dimensions(version):
    text = tpu_program("jit", version)
    assert " dot(" not in text and "dim_labels=bf_io->bf" in text
    # 4 forward (input, the block twice, output) and 7 backward (the input's weights only,
    # 2 per block repeat, 2 for the output) per step; accumulation runs them per microbatch.
    assert hlo.summarize(text).matmuls == 11
    assert hlo.summarize(tpu_program("accum_scan", version)).matmuls == 4 * 11


def test_a_real_convolution_is_not_a_matmul():
    conv = "  %c = f32[1,8,8,4] convolution(%a, %b), window={size=3x3}, dim_labels=b01f_01io->b01f"
    assert not hlo.is_matmul("convolution", conv)
    assert hlo.is_matmul("convolution", "  %c = f32[8,32] convolution(%a, %b), dim_labels=bf_io->bf")


@pytest.mark.parametrize("version", TPU_VERSIONS)
def test_the_tpu_programs_collectives_run_as_often_as_their_loops(version):
    report = collectives.parse_hlo(tpu_program("accum_scan", version))
    rows = [(c.kind, c.bytes, c.in_loop, c.runs_per_step) for c in report.collectives]
    # The shared block's gradient reduced in each of the 4 microbatches' loop, the rest once after it.
    assert rows == [("all-reduce", 4224, True, 4), ("all-reduce", 101808, False, 1)]
    assert (report.runs_per_step, report.bytes_per_step) == (5, 4 * 4224 + 101808)
    jit = collectives.parse_hlo(tpu_program("jit", version))
    assert [(c.kind, c.bytes, c.in_loop, c.runs_per_step) for c in jit.collectives] == [
        ("all-reduce", 106032, False, 1)
    ]


def test_a_tpu_programs_summary_row_has_no_unknown_trip_count_and_counts_its_matmuls():
    row = hlo.summarize(tpu_program("jit", "0.12.0.1")).row()
    assert row["trip counts"] == "2, 2" and row["matmuls (dot / GEMM / TPU convolution) per step"] == 11
