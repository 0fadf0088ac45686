"""Checkers for the exercises of notebook 03 (the mesh: shard shapes, a batch sharding)."""

from __future__ import annotations

from jax.sharding import Mesh, NamedSharding, Sharding
from jax.sharding import PartitionSpec as P

from dpcourse.exercises.base import as_shape, as_tuple, bad_input, checker, describe, wrong

SHAPE_03_1 = (48, 784)  # the global array whose shards exercise 03.1 asks about
SPECS_03_1 = (P("data", None), P(None, "data"), P())


def shard_shape_or_none(mesh: Mesh, spec: P, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Per-device shard shape of a ``shape`` array under ``spec``; None where JAX refuses (does not divide)."""
    try:
        return tuple(NamedSharding(mesh, spec).shard_shape(shape))
    except ValueError:
        return None


@checker("ex03_1", "a tuple of three predicted shard shapes (or None where JAX refuses)")
def shard_shapes(answer, mesh: Mesh) -> str:
    """Exercise 03.1: per-device shapes of a ``[48, 784]`` array under three PartitionSpecs.

    The answer lists the shapes for ``P('data', None)``, ``P(None, 'data')``
    and ``P()`` in that order, with None where the dimension does not divide
    by the device count (``device_put`` refuses). The reference comes from
    ``NamedSharding(mesh, spec).shard_shape``.
    """
    items = as_tuple(answer, 3, "shapes for P('data', None), P(None, 'data'), P()")
    n = mesh.shape["data"]
    for spec, item in zip(SPECS_03_1, items):
        got = as_shape(item, f"the shard shape under {spec}")
        ref = shard_shape_or_none(mesh, spec, SHAPE_03_1)
        if got == ref:
            continue
        if ref is None:
            dim = SHAPE_03_1[list(spec).index("data")]
            raise wrong(
                f"Under {spec}: {dim} does not divide by {n} devices, so JAX refuses the placement; answer None.",
                "refused-placement",
            )
        if got is None:
            raise wrong(
                f"Under {spec} the placement works: the split dimension divides by {n}; give its shard shape.",
                "none-where-it-divides",
            )
        if got == SHAPE_03_1 and spec != P():
            raise wrong(
                f"Under {spec} you gave the whole array: naming 'data' divides that dimension by the {n} devices.",
                "whole-array",
            )
        if spec == P():
            raise wrong("P() replicates: every device holds the whole [48, 784] array.", "replicated-split")
        other = P(*reversed(tuple(spec)))
        if got == shard_shape_or_none(mesh, other, SHAPE_03_1):
            raise wrong(
                f"Under {spec} you split the other dimension: the position of 'data' in the spec picks the dimension.",
                "other-dimension",
            )
        raise wrong(f"Under {spec} each device holds {ref}, not {got}.", "shard-shape")
    return f"Right: {', '.join(f'{s} -> {r}' for s, r in zip(SPECS_03_1, items))} on {n} devices."


@checker("ex03_2", "a NamedSharding for the labels of a batch, int32 [global_batch]")
def label_sharding(answer, mesh: Mesh) -> str:
    """Exercise 03.2: the sharding of a batch's labels ``[global_batch]`` for data parallelism.

    Right: ``NamedSharding(mesh, P('data'))`` on all the lesson's devices,
    which puts label ``i`` on the device that holds image ``i`` under
    ``P('data', None)``. Other sharding types are compared with
    ``Sharding.is_equivalent_to`` against the reference.
    """
    if not isinstance(answer, Sharding):
        raise bad_input(
            f"Expected a jax.sharding.NamedSharding, e.g. NamedSharding(mesh, P(...)); got {describe(answer)}."
        )
    n = mesh.shape["data"]
    ref = NamedSharding(mesh, P("data"))
    if isinstance(answer, NamedSharding):
        spec = tuple(answer.spec)
        if set(answer.mesh.device_ids.flat) != set(mesh.device_ids.flat):
            raise wrong(f"This sharding uses {answer.mesh.size} devices; build it on the lesson's mesh of {n}.")
        if len(spec) > 1 and any(a is not None for a in spec[1:]):
            raise wrong(f"{answer.spec} names {len(spec)} dimensions; the labels have one, [global_batch].")
        if len(spec) > 1:
            raise wrong(
                f"{answer.spec} is the images' spec, for two dimensions; the labels have one, [global_batch], "
                "so their spec names one."
            )
        if not spec or spec[0] is None:
            raise wrong(
                "That replicates the labels: every device would hold all of them, while each device holds only "
                "its own rows of the images."
            )
        if spec[0] != "data":
            raise wrong(f"{answer.spec}: split the one dimension over the mesh's axis, 'data'.")
        return "Right: P('data') gives each device global_batch / N labels, those of its own rows of images."
    if answer.is_equivalent_to(ref, 1):
        return "Right: it places the labels as P('data') does."
    raise wrong("It does not place the labels as P('data') on the lesson's mesh does.")
