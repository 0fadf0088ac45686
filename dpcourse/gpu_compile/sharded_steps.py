"""Lesson 10's steps as compile-only builders: ``build(cfg, mesh) -> (jitted, abstract_args)``.

The interface of :mod:`dpcourse.gpu_compile.compile` (``make placement``, the GPU
compile without a GPU): each builder takes a :class:`dpcourse.config.Config`
and a 1-D mesh with axis ``"data"`` and returns a jitted step and its
arguments as ``jax.ShapeDtypeStruct`` with ``NamedSharding`` on that mesh
(nothing is allocated). :data:`STEPS` names them, in the lesson's order.
The global batch is ``cfg.per_device_batch x N``; the accumulation steps
split it into :data:`ACCUM_K` microbatches.
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
STEPS: dict[str, str] = {
    "dp_replicated": "dpcourse.gpu_compile.sharded_steps:replicated",
    "zero1": "dpcourse.gpu_compile.sharded_steps:zero1",
    "zero1_allreduce_first": "dpcourse.gpu_compile.sharded_steps:zero1_allreduce_first",
    "fsdp_naive": "dpcourse.gpu_compile.sharded_steps:fsdp_naive",
    "fsdp_gathered": "dpcourse.gpu_compile.sharded_steps:fsdp_gathered",
    "accum_scan": "dpcourse.gpu_compile.sharded_steps:accum_scan",
    "accum_reduced": "dpcourse.gpu_compile.sharded_steps:accum_reduced",
}


def _abstract(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def _shapes(cfg):
    optimizer = train.make_optimizer(cfg)
    params = jax.eval_shape(lambda: model.init_params(cfg))
    return optimizer, params, jax.eval_shape(optimizer.init, params)


def _batch(cfg, mesh):
    batch = cfg.global_batch(mesh.size)
    x = jax.ShapeDtypeStruct((batch, N_FEATURES), np.float32, sharding=NamedSharding(mesh, P("data", None)))
    y = jax.ShapeDtypeStruct((batch,), np.int32, sharding=NamedSharding(mesh, P("data")))
    return x, y


def _replicated(tree, mesh):
    return jax.tree.map(lambda _: NamedSharding(mesh, P()), tree)


def replicated(cfg, mesh):
    """Replicated data parallelism (the reference)."""
    optimizer, params, state = _shapes(cfg)
    step = sharded.make_replicated_step(cfg, optimizer, mesh, params, state)
    return step, (_abstract(params, _replicated(params, mesh)), _abstract(state, _replicated(state, mesh))) + _batch(
        cfg, mesh
    )


def _zero1(cfg, mesh, allreduce_first):
    optimizer, params, state = _shapes(cfg)
    step, plan = sharded.make_zero1_step(cfg, optimizer, mesh, params, state, allreduce_first=allreduce_first)
    return step, (_abstract(params, _replicated(params, mesh)), _abstract(state, plan.shardings(mesh))) + _batch(
        cfg, mesh
    )


def zero1(cfg, mesh):
    """ZeRO-1, naive: AdamW state sharded, parameters replicated, shardings on inputs and outputs only."""
    return _zero1(cfg, mesh, allreduce_first=False)


def zero1_allreduce_first(cfg, mesh):
    """ZeRO-1 with the gradients constrained to ``P()`` after ``value_and_grad``: one all-reduce, one all-gather."""
    return _zero1(cfg, mesh, allreduce_first=True)


def _fsdp(cfg, mesh, gather_once):
    optimizer, params, state = _shapes(cfg)
    step, p_plan, s_plan = sharded.make_fsdp_step(cfg, optimizer, mesh, params, state, gather_once)
    return step, (_abstract(params, p_plan.shardings(mesh)), _abstract(state, s_plan.shardings(mesh))) + _batch(
        cfg, mesh
    )


def fsdp_naive(cfg, mesh):
    """FSDP with shardings on the step's inputs and outputs only."""
    return _fsdp(cfg, mesh, gather_once=False)


def fsdp_gathered(cfg, mesh):
    """FSDP with the parameters gathered once and the gradients reduce-scattered (sharding constraints)."""
    return _fsdp(cfg, mesh, gather_once=True)


def accum_scan(cfg, mesh):
    """Gradient accumulation over :data:`ACCUM_K` microbatches, ``lax.scan`` on an Auto mesh."""
    optimizer, params, state = _shapes(cfg)
    step = jax.jit(sharded.make_accumulation_step(cfg, optimizer, ACCUM_K, mesh))
    return step, (_abstract(params, _replicated(params, mesh)), _abstract(state, _replicated(state, mesh))) + _batch(
        cfg, mesh
    )


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
    optimizer, params, state = _shapes(cfg)
    emesh = explicit_mesh(mesh)
    step = _UnderMesh(jax.jit(sharded.make_reduced_accumulation_step(cfg, optimizer, ACCUM_K)), emesh)
    return step, (_abstract(params, _replicated(params, emesh)), _abstract(state, _replicated(state, emesh))) + _batch(
        cfg, emesh
    )


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
