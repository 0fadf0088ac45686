"""Tests of dpcourse.cross_compile.steps: each builder gives a jitted step and abstract arguments that lower on a mesh."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from dpcourse import config
from dpcourse.cross_compile import compile as deviceless
from dpcourse.cross_compile import steps as course_steps


@pytest.fixture()
def mesh(cpu_devices):
    return Mesh(np.array(cpu_devices[:4]), ("data",))


def test_abstract_args_replicate_the_state_and_split_the_batch(mesh):
    cfg = config.get_config("smoke")
    params, opt_state, x, y = course_steps.abstract_args(cfg, mesh)
    batch = cfg.per_device_batch * 4
    assert x.shape == (batch, 784) and x.dtype == np.float32 and x.sharding.spec == PartitionSpec("data", None)
    assert y.shape == (batch,) and y.dtype == np.int32 and y.sharding.spec == PartitionSpec("data")
    for leaf in jax.tree.leaves((params, opt_state)):
        assert isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding.spec == PartitionSpec()


@pytest.mark.parametrize("name", sorted({**deviceless.COURSE_STEPS, **deviceless.FAST_STEPS}))
def test_every_named_builder_exists_and_lowers(name, mesh):
    path = {**deviceless.COURSE_STEPS, **deviceless.FAST_STEPS}[name]
    assert path.startswith("dpcourse.cross_compile.steps:")
    build = deviceless.load_builder(path)
    step, args = build(config.get_config("smoke"), mesh)
    out = jax.eval_shape(step, *args)
    params_out = out[0]
    assert jax.tree.structure(params_out) == jax.tree.structure(args[0])
