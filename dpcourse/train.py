"""The optimizer and the training step in its three data-parallel forms.

- :func:`make_train_step`: one step of gradient descent, written for one
  device (notebook 02). Jitted on arrays sharded over a mesh it becomes
  automatic data parallelism: XLA inserts the all-reduce (notebook 04).
- :func:`make_shard_map_step`: gradients per shard inside ``jax.shard_map``,
  averaged with ``jax.lax.pmean`` over the mesh axis (notebook 05).
- :func:`make_pmap_step`: the legacy ``jax.pmap`` form (notebook 06).

All three compute the same update for the same global batch; the
equivalence tests in ``tests/lib/test_train.py`` hold them to it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse.config import Config
from dpcourse.model import loss_and_metrics

StepFn = Callable  # (params, opt_state, x, y) -> (params, opt_state, metrics)


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
    """AdamW with the config's learning rate and decoupled weight decay (optax)."""
    return optax.adamw(cfg.learning_rate, weight_decay=cfg.weight_decay)


def check_mesh_context(x) -> None:
    """Refuse a batch sharded over Explicit mesh axes when no mesh is set.

    ``jax.make_mesh`` builds ``Explicit`` axes unless told otherwise
    (``Mesh(...)`` builds ``Auto``). On Explicit axes shardings are part of
    the array types, and JAX needs the mesh in context (``jax.set_mesh``)
    to type the step's operations; without it JAX 0.11 and later fail deep
    inside the step (a ``ShardingTypeError`` about a scatter's
    ``out_sharding``, or ``Resource axis: data ... not found in mesh: ()``), while JAX 0.10.2 ran it. This check makes every JAX
    the course admits answer the same, early and with the fix. Auto axes and
    single-device arrays pass.

    Args:
        x: the step's batch (a ``jax.Array`` or a tracer of one).

    Raises:
        ValueError: ``x`` is sharded over a mesh with Explicit axes and no
            mesh is set; the message gives both fixes.
    """
    mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
    if mesh is None:
        return
    explicit = [name for name, kind in zip(mesh.axis_names, mesh.axis_types) if kind == AxisType.Explicit]
    if explicit and jax.sharding.get_abstract_mesh().empty:
        raise ValueError(
            f"The batch is sharded over a mesh with Explicit axes {explicit} (jax.make_mesh's default), "
            "but no mesh is in context here (none was set, or a `with jax.set_mesh(None):` block around this "
            "call cleared it). Either run the step under `with jax.set_mesh(mesh):`, or build the mesh "
            "with Auto axes, as the course does: jax.make_mesh(shape, names, "
            "axis_types=(jax.sharding.AxisType.Auto,) * len(names)) or Mesh(devices, names)."
        )


def make_train_step(cfg: Config, optimizer: optax.GradientTransformation) -> StepFn:
    """The plain training step (not jitted): ``jax.jit`` it where it is used.

    ``train_step(params, opt_state, x, y) -> (params, opt_state, metrics)``
    with ``x`` float32 ``[global_batch, 784]`` and ``y`` int32
    ``[global_batch]``; ``metrics`` holds the scalar mean ``loss`` and
    ``accuracy`` over the global batch, computed before the update.
    Works on a mesh with Auto axes, and on one with Explicit axes under
    ``jax.set_mesh(mesh)`` (see :func:`check_mesh_context`).
    """

    def train_step(params, opt_state, x, y):
        check_mesh_context(x)
        grad_fn = jax.value_and_grad(loss_and_metrics, has_aux=True)
        (_, metrics), grads = grad_fn(params, x, y, cfg)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, metrics

    return train_step


def make_shard_map_step(
    cfg: Config,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    axis: str = "data",
    reduce_dtype: str | None = None,
) -> StepFn:
    """The explicit data-parallel step: ``jax.shard_map`` + ``lax.pmean``.

    Inside ``shard_map`` each device sees its shard, ``x`` ``[per_device_batch,
    784]``, casts the replicated parameters to its own copy
    (``lax.pcast(..., to="varying")``), and computes the gradient of its
    local mean loss; ``pmean`` over
    ``axis`` averages gradients, loss and accuracy, which equals the gradient
    of the global mean loss because all shards have the same size. The
    optimizer update runs outside, on replicated values.

    Args:
        mesh: a mesh with an axis named ``axis``; batches are sharded over it.
        reduce_dtype: None (reduce gradients in their own dtype, float32),
            or e.g. ``"bfloat16"``: cast each gradient to it for the
            ``pmean`` and back to float32 after, which halves the all-reduce
            bytes at the cost of bfloat16 rounding of the mean (notebook 09).

    Returns:
        ``train_step(params, opt_state, x, y)`` taking the global batch
        (``[global_batch, 784]``, sharded ``P(axis, None)``), not jitted.
    """

    def local_grads(params, x, y):
        # With check_vma on, params enter as invariant over `axis` (P()).
        # Differentiating an invariant input inside shard_map already sums
        # its gradient over the axis (the transpose of the implicit
        # broadcast), so a pmean on top would scale it by the axis size.
        # Where that sum lands is the compiler's choice (the CPU compiler
        # leaves it inside the scan, once per block repeat). Casting to a
        # per-device ("varying") copy first keeps each gradient local, so the
        # one pmean below is the only reduction, written after the loop.
        params = jax.lax.pcast(params, axis, to="varying")
        grad_fn = jax.value_and_grad(loss_and_metrics, has_aux=True)
        (_, metrics), grads = grad_fn(params, x, y, cfg)
        if reduce_dtype is None:
            grads = jax.lax.pmean(grads, axis_name=axis)
        else:
            grads = jax.tree.map(lambda g: jax.lax.pmean(g.astype(reduce_dtype), axis).astype(g.dtype), grads)
        metrics = jax.lax.pmean(metrics, axis_name=axis)
        return grads, metrics

    sharded_grads = jax.shard_map(
        local_grads,
        mesh=mesh,
        in_specs=(P(), P(axis, None), P(axis)),
        out_specs=(P(), P()),
        check_vma=True,
    )

    def train_step(params, opt_state, x, y):
        grads, metrics = sharded_grads(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, metrics

    return train_step


def make_pmap_step(
    cfg: Config, optimizer: optax.GradientTransformation, devices: list | None = None, axis: str = "data"
) -> StepFn:
    """The legacy form: the whole step under ``jax.pmap`` with ``lax.pmean``.

    Every argument carries a leading device axis: params and optimizer state
    replicated ``[n_devices, ...]`` (see :func:`replicate`), ``x``
    ``[n_devices, per_device_batch, 784]``, ``y`` ``[n_devices,
    per_device_batch]`` (see :func:`split_for_pmap`). Outputs too; metrics are
    ``[n_devices]`` with the same value on every device.

    In JAX 0.10, ``jax.pmap`` is implemented with ``jax.jit`` and
    ``jax.shard_map`` (see the docstring of ``jax.pmap``).
    """

    def step(params, opt_state, x, y):
        grad_fn = jax.value_and_grad(loss_and_metrics, has_aux=True)
        (_, metrics), grads = grad_fn(params, x, y, cfg)
        grads = jax.lax.pmean(grads, axis_name=axis)
        metrics = jax.lax.pmean(metrics, axis_name=axis)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, metrics

    return jax.pmap(step, axis_name=axis, devices=devices)


def nearest_valid_batches(global_batch: int, n_devices: int) -> tuple[int, int]:
    """The multiples of ``n_devices`` just below and above ``global_batch``.

    The lower one is at least ``n_devices`` (one example per device).
    """
    lower = max(n_devices, (global_batch // n_devices) * n_devices)
    upper = -(-global_batch // n_devices) * n_devices
    if upper == lower:
        upper += n_devices
    return lower, upper


def check_global_batch(global_batch: int, n_devices: int) -> int:
    """Check that a global batch splits evenly over ``n_devices`` devices.

    Returns:
        The per-device batch, ``global_batch // n_devices``.

    Raises:
        ValueError: ``global_batch`` < 1, ``n_devices`` < 1, or not divisible;
            the message names the batch, the device count and the nearest
            valid sizes.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}.")
    if global_batch < 1 or global_batch % n_devices:
        lower, upper = nearest_valid_batches(max(global_batch, 1), n_devices)
        raise ValueError(
            f"Global batch {global_batch} does not divide evenly over {n_devices} devices. "
            f"Nearest valid global batches: {lower} or {upper} "
            f"(a multiple of {n_devices})."
        )
    return global_batch // n_devices


def split_for_pmap(x: np.ndarray, n_devices: int) -> np.ndarray:
    """Reshape a global batch ``[global_batch, ...]`` to ``[n_devices, per_device_batch, ...]``.

    Raises:
        ValueError: the global batch does not divide by ``n_devices`` (see
            :func:`check_global_batch`).
    """
    per_device = check_global_batch(x.shape[0], n_devices)
    return x.reshape((n_devices, per_device) + x.shape[1:])


def _is_typed_key(leaf) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _key_error(name: str, shape: tuple, n_devices: int, what: str) -> ValueError:
    return ValueError(
        f"pmap key input {name} has shape {shape} ({what}); pmap needs exactly one key per device, "
        f"shape ({n_devices},) of typed keys. Split one key with jax.random.split(key, {n_devices}) "
        f"(not a shape such as ({n_devices}, 2), which gives each device several keys)."
    )


def check_pmap_leading_axis(tree, n_devices: int) -> None:
    """Check that every array in ``tree`` has leading axis ``n_devices``.

    ``jax.pmap`` maps over the leading axis, one slice per device. Typed PRNG
    key arrays (``jax.random.key``, a key dtype) must be exactly one key per
    device, shape ``(n_devices,)``: ``jax.random.split(key, (n, 2))`` has the
    right leading axis yet gives each device two keys, which fails deep
    inside the mapped function. Legacy raw keys (``jax.random.PRNGKey``,
    uint32 ``(n_devices, 2)``) look like any other uint32 array here; check
    them with :func:`check_pmap_keys`.

    Raises:
        ValueError: an array is a scalar or has another leading size, or a
            typed key array is not ``(n_devices,)``; the message gives its
            shape and the fix.
    """
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        shape = tuple(np.shape(leaf))
        name = jax.tree_util.keystr(path) or "argument"
        if _is_typed_key(leaf):
            if shape != (n_devices,):
                raise _key_error(name, shape, n_devices, "typed keys")
            continue
        if not shape or shape[0] != n_devices:
            raise ValueError(
                f"pmap input {name} has shape {shape}; its leading axis must be the device "
                f"count {n_devices}. Reshape a global batch with "
                f"split_for_pmap(x, {n_devices}) and replicate parameters with replicate()."
            )


def check_pmap_keys(keys, n_devices: int) -> None:
    """Check that ``keys`` holds exactly one PRNG key per device for ``jax.pmap``.

    Accepted: typed keys (``jax.random.key``; the course's style) of shape
    ``(n_devices,)``, or legacy raw keys (``jax.random.PRNGKey``) as uint32
    ``(n_devices, 2)``.

    Raises:
        ValueError: any other shape or dtype; the message names the shape
            found and the fix (``jax.random.split(key, n_devices)``).
    """
    shape = tuple(np.shape(keys))
    if _is_typed_key(keys):
        if shape != (n_devices,):
            raise _key_error("keys", shape, n_devices, "typed keys")
        return
    dtype = getattr(keys, "dtype", None)
    if dtype == np.uint32 and shape == (n_devices, 2):
        return
    raise _key_error("keys", shape, n_devices, f"dtype {dtype}, neither typed keys nor legacy uint32 (n, 2)")


def replicate(tree, devices: list):
    """Put one copy of each array on every device, stacked on a new leading axis.

    Today's replacement for the removed ``jax.device_put_replicated``: each
    leaf ``[...]`` becomes a ``jax.Array`` ``[n_devices, ...]`` sharded
    ``P("data")`` over a 1-D mesh of ``devices``, the layout ``jax.pmap``
    expects.
    """
    mesh = Mesh(np.array(devices), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    n = len(devices)
    return jax.tree.map(lambda a: jax.device_put(np.broadcast_to(np.asarray(a), (n,) + np.shape(a)), sharding), tree)


def unreplicate(tree):
    """Take device 0's copy of each array: ``[n_devices, ...] -> [...]``.

    Outside ``jit`` it indexes with no mesh in context (``jax.set_mesh(None)``):
    the arrays of a ``pmap`` live on pmap's own mesh, which JAX refuses to
    index under a different mesh set in context (notebook 03, section 4).
    """
    if any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(tree)):
        return jax.tree.map(lambda a: a[0], tree)
    with jax.set_mesh(None):
        return jax.tree.map(lambda a: a[0], tree)


def make_device_axis_step(cfg: Config, optimizer: optax.GradientTransformation, n_devices: int) -> StepFn:
    """Automatic data parallelism with one gradient reduction per step.

    Plain ``jax.jit`` on the same sharded arrays as :func:`make_train_step`,
    but the global batch is reshaped to ``[n_devices, per_device_batch, 784]``
    and the per-device gradients come from ``jax.vmap`` over that leading
    axis. Each device then accumulates its own gradient through the backward
    ``scan`` (an array ``[n_devices, ...]`` sharded over the mesh), and the
    mean over the device axis after the loop is the only all-reduce.
    Taught in notebook 04: the CPU compiler places the plain step's
    reduction of the shared block's gradient inside the backward loop; this
    form has one reduction per step whatever the backend's passes do.

    Raises:
        ValueError: (when called) the global batch does not divide by
            ``n_devices``; or the batch is on an Explicit-axes mesh that is
            not set (:func:`check_mesh_context`).
    """

    grad_fn = jax.vmap(
        jax.value_and_grad(functools.partial(loss_and_metrics, cfg=cfg), has_aux=True), in_axes=(None, 0, 0)
    )

    def train_step(params, opt_state, x, y):
        check_mesh_context(x)
        per_device = check_global_batch(x.shape[0], n_devices)
        xs = x.reshape(n_devices, per_device, x.shape[-1])
        ys = y.reshape(n_devices, per_device)
        (_, metrics), grads = grad_fn(params, xs, ys)
        grads = jax.tree.map(lambda g: g.mean(axis=0), grads)
        metrics = jax.tree.map(lambda m: m.mean(axis=0), metrics)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, metrics

    return train_step


def max_abs_diff(tree_a, tree_b) -> float:
    """Largest absolute element-wise difference between two pytrees of arrays.

    Raises:
        ValueError: the trees have different structure or leaf shapes.
    """
    leaves_a, def_a = jax.tree.flatten(tree_a)
    leaves_b, def_b = jax.tree.flatten(tree_b)
    if def_a != def_b:
        raise ValueError(f"Different tree structures: {def_a} vs {def_b}.")
    worst = 0.0
    for a, b in zip(leaves_a, leaves_b):
        a, b = np.asarray(jax.device_get(a)), np.asarray(jax.device_get(b))
        if a.shape != b.shape:
            raise ValueError(f"Leaf shapes differ: {a.shape} vs {b.shape}.")
        if a.size:
            worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
    return worst


def adam_first_moment(opt_state):
    """The first-moment estimate ``mu`` of an optax Adam/AdamW state (a params-shaped tree).

    After one step from a fresh state, ``mu = (1 - b1) x gradient`` (optax's
    default ``b1 = 0.9``), so comparing ``mu`` compares gradients, which
    AdamW's normalised update would hide: a gradient N times too large
    gives almost the same parameters but an N times larger ``mu``.

    Raises:
        ValueError: no Adam state in ``opt_state``.
    """
    for leaf in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "mu") and hasattr(x, "nu")):
        if hasattr(leaf, "mu") and hasattr(leaf, "nu"):
            return leaf.mu
    raise ValueError("No Adam state (with mu and nu) found in opt_state.")


GRAD_REL_TOL = 1e-4  # float32 everywhere (CPU); see equivalence_tolerances


def equivalence_tolerances(platform: str, learning_rate: float, steps: int) -> tuple[float, float]:
    """Tolerances for "N devices give the same result as one" (notebooks 04 to 06).

    Returns:
        ``(param_abs_tol, grad_rel_tol)``: the largest tolerated absolute
        parameter difference after ``steps`` AdamW steps, and the largest
        tolerated gradient difference relative to the largest gradient element.

    Why these values:

    - CPU: every matmul is float32 (machine epsilon 1.2e-7). Summing the
      same terms in another order (per shard, then across shards) changes a
      gradient by a few roundings, far below 1e-4 of its largest element;
      the parameters stay within 1e-5 (measured: below 1e-6).
    - GPU: JAX's default float32 matmul runs as TF32, whose inputs keep 10
      mantissa bits (rounding 2^-11, about 5e-4); a different accumulation
      order can move a value across a rounding boundary, so gradients get
      1e-2. AdamW moves each weight by at most about ``learning_rate`` per
      step whatever the gradient, so two correct runs can differ by up to
      ``2 x learning_rate x steps`` where a gradient element is near zero:
      that is the honest parameter bound there, and the gradient check is
      the sharp one.

    Either way a gradient scaled by N (``psum`` for ``pmean``) is a relative
    error of N - 1 >= 1 and fails.
    """
    if platform == "cpu":
        return 1e-5, GRAD_REL_TOL
    return 2.0 * learning_rate * steps, 1e-2


def first_step_gradient_diff(state_ref, state_other, b1: float = 0.9) -> tuple[float, float]:
    """Compare the gradients of the first step via AdamW's first moment.

    Both states must come from exactly one step from a fresh ``optimizer.init``.
    Pmap states (leading device axis) are reduced to device 0's copy.

    Returns:
        ``(max_abs_grad_diff, max_abs_grad)``: the largest absolute gradient
        difference and the largest absolute reference gradient element.
    """
    mu_ref = adam_first_moment(state_ref)
    mu_other = adam_first_moment(state_other)
    # A pmap state has one more (leading, device) axis on every leaf.
    extra_axes = np.ndim(jax.tree.leaves(mu_other)[0]) - np.ndim(jax.tree.leaves(mu_ref)[0])
    if extra_axes == 1:
        mu_other = unreplicate(mu_other)
    elif extra_axes == -1:
        mu_ref = unreplicate(mu_ref)
    diff = max_abs_diff(mu_ref, mu_other) / (1.0 - b1)
    scale = max(float(np.max(np.abs(np.asarray(jax.device_get(a))))) for a in jax.tree.leaves(mu_ref)) / (1.0 - b1)
    return diff, scale
