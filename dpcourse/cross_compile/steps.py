"""Every compile-only step builder of the course (lessons 04, 05, 09 and 10), in one style.

A builder is ``build(cfg, mesh) -> (jitted, abstract_args)``: ``cfg`` a
:class:`dpcourse.config.Config`, ``mesh`` a 1-D ``jax.sharding.Mesh`` with
axis ``"data"``; ``jitted`` has ``.lower(*abstract_args)``, and
``abstract_args`` is the step's ``(params, opt_state, x, y)`` as
``jax.ShapeDtypeStruct`` with their ``NamedSharding`` on ``mesh`` (nothing
is allocated; :func:`abstract_args`). The global batch is
``cfg.per_device_batch x N``: ``x`` float32 ``[global_batch, 784]`` sharded
``P('data', None)``, ``y`` int32 ``[global_batch]`` sharded ``P('data')``.

:mod:`dpcourse.cross_compile.compile` names them as ``"module:function"``:
``COURSE_STEPS`` and ``FAST_STEPS`` there (the data-parallel steps of 04, 05
and 09), :data:`SHARDED_STEPS` here (lesson 10's forms, in the lesson's
order; the accumulation steps split the batch into :data:`ACCUM_K`
microbatches).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import model, train
from dpcourse.data import N_FEATURES
from dpcourse.sharded import forms as sharded

ACCUM_K = 4
_HERE = __name__
SHARDED_STEPS: dict[str, str] = {
    "dp_replicated": f"{_HERE}:replicated",
    "zero1": f"{_HERE}:zero1",
    "zero1_allreduce_first": f"{_HERE}:zero1_allreduce_first",
    "fsdp_naive": f"{_HERE}:fsdp_naive",
    "fsdp_gathered": f"{_HERE}:fsdp_gathered",
    "accum_scan": f"{_HERE}:accum_scan",
    "accum_reduced": f"{_HERE}:accum_reduced",
}
STEPS = SHARDED_STEPS  # lesson 10's name for them

# The lesson's names of the forms and their keys (step names here, metric suffixes in results.json).
FORM_KEYS: dict[str, str] = {
    "replicated DP": "dp_replicated",
    "ZeRO-1": "zero1",
    "ZeRO-1, all-reduce first": "zero1_allreduce_first",
    "FSDP, naive": "fsdp_naive",
    "FSDP, gathered once": "fsdp_gathered",
    "accumulation, scan": "accum_scan",
    "accumulation, reduced": "accum_reduced",
}
FORM_LABELS: dict[str, str] = {key: label for label, key in FORM_KEYS.items()}


def _abstract(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def _shapes(cfg):
    """The optimizer, and the shapes of the parameters and of its state (nothing allocated)."""
    optimizer = train.make_optimizer(cfg)
    params = jax.eval_shape(lambda: model.init_params(cfg))
    return optimizer, params, jax.eval_shape(optimizer.init, params)


def _replicated(tree, mesh):
    return jax.tree.map(lambda _: NamedSharding(mesh, P()), tree)


def abstract_args(cfg, mesh, param_shardings=None, state_shardings=None) -> tuple:
    """``(params, opt_state, x, y)`` as ``ShapeDtypeStruct`` on ``mesh``.

    Parameters and AdamW state take ``param_shardings`` and
    ``state_shardings`` (pytrees of ``NamedSharding``; default replicated
    ``P()``); the batch is split over ``data`` (see the module's notes).
    """
    _, params, state = _shapes(cfg)
    params = _abstract(params, param_shardings or _replicated(params, mesh))
    state = _abstract(state, state_shardings or _replicated(state, mesh))
    batch = cfg.global_batch(mesh.size)
    x = jax.ShapeDtypeStruct((batch, N_FEATURES), np.float32, sharding=NamedSharding(mesh, P("data", None)))
    y = jax.ShapeDtypeStruct((batch,), np.int32, sharding=NamedSharding(mesh, P("data")))
    return params, state, x, y


# ---- the data-parallel steps of 04, 05 and 09 ----


def jit_step(cfg, mesh):
    """Plain ``jit`` of :func:`dpcourse.train.make_train_step` (automatic data parallelism)."""
    return jax.jit(train.make_train_step(cfg, train.make_optimizer(cfg))), abstract_args(cfg, mesh)


def device_axis_step(cfg, mesh):
    """``jit`` of :func:`dpcourse.train.make_device_axis_step` (per-device gradients, one mean)."""
    step = train.make_device_axis_step(cfg, train.make_optimizer(cfg), mesh.size)
    return jax.jit(step), abstract_args(cfg, mesh)


def shard_map_step(cfg, mesh):
    """``jit`` of :func:`dpcourse.train.make_shard_map_step` (explicit ``pmean`` after the backward pass)."""
    return jax.jit(train.make_shard_map_step(cfg, train.make_optimizer(cfg), mesh)), abstract_args(cfg, mesh)


def fast_jit_step(cfg, mesh):
    """Notebook 09's fast step under plain ``jit``: repeats fully unrolled, bfloat16 compute."""
    return jit_step(cfg.with_overrides(block_unroll="full", compute_dtype="bfloat16"), mesh)


# ---- lesson 10's forms (dpcourse.sharded.forms) ----


def replicated(cfg, mesh):
    """Replicated data parallelism (the reference)."""
    optimizer, params, state = _shapes(cfg)
    return sharded.make_replicated_step(cfg, optimizer, mesh, params, state), abstract_args(cfg, mesh)


def _zero1(cfg, mesh, allreduce_first):
    optimizer, params, state = _shapes(cfg)
    step, plan = sharded.make_zero1_step(cfg, optimizer, mesh, params, state, allreduce_first=allreduce_first)
    return step, abstract_args(cfg, mesh, state_shardings=plan.shardings(mesh))


def zero1(cfg, mesh):
    """ZeRO-1, naive: AdamW state sharded, parameters replicated, shardings on inputs and outputs only."""
    return _zero1(cfg, mesh, allreduce_first=False)


def zero1_allreduce_first(cfg, mesh):
    """ZeRO-1 with the gradients constrained to ``P()`` after ``value_and_grad``: one all-reduce, one all-gather."""
    return _zero1(cfg, mesh, allreduce_first=True)


def _fsdp(cfg, mesh, gather_once):
    optimizer, params, state = _shapes(cfg)
    step, p_plan, s_plan = sharded.make_fsdp_step(cfg, optimizer, mesh, params, state, gather_once)
    return step, abstract_args(cfg, mesh, p_plan.shardings(mesh), s_plan.shardings(mesh))


def fsdp_naive(cfg, mesh):
    """FSDP with shardings on the step's inputs and outputs only."""
    return _fsdp(cfg, mesh, gather_once=False)


def fsdp_gathered(cfg, mesh):
    """FSDP with the parameters gathered once and the gradients reduce-scattered (sharding constraints)."""
    return _fsdp(cfg, mesh, gather_once=True)


def accum_scan(cfg, mesh):
    """Gradient accumulation over :data:`ACCUM_K` microbatches, ``lax.scan`` on an Auto mesh."""
    optimizer, _, _ = _shapes(cfg)
    return jax.jit(sharded.make_accumulation_step(cfg, optimizer, ACCUM_K, mesh)), abstract_args(cfg, mesh)


class _UnderMesh:
    """A jitted function whose ``lower`` runs under ``jax.set_mesh(mesh)`` (Explicit axes need it)."""

    def __init__(self, jitted, mesh: Mesh):
        self.jitted, self.mesh = jitted, mesh

    def lower(self, *args):
        with jax.set_mesh(self.mesh):
            return self.jitted.lower(*args)

    def __call__(self, *args):
        with jax.set_mesh(self.mesh):
            return self.jitted(*args)


def explicit_mesh(mesh: Mesh) -> Mesh:
    """The same devices and axis names with every axis ``AxisType.Explicit``."""
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Explicit,) * len(mesh.axis_names))


def accum_reduced(cfg, mesh):
    """Gradient accumulation with ``reduced``/``unreduced`` shardings on an Explicit mesh over the same devices.

    Raises:
        RuntimeError: this JAX lacks reduced/unreduced shardings.
    """
    optimizer, _, _ = _shapes(cfg)
    emesh = explicit_mesh(mesh)
    step = _UnderMesh(jax.jit(sharded.make_reduced_accumulation_step(cfg, optimizer, ACCUM_K)), emesh)
    return step, abstract_args(cfg, emesh)
