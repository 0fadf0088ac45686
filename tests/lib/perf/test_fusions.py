"""Tests of dpcourse.perf.fusions: the kernels of a compiled step, and whether the GELU rides in the matmuls'."""

import base64
import gzip
from pathlib import Path

import jax
import numpy as np

from dpcourse import config, model, train
from dpcourse.perf import breakdown, fusions

DATA = Path(__file__).resolve().parents[2] / "data"
# The course's scan step in float32 at the full profile and global batch 4096, compiled by JAX 0.10.2 for one
# TPU v5e (notebook 09's ladder, on the chip): matmuls as convolutions inside output fusions.
TPU_SCAN = DATA / "hlo_tpu_v5e_scan_f32_full_1_jax0.10.2.txt.gz"


def test_a_tpu_program_keeps_the_gelu_in_its_matmul_fusions():
    c = fusions.census(gzip.decompress(TPU_SCAN.read_bytes()).decode())
    # the loop bodies' forward, input-gradient and weight-gradient matmuls, and the input and output layers
    assert (c.kernels, c.matmul_kernels, c.matmul_with_gelu, c.elementwise_kernels) == (48, 8, 3, 40)


def test_a_gemm_library_call_is_a_matmul_kernel_and_loop_fusions_are_element_wise():
    text = """HloModule m

%fused_gelu (p: f32[8,4]) -> f32[8,4] {
  %p = f32[8,4]{1,0} parameter(0)
  ROOT %t = f32[8,4]{1,0} tanh(%p)
}

ENTRY %main (a: f32[8,4], b: f32[4,4]) -> f32[8,4] {
  %a = f32[8,4]{1,0} parameter(0)
  %b = f32[4,4]{1,0} parameter(1)
  %gemm = (f32[8,4]{1,0}, s8[0]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm"
  %g = f32[8,4]{1,0} get-tuple-element(%gemm), index=0
  ROOT %f = f32[8,4]{1,0} fusion(%g), kind=kLoop, calls=%fused_gelu
}
"""
    c = fusions.census(text)
    assert (c.kernels, c.matmul_kernels, c.matmul_with_gelu, c.elementwise_kernels) == (2, 1, 0, 1)
    assert not c.gelu_in_matmuls and "kernels of its own" in c.sentence("fast")


def _mosaic_call(ops: bytes) -> str:
    body = base64.b64encode(b"ML\xefR" + ops).decode()
    return (
        '  %k = (bf16[8,4]{1,0}) custom-call(%a), custom_call_target="tpu_custom_call", '
        'backend_config={"custom_call_config":{"body":"' + body + '"}}'
    )


def test_a_pallas_kernel_is_a_matmul_when_its_mosaic_body_has_one():
    with_matmul = _mosaic_call(b"\x00arith.mulf\x00tpu.matmul\x00scf.yield")
    without = _mosaic_call(b"\x00arith.mulf\x00arith.addf")
    assert fusions.matmul_call(with_matmul) and not fusions.matmul_call(without)
    assert not fusions.matmul_call(with_matmul.replace('"body":"', '"body":"@@'))  # not base64: no kernel read
    text = f"""HloModule m

ENTRY %main (a: f32[8,4]) -> (bf16[8,4]) {{
  %a = f32[8,4]{{1,0}} parameter(0)
{with_matmul}
  ROOT %t = (bf16[8,4]{{1,0}}) tuple(%k)
}}
"""
    assert fusions.census(text).matmul_kernels == 1
    assert breakdown.kernel_kinds(text)["k"] == "matmul"


def test_the_cpu_compiler_keeps_the_gelu_apart():
    cfg = config.make_config("smoke").with_overrides(block_unroll="full")
    opt = train.make_optimizer(cfg)
    params = model.init_params(cfg)
    step = jax.jit(train.make_train_step(cfg, opt))
    x, y = np.zeros((16, 784), np.float32), np.zeros((16,), np.int32)
    c = fusions.census(step.lower(params, opt.init(params), x, y).compile().as_text())
    assert c.matmul_kernels == 3 * cfg.block_repeats + 5  # each repeat's three, the input and output layers'
    assert c.matmul_with_gelu == 0 and c.elementwise_kernels > 0


def test_the_sentence_says_when_the_element_wise_work_rides_in_the_matmuls():
    c = fusions.FusionCensus(kernels=419, matmul_kernels=389, matmul_with_gelu=323, elementwise_kernels=30)
    assert c.gelu_in_matmuls and "rides in the matmuls' kernels" in c.sentence("unrolled_bf16")


def test_the_stored_h200_schedule_runs_its_gemms_apart_from_the_element_wise_work():
    c = fusions.census((DATA / "sched_h200_plain_smoke_8_jax0.10.2.txt").read_text())
    assert (c.matmul_kernels, c.matmul_with_gelu, c.elementwise_kernels) == (8, 0, 44)
