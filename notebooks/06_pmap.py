# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · `jax.pmap`: the legacy way, done right
#
# **Goal.** Much existing JAX code uses `jax.pmap`. Learn to read and write
# it correctly for this JAX version: the leading device axis, replicated
# parameters without the removed helpers, one PRNG key per device, a step
# with `axis_name` and `lax.pmean`, an epoch loop that keeps state on the
# devices. Then see how `pmap` maps onto `jit` + `shard_map` today, and
# check that it reaches the same parameters as notebook 05.
#
# **Assumes.** Notebook 05. At least 2 devices.
#
# **Time**: under 30 s with `smoke`, under 30 s with `cpu`, on a 2-core CPU; under 30 s with `cpu`
# (on 8 simulated CPU devices), on 1 x TPU v5 lite (measured; other work slows it: the run's
# details, its load included, are in `baselines/timings.json`).

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for multi-device lessons

# %%
from dpcourse.lesson import start_lesson

lesson = start_lesson("06_pmap", PROFILE, N_CPU_DEVICES, min_devices=2)
cfg, dataset = lesson.cfg, lesson.dataset

# %%
import jax
import jax.numpy as jnp
import numpy as np
import optax
from IPython.display import display
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import bench, data, model, record, show, train

devs = lesson.devices.devices
lesson.check_global_mesh()  # a mesh you set with jax.set_mesh must be this lesson's, or none
n = len(devs)
global_batch = cfg.global_batch(n)
optimizer = train.make_optimizer(cfg)
init_host = model.init_params(cfg)
print(f"{lesson.devices.label}; global batch {global_batch} = {n} x {cfg.per_device_batch}")

# %% [markdown]
# ## 1. The leading axis is the device axis
#
# `pmap` maps a function over the **leading** axis of every argument, one
# slice per device. A global batch `[global_batch, 784]` must become
# `[n_devices, per_device_batch, 784]`, which only works when the global
# batch divides by the device count:

# %%
x_host, y_host = data.stacked_batches(dataset, cfg.n_batches, global_batch)
# [n_batches, n, b, 784] and [n_batches, n, b]
x_dev = np.stack([train.split_for_pmap(x_host[i], n) for i in range(cfg.n_batches)])
y_dev = np.stack([train.split_for_pmap(y_host[i], n) for i in range(cfg.n_batches)])
print("one pmap batch:", x_dev[0].shape, y_dev[0].shape)
train.check_pmap_leading_axis((x_dev[0], y_dev[0]), n)

try:
    train.split_for_pmap(x_host[0][: global_batch - 1], n)
except ValueError as err:
    print("uneven global batch:", err)
try:
    train.check_pmap_leading_axis({"x": x_host[0]}, n)
except ValueError as err:
    print("forgot to reshape:", err)

# %% [markdown]
# The check matters because `pmap` itself is lenient. **Without
# `devices=`, `pmap` accepts any leading axis up to the local device count
# and runs on the first that many devices**: a batch split 3 ways instead of
# N runs on 3 devices, silently leaving the others idle (only a leading
# axis larger than the device count is an error). The course passes
# `devices=` and checks the leading axis against N, so a wrong split fails
# loudly. (`backend=` only picks the platform, as the lesson's devices may
# be simulated CPU devices beside a GPU.)

# %%
platform = devs[0].platform  # the lesson's backend (simulated CPU devices on a 1-GPU machine)
partial_run = jax.pmap(lambda v: v * 2, backend=platform)(jnp.ones((min(3, n), 4)))
local = len(jax.local_devices(backend=platform))
ran_on = len(partial_run.devices())
print(f"leading axis {min(3, n)}, no devices=: ran on {ran_on} of {local} local devices")
assert ran_on == min(3, n), (
    f"pmap ran on {ran_on} devices; a leading axis of {min(3, n)} should use that many"
)

# %% [markdown]
# Put the batches on the devices once, already split along the leading
# axis, so no step copies them from the host:

# %%
device_axis = NamedSharding(Mesh(np.array(devs), ("data",)), P(None, "data"))
x_stack = jax.device_put(x_dev, device_axis)
y_stack = jax.device_put(y_dev, device_axis)
batches = [(x_stack[i], y_stack[i]) for i in range(cfg.n_batches)]

# %% [markdown]
# ## 2. Replicated parameters, with today's API
#
# `jax.device_put_replicated` and `jax.device_put_sharded` were removed from
# JAX. A replicated pytree for `pmap` is a stack of N identical copies on a
# leading axis, sharded over the devices, which `jax.device_put` with a
# `NamedSharding` builds directly. This cell is yours to change; the next
# one compares what it builds with the package's `train.replicate`, which
# later lessons use:


# %% tags=["lesson_replicate"]
def replicate(tree, devices):
    """One copy of every leaf per device: [...] -> [n_devices, ...], sharded P("data")."""
    sharding = NamedSharding(Mesh(np.array(devices), ("data",)), P("data"))
    stack = lambda a: np.broadcast_to(np.asarray(a), (len(devices),) + np.shape(a))  # noqa: E731
    return jax.tree.map(lambda a: jax.device_put(stack(a), sharding), tree)


params_r = replicate(init_host, devs)
state_r = replicate(optimizer.init(init_host), devs)
print("w_block:", params_r["w_block"].shape, params_r["w_block"].sharding.spec)

# %%
from dpcourse.exercises import checks

display(
    checks.compare(params_r, train.replicate(init_host, devs), "replicas", "train.replicate"),
)
on_devices = [{s.device for s in a.addressable_shards} for a in jax.tree.leaves(params_r)]
print(
    "every leaf has one copy on each of the", n, "devices:", all(d == set(devs) for d in on_devices)
)

# %% [markdown]
# ## 3. One PRNG key per device
#
# Randomness inside `pmap` (dropout, data augmentation) needs a **different**
# key on each device, or every device draws the same mask. Split one key
# into N and map over them. (The course's model has no dropout; this shows
# the pattern on a toy dropout.)
#
# **Key style.** This course uses typed keys, `jax.random.key(seed)`: a
# scalar of a key dtype (`key<fry>`), so N keys are shape `(N,)`, one per
# device. Legacy code uses `jax.random.PRNGKey(seed)`, a raw uint32 array of
# shape `(2,)`, so N keys are `(N, 2)`. `train.check_pmap_keys` accepts
# both and nothing else; `check_pmap_leading_axis` also checks typed keys.


# %%
def toy_dropout(key, x, rate=0.5):
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def distinct(masks):
    return len({tuple(np.asarray(m)) for m in masks})


ones = jnp.ones((n, 8))
dropout_on_devices = jax.pmap(toy_dropout, devices=devs)
masks_good = dropout_on_devices(jax.random.split(jax.random.key(0), n), ones)
same_key = jnp.stack([jax.random.key(0)] * n)
masks_bad = dropout_on_devices(same_key, ones)
print("split keys, distinct masks:", distinct(masks_good), "of", n)
print("one key copied, distinct masks:", distinct(masks_bad), "of", n)
assert distinct(masks_good) == n, (
    f"split keys gave {distinct(masks_good)} distinct masks of {n}, not one per device"
)
assert distinct(masks_bad) == 1, f"one copied key gave {distinct(masks_bad)} distinct masks, not 1"

# %% [markdown]
# A split with the wrong shape passes `pmap`'s own leading-axis check and
# then fails deep inside the mapped function. `jax.random.split(key, (N,
# 2))` has leading axis N but gives each device two keys, and the error
# comes from `jax.random.bernoulli` inside `toy_dropout`, far from the
# mistake:

# %%
try:
    dropout_on_devices(jax.random.split(jax.random.key(0), (n, 2)), ones)
    raise AssertionError("two keys per device should fail inside the mapped function")
except (TypeError, ValueError) as err:
    print(f"inside pmap: {type(err).__name__}: {checks.first_sentence(err)}")

# %% [markdown]
# The course's check names the shape and the fix before anything runs:

# %%
keys = jax.random.split(jax.random.key(0), n)
train.check_pmap_keys(keys, n)
train.check_pmap_leading_axis((keys, ones), n)
try:
    train.check_pmap_leading_axis(jax.random.split(jax.random.key(0), (n, 2)), n)
    raise AssertionError("two keys per device should be refused")
except ValueError as err:
    print("two keys per device:", err)

# %% [markdown]
# **`jit` of `pmap`.** Splitting the key inside a jitted function that
# calls the `pmap` works with typed keys here and draws the very same masks.
# (Some older JAX versions failed to lower typed keys under `jit(pmap)`:
# jax-ml/jax issue 20392, fixed in pull request 21216; if you meet that
# error, upgrade JAX rather than switching key style.)

# %%
split_and_drop = jax.jit(lambda key, x: dropout_on_devices(jax.random.split(key, n), x))
masks_jit = split_and_drop(jax.random.key(0), ones)
assert np.array_equal(np.asarray(masks_jit), np.asarray(masks_good)), (
    "jit(pmap) with the key split inside gave other masks than the split outside it"
)
print("jit(pmap) with the key split inside: same masks as above")

# %% [markdown]
# ## 4. The step
#
# The whole step runs under `pmap` with `axis_name='data'`. Inside it each
# device sees its own slice: its replica of the parameters and its
# `[per_device_batch, 784]` rows. `lax.pmean` averages gradients and
# metrics across devices, so every device applies the same update and the
# replicas stay identical. Change this cell and re-run what follows (the
# check after it says what your change does to one step):


# %% tags=["lesson_pmap_step"]
def pmap_step(params, opt_state, x, y):
    grad_fn = jax.value_and_grad(model.loss_and_metrics, has_aux=True)
    (_, metrics), grads = grad_fn(params, x, y, cfg)  # this device's rows only
    grads = jax.lax.pmean(grads, axis_name="data")  # the mean over all devices
    metrics = jax.lax.pmean(metrics, axis_name="data")
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, metrics


p_step = jax.pmap(pmap_step, axis_name="data", devices=devs)

# %% [markdown]
# The package's `train.make_pmap_step` (used by the tests and later
# lessons) is the same step. One step of each from the same replicas:

# %%
mine = p_step(params_r, state_r, *batches[0])
package = train.make_pmap_step(cfg, optimizer, devs)(params_r, state_r, *batches[0])
display(
    checks.compare(
        mine,
        package,
        "parameters, AdamW state and metrics",
        "train.make_pmap_step",
        start=(params_r, state_r),
        factors=[checks.device_factor(n)],
    ),
)

# %% [markdown]
# ## 5. An epoch that stays on the devices
#
# Keep parameters and optimizer state on the devices between steps; collect
# the small per-step metrics as device arrays and bring them to the host once
# at the end. Pulling a value to the host every step (`float(loss)`) would
# make the host wait for each step to finish.

# %%
history = []
p, s = params_r, state_r
for i in range(cfg.n_batches):
    p, s, metrics = p_step(p, s, *batches[i])
    history.append(metrics)  # stays on device
history = jax.device_get(history)  # one transfer
display(
    show.table(
        [
            {"step": i + 1, "loss": float(m["loss"][0]), "accuracy": float(m["accuracy"][0])}
            for i, m in enumerate(history)
        ],
        caption="One pass over the stacked batches (metrics from device 0)",
    )
)
replica_spread = train.max_abs_diff(
    jax.tree.map(lambda a: a[0], p),
    jax.tree.map(lambda a: a[-1], p),
)
print(f"largest difference between the first and last replica: {replica_spread:.3g}")
assert replica_spread == 0.0, (
    f"The first and last replicas differ by {replica_spread:.3g}: each device must apply the same "
    "all-reduced gradient (a reduction missing from your pmap_step?)"
)

# %% [markdown]
# ## 6. Debugging `pmap`
#
# - **Shape mistakes**: the leading axis must equal the device count (or the
#   `devices=` list). Check with `check_pmap_leading_axis` before calling.
# - **Silent recompiles**: a new shape or dtype compiles a new program. If a
#   step is slow every time, print shapes, or run with
#   `jax.config.update("jax_log_compiles", True)`.
# - **Per-device printing**: `print` runs once while tracing; use
#   `jax.debug.print` to see values from every device (order not fixed):

# %%
jax.pmap(lambda v: jax.debug.print("device value {v}", v=v), devices=devs)(
    jnp.arange(n, dtype=jnp.float32),
)
jax.effects_barrier()

# %% [markdown]
# - **Out of memory**: everything replicated (parameters, optimizer state)
#   costs its full size on *every* device; only the batch shrinks with N.
#   First try **buffer donation**: `jax.pmap(step, ..., donate_argnums=(0,
#   1))` (or `jax.jit(..., donate_argnums=...)`) lets XLA write the new
#   parameters and optimizer state into the old buffers instead of holding
#   both. A donated input is deleted by the call, so donate only what you
#   replace with the output: this notebook does *not* donate, because
#   `params_r` and `state_r` are used again below (the comparison and the
#   benchmark start from them). Then free arrays you no longer need
#   (`memory.free`) before the next run.
#
# ## 7. From `pmap` to `jit` + `shard_map`
#
# In this JAX version `jax.pmap` is itself built from `jax.jit` and
# `jax.shard_map` (see its docstring). The translation:
#
# | `pmap` | `jit` + `shard_map` |
# |---|---|
# | leading axis = devices | a `Mesh` with axis `data`; arguments keep their global shapes |
# | `in_axes=0` | `in_specs=P('data', ...)` |
# | `in_axes=None` (broadcast) | `in_specs=P()` |
# | `out_axes=0` | `out_specs=P('data', ...)` |
# | a value equal on all devices, stacked N times | `out_specs=P()`, one copy |
# | `axis_name='data'` | the mesh axis name in `lax.pmean(x, 'data')` |
# | `device_put_replicated` (removed) | `jax.device_put(x, NamedSharding(mesh, P()))` |
# | `device_put_sharded` (removed) | `jax.device_put(x, NamedSharding(mesh, P('data')))` |
# | `x[0]` to unreplicate | nothing to do: replicated arrays are one logical array |
#
# Both must give the same training step. Check it against the `shard_map`
# step of notebook 05. One thing to know when a mesh is set in context
# (notebook 03, section 4): `pmap` builds its own mesh from `devices=` and
# `axis_name`, and JAX refuses it unless it equals the mesh in context
# (`The context mesh ... should match the mesh passed to shard_map`), as an
# Explicit mesh or other axis names do not. So the `pmap` calls below run
# under `jax.set_mesh(None)`, with no mesh in context:

# %%
mesh = Mesh(np.array(devs), ("data",))
smap_step = jax.jit(train.make_shard_map_step(cfg, optimizer, mesh))
ps = jax.device_put(init_host, NamedSharding(mesh, P()))
ss = optimizer.init(ps)
x_flat = jax.device_put(x_host, NamedSharding(mesh, P(None, "data", None)))
y_flat = jax.device_put(y_host, NamedSharding(mesh, P(None, "data")))
pp, sp = params_r, state_r
rows = []
for k in range(3):
    ps, ss, _ = smap_step(ps, ss, x_flat[k % cfg.n_batches], y_flat[k % cfg.n_batches])
    with jax.set_mesh(None):  # pmap brings its own mesh
        pp, sp, _ = p_step(pp, sp, *batches[k % cfg.n_batches])
    if k == 0:  # AdamW hides a scaled gradient: compare the gradients too
        grad_diff, grad_scale = train.first_step_gradient_diff(ss, sp)
    rows.append(
        {
            "step": k + 1,
            "max |diff| pmap vs shard_map": train.max_abs_diff(ps, train.unreplicate(pp)),
        }
    )
display(show.table(rows, caption="pmap vs shard_map, same start, same global batch"))
equiv = rows[-1]["max |diff| pmap vs shard_map"]
# Same tolerances and reasons as notebook 04 (train.equivalence_tolerances).
EQUIV_TOL, GRAD_REL_TOL = train.equivalence_tolerances(devs[0].platform, cfg.learning_rate, steps=3)
assert equiv < EQUIV_TOL, checks.beyond(
    "the parameters after 3 steps, your pmap step against shard_map,", equiv, EQUIV_TOL
)
GRAD_TOL = GRAD_REL_TOL * grad_scale  # relative to the largest gradient element
print(f"first-step gradients: max |diff| {grad_diff:.3g} (tolerance {GRAD_TOL:.3g})")
assert grad_diff < GRAD_TOL, checks.beyond(
    "the first step's gradients, your pmap step against shard_map,",
    grad_diff,
    GRAD_TOL,
    f"{grad_diff / grad_scale:.2g} of the largest gradient element; a psum for a pmean?",
)

# %% [markdown]
# ## 8. Benchmark

# %%
with jax.set_mesh(None):  # pmap brings its own mesh (section 7)
    res_pmap, *_ = bench.benchmark(
        p_step, params_r, state_r, batches, cfg, label=f"{n} devices, pmap"
    )
display(show.records_table([res_pmap], dataset.source))
if lesson.devices.simulated:
    print("Simulated CPU devices add no compute: this throughput says nothing about real devices.")

# %%
_ = record.figures(
    {
        "throughput": (res_pmap.examples_per_s, "examples/s"),
        "ms_per_step": (res_pmap.ms_per_step, "ms"),
        "final_loss": (res_pmap.final_loss, "loss"),
        "final_accuracy": (res_pmap.final_accuracy, "fraction"),
        "max_abs_param_diff_vs_shard_map": (equiv, "abs"),
        "max_abs_param_diff_vs_shard_map_tolerance": (EQUIV_TOL, "abs"),
        "max_abs_grad_diff_vs_shard_map": (grad_diff, "abs"),
        "max_abs_grad_diff_vs_shard_map_tolerance": (GRAD_TOL, "abs"),
    }
)

# %% [markdown]
# ## What you learned
#
# - `pmap` maps over the leading axis; reshape global batches to
#   `[n_devices, per_device_batch, ...]` and check it.
# - Replicate with `jax.device_put` and a `NamedSharding`; the old helpers
#   are gone.
# - Without `devices=`, `pmap` runs on as many devices as the leading axis
#   says, up to all local ones: check the leading axis yourself.
# - Split PRNG keys per device: one typed key each, shape `(N,)`, and check
#   that the masks differ.
# - Keep state on the devices, pull metrics once.
# - `pmap` is `jit` + `shard_map` underneath, and gives the same step.
#
# **Next:** [07_sweep](07_sweep.ipynb) measures throughput over global batch
# sizes and compares it with the cost model.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
from dpcourse.exercises import lesson06 as check

# %% [markdown]
# **06.1 · A new mask at every step.** Section 3 split one key over the
# devices, which gives each device its own mask, but the same masks at
# every step of training. Write `step_keys(seed, step)` returning one PRNG
# key per device (`n` of them) for training step `step`: different on each
# device, different at each step and for each seed, and the same whenever
# the seed and the step repeat (so a run can be repeated). The check draws a
# mask from each key at a few steps and seeds.

# %% tags=["exercise", "ex06_1"]
step_keys = ...  # replace with: def step_keys(seed, step): ...

# %%
check.per_device_keys(step_keys, n)

# %% [markdown]
# **06.2 · What does each device hold?** Under `pmap` the parameters and the
# AdamW state are replicated. Predict the bytes **one** device holds for
# both, for this profile (`model.param_count(cfg)` parameters, float32).
# What does optax's AdamW keep besides the parameters? The check measures
# the shards of `train.replicate`.

# %% tags=["exercise", "ex06_2"]
bytes_per_device = ...  # a number of bytes

# %%
check.bytes_per_device(bytes_per_device, cfg, n)
