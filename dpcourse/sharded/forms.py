"""Sharded data parallelism (ZeRO-1, FSDP) and gradient accumulation, as lesson 10 teaches them.

Lesson 10 writes each form in its own cells; this module keeps the reusable
version that the lesson checks its cells against, that the tests hold to
replicated data parallelism, and that ``make placement`` compiles:

- :func:`shard_specs`: a ``PartitionSpec`` per leaf of a parameter (or
  optimizer-state) tree, sharding each leaf on its largest axis that divides
  by the device count; leaves below a size threshold, and leaves with no
  divisible axis, stay replicated, and the plan says which and why.
- :func:`per_device_bytes`: bytes each device holds, from ``addressable_shards``.
- :func:`state_bytes_formula`: the 4 + 4 + 8 bytes per parameter of float32
  parameters, gradients and AdamW's two moments, per form.
- :func:`constrain`: where a value goes inside a step, on a mesh of either
  axis type (``with_sharding_constraint`` on Auto axes, ``reshard`` on Explicit).
- Step builders: :func:`make_zero1_step` (naive, or with the gradient
  all-reduced first), :func:`make_fsdp_step` (naive or
  gathered once), :func:`make_accumulation_step` (a ``lax.scan`` over
  microbatches on an Auto mesh) and :func:`make_reduced_accumulation_step`
  (``reduced``/``unreduced`` shardings on an Explicit mesh: one all-reduce per
  step).
- The census of what a compiled step communicates, and the cost model's
  prediction of it: :mod:`dpcourse.compiled.census`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse.config import Config
from dpcourse.model import forward

MIN_SHARD_ELEMENTS = 1024  # leaves smaller than this stay replicated (see shard_specs)
BYTES_PER_PARAM = {"params": 4, "grads": 4, "adam": 8}  # float32 values, AdamW's mu and nu


@dataclass(frozen=True)
class ShardPlan:
    """How each leaf of a tree is placed over one mesh axis.

    Attributes:
        specs: a tree of ``PartitionSpec`` with the structure of the input tree.
        replicated: ``(leaf path, shape, reason)`` for every leaf left
            replicated, reason ``"below threshold"`` or ``"no axis divides
            by N"``.
        n_devices: the size of the axis.
        axis: the mesh axis name.
    """

    specs: object
    replicated: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)
    n_devices: int = 1
    axis: str = "data"

    def shardings(self, mesh: Mesh):
        """The specs as ``NamedSharding`` on ``mesh`` (same tree structure)."""
        return jax.tree.map(lambda s: NamedSharding(mesh, s), self.specs, is_leaf=lambda s: isinstance(s, P))

    def describe(self) -> str:
        """One sentence naming the replicated leaves and why (or saying that all are sharded)."""
        if not self.replicated:
            return f"Every leaf is sharded over {self.n_devices} devices."
        parts = [f"{path} {shape} ({why})" for path, shape, why in self.replicated]
        return f"Left replicated on {self.n_devices} devices: " + "; ".join(parts) + "."


def largest_divisible_axis(shape: tuple[int, ...], n_devices: int) -> int | None:
    """Index of the largest dimension of ``shape`` divisible by ``n_devices`` (first on a tie), or None."""
    best = None
    for i, d in enumerate(shape):
        if d % n_devices == 0 and (best is None or d > shape[best]):
            best = i
    return best


def leaf_spec(
    shape: tuple[int, ...], n_devices: int, axis: str = "data", min_elements: int = MIN_SHARD_ELEMENTS
) -> tuple[P, str | None]:
    """The spec of one leaf and, when it stays replicated, why.

    Returns:
        ``(P(...) sharding the largest divisible dimension over axis, None)``,
        or ``(P(), reason)``.
    """
    if math.prod(shape) < max(min_elements, 1) or not shape:
        return P(), "below threshold"
    dim = largest_divisible_axis(shape, n_devices)
    if dim is None:
        return P(), f"no axis divides by {n_devices}"
    return P(*[axis if i == dim else None for i in range(len(shape))]), None


def shard_specs(tree, n_devices: int, axis: str = "data", min_elements: int = MIN_SHARD_ELEMENTS) -> ShardPlan:
    """A :class:`ShardPlan` for every array leaf of ``tree`` (parameters or optimizer state).

    Each leaf with at least ``min_elements`` elements is sharded on its
    largest dimension that divides by ``n_devices``. Smaller leaves stay
    replicated (a collective per tiny leaf costs its latency and saves
    almost no memory), and so do leaves where no dimension divides: for
    example every leaf of the course's model on 3 devices at the smoke and
    cpu sizes (784, 256 and 10 are not multiples of 3).

    Raises:
        ValueError: ``n_devices`` < 1.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}.")
    replicated = []

    def one(path, leaf):
        shape = tuple(np.shape(leaf))
        spec, why = leaf_spec(shape, n_devices, axis, min_elements)
        if why is not None and n_devices > 1:
            replicated.append((jax.tree_util.keystr(path), shape, why))
        return spec

    specs = jax.tree_util.tree_map_with_path(one, tree)
    return ShardPlan(specs, replicated, n_devices, axis)


def per_device_bytes(tree, device=None) -> int:
    """Bytes of ``tree``'s arrays held on ``device`` (default: the first device of the first leaf).

    Counted from ``addressable_shards``: a replicated array counts in full on
    every device, an array sharded ``N`` ways counts ``1 / N``.
    """
    leaves = [a for a in jax.tree.leaves(tree) if hasattr(a, "addressable_shards")]
    if not leaves:
        return 0
    if device is None:
        device = leaves[0].addressable_shards[0].device
    return int(sum(s.data.nbytes for a in leaves for s in a.addressable_shards if s.device == device))


def state_bytes_formula(n_params: int, n_devices: int, form: str) -> dict[str, float]:
    """Bytes per device of parameters, gradients and AdamW state (float32), by the formula.

    4 bytes per parameter for the parameters, 4 for the gradients, 8 for
    AdamW's first and second moments: 16 in all in replicated data
    parallelism. ZeRO-1 divides the AdamW state by ``N``; FSDP (ZeRO-3)
    divides all three. Activations come on top and depend on the batch.

    Args:
        form: ``"replicated"``, ``"zero1"`` or ``"fsdp"``.

    Raises:
        ValueError: another form, or ``n_devices`` < 1.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}.")
    split = {"replicated": (1, 1, 1), "zero1": (1, 1, n_devices), "fsdp": (n_devices, n_devices, n_devices)}
    if form not in split:
        raise ValueError(f"Unknown form {form!r}. Valid forms: {', '.join(split)}.")
    p, g, a = split[form]
    out = {
        "params": BYTES_PER_PARAM["params"] * n_params / p,
        "grads": BYTES_PER_PARAM["grads"] * n_params / g,
        "adam": BYTES_PER_PARAM["adam"] * n_params / a,
    }
    out["total"] = sum(out.values())
    return out


def state_ratio_formula(n_devices: int, form: str) -> float:
    """Replicated DP's bytes per device between steps over ``form``'s, by the formula (parameters + AdamW).

    12 bytes per parameter (4 parameters, 8 AdamW) replicated; ZeRO-1 keeps
    4 + 8 / N, so the ratio is ``12 / (4 + 8 / N)`` (2.4 on 8 devices, under
    3 for any N); FSDP keeps 12 / N, ratio ``N``. Lesson 10 prints it beside
    the measured ratio.

    Raises:
        ValueError: as :func:`state_bytes_formula`.
    """
    ref = state_bytes_formula(1, n_devices, "replicated")
    this = state_bytes_formula(1, n_devices, form)
    return (ref["params"] + ref["adam"]) / (this["params"] + this["adam"])


def params_that_fit(memory_bytes: float, n_devices: int = 1, form: str = "replicated", reserve: float = 0.0) -> int:
    """The largest parameter count whose state fits ``memory_bytes`` per device (no activations).

    Uses :func:`state_bytes_formula`, which for ``"fsdp"`` counts 16 / N
    bytes per parameter: a model gathered one layer at a time, each layer
    freed after use. An FSDP step that gathers every parameter at once
    (lesson 10's "gathered once") holds whole parameters and gradients
    while it runs, and fits far less.

    Args:
        memory_bytes: device memory, bytes (e.g. a datasheet figure).
        reserve: fraction of the memory kept for activations and workspace.

    Raises:
        ValueError: a negative memory, ``reserve`` outside [0, 1), or an unknown form.
    """
    if memory_bytes < 0 or not 0 <= reserve < 1:
        raise ValueError(f"Need memory_bytes >= 0 and 0 <= reserve < 1, got {memory_bytes} and {reserve}.")
    per_param = state_bytes_formula(1, n_devices, form)["total"]
    return int(memory_bytes * (1 - reserve) // per_param)


# --- gradient accumulation: the batch as K microbatches -------------------------------------


def _nearest(values: list[int], target: int) -> list[int]:
    below = [v for v in values if v < target]
    above = [v for v in values if v > target]
    return ([max(below)] if below else []) + ([min(above)] if above else [])


def check_accumulation(global_batch: int, k: int, n_devices: int) -> int:
    """Check that ``global_batch`` splits into ``k`` microbatches that each split over ``n_devices``.

    Returns:
        The microbatch size ``global_batch // k``.

    Raises:
        ValueError: ``k`` < 1, ``k`` does not divide ``global_batch``, or the
            microbatch does not divide by ``n_devices``; the message gives the
            nearest valid accumulation counts for this batch (and, for the
            second case, the nearest valid global batches for this ``k``).
    """
    if k < 1 or global_batch < 1 or n_devices < 1:
        raise ValueError(f"Need k >= 1, global_batch >= 1 and n_devices >= 1, got {k}, {global_batch}, {n_devices}.")
    valid_k = [d for d in range(1, global_batch + 1) if global_batch % d == 0 and (global_batch // d) % n_devices == 0]
    step = k * n_devices
    lower, upper = max(step, global_batch // step * step), -(-global_batch // step) * step
    batches = sorted({lower, upper if upper != lower else upper + step})
    if global_batch % k and not valid_k:
        raise ValueError(
            f"K = {k} microbatches do not divide the global batch {global_batch}, and {global_batch} does "
            f"not divide by {n_devices} devices, so no K works for this batch: use a global batch of "
            f"{' or '.join(map(str, batches))} (a multiple of K x N = {step})."
        )
    if global_batch % k:
        raise ValueError(
            f"K = {k} microbatches do not divide the global batch {global_batch}. "
            f"Nearest valid K for this batch on {n_devices} devices: {_nearest(valid_k, k)}."
        )
    micro = global_batch // k
    if micro % n_devices:
        near = _nearest(valid_k, k)
        lead = (
            f"Nearest valid K for this batch: {near}; or keep"
            if near
            else f"No K works for a batch of {global_batch} on {n_devices} devices: keep"
        )
        raise ValueError(
            f"A microbatch of {micro} examples (global batch {global_batch} / K = {k}) does not divide over "
            f"{n_devices} devices. {lead} K = {k} with a global batch of "
            f"{' or '.join(map(str, batches))} (a multiple of K x N = {step})."
        )
    return micro


def split_microbatches(x, k: int):
    """``[global_batch, ...] -> [k, global_batch // k, ...]``: microbatch ``j`` holds rows ``j, j + k, j + 2k, ...``.

    Strided rather than contiguous so that each device's rows of a batch
    sharded over the leading axis stay on that device in every microbatch
    (no data moves). The mean of the ``k`` equal-sized microbatch means is
    the global mean.
    """
    micro = x.shape[0] // k
    return jnp.swapaxes(x.reshape((micro, k) + x.shape[1:]), 0, 1)


def constrain(tree, shardings):
    """Place ``tree`` (inside a jitted step) as ``shardings`` say, on a mesh of Auto or Explicit axes.

    On a mesh with Auto axes this is ``jax.lax.with_sharding_constraint``: a
    hint the compiler meets by adding the collective (an all-gather, a
    reduce-scatter). On a mesh whose axes are all Explicit the sharding is part
    of each array's type and ``with_sharding_constraint`` only asserts it
    (JAX raises "acts as an assert when all axes of mesh are of type
    Explicit"), so this calls ``jax.sharding.reshard``, which changes the type
    and adds the same collective.

    Args:
        tree: an array or a tree of arrays.
        shardings: one ``NamedSharding``, or a tree of them matching ``tree``.

    Returns:
        ``tree`` with the given shardings.

    Raises:
        ValueError: the shardings' meshes are not all Auto or all Explicit, or
            one is not a ``NamedSharding``.
    """
    leaves = jax.tree.leaves(shardings, is_leaf=lambda s: isinstance(s, NamedSharding))
    kinds = set()
    for s in leaves:
        if not isinstance(s, NamedSharding):
            raise ValueError(
                f"constrain takes NamedShardings, got {type(s).__name__}: build one with NamedSharding(mesh, spec)"
            )
        kinds.add(all(t == jax.sharding.AxisType.Explicit for t in s.mesh.axis_types))
    if len(kinds) > 1:
        raise ValueError(
            "constrain got shardings on meshes of Explicit axes and of Auto axes at once: build them all on one mesh"
        )
    if kinds == {True}:
        return jax.sharding.reshard(tree, shardings)
    return jax.lax.with_sharding_constraint(tree, shardings)


def _per_example(logits, y):
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return losses.mean(), (losses, (jnp.argmax(logits, axis=-1) == y).astype(jnp.float32))


def _metrics(losses, correct):
    return {"loss": losses.mean(), "accuracy": correct.mean()}


def make_accumulation_step(cfg: Config, optimizer: optax.GradientTransformation, k: int, mesh: Mesh, axis="data"):
    """Gradient accumulation over ``k`` microbatches with ``lax.scan``, on an Auto mesh (not jitted).

    ``step(params, opt_state, x, y)`` with replicated parameters and a global
    batch sharded over ``axis``; the gradient is the mean of the ``k``
    microbatch gradients, so the update equals the full-batch step's (up to
    float rounding). Metrics (loss, accuracy over the global batch, before
    the update) come from per-example values stacked by the scan.
    Nothing says where the gradient is reduced (the naive form), so the
    compiler decides: XLA's GPU compiler all-reduces the shared block's
    weight and bias in every microbatch (``k`` times per step) and the rest
    of the gradient once after the loop; the CPU compiler reduces every
    microbatch's gradient, the block's in every backward iteration
    (lesson 10 counts both).

    Raises:
        ValueError: (when called) see :func:`check_accumulation`.
    """
    micro_sharding = NamedSharding(mesh, P(None, axis))

    def loss(p, x, y):
        logits = forward(p, x, cfg.block_repeats, cfg.block_mix, cfg.block_unroll, cfg.compute_dtype)
        return _per_example(logits, y)

    def step(params, opt_state, x, y):
        check_accumulation(x.shape[0], k, mesh.shape[axis])
        xs = constrain(split_microbatches(x, k), NamedSharding(mesh, P(None, axis, None)))
        ys = constrain(split_microbatches(y, k), micro_sharding)

        def body(acc, xy):
            (_, per), g = jax.value_and_grad(loss, has_aux=True)(params, *xy)
            return jax.tree.map(jnp.add, acc, g), per

        zeros = jax.tree.map(jnp.zeros_like, params)
        acc, (losses, correct) = jax.lax.scan(body, zeros, (xs, ys))
        grads = jax.tree.map(lambda g: g / k, acc)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, _metrics(losses, correct)

    return step


def has_reduced_shardings() -> bool:
    """Whether this JAX has ``PartitionSpec(reduced=..., unreduced=...)`` and ``jax.reshard``."""
    try:
        P(reduced={"data"})
        P(unreduced={"data"})
    except TypeError:
        return False
    return hasattr(jax, "reshard")


REDUCED_NEEDS = (
    "PartitionSpec(reduced=..., unreduced=...) and jax.reshard (the course's JAX 0.10.2 and 0.12.0.1 have them)"
)


def _bias(b, h):
    # A plain `h + b` with a reduced `b` is refused (ShardingTypeError: inputs cannot be sharded on
    # the axes another input is reduced on); broadcasting it to h's sharding first works.
    return jax.lax.broadcast_in_dim(b, h.shape, (h.ndim - 1,), out_sharding=jax.typeof(h).sharding.spec)


def forward_explicit(params, x, cfg: Config):
    """:func:`dpcourse.model.forward` (float32, scan) with its bias adds written for an Explicit mesh.

    Same values as the model's forward; each bias is broadcast to the
    activation's sharding before the add, which parameters typed
    ``reduced`` need.
    """
    h = x @ params["w_in"]
    h = jax.nn.gelu(h + _bias(params["b_in"], h))

    def block(h, _):
        z = h @ params["w_block"]
        return (1.0 - cfg.block_mix) * h + cfg.block_mix * jax.nn.gelu(z + _bias(params["b_block"], z)), None

    h, _ = jax.lax.scan(block, h, None, length=cfg.block_repeats)
    z = h @ params["w_out"]
    return z + _bias(params["b_out"], z)


def make_reduced_accumulation_step(cfg: Config, optimizer: optax.GradientTransformation, k: int, axis="data"):
    """Gradient accumulation with one all-reduce per step, for an Explicit mesh (not jitted).

    Run the jitted step under ``jax.set_mesh(mesh)`` with arrays on a mesh
    whose ``axis`` is ``AxisType.Explicit``. The replicated parameters are
    resharded to ``P(reduced={axis})`` before the microbatch loop: their
    gradients then come out ``unreduced`` (each device's partial sum, no
    communication), the accumulator is ``P(unreduced={axis})``, and one
    ``jax.reshard(..., P())`` after the loop is the only all-reduce of the
    gradient. Needs :data:`REDUCED_NEEDS` (see :func:`has_reduced_shardings`).

    Raises:
        ValueError: (when called) see :func:`check_accumulation`.
        RuntimeError: this JAX lacks reduced/unreduced shardings.
    """
    if not has_reduced_shardings():
        raise RuntimeError(
            f"Gradient accumulation with one all-reduce needs {REDUCED_NEEDS}; this is JAX {jax.__version__}."
        )

    def loss(p, x, y):
        return _per_example(forward_explicit(p, x, cfg), y)

    def step(params, opt_state, x, y):
        n = jax.typeof(x).sharding.mesh.shape[axis]
        check_accumulation(x.shape[0], k, n)
        xs, ys = split_microbatches(x, k), split_microbatches(y, k)
        reduced = jax.tree.map(lambda a: jax.reshard(a, P(*[None] * a.ndim, reduced={axis})), params)
        zeros = jax.tree.map(lambda a: jnp.zeros_like(a, out_sharding=P(*[None] * a.ndim, unreduced={axis})), params)

        def body(acc, xy):
            (_, per), g = jax.value_and_grad(loss, has_aux=True)(reduced, *xy)
            return jax.tree.map(jnp.add, acc, g), per

        acc, (losses, correct) = jax.lax.scan(body, zeros, (xs, ys))
        grads = jax.tree.map(lambda g: jax.reshard(g, P(*[None] * g.ndim)) / k, acc)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, _metrics(losses, correct)

    return step


# --- ZeRO-1 and FSDP ---------------------------------------------------------------------------


def _train_step(cfg: Config, optimizer, gather=None, scatter=None):
    # gather: shardings the parameters are constrained to at the start of the loss (FSDP gathered once).
    # scatter: shardings the gradients are constrained to right after value_and_grad (FSDP: the sharded
    # specs, a reduce-scatter; ZeRO-1 with the all-reduce first: P(), one all-reduce).
    def loss(p, x, y):
        if gather is not None:  # FSDP, gathered once: every parameter replicated for the whole pass
            p = constrain(p, gather)
        logits = forward(p, x, cfg.block_repeats, cfg.block_mix, cfg.block_unroll, cfg.compute_dtype)
        return _per_example(logits, y)

    def step(params, opt_state, x, y):
        (_, per), grads = jax.value_and_grad(loss, has_aux=True)(params, x, y)
        if scatter is not None:  # the gradients' placement, said before the optimizer pulls its own
            grads = constrain(grads, scatter)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, _metrics(*per)

    return step


def make_replicated_step(cfg: Config, optimizer, mesh: Mesh, params, opt_state, axis="data"):
    """Replicated data parallelism (the reference), jitted: everything ``P()``, the batch over ``axis``."""
    rep = NamedSharding(mesh, P())
    p_sh, s_sh = jax.tree.map(lambda _: rep, params), jax.tree.map(lambda _: rep, opt_state)
    return jax.jit(
        _train_step(cfg, optimizer),
        in_shardings=(p_sh, s_sh, NamedSharding(mesh, P(axis, None)), NamedSharding(mesh, P(axis))),
        out_shardings=(p_sh, s_sh, rep),
    )


def make_zero1_step(
    cfg: Config,
    optimizer,
    mesh: Mesh,
    params,
    opt_state,
    axis="data",
    min_elements=MIN_SHARD_ELEMENTS,
    allreduce_first: bool = False,
):
    """ZeRO-1, jitted: parameters replicated, AdamW state sharded by :func:`shard_specs`.

    Args:
        allreduce_first: False (the naive form): shardings on the step's
            inputs and outputs only. Sharding propagation then carries the
            sharded optimizer state's specs back into the gradient, and XLA's
            GPU compiler reduce-scatters the shared block's gradient in every
            iteration of the backward loop (lesson 10 counts it). True: the
            gradients are constrained to ``P()`` right after
            ``value_and_grad``, so the compiler all-reduces them once after the
            loops, each device updates its slice, and one all-gather
            re-replicates the parameters.

    Returns:
        ``(step, state_plan)``; place ``opt_state`` with
        ``state_plan.shardings(mesh)`` (the step's in and out shardings).
    """
    n = mesh.shape[axis]
    rep = NamedSharding(mesh, P())
    plan = shard_specs(opt_state, n, axis, min_elements)
    p_sh, s_sh = jax.tree.map(lambda _: rep, params), plan.shardings(mesh)
    step = jax.jit(
        _train_step(cfg, optimizer, scatter=p_sh if allreduce_first else None),
        in_shardings=(p_sh, s_sh, NamedSharding(mesh, P(axis, None)), NamedSharding(mesh, P(axis))),
        out_shardings=(p_sh, s_sh, rep),
    )
    return step, plan


def make_fsdp_step(
    cfg: Config,
    optimizer,
    mesh: Mesh,
    params,
    opt_state,
    gather_once: bool,
    axis="data",
    min_elements=MIN_SHARD_ELEMENTS,
):
    """FSDP (ZeRO-3), jitted: parameters and AdamW state sharded by :func:`shard_specs`.

    Args:
        gather_once: False: shardings on the step's inputs and outputs only
            (the compiler decides where to gather; XLA's GPU compiler gathers
            the shared block's weight in every forward and backward iteration
            of the loop). True: the parameters are constrained to ``P()`` at
            the start of the loss (one all-gather) and the gradients to their
            sharded specs (one reduce-scatter).

    Returns:
        ``(step, param_plan, state_plan)``.
    """
    n = mesh.shape[axis]
    rep = NamedSharding(mesh, P())
    p_plan, s_plan = shard_specs(params, n, axis, min_elements), shard_specs(opt_state, n, axis, min_elements)
    p_sh, s_sh = p_plan.shardings(mesh), s_plan.shardings(mesh)
    gather = jax.tree.map(lambda _: rep, params) if gather_once else None
    inner = _train_step(cfg, optimizer, gather, p_sh if gather_once else None)
    step = jax.jit(
        inner,
        in_shardings=(p_sh, s_sh, NamedSharding(mesh, P(axis, None)), NamedSharding(mesh, P(axis))),
        out_shardings=(p_sh, s_sh, rep),
    )
    return step, p_plan, s_plan
