# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 12 · A bigger global batch: steps to a target, the learning rate, the noise scale
#
# **Goal.** Data parallelism with a fixed per-device batch multiplies the
# global batch by N. Notebooks 04 and 07 measured what that does to
# throughput. The question that comes next: **does training reach its
# target N times sooner?** Train the same model from the same start at
# several global batches until it reaches a loss on examples it never
# trains on; count the steps; fit where a bigger batch stops saving steps;
# estimate the same limit from the gradient noise scale, which the
# data-parallel step gives almost for free; and turn steps into time to the
# target on 2 x L4, 8 x H200 and TPU v5e slices.
#
# **Assumes.** Notebooks 04 and 05 (the `shard_map` step), 07 (the sweep
# and its cost model). At least 2 devices.
#
# **Time**: under 30 s with `smoke`, under 30 s with `cpu`, on a 2-core CPU; under 1 min with `cpu`
# (on 8 simulated CPU devices), on 1 x TPU v5 lite (measured; other work slows it: the run's
# details, its load included, are in `baselines/timings.json`).
#
# **Sources.** Shallue et al. 2018, "Measuring the Effects of Data
# Parallelism on Neural Network Training" (arXiv:1811.03600); McCandlish et
# al. 2018, "An Empirical Model of Large-Batch Training" (arXiv:1812.06162);
# Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1
# Hour" (arXiv:1706.02677); Malladi et al. 2022, "On the SDEs and Scaling
# Rules for Adaptive Gradient Algorithms" (arXiv:2205.10287).

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for multi-device lessons

# %%
from dpcourse.lesson import start_lesson

lesson = start_lesson("12_batch_size", PROFILE, N_CPU_DEVICES, min_devices=2)
dataset = lesson.dataset

# %%
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from IPython.display import display
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import bench, config, model, record, show, train
from dpcourse.exercises import checks
from dpcourse.exercises.cells import check_against
from dpcourse.large_batch import batch_size, readings, time_to_target

devs = lesson.devices.devices
lesson.check_global_mesh()  # a mesh you set with jax.set_mesh must be this lesson's, or none
n, backend = len(devs), devs[0].platform
mesh = Mesh(np.array(devs), ("data",))  # Auto axes, as in 04 and 05
plan = batch_size.plan_for(lesson.cfg.profile)
# A smaller model than the profile's: this lesson trains it to a target some 20 times.
cfg = lesson.cfg.with_overrides(width=plan.width, block_repeats=plan.block_repeats)
sizes, rounded = bench.sizes_for_devices(plan.global_batches, n)
# The held-out slice: the last examples of the training set, never in a training batch.
n_held = plan.held_out // n * n
x_train, y_train = dataset.images[: -plan.held_out], dataset.labels[: -plan.held_out]
held_host = dataset.images[-plan.held_out :][:n_held], dataset.labels[-plan.held_out :][:n_held]
x_held = jax.device_put(held_host[0], NamedSharding(mesh, P("data", None)))
y_held = jax.device_put(held_host[1], NamedSharding(mesh, P("data")))
print(f"{lesson.devices.label}; {model.param_count(cfg):,} parameters (width {cfg.width})")
print(
    f"training slice: {len(y_train):,} examples; "
    f"held-out slice: the last {n_held:,} ({dataset.source} data)"
)
print(f"global batches: {sizes}; target: held-out loss <= {plan.target_loss}")
if rounded:
    print(f"rounded to multiples of {n} devices: {', '.join(rounded)}")

# %% [markdown]
# ## 1. The step that measures its own noise
#
# Each device computes the gradient of its **per-device batch** `b`
# (before the `pmean`); the `pmean` gives the gradient of the **global
# batch** `B = n x b`. Both are estimates of the true gradient `G`: the
# smaller batch's is noisier. McCandlish et al. (App. A) show that two
# squared norms, `|G_b|^2` and `|G_B|^2`, give unbiased estimates of the
# signal `|G|^2` and of the noise `tr(Sigma)` (the summed variance of one
# example's gradient):
#
# - `|G|^2 ~ (B |G_B|^2 - b |G_b|^2) / (B - b)`
# - `tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)`
#
# Their ratio, the **simple noise scale** `B_simple = tr(Sigma) / |G|^2`, is
# the batch at which the gradient's noise and its signal are of the same
# size. In McCandlish et al.'s model, well below it a bigger batch mostly
# removes noise (a doubling comes close to halving the steps), well above
# it mostly repeats the signal (each doubling saves a smaller share of
# them); section 3 prints how closely this run's steps followed that, and
# section 4 how close `B_simple` came to the bend. The data-parallel step
# already holds both gradients; it costs one more scalar `pmean`, of each
# device's squared norm. Notebook 05's step, with that added:


# %%
def sq_norm(tree):
    return sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(tree))


def grads_and_norms(params, x, y):
    """On one device: x [per_device_batch, 784]. Averaged gradient, metrics, two squared norms."""
    params = jax.lax.pcast(params, "data", to="varying")  # this device's own copy (05)
    grad_fn = jax.value_and_grad(model.loss_and_metrics, has_aux=True)
    (_, metrics), grads = grad_fn(params, x, y, cfg)
    local_sq = jax.lax.pmean(sq_norm(grads), "data")  # mean of |G_b|^2: the one extra scalar
    grads = jax.lax.pmean(grads, "data")  # G_B, the all-reduce of 05
    metrics = jax.lax.pmean(metrics, "data")
    return grads, metrics, {"local_sq": local_sq, "global_sq": sq_norm(grads)}


def make_noise_step(optimizer, mesh):
    """step(params, opt_state, x [global_batch, 784], y) -> (params, opt_state, metrics, norms)."""
    specs = dict(in_specs=(P(), P("data", None), P("data")), out_specs=(P(), P(), P()))
    sharded = jax.shard_map(grads_and_norms, mesh=mesh, **specs)

    def step(params, opt_state, x, y):
        grads, metrics, norms = sharded(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, metrics, norms

    return step


# %% [markdown]
# The optimizer is AdamW with its learning rate kept in its state
# (`optax.inject_hyperparams`), so one compiled step serves every learning
# rate below. `check_against` compares your cell with the package's
# (`dpcourse.large_batch.batch_size.make_noise_step`), leaf by leaf; and the extra
# `pmean` must leave the training itself alone: the parameters, AdamW's
# state and the metrics after one step, against notebook 05's step.

# %%
optimizer = batch_size.make_optimizer(plan.base_lr, cfg.weight_decay)
p_try = jax.device_put(model.init_params(cfg), NamedSharding(mesh, P()))
s_try = optimizer.init(p_try)
x_try, y_try = batch_size.batch_stream(x_train, y_train, sizes[0], 0, mesh)(0, 1)
x_try, y_try = x_try[0], y_try[0]
display(
    check_against(
        batch_size.make_noise_step(cfg, optimizer, mesh),
        make_noise_step(optimizer, mesh),
        p_try,
        s_try,
        x_try,
        y_try,
    )
)
with_norms = jax.jit(make_noise_step(optimizer, mesh))(p_try, s_try, x_try, y_try)
plain = jax.jit(train.make_shard_map_step(cfg, optimizer, mesh))(p_try, s_try, x_try, y_try)
extra_diff = train.max_abs_diff(with_norms[:3], plain)
print(f"max |diff| after one step, with the norms vs 05's step: {extra_diff}")
if backend == "cpu":  # the same arithmetic on the CPU: bitwise equal
    assert extra_diff == 0.0, f"the extra pmean changed the training step by {extra_diff}"

# %% [markdown]
# ## 2. The estimate, averaged over steps
#
# One step's estimates are noisy and can even be negative; McCandlish et
# al. average the numerator and the denominator **separately** over steps,
# then divide. The estimate of one step, and a check against the package's:


# %%
def noise_terms(local_sq, global_sq, b, big_b):
    """(|G|^2, tr(Sigma)) from |G_b|^2 (per-device batch b) and |G_B|^2 (global batch B)."""
    g2 = (big_b * global_sq - b * local_sq) / (big_b - b)
    trace = (local_sq - global_sq) / (1 / b - 1 / big_b)
    return g2, trace


local_sq, global_sq = float(with_norms[3]["local_sq"]), float(with_norms[3]["global_sq"])
b0, big_b0 = sizes[0] // n, sizes[0]
mine = noise_terms(local_sq, global_sq, b0, big_b0)
package = batch_size.noise_terms(local_sq, global_sq, b0, big_b0)
print(f"first step at B = {big_b0} (b = {b0}): |G_b|^2 = {local_sq:.4g}, |G_B|^2 = {global_sq:.4g}")
print(
    f"|G|^2 ~ {mine[0]:.4g}, tr(Sigma) ~ {mine[1]:.4g}, "
    f"one step's B_simple ~ {mine[1] / mine[0]:.4g}"
)
assert np.allclose(mine, package, rtol=1e-12), f"your noise_terms {mine} vs the package's {package}"

# %% [markdown]
# `batch_size.NoiseScale` keeps the two running sums; the training loop
# below feeds it every step's norms.
#
# ## 3. Steps to a target
#
# The loop of this lesson: from the same initial parameters, train until
# the loss on the held-out slice is at or below the target, and count the
# steps (Shallue et al.'s measurement). For speed, `run_steps` runs `k`
# steps in one call (`lax.scan`) and returns the held-out loss after each,
# so the count is exact; the steps after the crossing in the last call are
# not counted. A run that makes no progress for `plan.patience` steps (a
# learning rate that diverged) stops as "not reached".


# %%
def held_out_loss(params, x, y):
    return model.loss_and_metrics(params, x, y, cfg)[0]


def make_run_steps(step):
    """run_steps(params, opt_state, xs [k, B, 784], ys, x_held, y_held): k steps and losses."""

    def run_steps(params, opt_state, xs, ys, x_held, y_held):
        def body(carry, batch):
            params, opt_state, _, norms = step(*carry, *batch)
            held = held_out_loss(params, x_held, y_held)
            return (params, opt_state), (held, norms["local_sq"], norms["global_sq"])

        (params, opt_state), outs = jax.lax.scan(body, (params, opt_state), (xs, ys))
        return params, opt_state, *outs

    return run_steps


def steps_to_target(run_steps, params, opt_state, batches, held, target, max_steps, chunk, noise):
    """(steps or None, held-out losses): train until the held-out loss is <= target."""
    losses, best, since_best = [], np.inf, 0
    while len(losses) < max_steps:
        xs, ys = batches(len(losses), chunk)
        params, opt_state, held_losses, local_sq, global_sq = run_steps(
            params, opt_state, xs, ys, *held
        )
        for loss, lsq, gsq in zip(
            np.asarray(held_losses), np.asarray(local_sq), np.asarray(global_sq)
        ):
            losses.append(float(loss))
            if noise is not None:
                noise.update(lsq, gsq)
            if losses[-1] <= target:
                return len(losses), losses
            best, since_best = (losses[-1], 0) if losses[-1] < best else (best, since_best + 1)
            if len(losses) >= max_steps or since_best >= plan.patience:
                return None, losses
    return None, losses


# %% [markdown]
# One compiled program per global batch (its shapes), whatever the
# learning rate, all compiled first, side by side; every run starts from
# the same parameters and reads the examples in the same order.

# %%
from concurrent.futures import ThreadPoolExecutor

compiled = {}  # (global batch, devices) -> run_steps compiled for that shape


def lower_run_steps(global_batch, on=mesh, held=(x_held, y_held)):
    """run_steps for `global_batch` on the mesh `on`, lowered (the learning rate is state)."""
    opt = batch_size.make_optimizer(plan.base_lr, cfg.weight_decay)
    params = jax.device_put(model.init_params(cfg), NamedSharding(on, P()))
    batches = batch_size.batch_stream(x_train, y_train, global_batch, 0, on)
    run_steps = jax.jit(make_run_steps(make_noise_step(opt, on)))
    return run_steps.lower(params, opt.init(params), *batches(0, plan.chunk(global_batch)), *held)


def train_to_target(global_batch, learning_rate, seed=0, on=mesh, held=(x_held, y_held)):
    """One run to the target on the mesh `on`: (steps or None, held-out losses, noise, seconds)."""
    opt = batch_size.make_optimizer(learning_rate, cfg.weight_decay)
    params = jax.device_put(model.init_params(cfg, seed), NamedSharding(on, P()))
    opt_state = opt.init(params)
    batches = batch_size.batch_stream(x_train, y_train, global_batch, seed, on)
    chunk = plan.chunk(global_batch)
    key = (global_batch, on.size)
    if key not in compiled:
        compiled[key] = lower_run_steps(global_batch, on, held).compile()
    noise = batch_size.NoiseScale(global_batch // on.size, global_batch) if on.size > 1 else None
    t0 = time.perf_counter()
    steps, losses = steps_to_target(
        compiled[key],
        params,
        opt_state,
        batches,
        held,
        plan.target_loss,
        plan.max_steps,
        chunk,
        noise,
    )
    return steps, losses, noise, time.perf_counter() - t0


lowered = {(batch, n): lower_run_steps(batch) for batch in sizes}
with ThreadPoolExecutor() as pool:  # the compiles are independent: use every core (as in 09)
    compiled.update(zip(lowered, pool.map(lambda low: low.compile(), lowered.values())))
runs = {}  # (rule, global batch) -> (steps, losses, noise, seconds)
for batch in show.progress(sizes, "global batches", "batch"):
    by_lr = {}  # the three rules share the smallest batch's learning rate
    for rule in batch_size.LR_RULES:
        lr = batch_size.scaled_learning_rate(plan.base_lr, sizes[0], batch, rule)
        if lr not in by_lr:
            by_lr[lr] = train_to_target(batch, lr)
        runs[rule, batch] = by_lr[lr]

# %% [markdown]
# Your loop against the package's (`batch_size.steps_to_target`), on the
# same compiled program at the smallest batch: the same steps, the same losses.

# %%
opt0 = batch_size.make_optimizer(plan.base_lr, cfg.weight_decay)
p0 = jax.device_put(model.init_params(cfg), NamedSharding(mesh, P()))
batches0 = batch_size.batch_stream(x_train, y_train, sizes[0], 0, mesh)
package_run = batch_size.steps_to_target(
    compiled[sizes[0], n],
    p0,
    opt0.init(p0),
    batches0,
    (x_held, y_held),
    plan.target_loss,
    plan.max_steps,
    plan.chunk(sizes[0]),
    patience=plan.patience,
)
mine_steps, mine_losses = runs["same", sizes[0]][:2]
print(f"steps: yours {mine_steps}, the package's {package_run.steps}")
assert mine_steps == package_run.steps and mine_losses == package_run.held_out, (
    f"Your loop reached the target in {mine_steps} steps and the package's in {package_run.steps} "
    "(or their held-out losses differ): both run the same program on the same batches, "
    "so compare your train_to_target with batch_size.steps_to_target."
)

# %% [markdown]
# The table: steps to the target for each global batch and learning-rate
# rule. Each rule scales only the learning rate, from the smallest batch's
# `plan.base_lr` at `B0`: "same" keeps it; "sqrt" multiplies it by
# `sqrt(B / B0)`; "linear" by `B / B0`. AdamW's other settings stay as
# they are at every batch.

# %%
rows = []
for batch in sizes:
    row = {"global batch": batch, "per-device batch": batch // n}
    for rule in batch_size.LR_RULES:
        steps = runs[rule, batch][0]
        row[f"steps ({rule})"] = steps if steps is not None else "not reached"
    for rule in ("sqrt", "linear"):
        row[f"lr ({rule})"] = batch_size.scaled_learning_rate(plan.base_lr, sizes[0], batch, rule)
    row["noise scale (sqrt run)"] = runs["sqrt", batch][2].b_simple
    rows.append(row)
display(
    show.table(rows, caption=f"Steps to held-out loss {plan.target_loss}, {lesson.devices.label}")
)

# %% [markdown]
# **Fit.** McCandlish et al. find that steps `S` and examples `E = B S` to
# a target trade off as `(S / S_min - 1)(E / E_min - 1) = 1`: with `E = B S`
# that is exactly `S = S_min + E_min / B`, a straight line in `1 / B`.
# `S_min` is the fewest steps any batch can take, `E_min` the fewest
# examples, and the **critical batch** `B_crit = E_min / S_min` is where
# the batch takes twice `S_min` steps and twice `E_min` examples. The model
# assumes a tuned learning rate at each batch: the fit takes, for each
# batch, the fewest steps of the three rules.

# %%
best = {}
for batch in sizes:
    reached = [runs[rule, batch][0] for rule in batch_size.LR_RULES if runs[rule, batch][0]]
    if reached:
        best[batch] = min(reached)
fit = batch_size.fit_trade_off(list(best), list(best.values()))
print(
    f"S_min = {fit.s_min:.1f} steps, E_min = {fit.e_min:,.0f} examples, "
    f"B_crit = {fit.b_crit:,.0f} examples (worst fit error {fit.worst_error:.0%})"
)

fig, ax = plt.subplots(figsize=(6.5, 3.8))
for rule, marker in zip(batch_size.LR_RULES, ("o", "s", "^")):
    got = [(b, runs[rule, b][0]) for b in sizes if runs[rule, b][0]]
    ax.plot(*zip(*got), marker=marker, label=f"{rule} learning rate")
curve = np.geomspace(sizes[0], sizes[-1], 50)
ax.plot(curve, [fit.steps_at(b) for b in curve], "k-", lw=1, label="fit S_min + E_min / B")
first = best[min(best)]
ax.plot(curve, first * min(best) / curve, "k:", label="perfect scaling")
ax.axvline(fit.b_crit, color="grey", ls="--", lw=1, label=f"B_crit = {fit.b_crit:,.0f}")
ax.set(xscale="log", yscale="log", xlabel="global batch (examples)", ylabel="steps to target")
ax.set_xticks(sizes, [str(b) for b in sizes])  # the trained batches only: no crowded minor labels
ax.xaxis.set_minor_formatter(plt.NullFormatter())
ax.set_title(f"Steps to held-out loss {plan.target_loss} ({dataset.source} data)")
ax.legend(fontsize=8)
fig.tight_layout()
_ = show.figure(fig, "steps_to_target")

# %% [markdown]
# Read the plot from left to right: at small batches the points can follow
# the perfect-scaling line (doubling the batch halves the steps; the line
# below says how close this run's two smallest batches came); towards
# `B_crit` they bend away. In the fit's model the steps never stop
# falling, they fall by less and less: a doubling from `B` saves
# `B_crit / (2 (B + B_crit))` of them, a quarter at `B_crit`, a tenth at
# `4 B_crit`. Section 6 reads the step between this run's two largest
# batches, and which rule did best at each batch, against the seeds'
# spread.
#
# The learning rate matters as much as the batch, and the rules here are
# partial, on purpose simple:
#
# - "sqrt" is only the learning-rate part of Malladi et al.'s square-root
#   rule for Adam-type optimizers. Their rule, for a batch `kappa` times
#   larger, also multiplies `1 - beta1` and `1 - beta2` by `kappa` and
#   divides `epsilon` by `sqrt(kappa)`; here those stay at AdamW's
#   defaults.
# - "linear" is Goyal et al.'s rule for SGD without the gradual warm-up
#   their rule comes with: at the large batches its first steps are as
#   large as its last.
#
# How close the two smallest batches came to perfect scaling, read from
# the table above (which rule did best is read in section 6, once the
# seeds have said how far a count moves by luck):

# %%
print(readings.scaling_sentence(best))

# %% [markdown]
# ## 4. The noise scale beside the critical batch
#
# Each run averaged `B_simple` over its steps. McCandlish et al. find that
# `B_simple` tracks `B_crit` across their tasks, but only roughly: the noise
# scale grows as the loss falls (so it depends on when it is read), and
# `B_simple` leaves out the curvature of the loss. How close the two come
# here is a result of this run, not a rule:

# %%
noise_by_batch = {b: runs["sqrt", b][2].b_simple for b in sizes}
b_simple = float(np.median([v for v in noise_by_batch.values() if np.isfinite(v)]))
factor = max(b_simple / fit.b_crit, fit.b_crit / b_simple)
display(
    show.key_values(
        {
            "B_simple, median over the square-root runs": f"{b_simple:,.0f} examples",
            "B_simple per run": ", ".join(f"{b}: {v:,.0f}" for b, v in noise_by_batch.items()),
            "B_crit from the fit": f"{fit.b_crit:,.0f} examples",
            "agreement": f"within a factor of {factor:.1f}",
        },
        caption="Noise scale and critical batch",
    )
)

# %% [markdown]
# The point: `B_simple` came from norms the data-parallel step already
# had, during **one** run, while `B_crit` needed a run to the target at
# every batch. On a real workload you would watch `B_simple` during
# training and grow the global batch (or the device count) while it stays
# well below it.
#
# ## 5. Data parallelism changes where, not what
#
# The steps depend on the **global** batch, not on how it is split. The
# same global batch on one device and on all of them, same start, same
# examples:

# %%
one_mesh = Mesh(np.array(devs[:1]), ("data",))
with jax.set_mesh(None):  # the one-device run, outside any global mesh
    held_one = tuple(jax.device_put(a, devs[0]) for a in held_host)
    steps_1, losses_1, _, _ = train_to_target(
        sizes[1],
        batch_size.scaled_learning_rate(plan.base_lr, sizes[0], sizes[1], "sqrt"),
        on=one_mesh,
        held=held_one,
    )
steps_n, losses_n = runs["sqrt", sizes[1]][:2]
common = min(len(losses_1), len(losses_n))
curve_diff = float(np.max(np.abs(np.array(losses_1[:common]) - np.array(losses_n[:common]))))
# float32 sums in another order (per shard, then across shards) differ by a few roundings a
# step; measured on the CPU (smoke and cpu profiles, 2 to 8 devices): held-out losses within
# 1e-6. 1e-4 leaves 100 x that. A GPU's default float32 matmul runs as TF32: 1e-2 there.
CURVE_TOL = 1e-4 if backend == "cpu" else 1e-2
display(
    show.table(
        [
            {"devices": 1, "global batch": sizes[1], "steps to target": steps_1},
            {"devices": n, "global batch": sizes[1], "steps to target": steps_n},
        ],
        caption="Same global batch, 1 device vs N devices",
    )
)
print(
    f"max |held-out loss difference| over {common} steps: {curve_diff:.2g} "
    f"(tolerance {CURVE_TOL:g})"
)
assert curve_diff < CURVE_TOL, checks.beyond(
    "the held-out losses, 1 vs N devices,", curve_diff, CURVE_TOL
)
assert (
    steps_1 == steps_n or abs(losses_n[min(steps_1, steps_n) - 1] - plan.target_loss) < CURVE_TOL
), f"1 device took {steps_1} steps and {n} devices {steps_n}, and not by round-off at the target"

# %% [markdown]
# ## 6. One seed is noisy
#
# A step count from one run carries the luck of its initialisation and of
# the order of its examples. The same batch and rule with other seeds:

# %%
seed_batch = sizes[1]
lr_seed = batch_size.scaled_learning_rate(plan.base_lr, sizes[0], seed_batch, "sqrt")
seed_steps = {0: runs["sqrt", seed_batch][0]}
for seed in plan.seeds:
    if seed not in seed_steps:
        seed_steps[seed] = train_to_target(seed_batch, lr_seed, seed=seed)[0]
spread = readings.seed_spread(list(seed_steps.values()))
display(
    show.table(
        [{"seed": k, "steps to target": v} for k, v in seed_steps.items()],
        caption=f"Global batch {seed_batch}, square-root rule, {len(seed_steps)} seeds",
    )
)
print(readings.spread_sentence(list(seed_steps.values()), seed_batch))
print(
    readings.rules_sentence({k: v[0] for k, v in runs.items()}, batch_size.LR_RULES, sizes, spread)
)
print(readings.steps_sentence(best, fit.b_crit, spread))

# %% [markdown]
# ## 7. Time to the target
#
# Time to the target is steps x time per step. With a fixed per-device
# batch `b`, N devices train a global batch `N b`: each device's compute
# stays the same while the all-reduce changes with N, and in the fit's
# model (`S_min (1 + B_crit / B)`) each doubling of `N b` saves a smaller
# share of the steps once it passes `B_crit`. Which of the two decides
# depends on what the step is made of, so the tables below price two
# steps, each with the steps of this run's fit
# (`dpcourse.large_batch.time_to_target`):
#
# - **this lesson's model**, the one whose steps were counted, at the
#   per-device batch of this run's smallest global batch;
# - **the `full` workload's model** at its own per-device batch, with the
#   same fitted steps: an assumption, since its steps to its own target
#   were not counted here (a larger model reaches a target in other step
#   counts, with another `B_crit`). Read it for how the step's make-up
#   moves the answer, not as a forecast of that workload.
#
# The modelled step is the training FLOPs at the device's peak (TF32 on
# the GPUs, bf16 on the TPU, where a default float32 matmul is one bf16
# pass), plus the all-reduce of the gradient with its latency: on the
# GPUs a ring over the datasheet link with NCCL's own latencies (8.4 µs
# per call and 3.4 µs per ring step over NVLink, 5.7 µs over PCIe: the
# tuning tables of NCCL's source), on TPU v5e slices the ICI model of
# `dpcourse.costs` (about 1 µs per hop; a slice with fewer than 16 chips
# along an axis has no wraparound link there, so that axis is a line, not
# a ring). The step's own fixed cost (launches, the update) is left out,
# as nothing measured it on these machines. Neither a lower nor an upper
# bound, then: an estimate. Each row's global batch is marked **trained**
# (run to the target here), **interpolated** (between two trained ones)
# or **extrapolated** (beyond them); the steps of every row come from the
# fit, whose worst error at the trained batches is printed above. Under
# each table, one line says which term of the step decides it, read from
# its rows, and one where its time is shortest. One device is left out:
# with no all-reduce and no fixed cost its modelled step would be the
# compute term alone. Beyond one node (2 L4s, 8 H200s) the link between
# nodes is slower than the one assumed. On a GPU or TPU machine, the
# measured table below gives this run's devices.

# %%
b_dev = sizes[0] // n
full_cfg = config.make_config("full")  # the profile of a GPU or TPU machine
# Up to 4 x the largest batch measured: the last rows extrapolate the fit.
counts_n = [2**k for k in range(1, int(np.log2(4 * sizes[-1] // b_dev)) + 1)]
v5e_shapes = [(2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16)]  # Google's v5e slices
machines = [
    time_to_target.gpus("L4", "NVIDIA L4", counts_n),
    time_to_target.gpus("H200", "NVIDIA H200", counts_n),
    time_to_target.tpu_slices("TPU v5e", "TPU v5 lite", v5e_shapes),
]
LESSON_MODEL = f"this lesson's model ({lesson.cfg.profile} profile, width {cfg.width})"
workloads = {  # whose step is priced: (model, per-device batch)
    LESSON_MODEL: (cfg, b_dev),
    f"the full profile's model (width {full_cfg.width}, assumed steps)": (
        full_cfg,
        full_cfg.per_device_batch,
    ),
}
tables = {}  # (workload, machine) -> rows
for workload, (model_cfg, per_device) in workloads.items():
    for machine in machines:
        table = time_to_target.rows(fit, per_device, machine, model_cfg, sizes)
        tables[workload, machine.label] = table
        display(
            show.table(
                table,
                caption=f"{machine.label}, {workload}: time to the target, fitted steps x modelled "
                f"step with latency, {per_device} examples per device",
            )
        )
        print(time_to_target.regime_sentence(table, fit.b_crit, machine.label, workload))
        print(time_to_target.reading(table, machine.label))
node_rows = {  # one node of GPUs, one TPU v5e host (a v5e-8), this lesson's model
    label: next((r for r in tables[LESSON_MODEL, label] if r["devices"] == node), None)
    for label, node in (("L4", 2), ("H200", 8), ("TPU v5e", 8))
}
for row in node_rows.values():
    if row is not None:
        print(
            f"{row['machine']}, {LESSON_MODEL}: {row['time to target ms']:.3g} ms to the target "
            f"(fitted steps x modelled step, global batch {row['global batch']}, {row['batch']})"
        )

# %% [markdown]
# And measured here: each run's loop time over its steps, on this run's
# devices (the compile excluded; the held-out loss after every step
# included).

# %%
measured = [
    {
        "global batch": b,
        "steps": runs["sqrt", b][0],
        "ms/step": runs["sqrt", b][3] / len(runs["sqrt", b][1]) * 1e3,
        "time to target s": runs["sqrt", b][3] if runs["sqrt", b][0] else None,
    }
    for b in sizes
]
display(show.table(measured, caption=f"Measured, square-root rule, {lesson.devices.label}"))
print(readings.measured_sentence(measured, lesson.devices.simulated))

# %% [markdown]
# ## 8. What these numbers are, and are not
#
# - **The data.** With the synthetic stand-in (no network; the banner at
#   the top says which data this run has) every figure here changes with
#   real Fashion-MNIST: the target, the steps, the noise scale, `B_crit`.
#   The method does not.
# - **Simulated devices** run the CPU's float32 arithmetic: their step
#   counts and noise scale are those of N real CPU devices (the line below,
#   from section 5's measurement, says how far they carry to a GPU or a
#   TPU); their times are not.
# - **One seed is noisy** (section 6): step counts that differ by less
#   than the spread cannot be told apart, and a few seeds give a low
#   estimate of the spread.
# - **A smaller model** than the profile's, and a learning rate tuned
#   only by a rule, not searched at every batch as Shallue et al. and
#   McCandlish et al. do: a tuned learning rate would lower the large-batch
#   step counts, and with them `S_min`.

# %%
print(readings.same_split_sentence(backend, curve_diff, steps_1, steps_n, n))

# %%
_ = record.figures(
    {
        **{
            f"steps_to_target_{rule}_{b}": (runs[rule, b][0], "steps")
            for rule in batch_size.LR_RULES
            for b in sizes
            if runs[rule, b][0] is not None
        },
        "s_min": (fit.s_min, "steps"),
        "e_min": (fit.e_min, "examples"),
        "b_crit": (fit.b_crit, "examples"),
        "noise_scale": (b_simple, "examples"),
        "noise_scale_vs_b_crit_factor": (factor, "ratio"),
        "one_vs_n_held_out_loss_max_abs_diff": (curve_diff, "abs"),
        "one_vs_n_held_out_loss_max_abs_diff_tolerance": (CURVE_TOL, "abs"),
        "fit_worst_error": (fit.worst_error, "fraction"),
        "seed_spread": (spread, "fraction"),
        **{f"seed_steps_{k}": (v, "steps") for k, v in seed_steps.items() if v is not None},
        "seed_batch": (seed_batch, "examples"),
        "per_device_batch": (b_dev, "examples"),
        **{f"ms_per_step_measured_{r['global batch']}": (r["ms/step"], "ms") for r in measured},
        **{
            f"time_to_target_s_measured_{r['global batch']}": (r["time to target s"], "s")
            for r in measured
            if r["time to target s"] is not None
        },
        **{
            f"devices_fastest_to_target_{'' if workload == LESSON_MODEL else 'full_workload_'}"
            f"{label.replace(' ', '_')}": (time_to_target.fastest(table)["devices"], "count")
            for (workload, label), table in tables.items()
        },
        **{
            f"time_to_target_s_{row['devices']}x{label.replace(' ', '_')}": (
                row["time to target ms"] / 1e3,
                "s",
            )
            for label, row in node_rows.items()
            if row is not None
        },
    }
)

# %% [markdown]
# ## What you learned
#
# - In McCandlish et al.'s model, steps to a target fall with the global
#   batch, in proportion well below the critical batch and by less and
#   less past it: `S = S_min + E_min / B`, with `B_crit = E_min / S_min`
#   where the bend is. A run's own counts follow it only roughly: sections
#   3 and 6 say how closely this one did, and which of its differences the
#   seeds' spread leaves undecided.
# - The learning rate has to move with the batch. The rules here move only
#   the learning rate (the learning-rate part of Malladi et al.'s
#   square-root rule; Goyal et al.'s linear rule without its warm-up), and
#   which does best can change with the batch; a difference smaller than
#   the seeds' spread names no winner (section 6's line says where, in
#   this run).
# - The gradient noise scale `B_simple = tr(Sigma) / |G|^2` comes from one
#   run, for one scalar `pmean` per step: the per-device and the averaged
#   gradient are the two batch sizes the estimate needs. McCandlish et al.
#   find it tracks the bend roughly; section 4 says how close it came here.
# - Time to the target is steps x step time, and which term decides
#   depends on the step. Where it is mostly the all-reduce (this lesson's
#   small model; section 7's line says how much of it is latency), every
#   device added changes each step's length, and the shortest time is set
#   by that cost against the falling steps, not by `B_crit` alone. Where
#   it is mostly compute (the `full` workload's step), `B_crit` says how
#   much a doubling still cuts the steps: in the model less than a quarter
#   past it, a tenth at `4 B_crit`. Once that cut is smaller than what the
#   all-reduce adds to the step, the time turns up, even with compute
#   still most of the step. Section 7's lines say, for each table, where
#   its time is shortest and what decides there.
# - The global batch decides the training; how it is split over devices
#   does not (within float32 round-off).
#
# **Next:** [13_elastic](13_elastic.ipynb): when a process goes away,
# preemption, survivors and restarts. First the exercises below; and on
# your own workload, measure its noise scale before you buy devices.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
from dpcourse.exercises import lesson12 as check

# %% [markdown]
# **12.1 · The noise scale from two norms.** One step of an 8-device run
# printed the norm of one device's gradient and of the averaged one:

# %%
print(f"per-device batch b = {check.PER_DEVICE_BATCH}, |G_b| = {check.LOCAL_NORM}")
print(f"global batch     B = {check.GLOBAL_BATCH}, |G_B| = {check.GLOBAL_NORM}")

# %% [markdown]
# What is this step's estimate of the simple noise scale `B_simple`, in
# examples?

# %% tags=["exercise", "ex12_1"]
noise_scale = ...  # a number of examples

# %%
check.noise_scale(noise_scale)

# %% [markdown]
# **12.2 · Steps at a new batch.** From this lesson's fit (`fit.s_min`,
# `fit.e_min`), how many steps does a global batch of `new_batch` need to
# reach the target?

# %%
new_batch = 2 * sizes[-1]
print(f"new_batch = {new_batch}; S_min = {fit.s_min:.2f}, E_min = {fit.e_min:.1f}")

# %% tags=["exercise", "ex12_2"]
steps_at_new_batch = ...  # a number of steps

# %%
check.steps_at_batch(steps_at_new_batch, fit, new_batch)

# %% [markdown]
# **12.3 · How many devices?** Another workload, 256 examples per device,
# 8 GPUs per node: the steps to its target from its fit and the measured
# step time at each device count. Which device count reaches the target
# soonest?

# %%
display(show.table(list(check.DEVICE_TABLE), caption="Steps and step time by device count"))

# %% tags=["exercise", "ex12_3"]
best_devices = ...  # a device count from the table

# %%
check.best_device_count(best_devices)
