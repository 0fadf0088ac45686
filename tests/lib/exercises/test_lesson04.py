"""The checkers of lesson 04 (dpcourse.exercises.lesson04): right answers pass, each planted mistake is named."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import model, train
from dpcourse.compiled import collectives
from dpcourse.config import make_config
from dpcourse.data import Dataset, prepare, synthetic_images
from dpcourse.exercises import lesson04
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, WRONG

CFG = make_config("smoke")


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


def mesh_of(k):
    return Mesh(np.array(jax.devices()[:k]), ("data",))


@pytest.fixture(scope="module")
def dataset():
    return Dataset(*prepare(*synthetic_images(256, seed=1)), source="synthetic", note="test")


def test_04_1_collectives_doubled():
    mesh = mesh_of(4)
    opt = train.make_optimizer(CFG)
    params = jax.device_put(model.init_params(CFG), NamedSharding(mesh, P()))
    x = jax.device_put(np.zeros((4 * CFG.per_device_batch, 784), np.float32), NamedSharding(mesh, P("data", None)))
    y = jax.device_put(np.zeros((4 * CFG.per_device_batch,), np.int32), NamedSharding(mesh, P("data")))
    report = collectives.collective_report(jax.jit(train.make_train_step(CFG, opt)), params, opt.init(params), x, y)
    in_loop = sum(c.runs_per_step for c in report.collectives if c.in_loop)
    expect(lesson04.collectives_doubled(report.runs_per_step + in_loop, CFG, mesh), CORRECT, "measured")
    right = report.runs_per_step + in_loop
    if in_loop:  # JAX 0.10 on CPU: the all-reduce sits inside the backward scan
        # The lifted answer: today's count, printed in section 3.
        expect(lesson04.collectives_doubled(report.runs_per_step, CFG, mesh), WRONG, "today's count")
        if report.runs_per_step > in_loop:
            expect(lesson04.collectives_doubled(2 * report.runs_per_step, CFG, mesh), WRONG, "Only the collectives")
        far = lesson04.collectives_doubled(right + 1000, CFG, mesh)
        expect(far, WRONG, "too large")
    for value in (report.runs_per_step, right + 1000):
        assert str(right) not in lesson04.collectives_doubled(value, CFG, mesh).message  # no answer given away
    expect(lesson04.collectives_doubled(..., CFG, mesh), NOT_ATTEMPTED)
    expect(lesson04.collectives_doubled("7", CFG, mesh), BAD_INPUT)
    expect(lesson04.collectives_doubled(right + 0.5, CFG, mesh), WRONG, "whole number")


@pytest.mark.parametrize("k", [1, 3, 8])
def test_04_2_solution_on_any_device_count(k, dataset):
    mesh = mesh_of(k)
    b = (100 // k) * k
    x = jax.device_put(dataset.images[:b], NamedSharding(mesh, P("data", None)))
    expect(lesson04.placed_batch(x, dataset, mesh), CORRECT)


def test_04_2_wrong_answers(dataset):
    mesh = mesh_of(8)
    expect(
        lesson04.placed_batch(jax.device_put(dataset.images[:96], NamedSharding(mesh, P())), dataset, mesh),
        WRONG,
        "replicated",
    )
    expect(lesson04.placed_batch(dataset.images[:100], dataset, mesh), WRONG, "do not divide by 8")
    expect(lesson04.placed_batch(dataset.images[:96], dataset, mesh), BAD_INPUT, "jax.Array")
    wrong_rows = jax.device_put(dataset.images[8:104], NamedSharding(mesh, P("data", None)))
    expect(lesson04.placed_batch(wrong_rows, dataset, mesh), WRONG, "first 96 images")
    one_device = jax.device_put(dataset.images[:96], jax.devices()[0])
    expect(lesson04.placed_batch(one_device, dataset, mesh), WRONG, "lives on 1 device")
    expect(lesson04.placed_batch(jax.numpy.zeros((96, 28, 28)), dataset, mesh), BAD_INPUT, "[B, 784]")
    expect(lesson04.placed_batch(..., dataset, mesh), NOT_ATTEMPTED)
    # Lifted from the lesson: its own first batch (64 rows in smoke on 8 devices), not about 100.
    lifted = jax.device_put(dataset.images[:64], NamedSharding(mesh, P("data", None)))
    expect(lesson04.placed_batch(lifted, dataset, mesh), WRONG, "not about 100")
