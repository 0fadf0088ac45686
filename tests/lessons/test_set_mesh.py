"""The one-device baseline under a global ``jax.set_mesh(mesh)``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import jax, numpy as np
from dpcourse import bench, config, data, placement, train
from dpcourse.devices import outside_mesh, setup_devices
setup_devices(8)
cfg = config.get_config("smoke", backend="cpu")
mesh = jax.make_mesh((8,), ("data",))
jax.set_mesh(mesh)  # global, as notebook 03 allows
dataset = data.load_fashion_mnist(source="synthetic", limit=2048)
optimizer = train.make_optimizer(cfg)
from dpcourse import model
init = model.init_params(cfg)
one = placement.place_single_device(cfg, dataset, jax.devices()[0], optimizer, init, 64)
step = jax.jit(train.make_train_step(cfg, optimizer))
result, *_ = bench.benchmark(step, one.params, one.opt_state, one.batches, warmup_steps=1, repeats=1, steps=1,
                             label="1 device", n_devices=1, global_batch=64)
assert not jax.sharding.get_abstract_mesh().empty  # the global mesh is back afterwards
print("OK", result.examples_per_s > 0)
"""


@pytest.mark.slow
def test_the_one_device_baseline_runs_under_a_global_mesh():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and "OK True" in out.stdout, out.stderr[-3000:]
