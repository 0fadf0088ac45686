"""Tests of dpcourse.train: data parallelism changes nothing but placement.

For the same global batch and the same initial parameters, each
data-parallel form the course teaches must give the same parameters,
optimizer state, loss and accuracy as one device, after one step and after
three, on 2, 4 and 8 simulated CPU devices:

- ``jit``: ``jax.jit(make_train_step)`` on sharded arrays (notebook 04),
- ``shard_map``: ``jax.jit(make_shard_map_step)`` (notebook 05),
- ``pmap``: ``make_pmap_step`` with ``replicate``/``split_for_pmap`` (notebook 06),
- ``device_axis``: ``jax.jit(make_device_axis_step)`` (notebook 04's fix).

AdamW's first update is ``lr * g / (|g| + eps)``, nearly blind to the scale
of the gradient, so comparing parameters alone would not catch a gradient
N times too large (``psum`` for ``pmean``). The tests therefore also compare
the optimizer state: after the first step Adam's first moment is exactly
``(1 - b1) * g`` and its second ``(1 - b2) * g**2``, i.e. the raw gradient.

Tolerances (float32; the forms sum the same terms in another order:
per-shard partial sums, then an all-reduce):
- gradients: |g| <= 0.08 here, float32 unit roundoff 6e-8; the measured
  largest difference is 3.3e-8. GRAD_ATOL = 1e-6 is 30 x that, and 1e4 x
  smaller than the error of a gradient scaled by N >= 2 (|g| max = 0.08).
- parameters after AdamW: measured 7.5e-7 at most. PARAM_ATOL = 1e-5 is
  30 x below one AdamW step (lr = 3e-4), so a missed, doubled or reversed
  update shows. (AdamW divides by |g| + 1e-8, so an element whose gradient
  sits within float32 error of zero could legitimately move further; with
  these fixed seeds none does.)
- loss: about 2.4, so one float32 ulp is 2.4e-7 (measured 4.8e-7).
  LOSS_ATOL = 1e-5, while one shard's loss differs from the global mean by
  about 0.06 here.
- accuracy: a multiple of 1/64 computed from the same argmax: equal
  (ACC_ATOL = 1e-6).
"""

from __future__ import annotations

import functools
import math
import re

import jax
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import data, model, train
from dpcourse.config import make_config

CFG = make_config("smoke")
GLOBAL_BATCH = 64  # divides by 2, 4 and 8
N_STEPS = 3
GRAD_ATOL = 1e-6
PARAM_ATOL = 1e-5
LOSS_ATOL = 1e-5
ACC_ATOL = 1e-6
FORMS = ("jit", "shard_map", "pmap", "device_axis")
DEVICE_COUNTS = (2, 4, 8)


@functools.cache
def batches() -> tuple[np.ndarray, np.ndarray]:
    """Three different global batches of the synthetic set: [3, 64, 784], [3, 64]."""
    images, labels = data.synthetic_images(N_STEPS * GLOBAL_BATCH, seed=3)
    x, y = data.prepare(images, labels, seed=3)
    return x.reshape(N_STEPS, GLOBAL_BATCH, -1), y.reshape(N_STEPS, GLOBAL_BATCH)


def adam_moments(opt_state):
    """The ScaleByAdamState inside an AdamW state (mu, nu: gradient moments)."""
    return next(
        s
        for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
        if isinstance(s, optax.ScaleByAdamState)
    )


@pytest.fixture(autouse=True)
def _on_the_cpu_devices(cpu_devices):
    """Every computation here runs on the simulated CPU devices, also on a GPU host.

    The meshes and the pmap devices are CPU devices (``jax.devices("cpu")``);
    anything not placed explicitly (the one-device references) goes to CPU 0
    too, so that both sides of a comparison are float32 on the same platform
    (a GPU's default TF32 matmuls would differ by ~1e-3).
    """
    with jax.default_device(cpu_devices[0]):
        yield


def on_cpu0(tree):
    return jax.device_put(tree, jax.devices("cpu")[0])


def mesh_of(n: int) -> Mesh:
    return Mesh(np.array(jax.devices("cpu")[:n]), ("data",))


@functools.cache
def run(form: str, n: int) -> tuple[list, frozenset]:
    """Run N_STEPS AdamW steps; returns host (params, opt_state, metrics) per step
    and the set of devices the final parameters live on."""
    optimizer = train.make_optimizer(CFG)
    params = model.init_params(CFG)
    opt_state = optimizer.init(params)
    xs, ys = batches()
    devs = jax.devices("cpu")[:n]
    if form == "reference":
        step = jax.jit(train.make_train_step(CFG, optimizer))
        params, opt_state = jax.device_put((params, opt_state), devs[0])

        def put(x, y):
            return jax.device_put((x, y), devs[0])
    elif form == "pmap":
        step = train.make_pmap_step(CFG, optimizer, devices=devs)
        params, opt_state = train.replicate(params, devs), train.replicate(opt_state, devs)

        def put(x, y):
            x, y = train.split_for_pmap(x, n), train.split_for_pmap(y, n)
            train.check_pmap_leading_axis((x, y), n)
            return x, y
    else:
        mesh = mesh_of(n)
        makers = {
            "jit": lambda: train.make_train_step(CFG, optimizer),
            "shard_map": lambda: train.make_shard_map_step(CFG, optimizer, mesh),
            "device_axis": lambda: train.make_device_axis_step(CFG, optimizer, n),
        }
        step = jax.jit(makers[form]())
        params, opt_state = jax.device_put((params, opt_state), NamedSharding(mesh, P()))

        def put(x, y):
            return (
                jax.device_put(x, NamedSharding(mesh, P("data", None))),
                jax.device_put(y, NamedSharding(mesh, P("data"))),
            )

    history = []
    for i in range(N_STEPS):
        params, opt_state, metrics = step(params, opt_state, *put(xs[i], ys[i]))
        state = (params, opt_state, metrics)
        if form == "pmap":
            loss = np.asarray(metrics["loss"])
            assert loss.shape == (n,) and np.all(loss == loss[0]), f"pmap metrics differ across devices: {loss}"
            state = train.unreplicate(state)
        history.append(jax.device_get(state))
    placed_on = frozenset(params["w_in"].sharding.device_set)
    return history, placed_on


@pytest.mark.parametrize("n", DEVICE_COUNTS)
@pytest.mark.parametrize("form", FORMS)
def test_data_parallel_step_runs_on_all_n_devices(form, n):
    _, placed_on = run(form, n)
    assert placed_on == frozenset(jax.devices("cpu")[:n])


@pytest.mark.parametrize("steps", (1, N_STEPS))
@pytest.mark.parametrize("n", DEVICE_COUNTS)
@pytest.mark.parametrize("form", FORMS)
def test_same_result_as_one_device(form, n, steps):
    ref_params, ref_state, ref_metrics = run("reference", 1)[0][steps - 1]
    params, opt_state, metrics = run(form, n)[0][steps - 1]
    where = f"{form} on {n} devices after {steps} step(s)"

    # Gradients, through Adam's moments (see the module docstring).
    b1 = 0.9  # optax.adamw's default
    mu_diff = train.max_abs_diff(adam_moments(opt_state).mu, adam_moments(ref_state).mu)
    grad_diff = mu_diff / (1 - b1) if steps == 1 else mu_diff
    assert grad_diff <= GRAD_ATOL, f"{where}: gradient (Adam first moment) differs by {grad_diff:.3g}"
    # nu = (1 - b2) g^2 with b2 = 0.999: an error dg moves it by about
    # 0.001 * 2 |g| dg <= 0.001 * 2 * 0.1 * GRAD_ATOL = 2e-10 per step.
    nu_diff = train.max_abs_diff(adam_moments(opt_state).nu, adam_moments(ref_state).nu)
    assert nu_diff <= 2e-10 * steps, f"{where}: Adam second moment differs by {nu_diff:.3g}"

    param_diff = train.max_abs_diff(params, ref_params)
    assert param_diff <= PARAM_ATOL, f"{where}: parameters differ by {param_diff:.3g}"
    assert abs(float(metrics["loss"]) - float(ref_metrics["loss"])) <= LOSS_ATOL, where
    assert abs(float(metrics["accuracy"]) - float(ref_metrics["accuracy"])) <= ACC_ATOL, where


def test_reference_actually_trains():
    # Guards the equivalence tests against comparing runs that do nothing.
    history, _ = run("reference", 1)
    first, last = history[0], history[-1]
    assert train.max_abs_diff(last[0], jax.device_get(model.init_params(CFG))) > 1e-4  # 3 AdamW steps of lr 3e-4
    assert int(adam_moments(last[1]).count) == N_STEPS
    assert math.isfinite(float(last[2]["loss"])) and float(first[2]["loss"]) > 0


# --------------------------------------------------------------------------
# The traps the course shows, checked (n = 4 devices)

TRAP_N = 4


@functools.cache
def reference_grads_step0():
    """Gradient of the global mean loss on one device, first batch."""
    xs, ys = batches()
    x, y = xs[0], ys[0]
    grad = jax.jit(jax.grad(lambda p, x, y: model.loss_and_metrics(p, x, y, CFG)[0]))
    return grad(*on_cpu0((model.init_params(CFG), x, y)))


def shard_map_grads(reduce, cast: bool, check_vma: bool = True):
    """Per-shard gradients inside shard_map, reduced with ``reduce`` over 'data'."""
    mesh = mesh_of(TRAP_N)

    def local(params, x, y):
        if cast:
            params = jax.lax.pcast(params, "data", to="varying")
        grads = jax.grad(lambda p: model.loss_and_metrics(p, x, y, CFG)[0])(params)
        return reduce(grads, "data")

    return jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data", None), P("data")), out_specs=P(), check_vma=check_vma)
    )


def leaf_ratios(grads, ref) -> list[float]:
    return [
        float(np.linalg.norm(np.asarray(g)) / np.linalg.norm(np.asarray(r)))
        for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref))
    ]


def test_pcast_then_pmean_gives_the_reference_gradient():
    xs, ys = batches()
    grads = shard_map_grads(jax.lax.pmean, cast=True)(model.init_params(CFG), xs[0], ys[0])
    assert train.max_abs_diff(grads, reference_grads_step0()) <= GRAD_ATOL


def test_trap_psum_instead_of_pmean_scales_gradients_by_n():
    xs, ys = batches()
    ref = reference_grads_step0()
    grads = shard_map_grads(jax.lax.psum, cast=True)(model.init_params(CFG), xs[0], ys[0])
    # Each leaf is N x the reference (to float32 rounding of the norms).
    assert leaf_ratios(grads, ref) == pytest.approx([TRAP_N] * len(ref), rel=1e-5)
    assert train.max_abs_diff(grads, ref) > 1000 * GRAD_ATOL  # the equivalence test would fail


def test_trap_differentiating_invariant_params_without_pcast_is_n_times_too_large():
    # JAX 0.10.2 with check_vma=True: the gradient of an input that is
    # invariant over 'data' (in_specs P()) is already summed over the axis by
    # the transpose; pmean on top leaves the SUM, N x the mean gradient.
    # make_shard_map_step casts the params to varying first for this reason.
    # If this fails after a JAX upgrade, the course's explanation in
    # notebook 05 and the comment in make_shard_map_step need revisiting.
    xs, ys = batches()
    ref = reference_grads_step0()
    grads = shard_map_grads(jax.lax.pmean, cast=False)(model.init_params(CFG), xs[0], ys[0])
    assert leaf_ratios(grads, ref) == pytest.approx([TRAP_N] * len(ref), rel=1e-5), (
        "JAX changed how shard_map differentiates replicated inputs (expected N x the reference)"
    )


def _per_shard_loss(params, x, y):
    return model.loss_and_metrics(params, x, y, CFG)[0]  # no collective: each shard's own mean


def test_trap_per_shard_loss_returned_as_replicated_is_one_devices_loss():
    xs, ys = batches()
    mesh = mesh_of(TRAP_N)
    params = model.init_params(CFG)
    wrong = jax.jit(
        jax.shard_map(
            _per_shard_loss, mesh=mesh, in_specs=(P(), P("data", None), P("data")), out_specs=P(), check_vma=False
        )
    )(params, xs[0], ys[0])
    loss = jax.jit(_per_shard_loss)
    per_device = GLOBAL_BATCH // TRAP_N
    first_shard = float(loss(*on_cpu0((params, xs[0][:per_device], ys[0][:per_device]))))
    global_mean = float(loss(*on_cpu0((params, xs[0], ys[0]))))
    assert float(wrong) == pytest.approx(first_shard, abs=LOSS_ATOL)
    assert abs(float(wrong) - global_mean) > 100 * LOSS_ATOL  # visibly not the mean


def test_trap_per_shard_loss_is_refused_when_check_vma_is_on():
    xs, ys = batches()
    f = jax.jit(
        jax.shard_map(
            _per_shard_loss,
            mesh=mesh_of(TRAP_N),
            in_specs=(P(), P("data", None), P("data")),
            out_specs=P(),
            check_vma=True,
        )
    )
    with pytest.raises(ValueError, match="out_specs"):
        f(model.init_params(CFG), xs[0], ys[0])


def test_trap_collective_under_plain_jit_is_an_unbound_axis_name():
    with pytest.raises(NameError, match="unbound axis name: data"):
        jax.jit(lambda g: jax.lax.pmean(g, "data"))(np.ones(3, np.float32))


# --------------------------------------------------------------------------
# Batch checks and pmap helpers


def test_check_global_batch_names_batch_devices_and_nearest_sizes():
    with pytest.raises(ValueError) as err:
        train.check_global_batch(100, 8)
    message = str(err.value)
    assert "Global batch 100" in message and "8 devices" in message
    assert "96 or 104" in message


@pytest.mark.parametrize("batch, n", [(0, 8), (-8, 8), (8, 0)])
def test_check_global_batch_rejects_non_positive_values(batch, n):
    with pytest.raises(ValueError):
        train.check_global_batch(batch, n)


def test_nearest_valid_batches():
    assert train.nearest_valid_batches(100, 8) == (96, 104)
    assert train.nearest_valid_batches(96, 8) == (96, 104)
    assert train.nearest_valid_batches(3, 4) == (4, 8)


def test_split_for_pmap_gives_each_device_consecutive_examples():
    x = np.arange(12 * 2).reshape(12, 2)
    split = train.split_for_pmap(x, 4)
    assert split.shape == (4, 3, 2)
    np.testing.assert_array_equal(split[1], x[3:6])


def test_split_for_pmap_rejects_an_uneven_batch():
    with pytest.raises(ValueError, match="Global batch 10 does not divide evenly over 4 devices"):
        train.split_for_pmap(np.zeros((10, 784)), 4)


def test_check_pmap_leading_axis_accepts_stacked_inputs():
    train.check_pmap_leading_axis({"x": np.zeros((8, 4, 784)), "y": np.zeros((8, 4))}, 8)


def test_check_pmap_leading_axis_names_the_array_and_the_fix():
    with pytest.raises(ValueError) as err:
        train.check_pmap_leading_axis({"x": np.zeros((64, 784))}, 8)
    message = str(err.value)
    assert "['x']" in message and "(64, 784)" in message
    assert "device count 8" in message and "split_for_pmap" in message and "replicate()" in message


def test_check_pmap_leading_axis_rejects_a_scalar():
    with pytest.raises(ValueError, match=r"shape \(\)"):
        train.check_pmap_leading_axis({"lr": np.float32(0.1)}, 2)


def test_check_pmap_leading_axis_wants_one_typed_key_per_device():
    # split(key, (4, 2)) has leading axis 4 but two keys per device.
    keys = jax.random.split(jax.random.key(0), (4, 2))
    with pytest.raises(ValueError) as err:
        train.check_pmap_leading_axis(keys, 4)
    message = str(err.value)
    assert "(4, 2)" in message and "one key per device" in message
    assert "jax.random.split(key, 4)" in message


def test_check_pmap_leading_axis_accepts_split_keys_beside_data():
    keys = jax.random.split(jax.random.key(0), 4)
    train.check_pmap_leading_axis((keys, np.zeros((4, 8))), 4)


@pytest.mark.parametrize("shape", [(), (3,), (4, 1)])
def test_check_pmap_leading_axis_rejects_other_typed_key_shapes(shape):
    keys = jax.random.split(jax.random.key(0), shape) if shape else jax.random.key(0)
    with pytest.raises(ValueError, match=re.escape(f"shape {shape}")):
        train.check_pmap_leading_axis({"key": keys}, 4)


def test_check_pmap_keys_accepts_typed_and_legacy_keys():
    train.check_pmap_keys(jax.random.split(jax.random.key(0), 4), 4)
    train.check_pmap_keys(jax.random.split(jax.random.PRNGKey(0), 4), 4)  # uint32 (4, 2)


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: jax.random.split(jax.random.key(0), (4, 2)), "(4, 2)"),
        (lambda: jax.random.split(jax.random.PRNGKey(0), (4, 2)), "(4, 2, 2)"),
        (lambda: jax.random.split(jax.random.PRNGKey(0), 3), "(3, 2)"),
        (lambda: np.zeros((4, 2), np.float32), "(4, 2)"),
    ],
)
def test_check_pmap_keys_names_the_shape_and_the_fix(make, shape):
    with pytest.raises(ValueError) as err:
        train.check_pmap_keys(make(), 4)
    assert shape in str(err.value) and "jax.random.split(key, 4)" in str(err.value)


def test_device_axis_step_rejects_an_uneven_batch():
    optimizer = train.make_optimizer(CFG)
    params = model.init_params(CFG)
    step = jax.jit(train.make_device_axis_step(CFG, optimizer, 8))
    with pytest.raises(ValueError, match="Global batch 12 does not divide evenly over 8 devices"):
        step(params, optimizer.init(params), np.zeros((12, 784), np.float32), np.zeros(12, np.int32))


def test_replicate_and_unreplicate():
    devs = jax.devices("cpu")[:4]
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.int32(5)}
    rep = train.replicate(tree, devs)
    assert rep["w"].shape == (4, 2, 3) and rep["step"].shape == (4,)
    assert rep["w"].sharding.device_set == set(devs)
    for shard in rep["w"].addressable_shards:  # one full copy per device
        np.testing.assert_array_equal(np.asarray(shard.data)[0], tree["w"])
    back = train.unreplicate(rep)
    np.testing.assert_array_equal(back["w"], tree["w"])
    assert int(back["step"]) == 5


def test_unreplicate_takes_a_pmap_output_apart_under_an_explicit_mesh_set_in_context():
    # Notebook 06 under a global Explicit mesh: pmap's arrays live on its own (Auto) mesh, which JAX
    # refuses to index under another mesh in context ("Context mesh ... should match the mesh of sharding").
    devs = jax.devices("cpu")[:4]
    rep = train.replicate({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, devs)
    explicit = Mesh(np.array(devs), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    with jax.set_mesh(explicit):
        back = train.unreplicate(rep)
    np.testing.assert_array_equal(back["w"], np.arange(6, dtype=np.float32).reshape(2, 3))


def test_unreplicate_inside_jit_indexes_the_traced_arrays():
    devs = jax.devices("cpu")[:4]
    rep = train.replicate({"w": np.ones((2, 3), np.float32)}, devs)
    assert jax.jit(train.unreplicate)(rep)["w"].shape == (2, 3)


def test_max_abs_diff():
    a = {"w": np.array([1.0, 2.0], np.float32), "b": np.array([0.5], np.float32)}
    b = {"w": np.array([1.0, 2.25], np.float32), "b": np.array([0.5], np.float32)}
    assert train.max_abs_diff(a, b) == 0.25
    assert train.max_abs_diff(a, a) == 0.0
    with pytest.raises(ValueError, match="tree structures"):
        train.max_abs_diff(a, {"w": a["w"]})
    with pytest.raises(ValueError, match="shapes differ"):
        train.max_abs_diff(a, {"w": a["w"], "b": np.zeros(2, np.float32)})


def test_equivalence_tolerances_are_tight_on_cpu_and_honest_on_gpu():
    param_cpu, grad_cpu = train.equivalence_tolerances("cpu", 3e-4, steps=3)
    param_gpu, grad_gpu = train.equivalence_tolerances("gpu", 3e-4, steps=3)
    assert (param_cpu, grad_cpu) == (1e-5, 1e-4)
    # AdamW moves a weight by at most about lr per step: 2 x lr x steps.
    assert param_gpu == pytest.approx(2 * 3e-4 * 3)
    # Even the looser GPU gradient tolerance catches a gradient scaled by N >= 2.
    assert grad_gpu < 1.0


def test_first_step_gradient_diff_sees_a_scaled_gradient_that_adamw_hides():
    opt = train.make_optimizer(CFG)
    params = model.init_params(CFG)
    rng = np.random.default_rng(1)
    grads = jax.tree.map(lambda a: rng.standard_normal(a.shape).astype(np.float32), params)
    _, state_ref = opt.update(grads, opt.init(params), params)
    _, state_same = opt.update(grads, opt.init(params), params)
    _, state_scaled = opt.update(jax.tree.map(lambda g: 8 * g, grads), opt.init(params), params)
    diff_same, scale = train.first_step_gradient_diff(state_ref, state_same)
    diff_scaled, _ = train.first_step_gradient_diff(state_ref, state_scaled)
    assert diff_same == 0.0
    # mu = (1 - b1) g, divided back out: the difference is 7 x the largest gradient.
    assert diff_scaled == pytest.approx(7 * scale, rel=1e-5)


def test_first_step_gradient_diff_accepts_the_pmap_state_on_either_side():
    opt = train.make_optimizer(CFG)
    params = model.init_params(CFG)
    grads = jax.tree.map(lambda a: np.ones_like(a), params)
    _, state = opt.update(grads, opt.init(params), params)
    stacked = jax.tree.map(lambda a: np.stack([np.asarray(a)] * 2), state)
    # A pmap state (leading device axis) is compared through device 0's copy.
    for a, b in ((stacked, state), (state, stacked)):
        assert train.first_step_gradient_diff(a, b) == (0.0, pytest.approx(1.0))


def placed(n: int, global_batch: int = GLOBAL_BATCH):
    """Fresh parameters and AdamW state replicated over ``n`` devices, and the first batch sharded."""
    mesh = mesh_of(n)
    params = jax.device_put(model.init_params(CFG), NamedSharding(mesh, P()))
    x, y = (jax.device_put(a[0][:global_batch], NamedSharding(mesh, P("data"))) for a in batches())
    return params, train.make_optimizer(CFG).init(params), x, y


def shard_map_first_step(cfg, n: int, global_batch: int = GLOBAL_BATCH, **options):
    """One jitted ``make_shard_map_step`` on ``n`` devices: ``(step, arguments, (params, opt_state, metrics))``."""
    step = jax.jit(train.make_shard_map_step(cfg, train.make_optimizer(cfg), mesh_of(n), **options))
    args = placed(n, global_batch)
    return step, args, step(*args)


def test_shard_map_step_can_reduce_gradients_in_bfloat16():
    # Notebook 09: the pmean in bfloat16 asks for half the all-reduce bytes and
    # gives the float32 gradient rounded to bfloat16 (8 significant bits).
    s_ref = shard_map_first_step(CFG, 4)[2][1]
    half, args, (_, s_half, _) = shard_map_first_step(CFG, 4, reduce_dtype="bfloat16")
    diff, scale = train.first_step_gradient_diff(s_ref, s_half)
    # bfloat16 rounding of the mean (up to 2^-8 relative) plus the rounding of each
    # shard's gradient before the sum: well under 1 % of the largest element.
    assert 0 < diff / scale < 1e-2
    assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(train.adam_first_moment(s_half)))
    from dpcourse.compiled import hlo

    written = hlo.written_all_reduce_bytes(half.lower(*args).as_text())
    assert {dtype for dtype, _ in written} >= {"bf16"}
    grads_bf16 = sum(b for d, b in written if d == "bf16")
    assert grads_bf16 == model.param_count(CFG) * 2  # every gradient value, 2 bytes


def test_the_written_backward_passes_run_per_device_in_the_shard_map_step(n=3):
    # Off a TPU the Pallas kernel runs in interpret mode. Each gradient is as close to the float32 step's
    # as JAX's own bfloat16 gradient is (a kernel's sum over all devices' rows would be n times too large),
    # and the loss is JAX's bfloat16 loss exactly: only the backward pass differs.
    def first_step(how, dtype="bfloat16"):
        _, _, (_, state, metrics) = shard_map_first_step(
            CFG.with_overrides(compute_dtype=dtype, block_backward=how), n, global_batch=48
        )
        return train.adam_first_moment(state), metrics["loss"]

    (exact, _), (jaxs, loss) = first_step("autodiff", "float32"), first_step("autodiff")
    for how in ("saved_slope", "pallas"):
        mine, my_loss = first_step(how)
        assert my_loss == loss, how
        for name, ref in exact.items():
            d_jax, d_mine = (float(np.linalg.norm(g[name] - ref)) for g in (jaxs, mine))
            assert d_mine <= 2 * d_jax + 2**-8 * float(np.linalg.norm(ref)), (how, name)


def test_the_pallas_kernel_names_the_step_that_runs_it_and_a_global_batch_that_fits():
    pallas = CFG.with_overrides(compute_dtype="bfloat16", block_backward="pallas")
    optimizer = train.make_optimizer(pallas)
    params, opt_state, x, y = placed(2)
    with pytest.raises(ValueError, match="jit spreads the batch over 2 devices .* use train.make_shard_map_step"):
        jax.jit(train.make_train_step(pallas, optimizer))(params, opt_state, x, y)
    x, y = (jax.device_put(np.zeros((1200,) + a.shape[1:], a.dtype), a.sharding) for a in (x, y))
    tile_error = "batch is 600 rows: .* each device \\(2 in all\\) .* \\(for example 1024 or 2048\\)"
    with pytest.raises(ValueError, match=tile_error):
        jax.jit(train.make_shard_map_step(pallas, optimizer, mesh_of(2)))(params, opt_state, x, y)
    devs = jax.devices("cpu")[:2]
    with pytest.raises(ValueError, match=tile_error):  # pmap's axis splits the batch too
        train.make_pmap_step(pallas, optimizer, devs)(
            *train.replicate((model.init_params(CFG), opt_state), devs), *(train.split_for_pmap(a, 2) for a in (x, y))
        )
