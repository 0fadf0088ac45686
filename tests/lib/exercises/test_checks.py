"""Tests of dpcourse.exercises.checks: a lesson cell's result against the package's, in one sentence."""

import jax
import numpy as np

from dpcourse.exercises import checks as cellcheck


def test_equal_trees_are_the_same_bit_for_bit():
    tree = {"w": np.ones((2, 3), np.float32), "k": jax.random.key(0)}
    out = cellcheck.compare(tree, dict(tree), "parameters", "train.replicate")
    assert out.same and "bit for bit" in out.message
    assert "note" in out._repr_html_().lower()


def test_a_difference_names_the_leaf_and_its_size():
    mine = {"a": np.zeros(3, np.float32), "b": np.array([0.0, 0.5, 0.0], np.float32)}
    ref = {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)}
    out = cellcheck.compare(mine, ref, "parameters", "train.make_pmap_step")
    assert not out.same and "['b']" in out.message and "0.5" in out.message
    assert cellcheck.compare(mine, ref, "parameters", "f", atol=1.0).same
    assert repr(out).startswith("[WARNING]")


def test_shape_dtype_and_structure_differences_are_named():
    ref = {"a": np.zeros(3, np.float32)}
    assert "shape (4,)" in cellcheck.compare({"a": np.zeros(4, np.float32)}, ref, "x", "f").message
    assert "dtype float64" in cellcheck.compare({"a": np.zeros(3)}, ref, "x", "f").message
    assert "structure" in cellcheck.compare({"b": np.zeros(3, np.float32)}, ref, "x", "f").message


def test_a_structure_difference_names_the_missing_and_the_extra_leaves():
    """A learner's extra or renamed key was reported as two PyTreeDef reprs: name the paths instead."""
    ref = {"w": np.zeros(2), "b": np.zeros(2)}
    assert cellcheck.structure_difference({"w": 0, "bias": 0}, ref) == "missing ['b'], extra ['bias']"
    assert cellcheck.structure_difference({"w": 0, "b": 0, "extra": 0}, ref) == "extra ['extra']"
    assert "a tuple where the reference has a list" in cellcheck.structure_difference((1, 2), [1, 2])
    many = cellcheck.structure_difference({f"k{i}": 0 for i in range(7)}, {})
    assert many == "extra ['k0'], ['k1'], ['k2'], ['k3'] and 3 more"
    message = cellcheck.compare({"w": np.zeros(2), "bias": np.zeros(2)}, ref, "parameters", "f").message
    assert "missing ['b'], extra ['bias']" in message and "PyTreeDef" not in message
