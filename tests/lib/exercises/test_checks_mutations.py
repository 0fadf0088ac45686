"""A wrong step cell is "Not yet", with its cause in the learner's terms; the lessons' own cells stay "Correct".

Each test plants one mistake a learner makes (a 1.3x learning rate, a
gradient 1.1x or 1.02x too large, the weight decay's sign flipped, ``psum``
for ``pmean``, the ``pcast`` removed, ``sum`` for ``mean``, an accumulated
gradient not divided by K) into a copy of the lesson's cell, taken from the
lesson's ``.py`` as committed, and checks it as the lesson does: 04's
``make_device_axis_step`` and 05's ``make_shard_map_step`` with
``check_against``, 10's accumulation with ``checks.compare_steps``
against replicated data parallelism. Smoke-profile sizes on 4 simulated
CPU devices, a fraction of a second per check.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import jupytext
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import model, train
from dpcourse.config import make_config
from dpcourse.exercises import checks
from dpcourse.exercises.base import CORRECT, WRONG
from dpcourse.exercises.cells import check_against

ROOT = Path(__file__).resolve().parents[3]
CFG = make_config("smoke")
N = 4  # simulated devices the steps run on: the cause must name N = 4


def lesson_source(stem: str, *names: str) -> str:
    """The lesson's code cells that define ``names``, in lesson order."""
    cells = [c.source for c in jupytext.read(ROOT / "notebooks" / f"{stem}.py").cells if c.cell_type == "code"]
    chosen = [src for src in cells if any(re.search(rf"^def {n}\(", src, flags=re.M) for n in names)]
    assert chosen, f"{stem}: no cell defines {names}"
    return "\n\n".join(chosen)


def plant(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"the lesson's cell no longer holds {old!r}: update this test's mutation"
    return source.replace(old, new)


@functools.cache
def setting():
    mesh = Mesh(np.array(jax.devices()[:N]), ("data",))
    opt = train.make_optimizer(CFG)
    params = jax.device_put(model.init_params(CFG), NamedSharding(mesh, P()))
    rng = np.random.default_rng(3)
    rows = N * CFG.per_device_batch
    x = jax.device_put(rng.random((rows, 784), dtype=np.float32), NamedSharding(mesh, P("data", None)))
    y = jax.device_put(rng.integers(0, 10, rows).astype(np.int32), NamedSharding(mesh, P("data")))
    return mesh, opt, (params, opt.init(params), x, y)


def run_cells(source: str, **names) -> dict:
    namespace = dict(jax=jax, jnp=jnp, optax=optax, functools=functools, model=model, P=P, cfg=CFG, **names)
    exec(compile(source, "<lesson cell>", "exec"), namespace)
    return namespace


def check_04(source: str):
    _, opt, args = setting()
    mine = run_cells(source)["make_device_axis_step"](opt, N)
    return check_against(train.make_device_axis_step(CFG, opt, N), mine, *args)


def check_05(source: str):
    mesh, opt, args = setting()
    mine = run_cells(source)["make_shard_map_step"](opt, mesh)
    return check_against(train.make_shard_map_step(CFG, opt, mesh), mine, *args)


SRC_04 = lesson_source("04_sharding", "make_device_axis_step")
SRC_05 = lesson_source("05_shard_map", "local_grads", "make_shard_map_step")
APPLY = "return optax.apply_updates(params, updates), opt_state, metrics"
LR_13 = "return optax.apply_updates(params, jax.tree.map(lambda u: 1.3 * u, updates)), opt_state, metrics"
UPDATE = "optimizer.update(grads, opt_state, params)"
FLIPPED_DECAY = "optimizer.update(grads, opt_state, jax.tree.map(jnp.negative, params))"  # decay pulls outwards
MEAN_04 = "grads = jax.tree.map(lambda g: g.mean(axis=0), grads)"
PMEAN_05 = 'grads = jax.lax.pmean(grads, "data")'
PCAST_05 = 'params = jax.lax.pcast(params, "data", to="varying")'


def test_the_lessons_own_step_cells_are_correct():
    for fb in (check_04(SRC_04), check_05(SRC_05)):
        assert fb.status == CORRECT, fb


MUTATIONS = {
    # id: (lesson, old, new, words the verdict must hold)
    "04 learning rate 1.3x": ("04", APPLY, LR_13, ["1.3x", "the learning rate?", "while the gradients agree"]),
    "05 learning rate 1.3x": ("05", APPLY, LR_13, ["1.3x", "the learning rate?"]),
    "04 gradient 1.1x": ("04", MEAN_04, MEAN_04.replace("g.mean(axis=0)", "1.1 * g.mean(axis=0)"), ["1.1x"]),
    "04 gradient 1.02x": ("04", MEAN_04, MEAN_04.replace("g.mean(axis=0)", "1.02 * g.mean(axis=0)"), ["1.02x"]),
    "05 gradient 1.02x": (
        "05",
        PMEAN_05,
        PMEAN_05 + "\n    grads = jax.tree.map(lambda g: 1.02 * g, grads)",
        ["1.02x"],
    ),
    "04 weight decay sign flipped": ("04", UPDATE, FLIPPED_DECAY, ["weight decay", "flipped sign"]),
    "05 weight decay sign flipped": ("05", UPDATE, FLIPPED_DECAY, ["weight decay", "flipped sign"]),
    "04 sum for mean": ("04", MEAN_04, MEAN_04.replace("g.mean(axis=0)", "g.sum(axis=0)"), ["4x", "N = 4 devices"]),
    "05 psum for pmean": ("05", PMEAN_05, PMEAN_05.replace("pmean", "psum"), ["4x", "N = 4 devices"]),
    "05 pcast removed": ("05", PCAST_05, "pass", ["4x", "N = 4 devices"]),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_planted_mistake_is_not_yet_with_its_cause(name):
    lesson, old, new, words = MUTATIONS[name]
    fb = (check_04 if lesson == "04" else check_05)(plant(SRC_04 if lesson == "04" else SRC_05, old, new))
    assert fb.status == WRONG, fb
    assert str(fb).split("] ", 1)[1].startswith("Not yet: Your cell computes something else"), fb
    for word in words:
        assert word in fb.message, fb
    assert "output[" not in fb.message and ".mu[" not in fb.message, fb  # words, not pytree paths


def test_a_sum_for_mean_names_the_gradients_and_the_leaf_in_words():
    fb = check_04(plant(SRC_04, MEAN_04, MEAN_04.replace("g.mean(axis=0)", "g.sum(axis=0)")))
    assert "your gradients are 4x the reference's (N = 4 devices): summed instead of averaged (a psum" in fb.message, fb
    assert "the optimizer's first moment" in fb.message and "tolerated" in fb.message, fb


def lesson_10_accumulation(source: str, mesh, opt, args):
    """Run lesson 10's accumulation cell (it also compiles its step on the lesson's first batch)."""
    from jax.sharding import NamedSharding as Named

    from dpcourse import costs
    from dpcourse.sharded import forms as sharded  # the lesson's imports

    params, opt_state, x, y = args
    names = dict(ACCUM_K=4, mesh=mesh, NamedSharding=Named, optimizer=opt, compiled={}, sharded=sharded, costs=costs)
    names.update(params=params, opt_state=opt_state, batches=[(x, y)])
    return run_cells(source, **names)["accum_step"]


@pytest.mark.parametrize("divided", [True, False], ids=["divided by K", "not divided by K"])
def test_10_accumulation_not_divided_by_k_is_named_and_the_lesson_cell_agrees(divided):
    """Two devices, so that K = 4 and N = 2 name different causes."""
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    opt = train.make_optimizer(CFG)
    params = jax.device_put(model.init_params(CFG), NamedSharding(mesh, P()))
    rng = np.random.default_rng(5)
    rows = 2 * CFG.per_device_batch  # 16 rows: 4 microbatches of 4, 2 per device
    x = jax.device_put(rng.random((rows, 784), dtype=np.float32), NamedSharding(mesh, P("data", None)))
    y = jax.device_put(rng.integers(0, 10, rows).astype(np.int32), NamedSharding(mesh, P("data")))
    args = (params, opt.init(params), x, y)
    source = lesson_source("10_sharded", "accum_step")
    if not divided:
        source = plant(source, "grads = jax.tree.map(lambda g: g / ACCUM_K, acc)", "grads = acc")
    mine = jax.jit(lesson_10_accumulation(source, mesh, opt, args))(*args)
    replicated = jax.jit(train.make_train_step(CFG, opt))(*args)
    factors = [checks.device_factor(2), checks.microbatch_factor(4)]
    out = checks.compare_steps(mine, replicated, args[:2], "accumulation, scan", "replicated DP", "cpu", factors)
    if divided:
        assert out.same, out.message
        return
    assert not out.same
    assert "your gradients are 4x the reference's (K = 4 microbatches): the accumulated gradient not divided by K?" in (
        out.message
    ), out.message
    assert "tolerated" in out.message, out.message


def test_a_pmap_style_comparison_with_its_start_names_the_learning_rate():
    """checks.compare (bit for bit, lesson 06) given the start describes a difference in words too."""
    params = {"w_block": np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)}
    grads = {"w_block": np.cos(np.arange(64, dtype=np.float32)).reshape(8, 8)}
    opt = optax.adamw(1e-3, weight_decay=1e-4)
    state = opt.init(params)

    def step(lr_factor):
        updates, new_state = opt.update(grads, state, params)
        updates = jax.tree.map(lambda u: lr_factor * u, updates)
        return optax.apply_updates(params, updates), new_state, {"loss": np.float32(1.0)}

    out = checks.compare(step(1.3), step(1.0), "parameters, AdamW state and metrics", "f", start=(params, state))
    assert not out.same
    assert "1.3x" in out.message and "the learning rate?" in out.message and "the block weight" in out.message, out


def test_a_jax_error_is_shown_with_its_first_sentence_whole():
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    try:
        jax.jit(jax.shard_map(lambda v: v.sum(), mesh=mesh, in_specs=P("data"), out_specs=P()))(jnp.ones(4))
    except ValueError as err:
        text = checks.first_sentence(err)
    else:
        pytest.fail("a varying value under out_specs=P() should be refused")
    assert "given the mesh:" in text and not text.endswith(":"), text  # what the colon introduces follows
    assert "\n" not in text and not text.endswith("..."), text
    long_sentence = "word " * 100 + "end."  # 505 characters, no sentence end before it
    assert checks.first_sentence(ValueError(long_sentence + " Next."), limit=90) == long_sentence


def test_an_assertion_sentence_says_what_differs_by_how_much_and_the_tolerance():
    text = checks.beyond("the parameters after 3 steps, 8 devices against one,", 3.2e-5, 1e-5, "a psum?")
    assert text == (
        "The parameters after 3 steps, 8 devices against one, differ by 3.2e-05, above the tolerance 1e-05: a psum?"
    )


def test_05_section_4_with_psum_stops_on_a_sentence_not_a_number():
    """05's section 4 compares the learner's shard_map step with one device: psum for pmean names N."""
    mesh, opt, args = setting()
    mine = run_cells(plant(SRC_05, PMEAN_05, PMEAN_05.replace("pmean", "psum")))["make_shard_map_step"](opt, mesh)
    ours = jax.jit(mine)(*args)
    with jax.set_mesh(None):
        one = jax.device_put(args, jax.devices()[0])
        single = jax.jit(train.make_train_step(CFG, opt))(*one)
    out = checks.compare_steps(
        ours, single, args[:2], "Your step after 1 step", "one device", "cpu", [checks.device_factor(N)]
    )
    assert not out.same
    assert out.message.startswith("Your step after 1 step differ from one device's: your gradients are 4x"), out.message
    assert "(N = 4 devices): summed instead of averaged" in out.message and "tolerated" in out.message, out.message


LOCAL_LOSS_05 = "(_, metrics), grads = grad_fn(params, x, y, cfg)"
METRICS_PMEAN_05 = 'metrics = jax.lax.pmean(metrics, "data")'


def test_labels_shifted_names_the_loss_and_the_accuracy_first_not_the_optimizer_state():
    """The step computes the loss first: a wrong loss is reported as such, with both metrics named."""
    fb = check_05(plant(SRC_05, LOCAL_LOSS_05, LOCAL_LOSS_05.replace(", y, cfg", ", jnp.roll(y, 1), cfg")))
    assert fb.status == WRONG, fb
    assert "Your cell computes something else: the loss differs from the reference's by" in fb.message, fb
    assert "the accuracy is different too" in fb.message and "1 more" not in fb.message, fb
    assert "first moment" not in fb.message, fb


def test_a_sum_divided_by_n_minus_1_names_n_over_n_minus_1():
    divided = 'grads = jax.tree.map(lambda g: g / 3, jax.lax.psum(grads, "data"))'  # N - 1 = 3 for N = 4
    fb = check_05(plant(SRC_05, PMEAN_05, divided))
    assert fb.status == WRONG, fb
    assert "1.33x the reference's (N/(N\u22121) = 4/3): divided by N \u2212 1 instead of by N devices?" in fb.message, (
        fb
    )


def test_metrics_without_pmean_explain_jaxs_out_specs_error():
    fb = check_05(plant(SRC_05, METRICS_PMEAN_05, "pass"))
    assert fb.status == WRONG, fb
    assert "out_specs" in fb.message and "jax.lax.pmean" in fb.message and "the metrics" in fb.message, fb


def test_the_title_names_the_step_not_its_makers_locals():
    fb = check_05(SRC_05)
    assert "<locals>" not in fb.exercise, fb.exercise
    assert fb.exercise == "train_step (your cell) vs train_step (made by dpcourse.train.make_shard_map_step)", fb
