"""Lesson 12's tools: steps to a held-out target, the gradient noise scale, and the steps-examples fit.

Taught in notebook 12 (``notebooks/12_batch_size.py``), which writes the
noise step, the estimator and the steps-to-target loop in its own cells and
checks them against these. Sources:

- McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch
  Training", arXiv:1812.06162: the simple noise scale
  ``B_simple = tr(Sigma) / |G|^2`` (section 2.2), its unbiased estimate from
  gradient norms at two batch sizes (Appendix A), and the trade-off
  ``(S / S_min - 1)(E / E_min - 1) = 1`` with ``B_crit = E_min / S_min``
  (section 2.3).
- Shallue, Lee, Antognini et al. 2018, "Measuring the Effects of Data
  Parallelism on Neural Network Training", arXiv:1811.03600: steps to a
  fixed target against batch size (perfect scaling, then diminishing returns).
- Goyal et al. 2017, "Accurate, Large Minibatch SGD", arXiv:1706.02677: the
  linear learning-rate rule (for SGD, with a gradual warm-up); Malladi, Lyu,
  Panigrahi and Arora 2022, "On the SDEs and Scaling Rules for Adaptive
  Gradient Algorithms", arXiv:2205.10287: the square-root rule for Adam-type
  optimizers (learning rate times ``sqrt(kappa)``, ``1 - beta1`` and
  ``1 - beta2`` times ``kappa``, ``epsilon`` divided by ``sqrt(kappa)`` for a
  batch ``kappa`` times larger). :func:`scaled_learning_rate` takes only the
  learning-rate part of each.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse.config import Config
from dpcourse.model import loss_and_metrics
from dpcourse.train import check_global_batch

LR_RULES = ("same", "sqrt", "linear")


def _whole(value, name: str, least: int = 1) -> int:
    """``value`` as an int when it is a whole number >= ``least``.

    Raises:
        ValueError: anything else (None, NaN, inf, 2.5, a string, True), in one sentence.
    """
    try:
        ok = not isinstance(value, (str, bytes, bool)) and float(value).is_integer() and int(value) >= least
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}.")
    return int(value)


def _finite(value, name: str, above: float | None = 0.0) -> float:
    """``value`` as a float when it is a finite number (> ``above`` unless that is None).

    Raises:
        ValueError: None, NaN, inf, a string, or a number not above ``above``, in one sentence.
    """
    try:
        number = None if isinstance(value, (str, bytes, bool)) else float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not math.isfinite(number) or (above is not None and number <= above):
        bound = "" if above is None else f" > {above:g}"
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}.")
    return number


@dataclass(frozen=True)
class Plan:
    """The sizes of lesson 12 for one profile.

    Attributes:
        global_batches: global batches trained to the target (examples), smallest
            first, rounded down to multiples of the device count by the lesson;
            the learning-rate rules scale from the smallest.
        base_lr: AdamW learning rate at the smallest global batch.
        target_loss: the held-out mean cross-entropy to reach.
        max_steps: a run that has not reached the target by then stops ("not reached").
        patience: a run stops ("not reached") after this many steps without a
            new best held-out loss (a diverged or stalled run).
        held_out: examples held out at the end of the training set (never trained on).
        width, block_repeats: the model's sizes for this lesson (smaller than
            the profile's, so that some 20 runs to a target fit the budget).
        seeds: seeds of the spread shown at the second global batch.
        chunk_examples: examples per call of the training loop (``k`` steps of
            ``B`` examples, ``k = chunk_examples // B``, at least 1, at most 64).
    """

    global_batches: tuple[int, ...]
    base_lr: float
    target_loss: float
    max_steps: int
    patience: int
    held_out: int
    width: int
    block_repeats: int
    seeds: tuple[int, ...]
    chunk_examples: int

    def chunk(self, global_batch: int) -> int:
        """Steps per call of the training loop at ``global_batch``."""
        return max(1, min(64, self.chunk_examples // global_batch))


PLANS: dict[str, Plan] = {
    "full": Plan((64, 256, 1024, 4096, 16384), 1e-3, 0.35, 4000, 200, 4096, 256, 16, (0, 1, 2), 65536),
    "cpu": Plan((64, 256, 512, 1024, 2048), 1e-3, 0.1, 500, 30, 1024, 32, 1, (0, 1, 2), 16384),
    "smoke": Plan((16, 64, 256), 1e-3, 1.2, 400, 30, 128, 16, 1, (0, 1), 4096),
}


def plan_for(profile: str) -> Plan:
    """The :class:`Plan` of a profile.

    Raises:
        ValueError: an unknown profile (the message lists the known ones).
    """
    if profile not in PLANS:
        raise ValueError(f"No lesson 12 plan for profile {profile!r}: use one of {', '.join(PLANS)}.")
    return PLANS[profile]


def scaled_learning_rate(base_lr: float, base_batch: int, global_batch: int, rule: str) -> float:
    """The learning rate at ``global_batch`` under a scaling rule.

    Only the learning rate moves; the optimizer's other settings stay.
    ``"same"``: ``base_lr``; ``"sqrt"``: ``base_lr * sqrt(B / B0)``, the
    learning-rate part of Malladi et al. 2022's square-root rule for Adam-type
    optimizers (their rule also scales ``1 - beta1``, ``1 - beta2`` and
    ``epsilon``); ``"linear"``: ``base_lr * B / B0``, Goyal et al. 2017's rule
    for SGD with momentum without the gradual warm-up it comes with.

    Raises:
        ValueError: an unknown rule, or a batch < 1.
    """
    if rule not in LR_RULES:
        raise ValueError(f"Unknown learning-rate rule {rule!r}: use one of {', '.join(LR_RULES)}.")
    _finite(base_lr, "The base learning rate")
    ratio = _whole(global_batch, "The global batch") / _whole(base_batch, "The base batch")
    return base_lr * {"same": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[rule]


def make_noise_step(cfg: Config, optimizer: optax.GradientTransformation, mesh: Mesh, axis: str = "data") -> Callable:
    """Notebook 05's ``shard_map`` step that also returns two squared gradient norms.

    Each device computes its local gradient ``g_b`` (of its per-device batch
    ``b``) and its squared norm; one more scalar ``pmean`` gives the mean of
    the per-device ``|g_b|^2``; the averaged gradient ``G_B`` (global batch
    ``B``) gives ``|G_B|^2`` with no collective. The training step itself is
    the same as :func:`dpcourse.train.make_shard_map_step`'s.

    Returns:
        ``step(params, opt_state, x, y) -> (params, opt_state, metrics, norms)``
        with ``x`` the global batch ``[B, 784]`` sharded ``P(axis, None)`` and
        ``norms = {"local_sq": mean over devices of |g_b|^2, "global_sq": |G_B|^2}``
        (float32 scalars, replicated), not jitted.

    Raises:
        ValueError: ``axis`` is not an axis of ``mesh``.
    """
    if axis not in mesh.axis_names:
        raise ValueError(f"The mesh has the axes {mesh.axis_names}, not {axis!r}: give axis= one of them.")

    def sq_norm(tree):
        return sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(tree))

    def local_grads(params, x, y):
        params = jax.lax.pcast(params, axis, to="varying")
        grad_fn = jax.value_and_grad(loss_and_metrics, has_aux=True)
        (_, metrics), grads = grad_fn(params, x, y, cfg)
        local_sq = jax.lax.pmean(sq_norm(grads), axis)  # the one extra scalar collective
        grads = jax.lax.pmean(grads, axis)
        metrics = jax.lax.pmean(metrics, axis)
        return grads, metrics, {"local_sq": local_sq, "global_sq": sq_norm(grads)}

    sharded = jax.shard_map(local_grads, mesh=mesh, in_specs=(P(), P(axis, None), P(axis)), out_specs=(P(), P(), P()))

    def step(params, opt_state, x, y):
        grads, metrics, norms = sharded(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, metrics, norms

    return step


def noise_terms(local_sq: float, global_sq: float, b: int, big_b: int) -> tuple[float, float]:
    """Unbiased estimates of ``|G|^2`` and ``tr(Sigma)`` from one step (McCandlish et al. 2018, App. A).

    ``|G|^2 ~ (B |G_B|^2 - b |G_b|^2) / (B - b)`` and
    ``tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)``. Each is noisy and may
    be negative on one step: average each over steps before dividing
    (:class:`NoiseScale`).

    Args:
        local_sq: ``|G_b|^2``, the squared norm of a gradient over ``b`` examples
            (in data parallelism: the per-device gradient, averaged over devices).
        global_sq: ``|G_B|^2``, over ``B`` examples (the averaged gradient).
        b, big_b: the two batch sizes, ``b < B`` (per-device and global batch).

    Raises:
        ValueError: ``b >= B`` or ``b < 1`` (one device gives no second batch size).
    """
    if not 1 <= b < big_b:
        raise ValueError(
            f"Need two batch sizes 1 <= b < B, got b={b}, B={big_b}: on one device the per-device and the "
            "global batch are the same; use 2 or more devices."
        )
    g2 = (big_b * global_sq - b * local_sq) / (big_b - b)
    trace = (local_sq - global_sq) / (1.0 / b - 1.0 / big_b)
    return g2, trace


@dataclass
class NoiseScale:
    """Running means of the two estimates over steps; ``b_simple`` is their ratio.

    ``b_simple = mean tr(Sigma) / mean |G|^2`` (the numerator and the
    denominator averaged separately, as McCandlish et al. 2018 do, App. A).
    """

    b: int
    big_b: int
    g2_sum: float = 0.0
    trace_sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        noise_terms(0.0, 0.0, _whole(self.b, "The per-device batch b"), _whole(self.big_b, "The global batch B"))

    def update(self, local_sq: float, global_sq: float) -> None:
        """Add one step's squared norms (``|G_b|^2``, ``|G_B|^2``)."""
        g2, trace = noise_terms(float(local_sq), float(global_sq), self.b, self.big_b)
        self.g2_sum += g2
        self.trace_sum += trace
        self.count += 1

    @property
    def b_simple(self) -> float:
        """The simple noise scale in examples; NaN before any step or when mean ``|G|^2 <= 0``."""
        if self.count == 0 or self.g2_sum <= 0:
            return float("nan")
        return self.trace_sum / self.g2_sum


def make_optimizer(learning_rate: float, weight_decay: float) -> optax.GradientTransformation:
    """AdamW with its learning rate in the optimizer state (``optax.inject_hyperparams``).

    The same compiled step then trains at any learning rate: the rules of
    :func:`scaled_learning_rate` change a number in the state, not the program.

    Raises:
        ValueError: a learning rate that is not a finite number > 0, or a weight decay not finite >= 0.
    """
    _finite(learning_rate, "The learning rate")
    if _finite(weight_decay, "The weight decay", above=None) < 0:
        raise ValueError(f"The weight decay must be >= 0, got {weight_decay!r}.")
    return optax.inject_hyperparams(optax.adamw)(learning_rate=learning_rate, weight_decay=weight_decay)


def make_run_steps(step: Callable, held_out_loss: Callable) -> Callable:
    """``k`` noise steps in one call (``lax.scan``), with the held-out loss after each.

    Args:
        step: a noise step (:func:`make_noise_step`, not jitted).
        held_out_loss: ``(params, x_held, y_held) -> scalar`` mean loss.

    Returns:
        ``run_steps(params, opt_state, xs, ys, x_held, y_held) -> (params, opt_state,
        held [k], local_sq [k], global_sq [k])`` with ``xs`` ``[k, B, 784]`` (global
        batches, sharded over the batch axis), not jitted.
    """

    def run_steps(params, opt_state, xs, ys, x_held, y_held):
        def body(carry, batch):
            params, opt_state, _, norms = step(*carry, *batch)
            held = held_out_loss(params, x_held, y_held)
            return (params, opt_state), (held, norms["local_sq"], norms["global_sq"])

        (params, opt_state), (held, local_sq, global_sq) = jax.lax.scan(body, (params, opt_state), (xs, ys))
        return params, opt_state, held, local_sq, global_sq

    return run_steps


@dataclass
class Run:
    """One training run to the target.

    Attributes:
        steps: the first step after which the held-out loss was at or below
            the target; None if not reached (the step limit, or no new best
            held-out loss for ``patience`` steps).
        held_out: the held-out loss after each step run (up to ``steps``).
        seconds: wall time of the loop (steps, held-out losses, noise updates).
        noise: the running noise scale over the steps counted (None: not estimated).
    """

    steps: int | None
    held_out: list[float] = field(default_factory=list)
    seconds: float = 0.0
    noise: NoiseScale | None = None


def steps_to_target(
    run_steps: Callable,
    params,
    opt_state,
    batches: Callable[[int, int], tuple],
    held_out: tuple,
    target: float,
    max_steps: int,
    chunk: int,
    noise: NoiseScale | None = None,
    patience: int | None = None,
) -> Run:
    """Train until the held-out loss is at or below ``target``; count the steps.

    Runs ``chunk`` steps per call; the count is exact (the held-out loss is
    taken after every step), the steps after the crossing in the last
    chunk are not counted.

    Args:
        run_steps: :func:`make_run_steps`' function, jitted.
        batches: ``(start, k) -> (xs, ys)``, the global batches of steps
            ``start`` to ``start + k - 1`` stacked ``[k, B, ...]``, placed.
        held_out: ``(x_held, y_held)``, placed.
        noise: updated with each counted step's norms, when given.
        patience: stop ("not reached") after this many steps without a new
            best held-out loss (a diverged or stalled run); None: never.

    Returns:
        A :class:`Run`.

    Raises:
        ValueError: a target that is not a finite number, or a ``max_steps``, ``chunk`` or
            ``patience`` that is not a whole number >= 1 (one sentence each).
    """
    _finite(target, "The target held-out loss", above=None)
    max_steps, chunk = _whole(max_steps, "max_steps"), _whole(chunk, "chunk (steps per call)")
    patience = None if patience is None else _whole(patience, "patience")
    start = time.perf_counter()
    losses: list[float] = []
    best, since_best = math.inf, 0
    while len(losses) < max_steps:
        xs, ys = batches(len(losses), chunk)
        params, opt_state, held, local_sq, global_sq = run_steps(params, opt_state, xs, ys, *held_out)
        for loss, lsq, gsq in zip(np.asarray(held), np.asarray(local_sq), np.asarray(global_sq)):
            losses.append(float(loss))
            if noise is not None:
                noise.update(lsq, gsq)
            if losses[-1] <= target:
                return Run(len(losses), losses, time.perf_counter() - start, noise)
            best, since_best = (losses[-1], 0) if losses[-1] < best else (best, since_best + 1)
            if len(losses) >= max_steps or (patience is not None and since_best >= patience):
                return Run(None, losses, time.perf_counter() - start, noise)
    return Run(None, losses, time.perf_counter() - start, noise)


def batch_stream(
    x: np.ndarray, y: np.ndarray, global_batch: int, seed: int, mesh: Mesh, axis: str = "data"
) -> Callable:
    """``batches(start, k)``: the global batches of steps ``start`` to ``start + k - 1``, placed on ``mesh``.

    The examples are read in an order shuffled with ``seed``, wrapping
    around (epochs); step ``i`` always gets the same batch, however the
    steps are grouped into calls.

    Args:
        x, y: host arrays ``[n, 784]`` and ``[n]`` (the training slice).

    Returns:
        ``batches(start, k) -> (xs [k, B, 784], ys [k, B])``, sharded over
        ``axis`` along the batch (the second) dimension.

    Raises:
        ValueError: a global batch that is not a whole number >= 1 or that the devices along
            ``axis`` do not divide (:func:`dpcourse.train.check_global_batch`), an ``axis`` the
            mesh does not have, or ``x`` and ``y`` of other lengths or empty.
    """
    if axis not in mesh.axis_names:
        raise ValueError(f"The mesh has the axes {mesh.axis_names}, not {axis!r}: give axis= one of them.")
    check_global_batch(_whole(global_batch, "The global batch"), mesh.shape[axis])
    if len(x) != len(y) or len(y) == 0:
        raise ValueError(f"x and y must hold the same number of examples, at least 1, got {len(x)} and {len(y)}.")
    order = np.random.default_rng(seed).permutation(len(y))
    x_sharding = NamedSharding(mesh, P(None, axis, None))
    y_sharding = NamedSharding(mesh, P(None, axis))

    def batches(start: int, k: int):
        idx = order[(start * global_batch + np.arange(k * global_batch)) % len(order)]
        xs = x[idx].reshape(k, global_batch, -1)
        return jax.device_put(xs, x_sharding), jax.device_put(y[idx].reshape(k, global_batch), y_sharding)

    return batches


@dataclass(frozen=True)
class TradeOff:
    """The fit ``S = S_min + E_min / B`` (the trade-off ``(S/S_min - 1)(E/E_min - 1) = 1`` with ``E = B S``).

    Attributes:
        s_min: fewest steps (an infinite batch), steps.
        e_min: fewest examples (batch -> 0), examples.
        worst_error: largest relative error of the fit at the batches fitted.
    """

    s_min: float
    e_min: float
    worst_error: float

    def __post_init__(self) -> None:  # a fit with no finite prediction (a NaN step count) never exists
        _finite(self.s_min, "S_min")
        _finite(self.e_min, "E_min")
        if _finite(self.worst_error, "The fit's worst error", above=None) < 0:
            raise ValueError(f"The fit's worst error is a relative error >= 0, got {self.worst_error!r}.")

    @property
    def b_crit(self) -> float:
        """The critical batch ``E_min / S_min`` (examples): twice the fewest steps and twice the fewest examples."""
        return self.e_min / self.s_min

    def steps_at(self, global_batch: float) -> float:
        """Predicted steps to the target at ``global_batch``: ``S_min (1 + B_crit / B)``."""
        return self.s_min + self.e_min / _finite(global_batch, "The global batch")


def fit_trade_off(global_batches: Sequence[int], steps: Sequence[float]) -> TradeOff:
    """Fit ``S = S_min + E_min / B`` to measured steps by least squares in ``1 / B``.

    From ``(S/S_min - 1)(E/E_min - 1) = 1`` and ``E = B S``:
    ``S = S_min + E_min / B`` exactly (McCandlish et al. 2018, eq. 2.11 with
    ``B_crit = E_min / S_min``), a straight line in ``1 / B``.

    Raises:
        ValueError: a batch that is not a whole number >= 1, a step count that is None (a run
            that did not reach the target) or not a finite number > 0, fewer than 2 distinct
            batches, or a fit with ``S_min <= 0`` or ``E_min <= 0`` (the steps do not fall
            with the batch as the model needs); one sentence each.
    """
    global_batches, steps = list(global_batches), list(steps)
    if len(global_batches) != len(steps):
        raise ValueError(f"Need one step count per global batch, got {len(global_batches)} and {len(steps)}.")
    for batch, count in zip(global_batches, steps):
        batch = _whole(batch, "Each global batch")
        if count is None:
            raise ValueError(
                f"The steps at global batch {batch} are None (its run did not reach the target): leave that "
                "batch out of the fit, as the lesson does."
            )
        _finite(count, f"The steps at global batch {batch}")
    if len(set(global_batches)) < 2:
        raise ValueError(
            f"The fit needs steps to the target at 2 or more distinct global batches, got {len(set(global_batches))} "
            f"({dict(zip(global_batches, steps))}): let the runs go on longer (the plan's max_steps and patience) "
            "or aim at a higher held-out loss (its target_loss), then run the training cells again."
        )
    batches = np.asarray(global_batches, dtype=float)
    s = np.asarray(steps, dtype=float)
    design = np.stack([np.ones_like(batches), 1.0 / batches], axis=1)
    (s_min, e_min), *_ = np.linalg.lstsq(design, s, rcond=None)
    if s_min <= 0 or e_min <= 0:
        raise ValueError(
            f"The fit gives S_min={s_min:.3g} and E_min={e_min:.3g}; both must be > 0. The steps do not fall "
            "with the batch as the model expects: add batches, or a target that takes more steps."
        )
    worst = float(np.max(np.abs(design @ np.array([s_min, e_min]) - s) / s))
    return TradeOff(float(s_min), float(e_min), worst)
