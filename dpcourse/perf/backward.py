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

import jax
import jax.numpy as jnp

# Rows of the batch per step of the kernel's grid, and the scoped VMEM the kernel may use. At
# width 1024 a step holds three [512, 1024] bfloat16 tiles in and one out (double-buffered), the
# weights (2 MiB) and the float32 weight gradient (4 MiB, double-buffered): about 20 MiB, more than
# the compiler's default scoped limit; TPU v5e and v6e have 128 MiB of VMEM (Google Cloud's TPU
# system architecture pages). Measured on one v5e chip (2026-12-06, JAX 0.10.2): 512 rows 38.7 ms
# per step of notebook 09's best rung, 1024 rows 39.0 ms.
TILE_ROWS = 512
VMEM_LIMIT_BYTES = 96 * 2**20


def _gelu_and_slope(z):
    """GELU of ``z`` and its derivative, element by element (one forward-mode pass)."""
    return jax.jvp(jax.nn.gelu, (z,), (jnp.ones_like(z),))


def _custom_block(block_mix: float, backward):
    """The block as a ``jax.custom_vjp`` whose forward pass keeps ``(h, mix x GELU'(z), W)`` for ``backward``."""

    @jax.custom_vjp
    def block(h, w, b):
        return (1.0 - block_mix) * h + block_mix * jax.nn.gelu(h @ w + b)

    def forward_keeping_slope(h, w, b):
        out, slope = _gelu_and_slope(h @ w + b)
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


def tile_rows(batch: int, rows: int = TILE_ROWS) -> int:
    """Rows per grid step for a batch: ``rows``, or the whole batch when it is smaller.

    Raises:
        ValueError: a batch larger than ``rows`` that it does not divide.
    """
    if batch <= rows:
        return batch
    if batch % rows:
        raise ValueError(
            f"The block's backward kernel takes the batch in tiles of {rows} rows, and {batch} is not a "
            f"multiple of {rows}: choose a global batch that is (for example {batch // rows * rows})."
        )
    return rows


def backward_kernel(block_mix: float, interpret: bool, rows: int = TILE_ROWS):
    """``(g, slope, h, w) -> (dh, dW, db)`` for one repeat as one Pallas kernel over tiles of ``rows`` rows.

    Args (of the returned function): ``g``, ``slope``, ``h`` ``[batch, W]``
    and ``w`` ``[W, W]`` bfloat16 (``slope`` already multiplied by ``mix``).

    Returns (of the returned function): ``dh [batch, W]`` in ``g``'s dtype,
    ``dW [W, W]`` and ``db [1, W]`` float32, summed over the tiles in the
    kernel's own float32 accumulators.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

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

    def run(g, slope, h, w):
        batch, width = g.shape
        step_rows = tile_rows(batch, rows)
        tile = pl.BlockSpec((step_rows, width), lambda i: (i, 0))
        whole = pl.BlockSpec((width, width), lambda i: (0, 0))  # the same block every step: stays in VMEM
        options = {}
        if not interpret:
            options["compiler_params"] = pltpu.CompilerParams(
                dimension_semantics=("arbitrary",),  # the steps add into dW and db: one after the other
                vmem_limit_bytes=VMEM_LIMIT_BYTES,
            )
        return pl.pallas_call(
            kernel,
            grid=(batch // step_rows,),
            in_specs=[tile, tile, tile, whole],
            out_specs=[tile, whole, pl.BlockSpec((1, width), lambda i: (0, 0))],
            out_shape=[
                jax.ShapeDtypeStruct(g.shape, g.dtype),
                jax.ShapeDtypeStruct((width, width), jnp.float32),
                jax.ShapeDtypeStruct((1, width), jnp.float32),
            ],
            interpret=interpret,
            **options,
        )(g, slope, h, w)

    return run


def block_with_kernel(block_mix: float, interpret: bool | None = None, rows: int = TILE_ROWS):
    """The block whose backward pass is :func:`backward_kernel` (bfloat16 only).

    Args:
        interpret: run the kernel in Pallas's interpret mode (JAX operations
            standing in for the TPU kernel: the same numbers, none of its
            speed); None: interpret everywhere but on a TPU backend.
        rows: rows of the batch per step of the kernel's grid (:func:`tile_rows`).

    Returns:
        ``block(h, w, b)`` as :func:`block_saving_slope`'s.

    Raises:
        TypeError: (at trace time) ``h`` is not bfloat16: the kernel's
            matmuls take bfloat16 operands.
    """
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    run = backward_kernel(block_mix, interpret, rows)

    def backward(kept, g):
        h, slope, w = kept
        if h.dtype != jnp.bfloat16:
            raise TypeError(
                f"The block's backward kernel computes in bfloat16, and this block's activations are {h.dtype}: "
                "use it with compute_dtype='bfloat16'."
            )
        dh, dw, db = run(g, slope, h, w)
        return dh, dw.astype(w.dtype), db[0].astype(w.dtype)

    return _custom_block(block_mix, backward)
