"""The checkers of lesson 03 (dpcourse.exercises.lesson03): right answers pass, each planted mistake is named."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse.exercises import lesson03
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, WRONG


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


def mesh_of(k):
    return Mesh(np.array(jax.devices()[:k]), ("data",))


def _shapes(n):
    return ((48 // n, 784) if 48 % n == 0 else None, (48, 784 // n) if 784 % n == 0 else None, (48, 784))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_03_1_solution_on_any_device_count(k):
    expect(lesson03.shard_shapes(_shapes(k), mesh_of(k)), CORRECT)


def test_03_1_wrong_answers():
    mesh = mesh_of(8)
    expect(lesson03.shard_shapes(((48, 784), (48, 98), (48, 784)), mesh), WRONG, "gave the whole array")
    expect(lesson03.shard_shapes(((6, 784), (48, 98), (6, 784)), mesh), WRONG, "P() replicates")
    expect(lesson03.shard_shapes(((48, 98), (48, 98), (48, 784)), mesh), WRONG, "split the other dimension")
    expect(lesson03.shard_shapes(((6, 784), None, (48, 784)), mesh), WRONG, "placement works")
    mesh3 = mesh_of(3)
    expect(lesson03.shard_shapes(((16, 784), (48, 261), (48, 784)), mesh3), WRONG, "answer None")
    expect(lesson03.shard_shapes(((6, 784), (48, 98)), mesh), BAD_INPUT, "tuple of 3")
    expect(lesson03.shard_shapes(("6x784", (48, 98), (48, 784)), mesh), BAD_INPUT, "tuple of ints")
    expect(lesson03.shard_shapes(..., mesh), NOT_ATTEMPTED)


def test_03_2_label_sharding():
    mesh = mesh_of(4)
    expect(lesson03.label_sharding(NamedSharding(mesh, P("data")), mesh), CORRECT)
    expect(lesson03.label_sharding(NamedSharding(mesh, P()), mesh), WRONG, "replicates the labels")
    expect(lesson03.label_sharding(NamedSharding(mesh, P(None)), mesh), WRONG, "replicates the labels")
    expect(lesson03.label_sharding(NamedSharding(mesh, P(None, "data")), mesh), WRONG, "the labels have one")
    expect(lesson03.label_sharding(NamedSharding(mesh_of(2), P("data")), mesh), WRONG, "uses 2 devices")
    expect(lesson03.label_sharding(P("data"), mesh), BAD_INPUT, "NamedSharding")
    expect(lesson03.label_sharding(None, mesh), NOT_ATTEMPTED)
    # Lifted from section 2 of the lesson (the images' sharding): not the labels'.
    expect(lesson03.label_sharding(NamedSharding(mesh, P("data", None)), mesh), WRONG, "images' spec")
