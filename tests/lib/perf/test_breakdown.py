"""Tests for dpcourse.perf.breakdown: kernel kinds from program text, a trace's kernels, the split, the stored one."""

from __future__ import annotations

import gzip
import json

import pytest

from dpcourse.perf import breakdown

HLO = """HloModule jit_train_step

%fused_dot (p0: f32[8,8], p1: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  %dot.1 = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %tanh.1 = f32[8,8]{1,0} tanh(%dot.1)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.9 = f32[] add(%a, %b)
}

%fused_reduce (p0: f32[8,8]) -> f32[8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %c = f32[] constant(0)
  ROOT %reduce.1 = f32[8]{0} reduce(%p0, %c), dimensions={0}, to_apply=%add
}

%fused_mul (p0: f32[8,8], p1: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  ROOT %multiply.1 = f32[8,8]{1,0} multiply(%p0, %p1)
}

%fused_dus (p0: f32[4,8,8], p1: f32[8,8], p2: s32[]) -> f32[4,8,8] {
  %p0 = f32[4,8,8]{2,1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %bitcast.1 = f32[1,8,8]{2,1,0} bitcast(%p1)
  ROOT %dynamic-update-slice.1 = f32[4,8,8]{2,1,0} dynamic-update-slice(%p0, %bitcast.1, %p2, %p2, %p2)
}

ENTRY %main (params__w.1: f32[8,8], opt_state_0__mu__w.1: f32[8,8], x.1: f32[8,8], s.1: f32[4,8,8]) -> f32[8,8] {
  %params__w.1 = f32[8,8]{1,0} parameter(0)
  %opt_state_0__mu__w.1 = f32[8,8]{1,0} parameter(1)
  %x.1 = f32[8,8]{1,0} parameter(2)
  %s.1 = f32[4,8,8]{2,1,0} parameter(3)
  %i = s32[] constant(0)
  %fusion.1 = f32[8,8]{1,0} fusion(%x.1, %params__w.1), kind=kOutput, calls=%fused_dot
  %fusion.2 = f32[8]{0} fusion(%fusion.1), kind=kInput, calls=%fused_reduce
  %bitcast.7 = f32[8,8]{1,0} bitcast(%opt_state_0__mu__w.1)
  %fusion.3 = f32[8,8]{1,0} fusion(%bitcast.7, %fusion.1), kind=kLoop, calls=%fused_mul
  %fusion.4 = f32[8,8]{1,0} fusion(%x.1, %fusion.1), kind=kLoop, calls=%fused_mul
  %fusion.5 = f32[4,8,8]{2,1,0} fusion(%s.1, %fusion.4, %i), kind=kLoop, calls=%fused_dus
  %copy.1 = f32[8,8]{1,0} copy(%fusion.4)
  ROOT %while.1 = f32[8,8]{1,0} while(%copy.1), condition=%c, body=%b
}
"""


def test_kernel_kinds_sorts_the_programs_kernels():
    kinds = breakdown.kernel_kinds(HLO)
    assert kinds["fusion.1"] == "matmul"
    assert kinds["fusion.2"] == "reduction"
    assert kinds["fusion.3"] == "optimizer"  # reads the optimizer's state, through a bitcast
    assert kinds["fusion.4"] == "element-wise"
    assert kinds["fusion.5"] == "copy"
    assert kinds["copy.1"] == "copy"
    assert kinds["while.1"] == "control"
    assert "dot.1" not in kinds and "add.9" not in kinds  # inside a fusion, inside a combiner


def write_trace(path, events):
    meta = [
        {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "/device:TPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/host:CPU"}},
    ]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": meta + events}, f)


def ev(name, ts, dur, pid=3):
    return {"ph": "X", "name": name, "pid": pid, "tid": 1, "ts": ts, "dur": dur}


def test_kernels_reads_the_device_timeline(tmp_path):
    path = tmp_path / "plugins" / "profile" / "s" / "h.trace.json.gz"
    path.parent.mkdir(parents=True)
    write_trace(
        path,
        [ev("fusion.1", 0, 60), ev("while.1", 0, 100), ev("fusion.2", 70, 20), ev("copy.1", 95, 5)]
        + [ev("fusion.1", 0, 5, pid=7), ev("PjitFunction", 0, 500, pid=7)],
    )
    assert breakdown.trace_file(tmp_path) == path
    ks, where = breakdown.kernels(path, breakdown.kernel_kinds(HLO))
    assert where == "/device:TPU:0"
    assert [(k.name, k.kind) for k in ks] == [("fusion.1", "matmul"), ("fusion.2", "reduction"), ("copy.1", "copy")]
    assert breakdown.kernels(path, {"other.1": "matmul"}) == ([], "")
    assert breakdown.trace_file(tmp_path / "plugins" / "none") is None


def test_split_adds_up_to_the_traced_step():
    ks = [
        breakdown.Kernel("fusion.1", "matmul", 0.0, 60.0),
        breakdown.Kernel("fusion.2", "reduction", 70.0, 20.0),
        breakdown.Kernel("fusion.1", "matmul", 100.0, 60.0),
        breakdown.Kernel("fusion.3", "optimizer", 160.0, 40.0),
    ]
    # 2 steps over 200 us: 0.1 ms each; 1e9 FLOPs per step at 2e13 FLOP/s = 0.05 ms at the rate.
    bd = breakdown.split(ks, 2, 0.1, 1e9, 2e13, "r", "/device:TPU:0")
    assert bd.traced_ms == pytest.approx(0.1)
    assert bd.matmul_at_rate_ms == pytest.approx(0.05) and bd.matmul_beyond_ms == pytest.approx(0.01)
    assert bd.other_ms["reduction"] == pytest.approx(0.01) and bd.other_ms["optimizer"] == pytest.approx(0.02)
    assert bd.idle_ms == pytest.approx(0.01) and bd.overlap_ms == 0.0
    assert bd.parts_ms == pytest.approx(bd.traced_ms) and bd.agrees
    assert bd.kernels_per_step["matmul"] == 1.0
    assert sum(row["share"] for row in bd.rows()) == pytest.approx(1.0)
    far = breakdown.split(ks, 2, 0.2, 1e9, 2e13)
    assert not far.agrees and "more than 5%" in far.sentences()[-1]
    fast = breakdown.split(ks, 2, 0.1, 1e9, 1e12)  # a rate the matmuls beat
    assert fast.matmul_beyond_ms < 0 and "less than that" in fast.sentences()[1]
    with pytest.raises(ValueError, match="Need kernels"):
        breakdown.split([], 2, 0.1, 1e9, 2e13)


def test_kernels_running_at_once_are_counted_once_in_the_step():
    ks = [breakdown.Kernel("a", "element-wise", 0.0, 100.0), breakdown.Kernel("b", "element-wise", 50.0, 100.0)]
    bd = breakdown.split(ks, 1, 0.15, 0.0, 1e12)
    assert bd.overlap_ms == pytest.approx(0.05) and bd.parts_ms == pytest.approx(0.15) and bd.idle_ms == 0.0


def test_the_stored_chip_split_adds_up_and_its_part_reads_it():
    chip = breakdown.stored()
    assert chip["device_kind"] == "TPU v5 lite" and chip["jax"] and chip["libtpu"] and chip["date"]
    bds = {name: breakdown.from_stored(d) for name, d in chip["breakdowns"].items()}
    kernel, twin, scan = bds["pallas_bf16_batch8192"], bds["unrolled_bf16_batch8192"], bds["scan_f32"]
    assert all(bds[n].agrees for n in ("unrolled_bf16_batch8192", "scan_f32", "scan_unroll8_f32", kernel.rung))
    assert kernel.date and kernel.kernels_per_step["matmul"] >= 128  # the Pallas kernels count as matmuls
    lines = breakdown.stored_part().lines
    assert lines[1] == breakdown.kernel_sentence(twin, kernel) and "(5.9% less)." in lines[1]
    assert "more)." in breakdown.kernel_sentence(kernel, twin)  # read the other way round
    assert "inside the matmuls' kernels" in lines[3] and "copy kernels" in lines[4]
    assert lines[-1].startswith("Best: pallas_bf16_batch8192 at 87.1% of 197 TFLOP/s; at least 85 %.")
    cpu_like = breakdown.split([breakdown.Kernel("a", "element-wise", 0.0, 500.0)], 1, 0.5, 0.0, 1e12, "u")
    assert "kernels of its own, unrolled or not" in breakdown.scan_sentences(scan, cpu_like, None, 128)[1]
