# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 10 · When the model or the batch does not fit: ZeRO, FSDP, gradient accumulation
#
# **Goal.** Replicated data parallelism keeps the whole model and the whole
# AdamW state on every device, and caps the per-device batch at what one
# device's memory holds beside them. Measure what each device holds, then shard the
# optimizer state (ZeRO-1), then the parameters too (FSDP), over the same
# `data` axis, and split the batch into microbatches (gradient
# accumulation). Every form must still be the same training: the lesson
# asserts it. And every form is counted in the compiled program: which
# collectives (all-reduce, reduce-scatter, all-gather), how many, how many
# bytes, inside or outside loops, on the CPU and for GPUs compiled without
# a GPU, against the cost model.
#
# **Assumes.** Notebooks 04 (sharded batches, the compiled program's
# collectives) and 05 (`shard_map`, what a reduction over `data` means).
# At least 2 devices; 2, 4 and 8 divide this model's sizes, 3 does not
# (section 2 says which leaves stay replicated then).
#
# **Time**: under 30 s with `smoke`, under 30 s with `cpu`, on a 2-core CPU; under 1 min with `cpu`
# (on 8 simulated CPU devices), on 1 x TPU v5 lite (measured; other work slows it: the run's
# details, its load included, are in `baselines/timings.json`).

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for multi-device lessons
ACCUM_K = 4  # microbatches per step in section 4
MIN_SHARD_ELEMENTS = 1024  # leaves smaller than this stay replicated
STEPS = 3  # training steps each form runs before it is compared with replicated DP
GPU_TARGETS = ("h200", "l4")  # GPUs to compile for without a GPU (section 6); () skips it
TPU_TARGETS = (
    "v5e_2x4",
    "v5p_2x2x2",
)  # TPU slices to compile for without a TPU (section 6); () skips it

# %%
from dpcourse.lesson import start_lesson

lesson = start_lesson("10_sharded", PROFILE, N_CPU_DEVICES, min_devices=2)
cfg, dataset = lesson.cfg, lesson.dataset

# %%
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import costs, data, model, train
from dpcourse.compiled import census
from dpcourse.cross_compile import notebook as gpu_notebook
from dpcourse.cross_compile import steps as sharded_steps
from dpcourse.exercises import checks
from dpcourse.sharded import forms as sharded
from dpcourse.sharded import report

devs = lesson.devices.devices
lesson.check_global_mesh()  # a mesh you set with jax.set_mesh must be this lesson's, or none
n, backend = len(devs), devs[0].platform
global_batch = cfg.global_batch(n)
mesh = Mesh(np.array(devs), ("data",))  # Auto axes, as in 04 and 05
optimizer = train.make_optimizer(cfg)
init_host = model.init_params(cfg)
n_params = model.param_count(cfg)
x_host, y_host = data.stacked_batches(dataset, cfg.n_batches, global_batch)
rep = NamedSharding(mesh, P())
x_sh, y_sh = NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P("data"))
batches = [
    (jax.device_put(x_host[i], x_sh), jax.device_put(y_host[i], y_sh)) for i in range(cfg.n_batches)
]
params = jax.device_put(init_host, rep)
opt_state = optimizer.init(params)
print(f"{lesson.devices.label}; {n_params:,} parameters; global batch {global_batch}")

# %% [markdown]
# Section 6 compiles this lesson's steps for GPUs and a TPU slice this
# machine does not have, in a separate process that takes a while; it
# starts now, in the background, and section 6 collects what it found.

# %%
gpu_steps = sharded_steps.SHARDED_STEPS
gpu_compile = gpu_notebook.start_gpu_compile(gpu_steps, GPU_TARGETS, n, cfg.profile, TPU_TARGETS)

# %% [markdown]
# ## 1. Memory first: what each device holds
#
# In replicated data parallelism every device holds, in float32:
#
# | what | bytes per parameter | lives |
# |---|---|---|
# | parameters | 4 | between steps (an argument of the step) |
# | gradients | 4 | during the step (temporary) |
# | AdamW's two moments, `mu` and `nu` | 4 + 4 = 8 | between steps |
# | activations | depend on the batch, not on the parameter count | during the step |
#
# 4 + 4 + 8 = 16 bytes per parameter before a single activation. The
# arrays say what they hold: `addressable_shards` lists each device's piece
# of an array, with its bytes.


# %%
def bytes_on(tree, device):
    """Bytes of the arrays of `tree` that live on `device` (its shards only)."""
    leaves = jax.tree.leaves(tree)
    return sum(s.data.nbytes for a in leaves for s in a.addressable_shards if s.device == device)


dev0 = devs[0]
held = {"parameters": bytes_on(params, dev0), "AdamW state": bytes_on(opt_state, dev0)}
report.show_replicated_state(held, n_params, n)  # held to the formula (+4: AdamW's step count)

# %% [markdown]
# The gradients and the activations exist only while the step runs. The
# compiled step says how much memory it needs per device:
# `memory_analysis()` gives its arguments (parameters, optimizer state and
# the batch shard) and its temporary buffers (gradients, activations, and
# anything the compiler gathers).

# %%
train_step = train.make_train_step(cfg, optimizer)  # notebook 02's step, unchanged
p_rep, s_rep = jax.tree.map(lambda _: rep, params), jax.tree.map(lambda _: rep, opt_state)
replicated_step = jax.jit(
    train_step, in_shardings=(p_rep, s_rep, x_sh, y_sh), out_shardings=(p_rep, s_rep, rep)
)
compiled = {"replicated DP": replicated_step.lower(params, opt_state, *batches[0]).compile()}
figures = census.memory_figures(compiled["replicated DP"])
batch_bytes = batches[0][0].nbytes // n + batches[0][1].nbytes // n
print(
    f"argument bytes {figures['argument_bytes']:,} = parameters "
    f"{held['parameters']:,} + AdamW state {held['AdamW state']:,} + batch shard {batch_bytes:,}; "
    f"temporary bytes {figures['temp_bytes']:,}"
)

# %% [markdown]
# **How large a model fits?** At 16 bytes per parameter, and before any
# activation, the memory figures of NVIDIA's datasheets give (L4: 24 GB
# GDDR6; H200 SXM: 141 GB HBM3e; the usable memory is less, by the CUDA
# context and XLA's workspace):

# %%
DATASHEET_MEMORY = {"NVIDIA L4": 24e9, "NVIDIA H200 SXM": 141e9}  # bytes, datasheet figures
report.show_fit(DATASHEET_MEMORY, 8)  # a node of 8 such GPUs (not this run's devices)

# %% [markdown]
# Replicated DP fits 1.5 billion parameters on an L4 however many L4s there
# are. ZeRO-1 (9 bytes per parameter on 8 devices: 4 + 4 + 8 / 8) and FSDP
# (16 / 8 = 2 bytes) raise that ceiling by sharding what replication
# copies. FSDP's 2 bytes assume it gathers **one layer at a time** and
# frees it after use; the FSDP step of section 3 gathers every parameter
# once for the whole step, so during the step it holds whole parameters
# and gradients again (section 3 measures its bytes per parameter).
#
# This course's model is tiny (1.9 million parameters at full size), so
# nothing here runs out of memory: the lesson measures the bytes and the
# communication, which scale the same way for a model that would.
#
# ## 2. ZeRO-1: shard the optimizer state
#
# Each AdamW moment is used only element by element (the update of weight
# `i` needs `mu[i]`, `nu[i]` and `grad[i]`), so device `d` can keep one
# slice of each moment and update only the matching slice of the
# parameters; the updated slices are then gathered so that every device
# has all the parameters for the next forward pass. The rule for the
# slices: cut each array on its **largest dimension that divides by the
# device count**, and keep small arrays whole (a collective per tiny array
# costs its latency and saves almost nothing).


# %%
def spec_for(shape, n_devices, min_elements=MIN_SHARD_ELEMENTS):
    """Shard the largest dimension that divides by n_devices; small or indivisible: P()."""
    if math.prod(shape) < min_elements:
        return P()
    dims = [i for i, d in enumerate(shape) if d % n_devices == 0]
    if not dims:
        return P()
    best = max(dims, key=lambda i: shape[i])
    return P(*["data" if i == best else None for i in range(len(shape))])


param_specs = jax.tree.map(lambda a: spec_for(a.shape, n), params)
state_specs = jax.tree.map(lambda a: spec_for(a.shape, n), opt_state)
report.show_specs(params, param_specs, state_specs, opt_state, n, MIN_SHARD_ELEMENTS)  # vs package

# %% [markdown]
# On 3 devices no dimension of this model divides (784, the widths and 10
# are not multiples of 3), so every leaf stays replicated and the line
# above names them: sharding would need padding, which the course does not
# do. The step itself is notebook 02's; only the shardings of its inputs
# and outputs change, and `jit` makes the compiler keep the state sharded:


# %%
def on_mesh(specs):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))


state_sh = on_mesh(state_specs)
zero1_step = jax.jit(
    train_step, in_shardings=(p_rep, state_sh, x_sh, y_sh), out_shardings=(p_rep, state_sh, rep)
)
opt_state_z1 = jax.device_put(opt_state, state_sh)
compiled["ZeRO-1"] = zero1_step.lower(params, opt_state_z1, *batches[0]).compile()
print("mu['w_in'] on device 0:", opt_state_z1[0].mu["w_in"].addressable_shards[0].data.shape)

# %% [markdown]
# This is ZeRO-1 in its **naive** form: only the step's inputs and outputs
# say where things live, and the compiler places the rest by **sharding
# propagation**. The AdamW update is element by element, so a sharded
# `mu` and `nu` ask for a sharded gradient; that request travels back
# through the update into the backward loop, where the shared block's
# gradient is summed over its BLOCK_REPEATS uses. The loop's gradient
# buffer becomes a slice, so the partitioner reduces and slices the
# block's gradient **in every backward iteration**, and XLA's GPU compiler
# turns each reduce-and-slice into a reduce-scatter inside the loop
# (section 6 counts them, and the bytes they send). The pass that moves
# the plain step's all-reduce out of that loop
# (`while-loop-all-reduce-code-motion`, notebook 04) has a mode for
# reduce-scatters, behind `--xla_gpu_enable_while_loop_reduce_scatter_code_motion`;
# it is off by default (moving a reduce-scatter out of a loop can raise
# memory use), and turning it on leaves this one where it is.
#
# The fix is to say where the gradient goes: constrain it to `P()` right
# after `value_and_grad`. The gradient is then all-reduced once, after the
# loops, as in replicated DP; each device updates its own slice of the
# parameters with its slice of `mu` and `nu`; and one all-gather after the
# update makes the parameters whole again for the next step.
#
# The constraint is `sharded.constrain`: on this lesson's Auto mesh it is
# `jax.lax.with_sharding_constraint`, a placement the compiler meets by
# adding a collective. On a mesh whose axes are Explicit (notebook 03,
# section 4) the sharding is part of each array's type, a
# `with_sharding_constraint` only asserts it, and `constrain` calls
# `jax.sharding.reshard` instead, which adds the same collective. So these
# cells run on either kind of mesh:


# %%
def zero1_allreduce_first_step(params, opt_state, x, y):
    (_, metrics), grads = jax.value_and_grad(model.loss_and_metrics, has_aux=True)(
        params, x, y, cfg
    )
    grads = sharded.constrain(grads, p_rep)  # one all-reduce, after the loops
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, metrics


zero1_ar_step = jax.jit(
    zero1_allreduce_first_step,
    in_shardings=(p_rep, state_sh, x_sh, y_sh),
    out_shardings=(p_rep, state_sh, rep),
)
compiled["ZeRO-1, all-reduce first"] = zero1_ar_step.lower(
    params, opt_state_z1, *batches[0]
).compile()

# %% [markdown]
# ## 3. FSDP: shard the parameters too
#
# Fully sharded data parallelism (ZeRO-3) keeps only a slice of each
# parameter on each device, with the same specs. A device needs a whole
# weight to use it, so the step must **all-gather** it first, and each
# device then needs only its slice of the gradient: a **reduce-scatter**
# (sum over devices, keep a slice) instead of an all-reduce. First with
# shardings on the inputs and outputs only, as for ZeRO-1:

# %%
param_sh = on_mesh(param_specs)
fsdp_naive_step = jax.jit(
    train_step,
    in_shardings=(param_sh, state_sh, x_sh, y_sh),
    out_shardings=(param_sh, state_sh, rep),
)
params_fsdp = jax.device_put(params, param_sh)
compiled["FSDP, naive"] = fsdp_naive_step.lower(params_fsdp, opt_state_z1, *batches[0]).compile()

# %% [markdown]
# Where the gathers go is then the compiler's choice. The shared block's
# weight is used in every iteration of the forward loop and again in every
# iteration of the backward loop. A weight that arrives sharded stays
# sharded wherever nothing says otherwise, so XLA's SPMD partitioner, on
# both backends, places an all-gather **at each use**: inside the forward
# and the backward loop body. What happens next differs. The CPU
# compiler's loop-invariant code motion sees that the gathered weight does
# not change from one iteration to the next and hoists each gather out of
# its loop (one per loop, per step); XLA's GPU compiler leaves them inside,
# 2 x BLOCK_REPEATS all-gathers per step (section 6 counts both). Saying
# otherwise is one constraint: gather every parameter once at the start of
# the loss, and constrain the gradients to the sharded specs (the compiler
# turns "sum over devices, keep my slice" into a reduce-scatter):


# %%
def fsdp_gathered_step(params, opt_state, x, y):
    def loss(p):
        p = sharded.constrain(p, p_rep)  # one all-gather per leaf
        return model.loss_and_metrics(p, x, y, cfg)

    (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
    grads = sharded.constrain(grads, param_sh)  # one reduce-scatter per leaf
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, metrics


fsdp_step = jax.jit(
    fsdp_gathered_step,
    in_shardings=(param_sh, state_sh, x_sh, y_sh),
    out_shardings=(param_sh, state_sh, rep),
)
compiled["FSDP, gathered once"] = fsdp_step.lower(params_fsdp, opt_state_z1, *batches[0]).compile()

# %% [markdown]
# Gathering once holds the whole parameter set during the step, as
# temporary memory: the right trade for this model, whose one block is
# reused 2 x BLOCK_REPEATS times. A model of many different layers would
# gather layer by layer instead (and free each after use), so that only
# one layer is ever whole; the constraint then goes inside the layer loop.
#
# What each device holds now, measured, against the formula:

# %%
held_by_form = {
    "replicated DP": (params, opt_state),
    "ZeRO-1": (params, opt_state_z1),
    "FSDP": (params_fsdp, opt_state_z1),
}
report.show_state_bytes(held_by_form, n_params, n, dev0)  # bytes_on each device, as in section 1

# %% [markdown]
# Between steps a device holds 4 + 8 = 12 bytes per parameter under
# replicated DP, 4 + 8 / N under ZeRO-1 (whole parameters, a slice of each
# moment) and 12 / N under FSDP. So the ratio is **12 / (4 + 8 / N)** for
# ZeRO-1, under 3 however many devices there are, and **N** only for FSDP.
# The formula counts every leaf as sharded; a leaf that no dimension lets
# split over the devices stays whole (on 3 devices, every leaf of this
# model), so the measured column can only fall short of it: the line under
# the table says how far it did in this run.
#
# During the step the compiled program needs more: its arguments (the
# state above and the batch shard) and its temporary buffers (gradients,
# activations, whatever it gathers). Per parameter, measured by
# `memory_analysis()`:

# %%
mem = report.show_step_memory(compiled, n_params, n)  # memory_analysis() of each step

# %% [markdown]
# FSDP gathered once holds whole parameters and whole gradients while the
# step runs, so its bytes per parameter come out far above the 2 of
# section 1's table, which counts a model gathered layer by layer. (The
# batch and the activations are in these figures too: at the `smoke` and
# `cpu` sizes they weigh as much as the model.)
#
# ## 4. Gradient accumulation: the batch as K microbatches
#
# When the **batch** does not fit (activations grow with it), split the
# global batch into K microbatches, run forward and backward on each in a
# `lax.scan`, sum the gradients, divide by K, and update once. The mean of
# K equal-sized microbatch means is the global mean, so the update is the
# full-batch update, up to float rounding. Two shapes must divide: the
# global batch by K, and each microbatch by the device count.

# %%
micro = sharded.check_accumulation(global_batch, ACCUM_K, n)
for bad_k, bad_batch in [(ACCUM_K + 1, global_batch), (ACCUM_K, global_batch + ACCUM_K)]:
    try:
        sharded.check_accumulation(bad_batch, bad_k, n)
    except ValueError as err:
        print(f"K = {bad_k}, global batch {bad_batch}:", err)
print(f"K = {ACCUM_K}: microbatches of {micro} examples, {micro // n} per device")


# %%
def split_k(a, k):
    """[B, ...] -> [k, B // k, ...]; microbatch j: rows j, j + k, ... (no row changes device)."""
    return jnp.swapaxes(a.reshape((a.shape[0] // k, k) + a.shape[1:]), 0, 1)


def per_example(logits, y):
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return losses.mean(), (losses, (jnp.argmax(logits, axis=-1) == y).astype(jnp.float32))


def loss_auto(p, x, y):
    logits = model.forward(
        p, x, cfg.block_repeats, cfg.block_mix, cfg.block_unroll, cfg.compute_dtype
    )
    return per_example(logits, y)


def accum_step(params, opt_state, x, y):
    xs = sharded.constrain(split_k(x, ACCUM_K), NamedSharding(mesh, P(None, "data", None)))
    ys = sharded.constrain(split_k(y, ACCUM_K), NamedSharding(mesh, P(None, "data")))

    def body(acc, xy):
        (_, per), g = jax.value_and_grad(loss_auto, has_aux=True)(params, *xy)
        return jax.tree.map(jnp.add, acc, g), per  # per-example losses leave the loop as they are

    acc, (losses, correct) = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params), (xs, ys))
    grads = jax.tree.map(lambda g: g / ACCUM_K, acc)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    metrics = {"loss": losses.mean(), "accuracy": correct.mean()}
    return optax.apply_updates(params, updates), opt_state, metrics


accum_jit = jax.jit(accum_step)
compiled["accumulation, scan"] = accum_jit.lower(params, opt_state, *batches[0]).compile()
from dpcourse.config import make_config  # the profiles' widths W: the block is W x W + W floats

block_share = (params["w_block"].nbytes + params["b_block"].nbytes) / costs.gradient_bytes(cfg)
shares = {
    p: (c.width**2 + c.width) * 4 / costs.gradient_bytes(c)
    for p, c in ((p, make_config(p)) for p in ("smoke", "cpu", "full"))
}
print(f"w_block and b_block: {block_share:.0%} of the gradient at the {cfg.profile} profile")
print("  by profile: " + ", ".join(f"{p} {v:.0%}" for p, v in shares.items()))

# %% [markdown]
# Written like this, every microbatch's gradient is a sum over the devices'
# shards, and the compiler decides which part to reduce **inside** the
# microbatch loop. XLA's GPU compiler moves part of it out (the same
# `while-loop-all-reduce-code-motion` as notebook 04: the loop only adds
# the reduced gradient to an accumulator), but not the shared block's
# weight and bias: their gradients are summed in the inner backward loop,
# so their all-reduce moves out of that inner loop only, into the
# microbatch loop, and they are all-reduced once per microbatch, K times
# per step; the rest once after the loop. How much stays in the loop is
# the block's share of the gradient, printed above for this run's profile
# and for the others (`full` is the profile a GPU runs). The CPU compiler reduces every
# microbatch's whole gradient, and the block's in every backward
# iteration. Section 6 measures which share of the gradient travels K
# times, and what that costs against replicated DP. The gradient only
# needs reducing once, after the loop. JAX's `reduced` and `unreduced`
# shardings, on a mesh with **Explicit** axes, say exactly that:
#
# - `jax.reshard(params, P(reduced={'data'}))`: replicated parameters whose
#   gradient is not reduced over `data` (the transpose of "reduced" is
#   "unreduced");
# - the accumulator `P(unreduced={'data'})`: each device holds its own
#   partial sum, no communication;
# - one `jax.reshard(acc, P())` after the loop: the one all-reduce.
#
# One detail: a plain bias add `h + b` with a reduced `b` is refused
# (`ShardingTypeError: Inputs cannot be sharded/varying on the same axes
# that another input is reduced on`); broadcasting `b` to the activation's
# sharding first works, so the forward pass is written again with that
# broadcast, and checked against the model's.

# %%
REDUCED_OK = sharded.has_reduced_shardings()
emesh = Mesh(np.array(devs), ("data",), axis_types=(AxisType.Explicit,))
if not REDUCED_OK:
    print(f"JAX {jax.__version__} lacks them: this part needs {sharded.REDUCED_NEEDS}. Skipped.")


# %%
def bias(b, h):
    return jax.lax.broadcast_in_dim(
        b, h.shape, (h.ndim - 1,), out_sharding=jax.typeof(h).sharding.spec
    )


def forward_explicit(p, x):
    h = x @ p["w_in"]
    h = jax.nn.gelu(h + bias(p["b_in"], h))

    def block(h, _):
        z = h @ p["w_block"]
        return (1.0 - cfg.block_mix) * h + cfg.block_mix * jax.nn.gelu(
            z + bias(p["b_block"], z)
        ), None

    h, _ = jax.lax.scan(block, h, None, length=cfg.block_repeats)
    z = h @ p["w_out"]
    return z + bias(p["b_out"], z)


def accum_reduced_step(params, opt_state, x, y):
    xs, ys = split_k(x, ACCUM_K), split_k(y, ACCUM_K)
    reduced = jax.tree.map(lambda a: jax.reshard(a, P(reduced={"data"})), params)
    zeros = jax.tree.map(lambda a: jnp.zeros_like(a, out_sharding=P(unreduced={"data"})), params)

    def body(acc, xy):
        (_, per), g = jax.value_and_grad(
            lambda p, x, y: per_example(forward_explicit(p, x), y), has_aux=True
        )(reduced, *xy)
        return jax.tree.map(jnp.add, acc, g), per  # g is unreduced: no communication

    acc, (losses, correct) = jax.lax.scan(body, zeros, (xs, ys))
    grads = jax.tree.map(lambda g: jax.reshard(g, P()) / ACCUM_K, acc)  # the one all-reduce
    updates, opt_state = optimizer.update(grads, opt_state, params)
    metrics = {"loss": losses.mean(), "accuracy": correct.mean()}
    return optax.apply_updates(params, updates), opt_state, metrics


if REDUCED_OK:
    e_rep = NamedSharding(emesh, P())
    e_x, e_y = NamedSharding(emesh, P("data", None)), NamedSharding(emesh, P("data"))
    with jax.set_mesh(emesh):  # arrays made here (AdamW's step count too) live on emesh
        e_batches = [
            (jax.device_put(x_host[i], e_x), jax.device_put(y_host[i], e_y))
            for i in range(cfg.n_batches)
        ]
        params_e = jax.device_put(init_host, e_rep)
        opt_state_e = optimizer.init(params_e)
        accum_reduced_jit = jax.jit(accum_reduced_step)
        compiled["accumulation, reduced"] = accum_reduced_jit.lower(
            params_e, opt_state_e, *e_batches[0]
        ).compile()
        logits_e = jax.jit(forward_explicit)(params_e, e_batches[0][0])
        print(
            "gradient accumulator type:",
            jax.typeof(
                jax.jit(lambda a: jax.reshard(a, P(unreduced={"data"})))(
                    jax.device_put(np.zeros(4, np.float32), e_rep)
                )
            ),
        )
    logits_ref = jax.jit(lambda p, x: model.forward(p, x, cfg.block_repeats, cfg.block_mix))(
        params, batches[0][0]
    )
    gap = train.max_abs_diff(logits_e, logits_ref)
    print("max |forward_explicit - model.forward|:", gap)
    # float32 in another order: a few roundings of logits of order 1, far below 1e-5
    assert gap < 1e-5, checks.beyond("forward_explicit's logits and model.forward's", gap, 1e-5)

# %% [markdown]
# **The memory it saves.** Activations scale with the batch a device
# processes at once: the microbatch, not the global batch. The compiled
# programs' temporary bytes per device:

# %%
mem = {form: census.memory_figures(c) for form, c in compiled.items()}
temp_full, temp_acc = mem["replicated DP"]["temp_bytes"], mem["accumulation, scan"]["temp_bytes"]
print(census.memory_saving(temp_full, temp_acc, ACCUM_K))

# %% [markdown]
# The activations shrink K times; the gradients do not, and the
# compiler's workspace follows its own choices for each shape. So the
# saving lands near K where the activations dominate, below it where the
# rest weighs as much, and can even pass it (the `cpu` profile's run on 8
# devices measured 4.25 x with K = 4): the line above is this run's, at
# this profile's size (run the `full` profile for the lesson's full-size
# model).
# **When to use it:** when the global batch you want (for the optimizer's
# sake) does not fit in the devices' memory at once. It costs time: K
# smaller passes use a device less fully than one large one, and nothing is
# gained when the batch fits.
#
# ## 5. Every form is still the same training
#
# Each form runs `STEPS` steps from the same start on the same batches;
# the parameters are compared with replicated data parallelism's.


# %%
def run(step, p, s, batch_list):
    for i in range(STEPS):
        p, s, m = step(p, s, *batch_list[i % len(batch_list)])
    return p, s, m


start = {
    "replicated DP": (params, opt_state),
    "ZeRO-1": (params, opt_state_z1),
    "ZeRO-1, all-reduce first": (params, opt_state_z1),
    "FSDP, naive": (params_fsdp, opt_state_z1),
    "FSDP, gathered once": (params_fsdp, opt_state_z1),
    "accumulation, scan": (params, opt_state),
}
final = {form: run(compiled[form], p, s, batches) for form, (p, s) in start.items()}
if REDUCED_OK:
    start["accumulation, reduced"] = (params_e, opt_state_e)
    with jax.set_mesh(emesh):
        final["accumulation, reduced"] = run(
            compiled["accumulation, reduced"], params_e, opt_state_e, e_batches
        )
# Same reasons as notebooks 04-06 (train.equivalence_tolerances): float32 sums in another order.
EQUIV_TOL, _ = train.equivalence_tolerances(backend, cfg.learning_rate, steps=STEPS)
# Each leaf is held to its own scale too (checks.compare_steps): AdamW's normalised update hides
# a gradient K or N times too large in the parameters, not in its first moment.
diffs = report.check_same_training(
    final, start["replicated DP"], backend, n, ACCUM_K, STEPS, EQUIV_TOL
)

# %% [markdown]
# ZeRO and FSDP do the same arithmetic as replicated DP, only placed
# differently: on the CPU the parameters came out **bitwise** equal on 3, 4,
# 5 and 8 devices, but on 2 FSDP, naive differed in a last bit (7.45e-09;
# JAX 0.10.2, smoke, Auto axes, measured), so every form is held to the
# tolerance and the table says which came out bitwise in this run. (On a
# GPU a reduce-scatter may sum in another order than an all-reduce, so
# there the written tolerance of notebooks 04-06 applies; so it does on a
# mesh of Explicit axes, where every operation carries its sharding into
# the program: ZeRO-1's then differs from replicated DP's in a last bit on
# the CPU too.) Accumulation
# sums the gradient in another order (per microbatch, then over
# microbatches), so it matches within the tolerance, not bitwise.
#
# The package keeps the reusable version of each form
# (`dpcourse.sharded.forms`, compiled by `make placement` through
# `dpcourse.cross_compile.steps`). Your cells above against it, same start, same
# batches (edit a cell above and this says which form now differs):

# %%
# the package's twins: dpcourse.cross_compile.steps (zero1, fsdp_gathered, accum_scan, ...)
report.check_against_package(
    final, run, cfg, mesh, start["replicated DP"], batches, ACCUM_K, EQUIV_TOL
)

# %% [markdown]
# ## 6. Counted in the compiled program
#
# Per form and per kind of collective: instructions (how many inside a
# loop) and runs per step, from the optimised program (`as_text()`). Two
# byte columns, per device and per step: the collectives' **result**
# bytes, as the program states them (an all-reduce's and an all-gather's
# result is the whole array, a reduce-scatter's only the `1 / N` slice it
# keeps), and the bytes each device **sends** in a ring, from the formulas
# of section 7 (an all-reduce sends `2 (N - 1) / N` of its result, an
# all-gather `(N - 1) / N`, a reduce-scatter `N - 1` times its slice).
# What a link's bandwidth divides is the second. First on this run's
# backend:

# %%
reports = report.show_census(compiled, n, backend)

# %% [markdown]
# **For GPUs, without a GPU.** The package's twins of this lesson's seven
# steps compiled for N x H200 and N x L4, N as many GPUs as this run has
# devices (the L4 description is approximate, made from its datasheet), by
# XLA's GPU compiler on this machine, through `dpcourse.cross_compile.compile`
# (the optional extra, `make gpu-compile`; without it, the result `make
# placement` stored for 8 GPUs, labelled as stored): the background process
# started at the top of the lesson, one for all targets, a second or two per step.
#
# **For TPU slices, without a TPU.** The same seven steps compiled by the
# TPU compiler for two 8-chip slices: a v5e 2x4 (the chips of Kaggle's TPU
# v5e-8) and a v5p 2x2x2 (a 3-D mesh), from libtpu's description of each
# slice (the optional extra `make tpu-compile`; without it, the result
# `make placement` stored, labelled as stored). Under each TPU table, each
# form whose collectives are of other kinds than in the GPU program,
# read from the two programs; after the tables, where the two slices'
# programs differ.

# %%
waited = time.perf_counter()
cross = gpu_compile.results()  # waits only for what is not done yet (or reads the stored one)
if gpu_compile.pending is not None:
    print(f"waited {time.perf_counter() - waited:.1f} s for the background compile")
report.show_cross_compiles(cross)

# %% [markdown]
# What the TPU compiler did differently (libtpu 0.0.42 and 0.0.50, the
# smoke and full profiles): it wrote no reduce-scatter. Where the GPU
# program reduce-scatters the gradient (ZeRO-1, FSDP), the TPU program
# all-reduces it whole and each chip keeps its slice, so its ZeRO-1 and
# FSDP steps move more bytes per step than replicated DP's one all-reduce.
# For the v5e slice it left ZeRO-1's all-gathers of the parameters one per
# leaf (five), where the GPU compiler combines them into one and, for the
# v5p slice, the same TPU compiler into two (the smoke profile, both
# libtpu releases): how far a compiler combines collectives depends on
# the chip it compiles for, so read the program rather than assume.
# Replicated DP and accumulation with `reduced`/`unreduced` are placed as
# on the GPU: one all-reduce per step, after the loops. "ZeRO-1,
# all-reduce first", which asks for the all-reduce itself, is the form
# that keeps its bytes on both compilers.

# %% [markdown]
# What the GPU compiler did (the tests in `tests/lib/cross_compile/test_sharded_steps.py` hold
# it to this on 8 x H200, so a JAX or XLA change that moves a collective
# fails CI), on 2, 4 or 8 devices:
#
# - replicated DP, and accumulation with `reduced`/`unreduced`: one
#   all-reduce per step, after the loops, of the gradient and the two
#   metrics;
# - ZeRO-1, naive: the shared block's gradient **reduce-scattered inside
#   the backward loop**, once per repeat, and the other sharded leaves'
#   once after it; a small all-reduce; one all-gather of the updated
#   parameters (section 2 says why the reduce-scatter sits in the loop);
# - ZeRO-1, all-reduce first: one all-reduce of the whole gradient and the
#   metrics and one all-gather of the sharded parameters, both outside the
#   loops;
# - FSDP naive: the shared block's weight all-gathered inside the forward
#   and the backward loop, 2 x BLOCK_REPEATS gathers per step, plus one of
#   the other sharded weights, and, as in naive ZeRO-1, the block's
#   gradient reduce-scattered in the backward loop;
# - FSDP gathered once: one all-gather and one reduce-scatter, outside the
#   loops;
# - accumulation with a scan: the shared block's weight and bias
#   all-reduced in every microbatch, K per step, the rest of the gradient
#   once after the loop.
#
# The "small all-reduce" of ZeRO-1 and FSDP is not only the two metrics:
# the leaves left replicated (the biases, below `MIN_SHARD_ELEMENTS`) are
# reduced whole, and travel with them. The cell below reads these figures
# from the GPU programs: which share of the gradient each all-reduce
# carries, and what each form sends against replicated DP.

# %%
report.show_gpu_figures(cross, cfg, ACCUM_K, MIN_SHARD_ELEMENTS)

# %% [markdown]
# ## 7. The cost model: communication per step, predicted
#
# The ring collectives of `dpcourse.costs` (bytes each device sends, and
# the bandwidth term of the time over a datasheet link, no latency; on TPU
# v5e slices the ICI model of `costs.tpu_collective_s`, where a
# reduce-scatter or an all-gather is half an all-reduce):
# all-reduce `2 (N - 1) / N x bytes`, reduce-scatter and all-gather
# `(N - 1) / N x bytes` each, for an array of `bytes` in all. An
# all-reduce is a reduce-scatter followed by an all-gather, so ZeRO and
# FSDP move **the same bytes** as replicated DP when each gradient is
# reduce-scattered once and each parameter gathered once (the `ZeRO-1`
# and `FSDP, gathered once` rows); ZeRO-1 with the all-reduce first sends
# 1.5 x, an all-reduce and an all-gather; the naive FSDP step multiplies
# the shared block's gather by its uses; the scan row assumes the whole
# gradient all-reduced in every microbatch, K x.

# %%
pred = census.predict_communication(
    costs.gradient_bytes(cfg), params["w_block"].nbytes, n, ACCUM_K, cfg.block_repeats
)
links = {"H200 NVLink4": "NVIDIA H200", "L4 PCIe Gen4": "NVIDIA L4"}  # rings of n GPUs
slices = {"v5e-8 ICI": (2, 4), "v5e-256 ICI": (16, 16)}  # a 2 x 4 mesh; a 16 x 16 torus
report.show_prediction(pred, cfg, n, ACCUM_K, links, slices)
print(
    f"GPU columns: rings of {n} devices; TPU columns: whole v5e slices at their own chip counts,\n"
    "over ICI (a v5e-8 is a 2 x 4 mesh without wraparound links, a v5e-256 a 16 x 16 torus);\n"
    "all bandwidth terms only, no latency."
)

# %% [markdown]
# Set against the GPU census, counts **and** bytes sent ("within 10%"
# compares the bytes). Counts alone mislead: in the scan accumulation the
# measured all-reduces carry other bytes than predicted (only the shared
# block's share travels K times). Where the program is placed as the
# prediction assumes, the bytes agree; in naive ZeRO-1 and naive FSDP the
# reduce-scatter runs BLOCK_REPEATS + 1 times instead of once, which hides
# inside 10% at the `smoke` size (a 32 x 32 block, 2 repeats) and is a
# multiple of replicated DP's bytes at `cpu` and `full` (section 6's cell
# prints this run's).

# %%
report.compare_with_prediction(cross, cfg, n, ACCUM_K)  # at the sizes each was compiled for

# %% [markdown]
# ## Records

# %%
report.record_forms(start, mem, reports, diffs, EQUIV_TOL, cross, dev0)

# %% [markdown]
# ## What you learned
#
# - Replicated data parallelism costs 16 bytes per parameter on every
#   device (4 parameters, 4 gradients, 8 AdamW) plus activations;
#   `addressable_shards` and `memory_analysis()` measure it.
# - ZeRO-1 shards the optimizer state, FSDP the parameters too, over the
#   same `data` axis. State between steps falls from 12 bytes per
#   parameter to 4 + 8 / N under ZeRO-1 (a ratio of 12 / (4 + 8 / N), under
#   3 for any N) and to 12 / N under FSDP (a ratio of N); leaves that do not
#   divide (or are too small to be worth it) stay replicated.
# - Shardings on a step's inputs and outputs leave the rest to sharding
#   propagation: on the GPU, naive ZeRO-1's sharded state pulls a
#   reduce-scatter into the backward loop, once per repeat (the CPU
#   compiler keeps the block gradient's all-reduce in that loop, as it does
#   for replicated DP). Constraining the gradient to `P()` after
#   `value_and_grad` gives one all-reduce and one all-gather, outside the
#   loops (on the GPU; on the CPU the block's all-reduce stays inside).
# - FSDP trades the all-reduce for an all-gather and a reduce-scatter of
#   the same total bytes, if each parameter is gathered once: left to
#   itself, the partitioner gathers the shared block at every use, and
#   only the CPU compiler hoists those gathers out of the loops.
# - Gradient accumulation over K microbatches gives the full-batch update
#   (within rounding) with the activations of one microbatch; a plain scan
#   leaves part of the gradient reduced in every microbatch, and `reduced`
#   and `unreduced` shardings keep it to one all-reduce per step.
# - The compiled program, not the Python, says what communicates: count it
#   per backend, in runs and in bytes sent, and hold it to the cost model.
#
# **Next:** [11_checkpoint](11_checkpoint.ipynb) saves a sharded state,
# kills the run and resumes it elsewhere. The question "what if the model
# does not fit" now has two answers here; splitting one layer's matmuls
# over devices (tensor parallelism) is a third, not taught in this course.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
from dpcourse.exercises import lesson10 as check

# %% [markdown]
# **10.1 · Bytes per device under ZeRO-1.** The full-size model has
# 1,863,690 parameters. Trained with AdamW in float32 on 4 devices with
# ZeRO-1, how many bytes of parameters plus AdamW state does each device
# hold between steps (no gradients, no activations; count every leaf as
# sharded)?

# %% tags=["exercise", "ex10_1"]
zero1_bytes = ...  # a number of bytes

# %%
check.zero1_bytes_per_device(zero1_bytes)

# %% [markdown]
# **10.2 · How many microbatches?** You want a global batch of 49,152
# examples on 8 GPUs, and one GPU fits the activations of at most 1,024
# examples at once. What is the smallest accumulation count K that works
# (the global batch must divide by K, and each microbatch by the 8 GPUs)?

# %% tags=["exercise", "ex10_2"]
accum_k = ...  # a whole number

# %%
check.microbatch_count(accum_k)
