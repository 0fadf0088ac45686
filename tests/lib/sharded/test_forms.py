"""dpcourse.sharded.forms and dpcourse.cross_compile.steps (lesson 10's builders): specs, bytes, accumulation checks, every form equal to replicated DP."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import model, train
from dpcourse.compiled import census, collectives
from dpcourse.config import make_config
from dpcourse.cross_compile import steps as sharded_steps
from dpcourse.sharded import forms as sharded

CFG = make_config("smoke")


def _mesh(n):
    return Mesh(np.array(jax.devices("cpu")[:n]), ("data",))


@pytest.mark.parametrize(
    "shape, n, expected",
    [((784, 32), 8, 0), ((32, 784), 8, 1), ((32, 32), 8, 0), ((10,), 8, None), ((784, 256), 3, None), ((6, 9), 3, 1)],
)
def test_largest_divisible_axis(shape, n, expected):
    assert sharded.largest_divisible_axis(shape, n) == expected


def test_leaf_spec_threshold_and_reasons():
    assert sharded.leaf_spec((784, 32), 8) == (P("data", None), None)
    assert sharded.leaf_spec((32,), 8) == (P(), "below threshold")
    assert sharded.leaf_spec((32,), 8, min_elements=0) == (P("data"), None)
    assert sharded.leaf_spec((), 8, min_elements=0) == (P(), "below threshold")
    assert sharded.leaf_spec((784, 256), 3) == (P(), "no axis divides by 3")


@pytest.mark.parametrize("n", [2, 4, 8])
def test_shard_specs_of_the_model_on_devices_that_divide(n):
    params = model.init_params(CFG)
    plan = sharded.shard_specs(params, n)
    assert plan.specs["w_in"] == P("data", None) and plan.specs["w_block"] == P("data", None)
    assert {path for path, _, why in plan.replicated} == {"['b_in']", "['b_block']", "['b_out']", "['w_out']"}
    assert all(why == "below threshold" for _, _, why in plan.replicated)
    assert "Left replicated on" in plan.describe() and "['w_out'] (32, 10)" in plan.describe()


def test_shard_specs_on_three_devices_names_every_leaf_that_does_not_divide():
    plan = sharded.shard_specs(model.init_params(make_config("cpu")), 3)
    assert all(spec == P() for spec in plan.specs.values())
    reasons = {path: why for path, _, why in plan.replicated}
    assert reasons["['w_in']"] == reasons["['w_block']"] == reasons["['w_out']"] == "no axis divides by 3"
    assert reasons["['b_out']"] == "below threshold"


def test_shard_specs_of_the_optimizer_state_follow_the_parameters():
    params = model.init_params(CFG)
    state = train.make_optimizer(CFG).init(params)
    specs = sharded.shard_specs(state, 8).specs
    assert specs[0].mu["w_in"] == specs[0].nu["w_in"] == P("data", None)
    assert specs[0].count == P()
    assert sharded.shard_specs(params, 1).replicated == []
    with pytest.raises(ValueError, match="n_devices must be >= 1"):
        sharded.shard_specs(params, 0)


def test_per_device_bytes_counts_shards(cpu_devices):
    mesh = _mesh(8)
    a = np.zeros((784, 32), np.float32)
    assert sharded.per_device_bytes(jax.device_put(a, NamedSharding(mesh, P()))) == a.nbytes
    assert sharded.per_device_bytes(jax.device_put(a, NamedSharding(mesh, P("data", None)))) == a.nbytes // 8
    assert sharded.per_device_bytes({}) == 0


def test_state_bytes_formula_and_what_fits():
    f = sharded.state_bytes_formula(1_000, 4, "replicated")
    assert (f["params"], f["grads"], f["adam"], f["total"]) == (4_000, 4_000, 8_000, 16_000)
    assert sharded.state_bytes_formula(1_000, 4, "zero1")["total"] == 4_000 + 4_000 + 2_000


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_zero1_state_ratio_is_12_over_4_plus_8_over_n_and_fsdp_is_n(n):
    assert sharded.state_ratio_formula(n, "zero1") == pytest.approx(12 / (4 + 8 / n))
    assert sharded.state_ratio_formula(n, "zero1") < 3
    assert sharded.state_ratio_formula(n, "fsdp") == pytest.approx(n)
    assert sharded.state_ratio_formula(n, "replicated") == 1
    assert sharded.state_bytes_formula(1_000, 4, "fsdp")["total"] == 4_000
    assert sharded.params_that_fit(24e9) == 1_500_000_000  # an L4's datasheet 24 GB at 16 bytes per parameter
    assert sharded.params_that_fit(141e9, 8, "fsdp") == 70_500_000_000
    with pytest.raises(ValueError, match="Unknown form 'zero2'"):
        sharded.state_bytes_formula(1, 1, "zero2")
    with pytest.raises(ValueError, match="reserve"):
        sharded.params_that_fit(1e9, reserve=1.0)


def test_check_accumulation_valid_and_nearest_values():
    assert sharded.check_accumulation(64, 4, 8) == 16
    with pytest.raises(ValueError, match=r"K = 5 microbatches do not divide the global batch 64.*\[4, 8\]"):
        sharded.check_accumulation(64, 5, 8)
    with pytest.raises(ValueError, match=r"18 examples.*Nearest valid K for this batch: \[3, 9\].*64 or 96"):
        sharded.check_accumulation(72, 4, 8)
    with pytest.raises(ValueError, match=r"No K works for a batch of 68 on 8 devices: keep K = 4.*64 or 96"):
        sharded.check_accumulation(68, 4, 8)
    with pytest.raises(ValueError, match="Need k >= 1"):
        sharded.check_accumulation(64, 0, 8)


def test_check_accumulation_says_the_batch_does_not_divide_by_the_devices_when_no_k_works():
    with pytest.raises(ValueError) as err:
        sharded.check_accumulation(63, 4, 8)
    message = str(err.value)
    assert "63 does not divide by 8 devices" in message
    assert "32 or 64" in message
    assert "[]" not in message


def test_split_microbatches_is_strided():
    x = np.arange(12).reshape(12, 1)
    xs = np.asarray(sharded.split_microbatches(x, 3))
    assert xs.shape == (3, 4, 1)
    for j in range(3):
        np.testing.assert_array_equal(xs[j, :, 0], np.arange(12)[j::3])


def _run(step, args, batches, steps=2):
    p = jax.device_put(model.init_params(CFG), jax.tree.map(lambda a: a.sharding, args[0]))
    state = train.make_optimizer(CFG).init(model.init_params(CFG))
    s = jax.device_put(state, jax.tree.map(lambda a: a.sharding, args[1]))
    for i in range(steps):
        x = jax.device_put(batches[i][0], args[2].sharding)
        y = jax.device_put(batches[i][1], args[3].sharding)
        p, s, m = step(p, s, x, y)
    return p, m


@pytest.mark.parametrize("n", [3, 8])
def test_every_form_equals_replicated_data_parallelism(cpu_devices, n):
    """ZeRO-1 and FSDP bitwise; accumulation within the course's CPU tolerance; counts on the CPU."""
    mesh = _mesh(n)
    rng = np.random.default_rng(1)
    gb = CFG.global_batch(n)
    batches = [(rng.random((gb, 784), dtype=np.float32), rng.integers(0, 10, gb).astype(np.int32)) for _ in range(2)]
    ref_step, ref_args = sharded_steps.replicated(CFG, mesh)
    ref, ref_m = _run(ref_step, ref_args, batches)
    tol, _ = train.equivalence_tolerances("cpu", CFG.learning_rate, steps=2)
    for name in ("zero1", "zero1_allreduce_first", "fsdp_naive", "fsdp_gathered", "accum_scan", "accum_reduced"):
        if name == "accum_reduced" and not sharded.has_reduced_shardings():
            continue
        step, args = getattr(sharded_steps, name)(CFG, mesh)
        got, m = _run(step, args, batches)
        diff = train.max_abs_diff(ref, got)
        if name.startswith("accum"):
            assert diff < tol, (name, diff)
        else:
            assert diff == 0.0, (name, diff)
        assert abs(float(m["loss"]) - float(ref_m["loss"])) < 1e-5
        if n == 8 and name == "fsdp_gathered":
            assert got["w_in"].sharding.spec == P("data", None)  # the parameters stay sharded between steps


def test_cpu_census_of_the_accumulation_forms(cpu_devices):
    mesh = _mesh(8)
    scan_step, scan_args = sharded_steps.accum_scan(CFG, mesh)
    scan = census.census(collectives.collective_report(scan_step, *scan_args))
    assert scan["all-reduce"].in_loop >= 1 and scan["all-reduce"].runs_per_step >= sharded_steps.ACCUM_K
    if sharded.has_reduced_shardings():
        red_step, red_args = sharded_steps.accum_reduced(CFG, mesh)
        red = census.census(collectives.collective_report(red_step, *red_args))
        assert red["all-reduce"] == census.KindCensus(1, 0, 1, red["all-reduce"].bytes_per_step)
        assert red["all-reduce"].bytes_per_step == model.param_count(CFG) * 4 + 8  # gradient + loss, accuracy


def test_forward_explicit_equals_the_model(cpu_devices):
    from jax.sharding import AxisType

    emesh = Mesh(np.array(jax.devices("cpu")), ("data",), axis_types=(AxisType.Explicit,))
    params = model.init_params(CFG)
    x = np.random.default_rng(2).random((16, 784), dtype=np.float32)
    with jax.set_mesh(emesh):
        pe = jax.device_put(params, NamedSharding(emesh, P()))
        xe = jax.device_put(x, NamedSharding(emesh, P("data", None)))
        got = jax.jit(lambda p, x: sharded.forward_explicit(p, x, CFG))(pe, xe)
    want = model.forward(params, x, CFG.block_repeats, CFG.block_mix)
    assert train.max_abs_diff(got, want) < 1e-6


def test_reduced_step_refuses_a_jax_without_reduced_shardings(monkeypatch):
    monkeypatch.setattr(sharded, "has_reduced_shardings", lambda: False)
    with pytest.raises(RuntimeError, match="reduced=...") as err:
        sharded.make_reduced_accumulation_step(CFG, train.make_optimizer(CFG), 4)
    assert jax.__version__ in str(err.value)


def _gather_then_scatter(mesh):
    rows, rep = NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P())

    def step(w, x):
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ sharded.constrain(w, rep))))(w)
        return w - 0.1 * sharded.constrain(g, rows)

    w = jax.device_put(np.ones((64, 32), np.float32), rows)
    x = jax.device_put(np.ones((16, 64), np.float32), rows)
    return jax.jit(step, in_shardings=(rows, rows), out_shardings=rows), w, x


@pytest.mark.parametrize("kind", ["Auto", "Explicit"])
def test_constrain_places_on_a_mesh_of_either_axis_type(cpu_devices, kind):
    # On Explicit axes with_sharding_constraint only asserts ("acts as an assert when all axes of mesh
    # are of type Explicit"): constrain reshards there, and both kinds gather the weight the same way.
    mesh = Mesh(np.array(cpu_devices), ("data",), axis_types=(getattr(jax.sharding.AxisType, kind),))
    with jax.set_mesh(mesh):
        step, w, x = _gather_then_scatter(mesh)
        text = step.lower(w, x).compile().as_text()
        out = step(w, x)
    assert out.sharding.spec == P("data", None)
    assert collectives.parse_hlo(text).of_kind("all-gather"), "the weight is gathered"


def test_constrain_refuses_what_it_cannot_place(cpu_devices):
    auto = Mesh(np.array(cpu_devices), ("data",))
    explicit = Mesh(np.array(cpu_devices), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    with pytest.raises(ValueError, match="Explicit axes and of Auto axes at once"):
        sharded.constrain([np.ones(8), np.ones(8)], [NamedSharding(auto, P()), NamedSharding(explicit, P())])
    with pytest.raises(ValueError, match="NamedSharding"):
        sharded.constrain(np.ones(8), P())


def test_step_names_and_form_labels_match():
    assert list(sharded_steps.STEPS) == list(sharded_steps.FORM_LABELS)
    for name, path in sharded_steps.STEPS.items():
        module, func = path.split(":")
        assert module == "dpcourse.cross_compile.steps" and callable(getattr(sharded_steps, func)), name
