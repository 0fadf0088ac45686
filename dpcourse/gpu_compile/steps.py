"""The course's data-parallel steps (notebooks 04-05, 09) as compile-only builders for :mod:`dpcourse.gpu_compile.compile`.

Each builder has the signature ``build(cfg, mesh) -> (jitted_fn,
abstract_args)``: ``cfg`` a :class:`dpcourse.config.Config`, ``mesh`` a 1-D
``jax.sharding.Mesh`` with axis ``"data"``, ``abstract_args`` the step's
``(params, opt_state, x, y)`` as ``jax.ShapeDtypeStruct`` with their
``NamedSharding``. :data:`dpcourse.gpu_compile.compile.COURSE_STEPS` names them
(``"dpcourse.gpu_compile.steps:jit_step"``); lesson 10's are in
:mod:`dpcourse.gpu_compile.sharded_steps`.
"""

from __future__ import annotations


def abstract_args(cfg, mesh) -> tuple:
    """``(params, opt_state, x, y)`` as ``ShapeDtypeStruct``: state replicated ``P()``, batch ``P('data', ...)``.

    ``x`` is float32 ``[global_batch, 784]``, ``y`` int32 ``[global_batch]``,
    with ``global_batch = cfg.per_device_batch x mesh.size``.
    """
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpcourse import model, train

    replicated = NamedSharding(mesh, P())

    def abstract(tree):
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), tree)

    init = jax.eval_shape(lambda: model.init_params(cfg))
    params = abstract(init)
    opt_state = abstract(jax.eval_shape(train.make_optimizer(cfg).init, init))
    batch = cfg.global_batch(mesh.size)
    x = jax.ShapeDtypeStruct((batch, 784), np.float32, sharding=NamedSharding(mesh, P("data", None)))
    y = jax.ShapeDtypeStruct((batch,), np.int32, sharding=NamedSharding(mesh, P("data")))
    return params, opt_state, x, y


def jit_step(cfg, mesh):
    """Plain ``jit`` of :func:`dpcourse.train.make_train_step` (automatic data parallelism)."""
    import jax

    from dpcourse import train

    return jax.jit(train.make_train_step(cfg, train.make_optimizer(cfg))), abstract_args(cfg, mesh)


def device_axis_step(cfg, mesh):
    """``jit`` of :func:`dpcourse.train.make_device_axis_step` (per-device gradients, one mean)."""
    import jax

    from dpcourse import train

    step = train.make_device_axis_step(cfg, train.make_optimizer(cfg), mesh.size)
    return jax.jit(step), abstract_args(cfg, mesh)


def shard_map_step(cfg, mesh):
    """``jit`` of :func:`dpcourse.train.make_shard_map_step` (explicit ``pmean`` after the backward pass)."""
    import jax

    from dpcourse import train

    return jax.jit(train.make_shard_map_step(cfg, train.make_optimizer(cfg), mesh)), abstract_args(cfg, mesh)


def fast_jit_step(cfg, mesh):
    """Notebook 09's fast step under plain ``jit``: repeats fully unrolled, bfloat16 compute."""
    return jit_step(cfg.with_overrides(block_unroll="full", compute_dtype="bfloat16"), mesh)
