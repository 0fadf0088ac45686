"""The shared block's backward pass written by hand: GELU's derivative kept, and a Pallas kernel for it.

Notebook 09's last rungs. JAX's own derivative of the block
``h -> (1 - mix) h + mix GELU(h W + b)`` keeps ``z = h W + b`` and computes
GELU's derivative at ``z`` again in the backward pass (a tanh and a
polynomial, element by element, in float32 on a TPU's vector unit, fused
into the kernels of the backward matmuls). Both blocks here keep
``mix x GELU'(z)`` from the forward pass instead, which computes the tanh
anyway; :func:`block_with_kernel` also runs the whole backward pass of one
repeat (both matmuls, the product with the kept derivative and the bias
gradient's sum) as one Pallas kernel over tiles of rows.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import AxisType

# Rows of the batch per step of the kernel's grid, and the scoped VMEM the kernel may use. At
# width 1024 a step holds three [512, 1024] bfloat16 tiles in and one out (double-buffered), the
# weights (2 MiB) and the float32 weight gradient (4 MiB, double-buffered): about 20 MiB, so the
# kernel sets its own scoped limit; TPU v5e and v6e have 128 MiB of VMEM (Google Cloud's TPU
# system architecture pages). Measured on one v5e chip (2026-12-06, JAX 0.10.2): 512 rows 38.7 ms
# per step of notebook 09's best rung, 1024 rows 39.0 ms.
TILE_ROWS = 512
VMEM_LIMIT_BYTES = 96 * 2**20


def _custom_block(block_mix: float, backward):
    """The block as a ``jax.custom_vjp`` whose forward pass keeps ``(h, mix x GELU'(z), W)`` for ``backward``."""

    @jax.custom_vjp
    def block(h, w, b):
        return (1.0 - block_mix) * h + block_mix * jax.nn.gelu(h @ w + b)

    def forward_keeping_slope(h, w, b):
        z = h @ w + b
        out, slope = jax.jvp(jax.nn.gelu, (z,), (jnp.ones_like(z),))  # GELU and its derivative, one pass
        return (1.0 - block_mix) * h + block_mix * out, (h, (block_mix * slope).astype(h.dtype), w)

    block.defvjp(forward_keeping_slope, backward)
    return block


def block_saving_slope(block_mix: float):
    """The block with a backward pass that reuses GELU's derivative from the forward pass (plain JAX).

    The gradient is JAX's own up to rounding: the kept derivative is rounded
    to the compute dtype, as ``z`` is.

    Returns:
        ``block(h, w, b)`` for ``h [batch, W]``, ``w [W, W]``, ``b [W]`` of one
        dtype; its result has ``h``'s shape and dtype.
    """

    def backward(kept, g):
        h, slope, w = kept
        gz = g * slope  # the cotangent of z
        return (1.0 - block_mix) * g + gz @ w.T, h.T @ gz, gz.sum(0)

    return _custom_block(block_mix, backward)


def tile_rows(batch: int, rows: int = TILE_ROWS, devices: int = 1) -> int:
    """Rows per grid step for one device's batch: ``rows``, or the whole batch when it is smaller.

    Raises:
        ValueError: a batch larger than ``rows`` that it does not divide (the message names global batches that fit).
    """
    if batch <= rows:
        return batch
    if batch % rows:
        lower = batch // rows * rows * devices
        raise ValueError(
            f"The block's backward kernel takes each device's batch in tiles of {rows} rows, and this device's "
            f"batch is {batch} rows: choose a global batch that gives each device ({devices} in all) a multiple "
            f"of {rows} rows or at most {rows} (for example {lower} or {lower + rows * devices})."
        )
    return rows


def block_with_kernel(block_mix: float, interpret: bool | None = None, rows: int = TILE_ROWS):
    """The block whose backward pass is one Pallas kernel over tiles of ``rows`` rows (bfloat16 only).

    The kernel takes ``g``, ``mix x GELU'(z)``, ``h`` ``[batch, W]`` and ``W``, and gives ``dh`` and
    ``dW``, ``db`` summed over the tiles in its own float32 accumulators. Inside ``jax.shard_map`` it
    runs on each device's rows (``batch`` is then the per-device batch).

    Args:
        interpret: run the kernel in JAX's TPU interpret mode (JAX operations
            standing in for the TPU kernel: the same numbers, none of its
            speed); None: interpret everywhere but on a TPU backend.
        rows: rows of the batch per step of the kernel's grid (:func:`tile_rows`).

    Returns:
        ``block(h, w, b)`` as :func:`block_saving_slope`'s.

    Raises:
        TypeError: (at trace time) ``h`` is not bfloat16: the kernel's
            matmuls take bfloat16 operands.
        ValueError: (at trace time) the batch is spread over devices outside ``jax.shard_map``
            (XLA cannot split the kernel), or does not fit :func:`tile_rows`.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    # The grid's steps add into dW and db: "arbitrary", one after the other.
    on_tpu = pltpu.CompilerParams(dimension_semantics=("arbitrary",), vmem_limit_bytes=VMEM_LIMIT_BYTES)

    def kernel(g_ref, slope_ref, h_ref, w_ref, dh_ref, dw_ref, db_ref):
        g = g_ref[...].astype(jnp.float32)
        gz = (g * slope_ref[...].astype(jnp.float32)).astype(jnp.bfloat16)  # the cotangent of z, this tile
        # dh = (1 - mix) g + gz W^T: contract gz's columns with W's columns.
        back = jax.lax.dot_general(gz, w_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        dh_ref[...] = ((1.0 - block_mix) * g + back).astype(dh_ref.dtype)

        @pl.when(pl.program_id(0) == 0)
        def _():
            dw_ref[...] = jnp.zeros_like(dw_ref)
            db_ref[...] = jnp.zeros_like(db_ref)

        # dW += h^T gz: contract the rows (this tile's examples) of both.
        dw_ref[...] += jax.lax.dot_general(h_ref[...], gz, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        db_ref[...] += jnp.sum(gz.astype(jnp.float32), axis=0, keepdims=True)

    def backward(kept, g):
        h, slope, w = kept
        if h.dtype != jnp.bfloat16:
            raise TypeError(
                f"The block's backward kernel computes in bfloat16, and this block's activations are {h.dtype}: "
                "use it with compute_dtype='bfloat16'."
            )
        # Inside jax.shard_map (or jax.pmap) the mesh's Manual axes split the batch: the ones this
        # device's rows vary over, or all of them where that is not tracked (check_vma off, pmap).
        aval = jax.typeof(g)
        mesh, mat = aval.sharding.mesh, aval.manual_axis_type
        manual = [axis for axis, kind in zip(mesh.axis_names, mesh.axis_types) if kind == AxisType.Manual]
        spread = math.prod(mesh.axis_sizes) // math.prod(mesh.shape[axis] for axis in manual)
        if spread > 1:
            raise ValueError(
                f"The block's backward kernel runs on each device's own rows, and here jit spreads the batch over "
                f"{spread} devices (XLA cannot split a Pallas kernel between them): use train.make_shard_map_step, "
                "which runs it inside jax.shard_map, or block_backward='saved_slope' with this step."
            )
        batch, width = g.shape
        step_rows = tile_rows(batch, rows, math.prod(mesh.shape[axis] for axis in (mat.varying or manual)))
        tile = pl.BlockSpec((step_rows, width), lambda i: (i, 0))
        whole = pl.BlockSpec((width, width), lambda i: (0, 0))  # the same block every step: stays in VMEM
        dh, dw, db = pl.pallas_call(
            kernel,
            grid=(batch // step_rows,),
            in_specs=[tile, tile, tile, whole],
            out_specs=[tile, whole, pl.BlockSpec((1, width), lambda i: (0, 0))],
            # Every result varies over the mesh axes as this device's rows do (jax.shard_map's check_vma).
            out_shape=[
                jax.ShapeDtypeStruct(g.shape, g.dtype, manual_axis_type=mat),
                jax.ShapeDtypeStruct((width, width), jnp.float32, manual_axis_type=mat),
                jax.ShapeDtypeStruct((1, width), jnp.float32, manual_axis_type=mat),
            ],
            # JAX's TPU interpret mode (interpret=True fails inside jax.shard_map with check_vma, JAX 0.10.2).
            interpret=pltpu.InterpretParams() if interpret else False,
            compiler_params=None if interpret else on_tpu,
        )(g, slope, h, w)
        return dh, dw.astype(w.dtype), db[0].astype(w.dtype)

    return _custom_block(block_mix, backward)
