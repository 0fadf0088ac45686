"""Tests of dpcourse.compiled.hlo: what the compiled program of each ladder rung contains."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import model
from dpcourse.compiled import hlo
from dpcourse.config import make_config

CFG = make_config("smoke").with_overrides(block_repeats=4)


def _grad_program(cfg):
    params = model.init_params(cfg)
    x = np.zeros((8, 784), np.float32)
    y = np.zeros(8, np.int32)
    fn = jax.jit(jax.grad(lambda p, x, y: model.loss_and_metrics(p, x, y, cfg)[0]))
    return fn.lower(params, x, y).compile().as_text()


def test_scan_is_a_loop_with_the_repeats_as_trip_count():
    s = hlo.summarize(_grad_program(CFG))
    assert s.while_loops >= 1
    assert CFG.block_repeats in s.trip_counts
    assert not s.unknown_trip


def test_full_unroll_has_no_loop_and_the_same_matmuls_per_step():
    scan = hlo.summarize(_grad_program(CFG))
    unrolled = hlo.summarize(_grad_program(CFG.with_overrides(block_unroll="full")))
    assert unrolled.while_loops == 0 and unrolled.trip_counts == ()
    # forward + two backward matmuls per repeat, plus the input and output layers:
    # per step the counts agree, however the program is written.
    assert unrolled.matmuls == scan.matmuls
    assert unrolled.matmuls >= 3 * CFG.block_repeats
    assert unrolled.row()["trip counts"] == "none"


GPU_LIKE = """HloModule m

%fused_computation (p0: f32[4,4]) -> f32[4,4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  ROOT %t = f32[4,4]{1,0} tanh(%p0)
}

%body (s: (s32[], f32[4,4])) -> (s32[], f32[4,4]) {
  %s = (s32[], f32[4,4]{1,0}) parameter(0)
  %h = f32[4,4]{1,0} get-tuple-element(%s), index=1
  %g = (f32[4,4]{1,0}, s8[0]{0}) custom-call(%h, %h), custom_call_target="__cublas$gemm"
  %f = f32[4,4]{1,0} fusion(%h), kind=kLoop, calls=%fused_computation
  ROOT %r = (s32[], f32[4,4]{1,0}) tuple(%i, %f)
}

%cond (s: (s32[], f32[4,4])) -> pred[] {
  %s = (s32[], f32[4,4]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  %w = (s32[], f32[4,4]{1,0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"6"}}
  ROOT %o = f32[4,4]{1,0} get-tuple-element(%w), index=1
}
"""


def test_gemm_calls_and_fusions_count_once_per_loop_iteration():
    s = hlo.summarize(GPU_LIKE)
    assert s.while_loops == 1 and s.trip_counts == (6,)
    assert s.matmuls == 6  # one cuBLAS call per iteration
    assert s.fusions == 6


def test_unknown_trip_count_is_flagged():
    s = hlo.summarize(GPU_LIKE.replace(', backend_config={"known_trip_count":{"n":"6"}}', ""))
    assert s.unknown_trip and s.trip_counts == (None,)
    assert s.matmuls == 1


def test_no_program_is_a_clear_error():
    with pytest.raises(ValueError, match="No HLO computation"):
        hlo.summarize("not hlo")


def test_written_all_reduce_keeps_the_dtype_the_program_asked_for():
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    x = jax.ShapeDtypeStruct((4 * 256,), jnp.float32, sharding=NamedSharding(mesh, P("data")))

    def lowered(dtype):
        f = jax.shard_map(
            lambda g: jax.lax.pmean(g.astype(dtype), "data").astype(jnp.float32),
            mesh=mesh,
            in_specs=P("data"),
            out_specs=P(),
        )
        return jax.jit(f).lower(x).as_text()

    assert hlo.written_all_reduce_bytes(lowered(jnp.bfloat16)) == [("bf16", 512)]
    assert hlo.written_all_reduce_bytes(lowered(jnp.float32)) == [("f32", 1024)]
    assert hlo.written_all_reduce_bytes("module {}") == []
