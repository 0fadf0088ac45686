# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Baseline: data, model and one device
#
# **Goal.** Load Fashion-MNIST, build the shared-block MLP, write the
# training step, and measure it on **one** device. Every later speed-up (or
# slow-down) is read against this number.
#
# **Assumes.** Notebook 01 (devices are configured before JAX starts).
#
# **Time**: under 30 s with `smoke`, under 30 s with `cpu`, on a 2-core CPU; under 1 min with
# `full`, on 1 x TPU v5 lite (measured; other work slows it: the run's details, its load included,
# are in `baselines/timings.json`).

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for multi-device lessons

# %%
from dpcourse.lesson import start_lesson

lesson = start_lesson("02_baseline", PROFILE, N_CPU_DEVICES, min_devices=1)
cfg, dataset = lesson.cfg, lesson.dataset

# %%
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from IPython.display import display

from dpcourse import bench, config, costs, data, memory, model, record, show, train
from dpcourse.exercises.cells import check_against

device = lesson.devices.devices[0]
global_batch = cfg.per_device_batch  # one device: global batch = per-device batch

# %% [markdown]
# ## 1. The data
#
# `load_fashion_mnist` downloads the training files from the published
# locations (or reuses the cache), checks each file's md5, shuffles once
# with seed 0, scales pixels to [0, 1] and flattens each 28x28 image to 784
# features. Without network access it falls back to a generated stand-in of
# the same shapes, and the banner above says so.

# %%
print(
    "images:",
    dataset.images.shape,
    dataset.images.dtype,
    " labels:",
    dataset.labels.shape,
    dataset.labels.dtype,
)
print("pixel range:", float(dataset.images.min()), "to", float(dataset.images.max()))
counts = np.bincount(dataset.labels, minlength=data.N_CLASSES)
display(
    show.table(
        [
            {"class": i, "name": n, "examples": int(c)}
            for i, (n, c) in enumerate(zip(data.CLASS_NAMES, counts))
        ],
        caption=f"Examples per class ({dataset.source} data)",
    )
)

# %% [markdown]
# ## 2. The model: a shared-block MLP
#
# Input layer 784 → WIDTH with GELU; then **one** hidden block (WIDTH x
# WIDTH dense + GELU) applied BLOCK_REPEATS times with `jax.lax.scan`, mixed
# in residually, `h ← (1 − mix)·h + mix·block(h)`; output layer WIDTH → 10.
# Re-using one block multiplies the compute per example by BLOCK_REPEATS but
# not the number of parameters, so the gradient that data parallelism must
# all-reduce stays small while each device has plenty to compute.

# %% [markdown]
# The forward pass, written here so you can change it. `lax.scan` applies
# `block` BLOCK_REPEATS times, carrying `h` from one repeat to the next.
# (`dpcourse.model.forward` is the reusable version later lessons import; it
# also knows notebook 09's unrolled and bfloat16 variants.)


# %%
def forward(params, x, block_repeats, block_mix):
    """Logits [batch, 10] of the shared-block MLP for images x [batch, 784]."""
    h = jax.nn.gelu(x @ params["w_in"] + params["b_in"])

    def block(h, _):
        out = jax.nn.gelu(h @ params["w_block"] + params["b_block"])
        return (1.0 - block_mix) * h + block_mix * out, None

    h, _ = jax.lax.scan(block, h, None, length=block_repeats)
    return h @ params["w_out"] + params["b_out"]


# %% [markdown]
# The loss is the mean softmax cross-entropy over the batch; accuracy rides
# along as a metric (`has_aux` below).


# %%
def loss_and_metrics(params, x, y):
    """Mean cross-entropy over the batch (a scalar) and {"loss", "accuracy"}."""
    logits = forward(params, x, cfg.block_repeats, cfg.block_mix)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    accuracy = (jnp.argmax(logits, axis=-1) == y).mean()
    return loss, {"loss": loss, "accuracy": accuracy}


# %% [markdown]
# Does your cell compute what the package computes? `check_against` runs
# both on the same parameters and images and compares the numbers (and,
# for the loss, its gradient). Edit a cell above (drop the `1.0 - block_mix`,
# say), re-run it and this one, and read what differs.

# %%
x_try = dataset.images[:8]
y_try = dataset.labels[:8]
p_try = model.init_params(cfg)
display(check_against(model.forward, forward, p_try, x_try, cfg.block_repeats, cfg.block_mix))
reference_loss = functools.partial(model.loss_and_metrics, cfg=cfg)
display(check_against(reference_loss, loss_and_metrics, p_try, x_try, y_try))

# %%
n_params = model.param_count(cfg)
flops_per_example = model.train_flops_per_example(cfg)
step_flops = costs.train_flops_per_step(cfg, global_batch)
display(
    show.key_values(
        {
            "profile": cfg.profile,
            "dataset": f"Fashion-MNIST train ({dataset.source}), {dataset.n_examples:,} examples",
            "input / labels": "float32 [batch, 784] / int32 [batch]",
            "WIDTH x BLOCK_REPEATS (mix)": f"{cfg.width} x {cfg.block_repeats} ({cfg.block_mix})",
            "parameters": n_params,
            "gradient per step (float32)": f"{costs.gradient_bytes(cfg) / 1e6:.2f} MB",
            "per-device batch / global batch": f"{cfg.per_device_batch} / {global_batch}",
            "training FLOPs per example (6 x matmul MACs)": f"{flops_per_example / 1e9:.4f} GFLOP",
            "training FLOPs per step": f"{step_flops / 1e9:.2f} GFLOP",
            "optimizer": f"AdamW, lr {cfg.learning_rate}, weight decay {cfg.weight_decay}",
            "benchmark plan": f"{cfg.warmup_steps} warm-up steps, "
            f"then {cfg.repeats} x {cfg.steps} timed steps, median",
        },
        caption="The workload",
    )
)

# %% [markdown]
# **Why analytic FLOPs?** XLA's `compiled.cost_analysis()` counts the body of
# a `lax.scan` once, not BLOCK_REPEATS times, so it under-counts this model
# badly. The count above is 6 x the forward multiply-accumulates per example:
# 2 FLOPs per multiply-accumulate, and the backward pass costs about twice
# the forward. The cell below shows the under-count: XLA's figure for the
# forward pass of 8 examples hardly moves between 1 repeat and BLOCK_REPEATS.


# %%
def xla_forward_flops(block_repeats):
    """XLA's own FLOP count for your forward pass on x_try (8 examples)."""
    fn = jax.jit(lambda p, x: forward(p, x, block_repeats, cfg.block_mix))
    cost = fn.lower(p_try, x_try).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"]  # a list in older JAX


analytic = 2 * model.macs_per_example(cfg) * len(x_try)  # forward only: 2 FLOPs per MAC
for r in (1, cfg.block_repeats):
    print(f"BLOCK_REPEATS = {r:3d}: cost_analysis {xla_forward_flops(r):>13,.0f} FLOPs")
print(f"analytic forward FLOPs at BLOCK_REPEATS = {cfg.block_repeats}: {analytic:,}")

# %% [markdown]
# ## 3. Put data and parameters on one device
#
# Parameters are drawn on the host with a fixed numpy seed (so every
# notebook and every device count starts from the same values) and moved
# with `jax.device_put`. The stacked training batches go to the device once,
# so the benchmark never times a host-to-device copy.

# %%
optimizer = train.make_optimizer(cfg)
params = jax.device_put(model.init_params(cfg), device)
opt_state = optimizer.init(params)
x_host, y_host = data.stacked_batches(dataset, cfg.n_batches, global_batch)
x_stack = jax.device_put(x_host, device)  # [n_batches, global_batch, 784]
y_stack = jax.device_put(y_host, device)  # [n_batches, global_batch]
batches = [(x_stack[i], y_stack[i]) for i in range(cfg.n_batches)]
print("x_stack:", x_stack.shape, "on", x_stack.devices())

# %% [markdown]
# ## 4. The training step
#
# `value_and_grad` gives the loss, its metrics and the gradient in one pass;
# optax turns the gradient into an AdamW update. Notebook 04 jits the very
# same step on sharded arrays (it imports the package's copy,
# `train.make_train_step`, which the check below holds this cell to).


# %%
def make_train_step(optimizer):
    """train_step(params, opt_state, x, y) -> (params, opt_state, metrics), not jitted."""

    def train_step(params, opt_state, x, y):
        grad_fn = jax.value_and_grad(loss_and_metrics, has_aux=True)
        (_, metrics), grads = grad_fn(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, metrics

    return train_step


# %%
reference_step = train.make_train_step(cfg, optimizer)
s_try = optimizer.init(p_try)
display(check_against(reference_step, make_train_step(optimizer), p_try, s_try, x_try, y_try))

# %% [markdown]
# `jax.jit` compiles it. `donate_argnums=(0, 1)` **donates** the parameters
# and the optimizer state: the step replaces both with its outputs, so XLA
# may write the new values into the old buffers instead of holding two
# copies. That is the first answer to an out-of-memory error in a training
# step. A donated array is deleted by the call (using it again raises an
# error), so always rebind the names to the outputs, as the loop does:
# `params, opt_state, metrics = train_step(params, opt_state, x, y)`.

# %%
train_step = jax.jit(make_train_step(optimizer), donate_argnums=(0, 1))
loss0, metrics0 = loss_and_metrics(params, *batches[0])
print(f"loss before training: {float(loss0):.4f} (ln 10 = {np.log(10):.4f} for a uniform guess)")

# %% [markdown]
# ## 5. Benchmark
#
# Compile once (timed apart), warm up, then time `repeats x steps` steps and
# report the median; `jax.block_until_ready` makes sure the device finished
# before the clock stops (JAX dispatches asynchronously).

# %%
result, params, opt_state = bench.benchmark(
    train_step, params, opt_state, batches, cfg, label=f"1 x {device.device_kind}"
)
display(show.records_table([result], dataset.source))

# %%
achieved = costs.achieved_flops_per_s(cfg, global_batch, result.ms_per_step)
peak = costs.find_peak(device.device_kind)
utilisation = costs.mfu(cfg, global_batch, result.ms_per_step, 1, device.device_kind)
display(
    show.key_values(
        {
            "achieved training FLOP/s": f"{achieved / 1e12:.3f} TFLOP/s",
            "device peak (dense)": "unknown for this device"
            if peak is None
            else f"{peak.peak() / 1e12:.0f} TFLOP/s {peak.float32_matmul.upper()} ({peak.source})",
            "which peak": "none" if peak is None else peak.mfu_note(),
            "MFU": "not computed: no known peak for this device"
            if utilisation is None
            else f"{utilisation:.1%}",
        },
        caption="Model-FLOPs utilisation",
    )
)

# %% [markdown]
# MFU compares the FLOPs the model needs with what the device could do at
# its peak, the peak of the precision this float32 step's matmuls actually
# run at. JAX's default float32 matmuls run as TF32 on recent NVIDIA GPUs,
# so the TF32 peak is the fair reference there. On a TPU the same default
# is one bf16 pass on the matrix unit (precision `"highest"` takes six), so
# the bf16 peak is the reference: Google publishes no float32 peak for
# TPUs. On a CPU there is no stated peak, so no MFU is printed rather than
# an invented one.

# %% [markdown]
# ## 6. What would N devices give? The cost model
#
# Keep the per-device batch and add devices: each device computes what this
# one did, then all of them all-reduce the gradient. A ring all-reduce sends
# and receives 2(N-1)/N times the gradient over each device's link, so its
# time is about `2(N-1)/N x gradient bytes / link bandwidth`. The table's
# step time, compute + all-reduce with no overlap, is an **estimate**, and
# each term errs in a known direction:
#
# - the all-reduce term uses the datasheet link with no latency per ring
#   step (notebook 07 measures both), so it is a *lower* bound on the
#   communication;
# - adding the two terms assumes no overlap, which is what to expect for
#   this step: gradients and metrics go in one all-reduce after the backward
#   pass, and the update needs its result, so nothing is left to run while
#   it travels. (XLA's latency-hiding scheduler does run for some GPUs: its
#   flag defaults to false, but the compiler turns it on for Hopper-class
#   targets; compiled without a GPU, it reorders the H100 and H200
#   programs, not the L4's, and in this step finds nothing to overlap.) A
#   step that does overlap would make the sum too high;
# - the compute term scales this run's measured time per example, which
#   holds while the per-device batch keeps the device as busy as here.
#
# The link comes from the device's entry in the peak table, or PCIe Gen4
# x16 (about 32 GB/s each way, the L4 node's link) where it is not listed.
#
# TPU slices all-reduce over ICI, chip to chip, not through a host link.
# Over one axis of a slice the all-reduce of `V` bytes takes `2 V / W_ici`,
# `W_ici` a link's bandwidth in both directions (Austin et al., "How to
# Scale Your Model", Google DeepMind 2025), when the axis closes into a
# ring; an axis without its wraparound link is a line and takes about twice
# as long. A v5e-8 (Kaggle's) is a 2 x 4 **mesh**, not a torus: only an
# axis of 16 v5e chips wraps around. Over both axes at once their bandwidths
# add. The rows below put this run's compute beside a v5e-8 and a v5e-256
# (a 16 x 16 torus), or, on a TPU, slices of its own chip
# (`costs.tpu_slice_allreduce_s`, no hop latency, like the GPU rows).

# %%
per_example_s = result.ms_per_step / 1000.0 / global_batch
rows = []


def prediction_row(machine, link, pred):
    return {
        "machine": machine,
        "link": link,
        "global batch": pred.global_batch,
        "compute ms": pred.compute_s * 1e3,
        "all-reduce ms": pred.allreduce_s * 1e3,
        "step ms": pred.step_s * 1e3,
        "examples/s": pred.examples_per_s,
        "scaling efficiency": f"{pred.efficiency:.1%}",
    }


if peak is None or not peak.is_tpu:
    link_bytes_per_s = peak.link_bytes_per_s if peak is not None else 32e9
    link_name = peak.link if peak is not None else "PCIe Gen4 x16 (assumed)"
    for n_dev in (1, 2, 4, 8):
        pred = costs.predict_step(
            cfg, cfg.per_device_batch, n_dev, 0.0, per_example_s, link_bytes_per_s
        )
        rows.append(prediction_row(f"{n_dev} x this device", link_name, pred))
tpu = peak if peak is not None and peak.is_tpu else costs.find_peak("TPU v5 lite")
tpu_shapes = [(2, 4), (16, 16)] if tpu.ici.torus_dims == 2 else [(2, 2, 2), (4, 4, 4)]
for shape in ([(1,) * tpu.ici.torus_dims] if tpu is peak else []) + tpu_shapes:
    pred = costs.predict_tpu_step(cfg, cfg.per_device_batch, tpu, shape, 0.0, per_example_s)
    link_name = f"ICI, {tpu.link_bytes_per_s / 1e9:.0f} GB/s each way per link"
    rows.append(prediction_row(costs.slice_name(tpu, shape), link_name, pred))
display(
    show.table(
        rows,
        caption=f"Predicted steps, compute as measured here, "
        f"{costs.gradient_bytes(cfg) / 1e6:.2f} MB gradient",
    )
)

# %% [markdown]
# The prediction for real devices only: on simulated CPU devices all shards
# share the same cores, and notebook 04 measures what actually happens.

# %%
record.figures(
    {
        "ms_per_step": (result.ms_per_step, "ms"),
        "throughput": (result.examples_per_s, "examples/s"),
        "compile_time": (result.compile_s, "s"),
        "final_loss": (result.final_loss, "loss"),
        "final_accuracy": (result.final_accuracy, "fraction"),
        "achieved_flops": (achieved, "FLOP/s"),
        "mfu": (utilisation, "fraction"),
    },
    device_count=1,
)
assert result.final_loss < float(loss0), "training should lower the loss"

# %% [markdown]
# ## 7. Free the device memory
#
# A device buffer lives as long as a Python reference to its array. Drop the
# names, collect, and check that the live buffers are gone before the next
# experiment (on a GPU this is what prevents a later out-of-memory error;
# inside a step, buffer donation, section 4, is the first remedy). A copy of
# the parameters stands in for an experiment you are done with: the lesson's
# own arrays stay, so any cell above can run again.

# %%
params_copy = jax.tree.map(jnp.copy, params)  # a second set of buffers, held by one name
before, after = memory.free(globals(), "params_copy")
print("before:", before)
print("after: ", after)
assert after.bytes < before.bytes, f"freeing the copy left {after} live (was {before})"

# %% [markdown]
# ## What you learned
#
# - The workload: Fashion-MNIST, a shared-block MLP whose compute grows with
#   BLOCK_REPEATS while its gradient stays the same size.
# - A training step is `value_and_grad` + an optax update under `jax.jit`;
#   donating its parameters and optimizer state (`donate_argnums`) lets XLA
#   update them in place.
# - Honest timing: compile apart, warm up, block until ready, take a median.
# - MFU needs a stated peak; without one, say so.
#
# **Next:** [03_mesh](03_mesh.ipynb) arranges many devices into a mesh.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
from dpcourse.exercises import lesson02 as check

# %% [markdown]
# **02.1 · FLOPs when BLOCK_REPEATS doubles.** Predict the training FLOPs per
# example of this model with BLOCK_REPEATS doubled and WIDTH unchanged.
# Count it yourself from `cfg.width` and `cfg.block_repeats` with the rule
# of section 2 (which layers repeat? how many FLOPs per multiply-accumulate?
# how much does the backward pass add?).

# %% tags=["exercise", "ex02_1"]
flops_doubled = ...  # a number: training FLOPs per example with 2 x BLOCK_REPEATS

# %%
check.flops_doubled(flops_doubled, cfg)

# %% [markdown]
# **02.2 · A plain SGD step.** Write `sgd_step(params, x, y, learning_rate)`
# that returns new parameters, `params - learning_rate * gradient` for every
# array of the dict, where the gradient is that of the mean loss
# `loss_and_metrics(params, x, y)[0]` (your cell of section 2). Use `jax.grad` and
# `jax.tree.map`. The check runs it on its own batch.

# %% tags=["exercise", "ex02_2"]
sgd_step = ...  # replace with: def sgd_step(params, x, y, learning_rate): ...

# %%
check.sgd_step(sgd_step, cfg)

# %% [markdown]
# **02.3 · What step time is 40 % MFU?** The course's `full` profile
# (`config.make_config("full")`: WIDTH 1024, BLOCK_REPEATS 128) runs on one
# NVIDIA H200 (dense TF32 peak 495 TFLOP/s, NVIDIA's datasheet) with a
# batch of 1024 examples. At which step time in **milliseconds** would it
# run at 40 % MFU? `costs.train_flops_per_step(cfg_full, 1024)` gives the
# FLOPs of that step.

# %%
cfg_full = config.make_config("full")  # the workload of exercise 02.3

# %% tags=["exercise", "ex02_3"]
step_ms_at_40_percent = ...  # a number, in ms

# %%
check.step_time_for_mfu(step_ms_at_40_percent)
