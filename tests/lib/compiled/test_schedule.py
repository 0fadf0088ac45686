"""Tests of dpcourse.compiled.schedule: the work the GPU compiler schedules inside each collective's window.

Two parts: the reader on small hand-written programs (windows, bytes sent,
``is_sync``, FLOPs, scalar bookkeeping), and the scheduled programs of the
smoke profile on 8 GPUs, compiled without a GPU by JAX 0.10.2 and 0.12.0.1
and stored trimmed in ``tests/data/sched_*`` (``tools/capture_schedule_hlo.py``):
H200 for every form notebook 09 reads, H100 SXM and the approximate L4 for
the plain and small-threshold steps. If an upgrade changes what they say,
notebook 09's section on overlap must be read again, not only these numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpcourse.compiled import schedule
from dpcourse.config import make_config
from dpcourse.costs import gradient_bytes

DATA = Path(__file__).resolve().parents[2] / "data"
VERSIONS = ("0.10.2", "0.12.0.1")
N = 8
METRIC_BYTES = 8  # loss and accuracy, reduced with the gradient
# The smoke gradient and metrics in one all-reduce: each device sends 2 (N - 1) / N of them in a ring.
PLAIN_SENT = 2 * (N - 1) / N * (gradient_bytes(make_config("smoke")) + METRIC_BYTES)


def stored(target: str, step: str, version: str) -> schedule.Schedule:
    return schedule.read_schedule((DATA / f"sched_{target}_{step}_smoke_8_jax{version}.txt").read_text(), N)


PROGRAM = """HloModule m, is_scheduled=true

%fused_dot (p0: f32[8,32], p1: f32[32,10]) -> f32[8,10] {
  %p0 = f32[8,32]{1,0} parameter(0)
  %p1 = f32[32,10]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,10]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%wrapped_rs (a: f32[64]) -> f32[8] {
  %a = f32[64]{0} parameter(0)
  ROOT %rs = f32[8]{0} reduce-scatter(%a), replica_groups=[1,8]<=[8], dimensions={0}, to_apply=%add
}

ENTRY %main (x: f32[8,32], w: f32[32,10], g: f32[64], s: s32[]) -> f32[8,10] {
  %x = f32[8,32]{1,0} parameter(0)
  %w = f32[32,10]{1,0} parameter(1)
  %g = f32[64]{0} parameter(2)
  %s = s32[] parameter(3)
  %ar-start = f32[64]{0} all-reduce-start(%g), replica_groups={{0,1,2,3}}, to_apply=%add, backend_config={"collective_backend_config":{"is_sync":false}}
  %step = s32[] fusion(%s), kind=kLoop, calls=%fused_select
  %gemm = f32[8,10]{1,0} fusion(%x, %w), kind=kCustom, calls=%fused_dot
  %ar-done = f32[64]{0} all-reduce-done(%ar-start)
  %rs-start = ((f32[64]{0}), f32[8]{0}) async-start(%ar-done), calls=%wrapped_rs
  %rs-done = f32[8]{0} async-done(%rs-start)
  %ag-start = (f32[8]{0}, f32[64]{0}) all-gather-start(%rs-done), replica_groups=mesh['axis_0'=8,'axis_1'=1] {'axis_0'}, dimensions={0}, backend_config={"collective_backend_config":{"is_sync":true}}
  %only-step = s32[] fusion(%s), kind=kLoop, calls=%fused_select
  %ag-done = f32[64]{0} all-gather-done(%ag-start)
  ROOT %out = f32[8,10]{1,0} copy(%gemm)
}
"""


def test_a_window_holds_the_work_scheduled_between_start_and_done():
    sched = schedule.read_schedule(PROGRAM, 8)
    ar, rs, ag = sched.windows
    assert (ar.kind, ar.group_size, ar.is_sync) == ("all-reduce", 4, False)
    assert [w.name for w in ar.work] == ["step", "gemm"]
    assert [w.name for w in ar.compute] == ["gemm"]  # the scalar step counter is bookkeeping
    assert ar.window_flops == 2 * 8 * 10 * 32  # 2 per multiply-accumulate
    assert ar.window_bytes == 4 * (8 * 10 + 8 * 32 + 32 * 10)  # result and operands at the boundary
    assert (rs.kind, rs.group_size, rs.payload_bytes, rs.work) == ("reduce-scatter", 8, 32, ())
    assert (ag.kind, ag.group_size, ag.is_sync, ag.has_compute) == ("all-gather", 8, True, False)


def test_a_window_of_element_wise_work_alone_is_not_a_window_of_compute():
    """A zero-FLOP broadcast or an optimizer update hides next to nothing: the cost model counts matmul FLOPs."""
    text = """HloModule m, is_scheduled=true

ENTRY %main (g: f32[64], p: f32[64]) -> f32[64] {
  %g = f32[64]{0} parameter(0)
  %p = f32[64]{0} parameter(1)
  %ar-start = f32[64]{0} all-reduce-start(%g), replica_groups={{0,1}}, to_apply=%add
  %zeros = f32[2,8,32]{2,1,0} fusion(), kind=kLoop, calls=%fused_broadcast
  %update = f32[64]{0} fusion(%p, %p), kind=kLoop, calls=%fused_add
  %ar-done = f32[64]{0} all-reduce-done(%ar-start)
  ROOT %out = f32[64]{0} add(%ar-done, %update)
}
"""
    sched = schedule.read_schedule(text, 2)
    (window,) = sched.windows
    assert [w.name for w in window.compute] == ["zeros", "update"]  # listed, with their bytes
    assert window.window_bytes == 4 * 2 * 8 * 32 + 3 * 4 * 64 and window.window_flops == 0
    assert not window.has_compute and sched.overlapped_fraction == 0
    assert sched.summary()["windows_with_compute"] == 0 and sched.summary()["in_window"] == []


def test_bytes_sent_per_device_follow_the_ring_formulas():
    sched = schedule.read_schedule(PROGRAM, 8)
    ar, rs, ag = sched.windows
    assert ar.sent_bytes == pytest.approx(2 * 3 / 4 * 256)
    assert rs.sent_bytes == pytest.approx(7 * 32)  # (N - 1) / N of the full 256 bytes
    assert ag.sent_bytes == pytest.approx(7 / 8 * 256)
    assert sched.overlapped_fraction == pytest.approx(ar.sent_bytes / (ar.sent_bytes + rs.sent_bytes + ag.sent_bytes))


def test_a_synchronous_collective_is_listed_without_a_window():
    text = """ENTRY %main (g: f32[16]) -> f32[16] {
  %g = f32[16]{0} parameter(0)
  ROOT %ar = f32[16]{0} all-reduce(%g), replica_groups={{0,1}}, to_apply=%add
}
"""
    sched = schedule.read_schedule(text, 2)
    assert not sched.scheduled  # no module line saying is_scheduled=true
    assert [(w.kind, w.work, w.sent_bytes) for w in sched.windows] == [("all-reduce", (), 64.0)]
    assert sched.overlapped_fraction == 0


def test_a_loop_inside_a_window_counts_its_body_times_its_trip_count():
    text = """HloModule m, is_scheduled=true
%body (t: (s32[], f32[4,4])) -> (s32[], f32[4,4]) {
  %t = (s32[], f32[4,4]{1,0}) parameter(0)
  %a = f32[4,4]{1,0} get-tuple-element(%t), index=1
  %d = f32[4,4]{1,0} dot(%a, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %i = s32[] get-tuple-element(%t), index=0
  ROOT %r = (s32[], f32[4,4]{1,0}) tuple(%i, %d)
}
ENTRY %main (g: f32[16], t: (s32[], f32[4,4])) -> f32[16] {
  %g = f32[16]{0} parameter(0)
  %t = (s32[], f32[4,4]{1,0}) parameter(1)
  %s = f32[16]{0} all-reduce-start(%g), replica_groups={{0,1}}, to_apply=%add
  %w = (s32[], f32[4,4]{1,0}) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %e = f32[16]{0} all-reduce-done(%s)
}
"""
    (window,) = schedule.read_schedule(text, 2).windows
    (loop,) = window.work
    assert (loop.what, loop.flops) == ("while (3 iterations)", 3 * 2 * 4 * 4 * 4)
    assert window.is_sync is None  # the start states none


def test_group_sizes_are_read_in_each_form_xla_prints():
    assert schedule.group_size("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0','axis_1'}", 1) == 8
    assert schedule.group_size("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}", 1) == 2
    assert schedule.group_size("replica_groups=[2,4]<=[8]", 1) == 4
    assert schedule.group_size("replica_groups={{0,2},{1,3}}", 1) == 2
    assert schedule.group_size("source_target_pairs={{0,1}}", 8) == 8


def test_not_a_program_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="No HLO computation found"):
        schedule.read_schedule("hello")


def test_the_scheduler_pass_is_found_in_a_dump_folder(tmp_path):
    assert schedule.scheduler_dump_options(str(tmp_path)) == {
        "xla_dump_to": str(tmp_path),
        "xla_dump_hlo_pass_re": "latency-hiding-scheduler",
    }
    (tmp_path / "module_0001.m.after_optimizations.txt").write_text("")
    assert not schedule.scheduler_ran(str(tmp_path))
    (tmp_path / "module_0001.m.0001.latency-hiding-scheduler.after_latency-hiding-scheduler.txt").write_text("")
    assert schedule.scheduler_ran(str(tmp_path))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", ["h100_sxm", "h200", "l4"])
def test_the_plain_step_has_one_all_reduce_and_nothing_to_overlap_it_with(target, version):
    sched = stored(target, "plain", version)
    assert sched.scheduled
    (window,) = sched.windows
    assert window.kind == "all-reduce" and window.runs_per_step == 1
    assert window.sent_bytes == pytest.approx(PLAIN_SENT)
    assert window.compute == (), f"the optimizer needs the combined gradient; {window.work} in the window"
    assert sched.overlapped_fraction == 0
    (after_loop,) = stored(target, "accum_reduced", version).windows if target == "h200" else [window]
    assert after_loop.kind == "all-reduce" and after_loop.runs_per_step == 1  # once, after the microbatch loop


# The smoke gradient split by a 4,096-byte combine threshold (dpcourse/cross_compile/overlap_steps.py):
# the input layer's weight, the block's weight, the output layer's weight with the two metrics, the biases.
SPLIT_PAYLOADS = sorted([784 * 32 * 4, 32 * 32 * 4, 32 * 10 * 4 + METRIC_BYTES, (32 + 32 + 10) * 4])
# Of those, the payloads whose window runs a GEMM on the H100 SXM and H200: JAX 0.10 leaves the input
# layer's (the largest) inside windows of compute, JAX 0.12 schedules it last, with element-wise work only.
WITH_GEMMS = {"0.10.2": [296, 784 * 32 * 4], "0.12.0.1": [296, 1288, 32 * 32 * 4]}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", ["h100_sxm", "h200", "l4"])
def test_a_small_combine_threshold_splits_the_gradient_in_four_all_reduces(target, version):
    sched = stored(target, "small_threshold", version)
    assert sorted(w.payload_bytes for w in sched.windows) == SPLIT_PAYLOADS == [296, 1288, 4096, 100352]
    assert sched.sent_bytes_per_step == pytest.approx(PLAIN_SENT)  # the same bytes, split up
    assert target != "l4" or any(w.is_sync is True for w in sched.windows)  # the L4 keeps some synchronous


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", ["h100_sxm", "h200"])
def test_a_small_combine_threshold_opens_windows_on_the_h100_and_h200(target, version):
    sched = stored(target, "small_threshold", version)
    gemms = sorted(w.payload_bytes for w in sched.windows if w.has_compute)
    assert gemms == WITH_GEMMS[version], "a weight gradient's GEMM runs inside these all-reduces' windows"
    assert sched.overlapped_fraction == pytest.approx(sum(gemms) / sum(SPLIT_PAYLOADS))
    assert any(w.compute and not w.has_compute for w in sched.windows), "a window of element-wise work only"


@pytest.mark.parametrize("version", VERSIONS)
def test_fsdp_gathered_once_moves_the_same_bytes_in_three_kinds(version):
    sched = stored("h200", "fsdp_gathered", version)
    kinds = sorted({w.kind for w in sched.windows})
    assert kinds == ["all-gather", "all-reduce", "reduce-scatter"]
    scatter = next(w for w in sched.windows if w.kind == "reduce-scatter")
    assert scatter.sent_bytes == pytest.approx((N - 1) * scatter.payload_bytes)
    assert sched.sent_bytes_per_step == pytest.approx(PLAIN_SENT)  # reduce-scatter + all-gather = all-reduce


@pytest.mark.parametrize("version", VERSIONS)
def test_fsdp_gathered_once_has_a_gemm_only_in_the_reduce_scatter_s_window(version):
    """Every window holds work, but the all-gather's is a zero-FLOP broadcast and the all-reduce's the update."""
    sched = stored("h200", "fsdp_gathered", version)
    by_kind = {w.kind: w for w in sched.windows}
    assert all(w.compute for w in sched.windows)
    assert [k for k, w in by_kind.items() if w.has_compute] == ["reduce-scatter"]
    assert by_kind["all-gather"].window_flops == 0 and by_kind["all-reduce"].window_flops == 0
    assert sched.overlapped_fraction == pytest.approx(by_kind["reduce-scatter"].sent_bytes / sched.sent_bytes_per_step)


def test_rows_and_summary_say_what_a_table_and_placement_json_need():
    sched = stored("h200", "small_threshold", "0.10.2")
    rows = sched.rows()
    assert len(rows) == len(sched.windows)
    assert set(rows[0]) >= {"collective", "bytes sent per device", "is_sync", "work in window", "window FLOPs"}
    summary = sched.summary()
    assert summary["collectives"] == len(sched.windows)
    assert summary["overlapped_fraction"] == round(sched.overlapped_fraction, 4)
    assert summary["in_window"] == ["all-reduce"]
