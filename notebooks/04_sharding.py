# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Sharding: automatic data parallelism
#
# **Goal.** Shard the batch over the `data` axis, replicate the parameters,
# and run the **same** jitted training step from notebook 02. The compiler
# (XLA's SPMD partitioner) turns it into a data-parallel program and inserts
# the gradient all-reduce for you. Then: find that all-reduce in the
# compiled program (and see that where it lands depends on the backend's
# compiler), measure against one device, and check that the result is the
# same as on one device.
#
# **Assumes.** Notebooks 02 (the step) and 03 (mesh, PartitionSpec). At
# least 2 devices.
#
# **Time**: under 30 s with `smoke`, under 30 s with `cpu`, on a 2-core CPU; under 1 min with `cpu`
# (on 8 simulated CPU devices), on 1 x TPU v5 lite (measured; other work slows it: the run's
# details, its load included, are in `baselines/timings.json`).

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for multi-device lessons

# %%
from dpcourse.lesson import start_lesson

lesson = start_lesson("04_sharding", PROFILE, N_CPU_DEVICES, min_devices=2)
cfg, dataset = lesson.cfg, lesson.dataset

# %%
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from IPython.display import display
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import bench, costs, data, model, placement, record, show, train
from dpcourse.compiled import collectives
from dpcourse.cross_compile import notebook as gpu_notebook
from dpcourse.exercises import checks
from dpcourse.exercises.cells import check_against

devs = lesson.devices.devices
lesson.check_global_mesh()  # a mesh you set with jax.set_mesh must be this lesson's, or none
n = len(devs)
global_batch = cfg.global_batch(n)
print(
    f"{lesson.devices.label}; per-device batch {cfg.per_device_batch}, global batch {global_batch}"
)

# %% [markdown]
# ## 1. Placements
#
# One mesh axis, `data`. The batch is split on its batch dimension, the
# parameters and the optimizer state are replicated:
#
# | array | shape (global) | PartitionSpec |
# |---|---|---|
# | one batch of images | `[global_batch, 784]` | `P('data', None)` |
# | one batch of labels | `[global_batch]` | `P('data')` |
# | stacked images | `[n_batches, global_batch, 784]` | `P(None, 'data', None)` |
# | stacked labels | `[n_batches, global_batch]` | `P(None, 'data')` |
# | parameters, optimizer state | as they are | `P()` (replicated) |
#
# The mesh has `Auto` axes (`Mesh(...)`'s default): the lesson is automatic
# partitioning, where the compiler decides the intermediate shardings. (On
# a `jax.make_mesh` mesh, `Explicit` by default, the same step needs
# `jax.set_mesh`; notebook 03, section 4.)

# %%
mesh = Mesh(np.array(devs), ("data",))
replicated = NamedSharding(mesh, P())
stacked_x_sharding = NamedSharding(mesh, P(None, "data", None))
stacked_y_sharding = NamedSharding(mesh, P(None, "data"))

optimizer = train.make_optimizer(cfg)
init_host = model.init_params(cfg)  # the same values as on one device
params = jax.device_put(init_host, replicated)
opt_state = optimizer.init(params)
x_host, y_host = data.stacked_batches(dataset, cfg.n_batches, global_batch)
x_stack = jax.device_put(x_host, stacked_x_sharding)
y_stack = jax.device_put(y_host, stacked_y_sharding)
batches = [(x_stack[i], y_stack[i]) for i in range(cfg.n_batches)]
print("one image batch:", batches[0][0].sharding.spec, " labels:", batches[0][1].sharding.spec)

# %% [markdown]
# `jax.debug.visualize_array_sharding` draws rank-1 and rank-2 arrays
# (`show.sharding` calls it, or prints a table where the optional rich
# package is missing). A batch of images, `[global_batch, 784]`, is cut into
# N row blocks; the labels into N pieces; the weights are on every device:

# %%
show.sharding(batches[0][0], "images")
show.sharding(batches[0][1], "labels")
show.sharding(params["w_block"], "w_block")

# %% [markdown]
# For the rank-3 stack of batches, a table of per-device shard shapes does
# the job:

# %%
show.shard_table(x_stack, "x_stack")

# %% [markdown]
# ## 2. The same step, on sharded arrays
#
# Nothing in `train_step` mentions devices. `jax.jit` sees inputs sharded
# over `data`, propagates those shardings through the program, and adds the
# communication that makes the result correct: the gradient of a mean over
# the global batch needs a sum over the devices' partial gradients, an
# **all-reduce**.

# %%
train_step = jax.jit(train.make_train_step(cfg, optimizer))
new_params, _, _ = train_step(params, opt_state, *batches[0])
print(
    "updated w_block sharding:", new_params["w_block"].sharding.spec, "(replicated, as it went in)"
)

# %% [markdown]
# **The `jit` way vs a `lax` collective.** Under plain `jit` you write the
# global computation (a mean over the whole batch) and the compiler adds the
# all-reduce. A `lax` collective such as `lax.pmean(v, "data")` is the
# per-device way: it needs a mapped axis called `data`, which plain `jit`
# does not have, so it is an error there. Inside `jax.shard_map` (notebook
# 05) the axis exists, and both ways give the same number:

# %%
x0 = batches[0][0]
jit_mean = float(jax.jit(jnp.mean)(x0))  # global view: the compiler adds the all-reduce
try:
    jax.jit(lambda v: jax.lax.pmean(v.mean(), "data"))(x0)
    raise AssertionError("lax.pmean under plain jit should fail: no axis named 'data'")
except NameError as err:
    print("lax.pmean under plain jit -> NameError:", checks.first_sentence(err))
per_device_mean = jax.shard_map(
    lambda v: jax.lax.pmean(v.mean(), "data"), mesh=mesh, in_specs=P("data", None), out_specs=P()
)
lax_mean = float(jax.jit(per_device_mean)(x0))
print(f"jit(jnp.mean): {jit_mean:.7f}   shard_map + lax.pmean: {lax_mean:.7f}")
# float32, summed in another order: a few roundings, far below 1e-6 of the mean
assert abs(jit_mean - lax_mean) <= 1e-6 * max(1.0, abs(jit_mean)), checks.beyond(
    "jit(jnp.mean) and shard_map + lax.pmean",
    abs(jit_mean - lax_mean),
    1e-6 * max(1.0, abs(jit_mean)),
)

# %% [markdown]
# ## 3. Where did the all-reduce go? Read the compiled program
#
# `train_step.lower(...).compile().as_text()` is the optimised program XLA
# will run. `collective_report` lists its cross-device collectives, their
# bytes, and whether they sit inside a loop. The ideal for data parallelism
# is **one** reduction of the gradient per step:

# %%
report = collectives.collective_report(train_step, params, opt_state, *batches[0])
ideal = costs.gradient_bytes(cfg)
display(show.table(report.rows(), caption=f"Collectives of jit(train_step) on {n} devices"))
display(
    show.key_values(
        {
            "ideal: one all-reduce of the gradient": f"{ideal:,} bytes per step",
            "collective instructions in the program": report.count,
            "of which inside a loop": report.in_loop_count,
            "collective executions per step": report.runs_per_step,
            "bytes through collectives per step": report.bytes_per_step,
        },
        caption=f"Automatic data parallelism on {lesson.devices.label}, JAX {jax.__version__}",
    )
)
backend = devs[0].platform
print(
    f"Measured on {backend} ({n} devices): jit(train_step) has {report.in_loop_count} "
    f"collective(s) inside a loop and runs {report.runs_per_step} collective(s) per step."
)
if backend == "cpu":
    print(gpu_notebook.CPU_ONLY_CAVEAT)

# %% [markdown]
# The ideal counts the gradient only; a real step also all-reduces the loss
# and accuracy (8 more bytes). The table shows where they went on this run:
# XLA's combiner may pack them into an instruction with gradients or leave
# them in one of their own, so count the rows rather than assume one.
#
# **Where the reduction lands is the backend compiler's decision.** In the
# backward pass of the `scan`, each iteration adds its contribution to the
# shared block's gradient, an accumulator carried through the loop. The
# accumulator is replicated like the weight, while each contribution is a
# partial sum over the local shard of the batch. The SPMD partitioner first
# reduces each contribution where it is made, inside the loop; later passes
# may move it:
#
# - **CPU** (measured with JAX 0.10.2 and 0.12.0.1): it stays inside the
#   loop, one all-reduce of the block's gradient per block repeat,
#   BLOCK_REPEATS times per step.
# - **GPU** (measured the same way, compiled for H100 SXM, H200 and an
#   approximate L4 at 2, 4 and 8 GPUs on a machine without a GPU): one
#   all-reduce per step, after the loop, of the gradient and the two metrics.
#   XLA's GPU pipeline has a pass the CPU pipeline lacks,
#   `while-loop-all-reduce-code-motion`: it moves an all-reduce whose result
#   is only accumulated in a loop out of the loop (the sum of the reduced
#   contributions is the reduction of their sum). Then
#   `gpu-all-reduce-combiner` merges it with the other gradients'
#   all-reduces into one instruction (switching off that pass leaves one
#   all-reduce per gradient leaf and metric; switching off the generic
#   `all-reduce-combiner` changes nothing: the GPU pipeline runs its own).
# - **TPU** (compiled with libtpu 0.0.42 and 0.0.50, the releases JAX
#   0.10.2's and 0.12.0.1's `tpu` extras take, for a v5e 2x4 slice, the 8
#   chips of Kaggle's TPU v5e-8, a 64-chip v5p 4x4x4 and a 256-chip v6e
#   16x16, on a machine without a TPU): as on the GPU, one all-reduce per
#   step, after the loop, of the gradient and the two metrics (7,454,768
#   bytes at the full profile, the same figure as the step compiled on a
#   real v5e chip). The TPU compiler runs the same pass: the experiment
#   below switches it off there too.
#
# The line printed under the table above is measured on this run's backend.
# The next cell asks XLA's GPU compiler and the TPU compiler themselves, in a
# fresh process: JAX can compile for N GPUs from a description of the GPU
# (here XLA's own H200 file), and for a TPU slice from libtpu's description
# of its topology, without having either. Each needs an optional extra
# (`make gpu-compile`, about 510 MB; `make tpu-compile`, libtpu, a 209 MB
# wheel); without one the cell shows the result `make placement` stored,
# labelled as stored, with the JAX version and date it was made.

# %%
# The same three steps compiled by XLA's GPU compiler for 8 x H200 and by the TPU compiler
# for a v5e 2x4 and a v6e 16x16 slice, without a GPU or a TPU (a fresh process with a GPU
# target description and libtpu's topologies; without an extra, the stored result).
gpu_results = gpu_notebook.show_gpu_placement(cfg.profile, backend)

# %% [markdown]
# **The experiment that turns it off.** Switch the pass off in the compile
# process (`XLA_FLAGS=--xla_disable_hlo_passes=while-loop-all-reduce-code-motion`)
# and compile plain `jit` for the GPU and the v5e slice again: on both the
# all-reduce of the block's gradient is back inside the loop, once per
# repeat, as on the CPU.

# %%
no_motion = gpu_notebook.show_gpu_placement(
    cfg.profile,
    backend,
    steps={"jit": "dpcourse.cross_compile.steps:jit_step"},
    disable_passes=(gpu_notebook.PASS_NAME,),
    tpu_targets=("v5e_2x4",),
)

# %% [markdown]
# **A way to one reduction per step by construction, still with plain
# `jit`.** Give each device its own gradient accumulator: reshape the global
# batch to `[N, per_device_batch, 784]` and take per-device gradients with
# `jax.vmap`. The accumulator becomes an `[N, ...]` array sharded over
# `data`, so the loop body has no cross-device value to reduce, and the
# mean over the device axis after the loop is the single all-reduce:


# %%
def make_device_axis_step(optimizer, n_devices):
    """train_step(params, opt_state, x, y), x [N x per_device_batch, 784]: one reduction a step."""
    loss_fn = functools.partial(model.loss_and_metrics, cfg=cfg)
    per_device_grad = jax.vmap(jax.value_and_grad(loss_fn, has_aux=True), in_axes=(None, 0, 0))

    def train_step(params, opt_state, x, y):
        xs = x.reshape(n_devices, -1, x.shape[-1])  # [N, per_device_batch, 784]
        ys = y.reshape(n_devices, -1)  # [N, per_device_batch]
        (_, metrics), grads = per_device_grad(params, xs, ys)  # each leaf [N, ...]
        grads = jax.tree.map(lambda g: g.mean(axis=0), grads)  # the one all-reduce
        metrics = jax.tree.map(lambda m: m.mean(axis=0), metrics)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, metrics

    return train_step


# %% [markdown]
# The package keeps the same step as `train.make_device_axis_step` (with a
# check of the batch size); `check_against` runs both on this lesson's
# sharded batch and compares the numbers, each output against its own scale
# (the gradients, read from AdamW's first moment, the change to each
# parameter, the metrics). Edit the cell above (take the `mean` over the
# wrong axis, say), re-run it and the check cell below: it says what
# differs, by how much, and the likely cause.
#
# The check cell also compiles your step and lists its collectives: the
# rows "jit(device-axis step)" in its two tables are your cell, and so is
# the row "N devices, device-axis jit" of section 5's benchmark (with
# "measured ratio, device-axis jit"). The check and the tables use
# arguments of their own, so they run again after the lesson has ended;
# sections 4 and 5 use the lesson's arrays, which its last cell frees: for
# your version in the benchmark, run the lesson again from the top.

# %%
# Arguments of its own (fresh parameters, the first batch), so that this cell still
# runs after the lesson's last cell has freed `params` and `batches`.
p_try = jax.device_put(init_host, replicated)
s_try = optimizer.init(p_try)
x_try = jax.device_put(x_host[0], NamedSharding(mesh, P("data", None)))
y_try = jax.device_put(y_host[0], NamedSharding(mesh, P("data")))
display(
    check_against(
        train.make_device_axis_step(cfg, optimizer, n),
        make_device_axis_step(optimizer, n),
        p_try,
        s_try,
        x_try,
        y_try,
    )
)
device_axis_step = jax.jit(make_device_axis_step(optimizer, n))
report_fixed = collectives.collective_report(device_axis_step, p_try, s_try, x_try, y_try)
display(show.table(report_fixed.rows(), caption="Collectives of jit(device-axis step)"))
display(
    show.table(
        [
            {
                "step": "jit(train_step)",
                "collectives": report.count,
                "inside loop": report.in_loop_count,
                "runs per step": report.runs_per_step,
                "bytes per step": report.bytes_per_step,
            },
            {
                "step": "jit(device-axis step)",
                "collectives": report_fixed.count,
                "inside loop": report_fixed.in_loop_count,
                "runs per step": report_fixed.runs_per_step,
                "bytes per step": report_fixed.bytes_per_step,
            },
            {
                "step": "ideal",
                "collectives": 1,
                "inside loop": 0,
                "runs per step": 1,
                "bytes per step": ideal,
            },
        ],
        caption="Collectives per step",
    )
)

# %% [markdown]
# ## 4. Same result as one device
#
# Data parallelism must change only *where* the work happens. Start one
# device and N devices from the same parameters, feed the same global batch,
# and compare the parameters after one step and after a few.
#
# The one-device side runs inside `with jax.set_mesh(None):`. Should you
# have set the mesh globally (`jax.set_mesh(mesh)`, notebook 03), `jit`
# would refuse the arrays on one device, as they are not on the context
# mesh's N devices; the block clears it for the reference only.

# %%
single = devs[0]
with jax.set_mesh(None):  # the one-device reference runs outside any global mesh
    one = placement.place_single_device(cfg, dataset, single, optimizer, init_host, global_batch)
params_1, state_1, batches_1 = one.params, one.opt_state, one.batches
params_n, state_n = params, opt_state
rows = []
for step_index in range(3):
    # The N-device step runs as you set things up (under your global mesh, if you set one).
    params_n, state_n, mn = train_step(params_n, state_n, *batches[step_index % cfg.n_batches])
    with jax.set_mesh(None):  # the reference and the comparison, outside any global mesh
        params_1, state_1, m1 = train_step(
            params_1, state_1, *batches_1[step_index % cfg.n_batches]
        )
        if step_index == 0:  # AdamW hides a scaled gradient: compare the gradients too
            grad_diff, grad_scale = train.first_step_gradient_diff(state_1, state_n)
        rows.append(
            {
                "step": step_index + 1,
                "max |param diff|": train.max_abs_diff(params_1, params_n),
                "loss 1 device": float(m1["loss"]),
                f"loss {n} devices": float(mn["loss"]),
            }
        )
display(show.table(rows, caption="1 device vs N devices, same global batch"))
equiv = rows[-1]["max |param diff|"]
# Tolerances (reasons in the docstring of train.equivalence_tolerances):
# float32 sums in another order differ by a few roundings; on a GPU, TF32
# matmuls round more coarsely. AdamW's normalised update would hide a
# gradient that is N times too large, so the gradients are compared too,
# read from AdamW's first moment after step 1.
EQUIV_TOL, GRAD_REL_TOL = train.equivalence_tolerances(devs[0].platform, cfg.learning_rate, steps=3)
GRAD_TOL = GRAD_REL_TOL * grad_scale
print(
    f"first-step gradients: max |diff| {grad_diff:.3g} (tolerance {GRAD_TOL:.3g}; "
    f"largest element {grad_scale:.3g})"
)
# Each leaf against its own scale as well: a parameter by the change the 3 steps made,
# AdamW's moments and the metrics as they are (dpcourse.exercises.checks.compare_steps).
same_training = checks.compare_steps(
    (params_n, state_n, mn),
    (params_1, state_1, m1),
    (params, opt_state),
    f"The parameters, AdamW state and metrics on {n} devices after 3 steps",
    "one device",
    backend,
    [checks.device_factor(n)],
)
print(same_training.message)
assert same_training.same, same_training.message
assert equiv < EQUIV_TOL, checks.beyond(
    f"the parameters after 3 steps, {n} devices against one,", equiv, EQUIV_TOL
)
assert grad_diff < GRAD_TOL, checks.beyond(
    f"the first step's gradients, {n} devices against one,",
    grad_diff,
    GRAD_TOL,
    f"{grad_diff / grad_scale:.2g} of the largest gradient element; a reduction that sums?",
)

# %% [markdown]
# **Float32 on a GPU is not float32 everywhere.** On NVIDIA GPUs JAX's
# default float32 matmul runs in TF32 (10 mantissa bits): measured on an
# H200 (JAX 0.11.2), a 2048 x 2048 matmul at the default precision was
# 2.9e-4 off in relative terms, and 8.1e-7 with `"highest"`.
# That is why the GPU tolerances above are loose. For a tight check, run
# both sides under `jax.default_matmul_precision("highest")` (full float32
# matmuls; slower) and hold them to the CPU tolerance:

# %%
if devs[0].platform != "cpu":
    with jax.default_matmul_precision("highest"):
        _, state_n_hi, _ = train_step(params, opt_state, *batches[0])  # under your mesh, if set
        with jax.set_mesh(None):  # the one-device side, outside any global mesh
            one_hi = placement.place_single_device(
                cfg, dataset, single, optimizer, init_host, global_batch
            )
            _, state_1_hi, _ = train_step(one_hi.params, one_hi.opt_state, *one_hi.batches[0])
            grad_diff_hi, grad_scale_hi = train.first_step_gradient_diff(state_1_hi, state_n_hi)
    _, TIGHT_GRAD_REL_TOL = train.equivalence_tolerances("cpu", cfg.learning_rate, steps=1)
    print(
        f"first-step gradients at 'highest' precision: max |diff| {grad_diff_hi:.3g} "
        f"(tolerance {TIGHT_GRAD_REL_TOL * grad_scale_hi:.3g}, the float32 one)"
    )
    assert grad_diff_hi < TIGHT_GRAD_REL_TOL * grad_scale_hi, checks.beyond(
        "the first step's gradients at 'highest' precision, N devices against one,",
        grad_diff_hi,
        TIGHT_GRAD_REL_TOL * grad_scale_hi,
    )
    record.figures(
        {
            "max_abs_grad_diff_vs_1_device_highest": (grad_diff_hi, "abs"),
            "max_abs_grad_diff_vs_1_device_highest_tolerance": (
                TIGHT_GRAD_REL_TOL * grad_scale_hi,
                "abs",
            ),
        }
    )
else:
    print("On CPUs the default float32 matmul is full float32: the check above is the tight one.")

# %% [markdown]
# ## 5. Benchmark: 1 device vs N devices
#
# Same global batch on both sides; the N-device run also shows the device-axis
# step from section 3. The `compile` column says what the compile time
# measured: `cold` is the first compile of that program in this process,
# `warm` a recompile of a program compiled earlier (every step here ran
# above). To time a cold compile, compare with another fresh program after
# the process has warmed up: the very first compile of a process also pays
# one-time start-up costs, so it is slower than any cold compile after it.

# %%
with jax.set_mesh(None):  # the one-device reference runs outside any global mesh
    one = placement.place_single_device(cfg, dataset, single, optimizer, init_host, global_batch)
    res_1, *_ = bench.benchmark(
        train_step, one.params, one.opt_state, one.batches, cfg, label=f"1 x {single.device_kind}"
    )
res_n, *_ = bench.benchmark(train_step, params, opt_state, batches, cfg, label=f"{n} devices, jit")
res_fix, *_ = bench.benchmark(
    device_axis_step, params, opt_state, batches, cfg, label=f"{n} devices, device-axis jit"
)
display(show.records_table([res_1, res_n, res_fix], dataset.source))
ratio = res_n.examples_per_s / res_1.examples_per_s
ratio_fix = res_fix.examples_per_s / res_1.examples_per_s
note = (
    "Simulated CPU devices add no compute: this ratio is scheduling on the same cores, not scaling."
    if lesson.devices.simulated
    else ""
)
fig = show.bar_chart(
    [r.label for r in (res_1, res_n, res_fix)],
    [r.examples_per_s for r in (res_1, res_n, res_fix)],
    "examples/s",
    f"Throughput, global batch {global_batch} ({dataset.source} data)",
    note,
)
_ = record.save_figure(fig, "throughput")

# %% [markdown]
# ### Reading the ratio honestly
#
# Where plain `jit` reduces inside the loop, the device-axis step moves
# fewer bytes, but it also stores an `[N, ...]` gradient accumulator and
# reduces it with a mean instead of letting the partitioner fuse the
# reduction; whether that wins depends on the backend and on the sizes.
# Measure it where you run.
#
# With N real GPUs, each device computes 1/N of the batch and the gradient
# is all-reduced. The cost model below adds compute time and all-reduce time
# as if nothing overlapped: an **estimate**, not a bound. Its all-reduce term
# uses the datasheet link with no latency (too low); no overlap is what to
# expect from this step: its one all-reduce comes after the backward pass,
# and the update needs its result. (XLA's latency-hiding scheduler is not
# the reason: compiled without a GPU, it runs for the H100 and H200 targets,
# not for the L4's, and finds nothing here to overlap.) Where a schedule
# does overlap, the sum is too high. A profiler trace shows what actually
# overlapped (notebook 09). If compute dominates (large per-device batch,
# many block repeats) the ratio approaches N; if the all-reduce dominates
# (small batch, slow links) it stays far below. On **simulated** CPU devices
# the N shards run on the same cores: no compute is added, so there is no
# real speed-up to measure. The ratio still moves away from 1, in either
# direction: N smaller per-device matmuls may use the cores and caches
# better or worse than one large one, and the all-reduce and partitioning
# cost extra work. The table below gives this run's ratio; it moves from run
# to run, with the profile's sizes and with the machine's cores (01 prints
# them). Read it as scheduling noise, not as scaling.

# %%
# The same link rule as notebook 02: the device's own link where it is listed
# (a TPU's chips all-reduce over ICI, over the slice's axes),
# else PCIe Gen4 x16 (32 GB/s each way, assumed); simulated devices have no link.
peak = costs.find_peak(single.device_kind)
per_example_s = res_1.ms_per_step / 1000.0 / global_batch
if peak is not None and peak.is_tpu and not lesson.devices.simulated:
    shape = costs.tpu_slice_shape([tuple(d.coords) for d in mesh.devices.flat], peak)
    link_bytes_per_s, link_name = (
        peak.link_bytes_per_s,
        f"ICI over a {costs.slice_name(peak, shape)}, "
        f"{peak.link_bytes_per_s / 1e9:.0f} GB/s each way per link",
    )
    pred = costs.predict_tpu_step(cfg, cfg.per_device_batch, peak, shape, 0.0, per_example_s)
else:
    if lesson.devices.simulated:
        link_bytes_per_s, link_name = (
            None,
            "none: simulated devices share host memory (all-reduce time left out)",
        )
    elif peak is not None:
        link_bytes_per_s, link_name = (
            peak.link_bytes_per_s,
            f"{peak.link}, {peak.link_bytes_per_s / 1e9:.0f} GB/s each way",
        )
    else:
        link_bytes_per_s, link_name = (
            32e9,
            "PCIe Gen4 x16, 32 GB/s each way (assumed: device not in the table)",
        )
    pred = costs.predict_step(
        cfg,
        cfg.per_device_batch,
        n,
        0.0,
        per_example_s,
        link_bytes_per_s,
        shared_cores=lesson.devices.simulated,
    )
display(
    show.key_values(
        {
            "measured ratio (N devices / 1 device), jit": f"{ratio:.2f}",
            "measured ratio, device-axis jit": f"{ratio_fix:.2f}",
            "gradient all-reduce per step (ideal)": f"{ideal / 1e6:.3f} MB",
            "link": link_name,
            "predicted all-reduce time": "n/a"
            if link_bytes_per_s is None
            else f"{pred.allreduce_s * 1e3:.3f} ms",
            "predicted step time (scaled compute + all-reduce)": f"{pred.step_s * 1e3:.2f} ms",
            "predicted ratio": f"{pred.examples_per_s / res_1.examples_per_s:.2f}",
        },
        caption="Measured against the cost model",
    )
)

# %%
record.figures(
    {
        "throughput_1_device": (res_1.examples_per_s, "examples/s"),
    },
    device_count=1,
)
_ = record.figures(
    {
        "throughput": (res_n.examples_per_s, "examples/s"),
        "throughput_device_axis": (res_fix.examples_per_s, "examples/s"),
        "ms_per_step": (res_n.ms_per_step, "ms"),
        "ratio_n_vs_1": (ratio, "ratio"),
        "final_loss": (res_n.final_loss, "loss"),
        "final_accuracy": (res_n.final_accuracy, "fraction"),
        "max_abs_param_diff_vs_1_device": (equiv, "abs"),
        "max_abs_param_diff_vs_1_device_tolerance": (EQUIV_TOL, "abs"),
        "max_abs_grad_diff_vs_1_device": (grad_diff, "abs"),
        "max_abs_grad_diff_vs_1_device_tolerance": (GRAD_TOL, "abs"),
        "collectives_per_step_jit": (report.runs_per_step, "count"),
        "collective_bytes_per_step_jit": (report.bytes_per_step, "bytes"),
        "collectives_in_loop_jit": (report.in_loop_count, "count"),
        "collectives_per_step_device_axis": (report_fixed.runs_per_step, "count"),
        "collective_bytes_per_step_device_axis": (report_fixed.bytes_per_step, "bytes"),
    }
)

# %% [markdown]
# ## 6. A batch that does not divide by the device count
#
# Every device must get the same number of examples. The package checks this
# where the invariant lives and says what to use instead:

# %%
try:
    train.check_global_batch(global_batch + 1, n)
    raise AssertionError("an uneven batch should be refused")
except ValueError as err:
    print(err)

# %% [markdown]
# ## What you learned
#
# - Data parallelism with `jit`: shard the batch `P('data', ...)`, replicate
#   the parameters `P()`, and run the unchanged step.
# - The compiler adds the all-reduce; the compiled program tells you where,
#   how often and how many bytes. Where it lands is the backend compiler's
#   decision: the CPU compiler leaves the shared block's reduction inside
#   the backward loop; XLA's GPU pipeline has a pass that moves it out,
#   shown by compiling for GPUs on this machine, no GPU needed (the
#   optional `make gpu-compile` extra).
#   Per-device gradients via `vmap` give one reduction per step on any
#   backend.
# - A `lax` collective needs a mapped axis: under plain `jit` it is an
#   unbound-axis error; write the global computation and let the compiler
#   reduce, or map the axis with `shard_map`.
# - One step on N devices equals one step on one device up to float32
#   rounding on CPUs; on NVIDIA GPUs the default float32 matmul is TF32, so
#   check under `jax.default_matmul_precision("highest")` for a tight match.
# - Simulated devices add no compute, so their timing ratios are not
#   speed-ups; real devices speed up when compute outweighs the part of the
#   all-reduce that does not overlap it.
# - A compile time is cold only for a program's first compile in the process.
#
# **Next:** [05_shard_map](05_shard_map.ipynb) writes the per-device program
# and its collective by hand.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
from dpcourse.exercises import lesson04 as check

# %% [markdown]
# **04.1 · Collectives when BLOCK_REPEATS doubles.** `report` (section 3)
# lists the collectives of `jit(train_step)` for this configuration. Predict
# how many collective executions per step the same step has when
# BLOCK_REPEATS doubles: which rows of the table depend on BLOCK_REPEATS? Compute
# your number from `report.collectives` (each has `.in_loop` and
# `.runs_per_step`); the check compiles the doubled step and measures it
# with `collective_report`.

# %% tags=["exercise", "ex04_1"]
runs_per_step_doubled = ...  # an int

# %%
check.collectives_doubled(runs_per_step_doubled, cfg, mesh)

# %% [markdown]
# **04.2 · Place a batch yourself.** Pick a global batch of about 100
# examples that the `n` devices can share, and place the first that many
# images of `dataset.images` (a numpy array `[examples, 784]`) on the mesh
# as data parallelism needs them.

# %% tags=["exercise", "ex04_2"]
x_mine = ...  # a jax.Array from jax.device_put(...)

# %%
check.placed_batch(x_mine, dataset, mesh)
