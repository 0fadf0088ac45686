"""Checkers for the exercises of notebook 06 (pmap: one key per device and step, replicated memory)."""

from __future__ import annotations

import jax
import numpy as np

from dpcourse import train
from dpcourse.config import Config
from dpcourse.exercises.base import as_callable, as_number, bad_input, checker, close, describe, how_far, wrong

MASK_SIZE = 256  # dropout-style mask drawn per device by the checker
KEEP = 0.5


def _as_keys(keys, n: int):
    """Typed PRNG keys ``[n]`` from typed keys or raw uint32 key data ``[n, 2]``."""
    if not hasattr(keys, "dtype"):
        raise bad_input(f"Expected an array of {n} PRNG keys (e.g. from jax.random.split); got {describe(keys)}.")
    if jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
        typed = keys
    elif np.dtype(keys.dtype) == np.uint32 and np.ndim(keys) >= 1 and np.shape(keys)[-1] == 2:
        typed = jax.random.wrap_key_data(np.asarray(jax.device_get(keys)))
    else:
        raise bad_input(f"Expected {n} PRNG keys (typed keys or uint32 [n, 2]); got {describe(keys)}.")
    if typed.shape != (n,):
        raise bad_input(f"Expected one key per device, shape ({n},); got keys of shape {typed.shape}.")
    return typed


def masks(keys) -> np.ndarray:
    """The dropout-style keep masks ``[n, 256]`` (bool) that ``keys [n]`` draw, one row per device."""
    draw = jax.vmap(lambda k: jax.random.bernoulli(k, KEEP, (MASK_SIZE,)))
    return np.asarray(jax.device_get(draw(keys)))


STEPS_TRIED = (0, 1, 2)  # steps at which the checker of 06.1 draws the masks


@checker("ex06_1", "a function step_keys(seed, step) -> one PRNG key per device")
def per_device_keys(answer, n_devices: int) -> str:
    """Exercise 06.1: one random key per device and per step, reproducible from the seed.

    The checker calls ``answer(seed, step)`` for seeds 0 and 1 at steps 0, 1
    and 2 (and seed 0, step 0 twice), draws a dropout-style mask per key, and
    checks that the masks differ between devices, between steps and between
    seeds, and repeat for the same seed and step.
    """
    fn = as_callable(answer, "step_keys(seed, step)")
    drawn = {(seed, step): masks(_as_keys(fn(seed, step), n_devices)) for seed in (0, 1) for step in STEPS_TRIED}
    first = drawn[(0, 0)]
    distinct = len({row.tobytes() for row in first})
    if n_devices > 1 and distinct == 1:
        raise wrong(
            "Every device got the same key, so every device draws the same mask: split the key, one per device."
        )
    if distinct < n_devices:
        raise wrong(f"Only {distinct} of {n_devices} masks differ: some devices share a key.")
    if not np.array_equal(first, masks(_as_keys(fn(0, 0), n_devices))):
        raise wrong(
            "Two calls with the same seed and step gave different masks: derive the keys from "
            "jax.random.key(seed) and the step only, so that a run can be repeated."
        )
    if np.array_equal(drawn[(0, 0)], drawn[(0, 1)]):
        raise wrong(
            "Steps 0 and 1 draw the same masks: each device would drop the same units at every step. "
            "Make the step part of the key before splitting it over the devices."
        )
    if np.array_equal(first, drawn[(1, 0)]):
        raise wrong("Seeds 0 and 1 gave the same masks: the keys must come from the seed.")
    if np.array_equal(drawn[(0, 1)], drawn[(1, 0)]):
        raise wrong(
            "Seed 0 at step 1 draws the same masks as seed 1 at step 0: adding the step to the seed makes "
            "runs with neighbouring seeds share their keys. jax.random.fold_in(key, step) mixes the step in."
        )
    rows = [row.tobytes() for grid in drawn.values() for row in grid]
    if len(set(rows)) < len(rows):
        raise wrong("Some device draws the same mask at two different steps or seeds: a key was reused.")
    return (
        f"Right: {n_devices} different masks at every step, new ones at each step and for each seed, "
        "and the same ones when the seed and step repeat."
    )


def replicated_bytes_per_device(params_host, optimizer) -> int:
    """Bytes one device holds for ``jax.pmap``-replicated parameters and optimizer state (measured)."""
    devices = jax.devices()[:1]  # one device's copy is what we measure
    tree = train.replicate((params_host, optimizer.init(params_host)), devices)
    return sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))


@checker("ex06_2", "the predicted bytes per device (a number)")
def bytes_per_device(answer, cfg: Config, n_devices: int) -> str:
    """Exercise 06.2: bytes each device holds for the replicated parameters and AdamW state.

    The reference is measured: the shard sizes of ``train.replicate`` applied
    to the parameters and ``optimizer.init`` of them. Accepted within 1 %.
    """
    from dpcourse import model

    value = as_number(answer, "a number of bytes", positive=True)
    params = model.init_params(cfg)
    ref = replicated_bytes_per_device(params, train.make_optimizer(cfg))
    param_bytes = 4 * model.param_count(cfg)
    if close(value, ref):
        return f"Right: {ref:,} bytes on every device (parameters, Adam's mu and nu, a step count), whatever N is."
    if close(value, param_bytes):
        raise wrong(
            "That is the parameters only: AdamW keeps two more arrays of the same size (mu and nu) on every device."
        )
    if n_devices > 1 and close(value, ref / n_devices):
        raise wrong(
            f"Replicated means a full copy on every device: only the batch shrinks with N, not this {ref:,} bytes."
        )
    if n_devices > 1 and close(value, ref * n_devices):
        raise wrong(f"That is the total over all {n_devices} devices; the question is per device.")
    if close(value, ref / 4):
        raise wrong("That counts values, not bytes: each float32 takes 4 bytes.")
    raise wrong(f"Your answer is {how_far(value, ref)}: count parameters + AdamW's mu and nu, 4 bytes each.")
