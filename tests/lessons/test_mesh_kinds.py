"""The course's steps on both kinds of mesh, 8 simulated CPU devices.

``jax.make_mesh`` builds Explicit axes by default; ``Mesh(...)`` builds
Auto axes. On every JAX the package admits (tested: 0.10.2 and 0.12.0.1):

- every step runs on an Auto mesh;
- on an Explicit mesh every step runs under ``jax.set_mesh(mesh)`` and
  gives the same parameters as on the Auto mesh;
- without ``jax.set_mesh`` the plain and device-axis steps refuse an
  Explicit mesh with a message naming both fixes (JAX 0.11+ would
  otherwise fail deep inside the step); the ``shard_map`` step, which
  takes its mesh as an argument, runs.
"""

from __future__ import annotations

import contextlib

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import model, train
from dpcourse.config import make_config

CFG = make_config("smoke")
N = 8
STEPS = ("jit", "device_axis", "shard_map")


def build_mesh(kind: str, devices) -> Mesh:
    if kind == "Mesh(...)":
        return Mesh(np.array(devices), ("data",))
    axis_type = AxisType.Auto if kind == "make_mesh Auto" else AxisType.Explicit
    return jax.make_mesh((len(devices),), ("data",), axis_types=(axis_type,), devices=devices)


def run_step(step_name: str, mesh: Mesh, set_mesh: bool):
    optimizer = train.make_optimizer(CFG)
    step = {
        "jit": lambda: train.make_train_step(CFG, optimizer),
        "device_axis": lambda: train.make_device_axis_step(CFG, optimizer, N),
        "shard_map": lambda: train.make_shard_map_step(CFG, optimizer, mesh),
    }[step_name]()
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal((CFG.per_device_batch * N, 784)).astype(np.float32)
    y_host = rng.integers(0, 10, CFG.per_device_batch * N).astype(np.int32)
    params = jax.device_put(model.init_params(CFG), NamedSharding(mesh, P()))
    opt_state = optimizer.init(params)
    x = jax.device_put(x_host, NamedSharding(mesh, P("data", None)))
    y = jax.device_put(y_host, NamedSharding(mesh, P("data")))
    with jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext():
        new_params, _, metrics = jax.jit(step)(params, opt_state, x, y)
    return jax.device_get(new_params), float(metrics["loss"])


@pytest.fixture(scope="module")
def reference(cpu_devices):
    """Each step on an Auto mesh built with Mesh(...), the course's way."""
    mesh = build_mesh("Mesh(...)", cpu_devices)
    return {name: run_step(name, mesh, set_mesh=False) for name in STEPS}


def test_mesh_kinds_are_what_the_notebooks_say(cpu_devices):
    assert build_mesh("Mesh(...)", cpu_devices).axis_types == (AxisType.Auto,)
    assert jax.make_mesh((N,), ("data",), devices=cpu_devices).axis_types == (AxisType.Explicit,)


@pytest.mark.parametrize("kind, set_mesh", [("make_mesh Auto", False), ("make_mesh Auto", True), ("Explicit", True)])
@pytest.mark.parametrize("step_name", STEPS)
def test_every_step_runs_on_each_mesh_kind_with_the_same_result(cpu_devices, reference, step_name, kind, set_mesh):
    params, loss = run_step(step_name, build_mesh(kind, cpu_devices), set_mesh)
    ref_params, ref_loss = reference[step_name]
    assert train.max_abs_diff(params, ref_params) < 1e-6
    assert loss == pytest.approx(ref_loss, rel=1e-6)


@pytest.mark.parametrize("step_name", ["jit", "device_axis"])
def test_an_explicit_mesh_without_set_mesh_is_refused_with_the_fixes(cpu_devices, step_name):
    with pytest.raises(ValueError, match=r"Explicit axes \['data'\].*jax\.set_mesh\(mesh\).*AxisType\.Auto"):
        run_step(step_name, build_mesh("Explicit", cpu_devices), set_mesh=False)


def test_the_shard_map_step_takes_its_mesh_and_runs_on_an_explicit_mesh(cpu_devices, reference):
    params, _ = run_step("shard_map", build_mesh("Explicit", cpu_devices), set_mesh=False)
    assert train.max_abs_diff(params, reference["shard_map"][0]) < 1e-6


def test_single_device_and_host_batches_pass_the_check(cpu_devices):
    train.check_mesh_context(jax.device_put(np.zeros((4, 784), np.float32), cpu_devices[0]))
    train.check_mesh_context(np.zeros((4, 784), np.float32))
