# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · `shard_map`: the per-device program, by hand
#
# **Goal.** Write the data-parallel step explicitly: each device computes
# the gradient of its own shard inside `jax.shard_map`, and `jax.lax.pmean`
# over the `data` axis averages them. Compare it with the automatic version
# of notebook 04 (speed, collectives, and the parameters it reaches), then
# make the classic mistakes on purpose and read their messages.
#
# **Assumes.** Notebook 04. At least 2 devices.
#
# **Time**: under 30 s with `smoke`, under 30 s with `cpu`, on a 2-core CPU; under 1 min with `cpu`
# (on 8 simulated CPU devices), on 1 x TPU v5 lite (measured; other work slows it: the run's
# details, its load included, are in `baselines/timings.json`).

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for multi-device lessons

# %%
from dpcourse.lesson import start_lesson

lesson = start_lesson("05_shard_map", PROFILE, N_CPU_DEVICES, min_devices=2)
cfg, dataset = lesson.cfg, lesson.dataset

# %%
import jax
import jax.numpy as jnp
import numpy as np
import optax
from IPython.display import display
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import bench, costs, model, placement, record, show, train
from dpcourse.compiled import collectives
from dpcourse.cross_compile import notebook as gpu_notebook
from dpcourse.exercises import checks
from dpcourse.exercises.cells import check_against

devs = lesson.devices.devices
lesson.check_global_mesh()  # a mesh you set with jax.set_mesh must be this lesson's, or none
n = len(devs)
global_batch = cfg.global_batch(n)
mesh = Mesh(np.array(devs), ("data",))  # Auto axes, as in 04 (Explicit: notebook 03)
optimizer = train.make_optimizer(cfg)
init_host = model.init_params(cfg)
# The placements of notebook 04: parameters P(), batches P('data', None).
placed = placement.place_data_parallel(cfg, dataset, mesh, optimizer, init_host, global_batch)
params, opt_state, batches = placed.params, placed.opt_state, placed.batches
x_host, y_host = placed.x_host, placed.y_host
print(f"{lesson.devices.label}; global batch {global_batch} = {n} x {cfg.per_device_batch}")

# %% [markdown]
# ## 1. What one shard sees
#
# Inside `shard_map` the function runs once per device on **local** arrays.
# `in_specs` says how each global argument is cut; `out_specs` how the
# per-device results are put back together. Here every device reports the
# shape it sees:


# %%
def local_shapes(x, y):
    shape = jnp.array([x.shape[0], x.shape[1], y.shape[0]])
    return shape[None, :]  # one row per device


seen = jax.shard_map(
    local_shapes, mesh=mesh, in_specs=(P("data", None), P("data")), out_specs=P("data")
)(*batches[0])
display(
    show.table(
        [
            {"device": i, "x rows": int(r[0]), "x features": int(r[1]), "y rows": int(r[2])}
            for i, r in enumerate(np.asarray(seen))
        ],
        caption=f"Local shapes inside shard_map (global x: {tuple(batches[0][0].shape)})",
    )
)

# %% [markdown]
# ## 2. The explicit step
#
# Three decisions, all visible in the code:
#
# 1. `in_specs=(P(), P('data', None), P('data'))`: parameters replicated,
#    batch split.
# 2. `lax.pcast(params, 'data', to='varying')`: each device differentiates
#    its **own copy** of the parameters. With `check_vma=True` (the default)
#    JAX tracks which values vary across the axis. A replicated (invariant)
#    input is implicitly broadcast to every device, and the gradient of a
#    broadcast is a sum: differentiating it directly makes JAX *sum* its
#    gradient over the devices for you, so a `pmean` on top would give N
#    times the mean (section 5 shows it).
# 3. `lax.pmean` over `data` on the local gradients, loss and accuracy: the
#    mean of equal-sized shards' mean gradients is the global mean gradient.
#
# The optimizer update stays outside `shard_map`, on replicated values.


# %%
def local_grads(params, x, y):
    """On one device: x [per_device_batch, 784]. Returns the global mean gradient and metrics."""
    params = jax.lax.pcast(params, "data", to="varying")  # this device's own copy
    grad_fn = jax.value_and_grad(model.loss_and_metrics, has_aux=True)
    (_, metrics), grads = grad_fn(params, x, y, cfg)
    grads = jax.lax.pmean(grads, "data")  # the all-reduce, after the backward loop
    metrics = jax.lax.pmean(metrics, "data")
    return grads, metrics


def make_shard_map_step(optimizer, mesh):
    """train_step(params, opt_state, x, y) on the global batch x [global_batch, 784]."""
    specs = dict(in_specs=(P(), P("data", None), P("data")), out_specs=(P(), P()))
    sharded_grads = jax.shard_map(local_grads, mesh=mesh, **specs)

    def train_step(params, opt_state, x, y):
        grads, metrics = sharded_grads(params, x, y)  # replicated on every device
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, metrics

    return train_step


# %% [markdown]
# The package keeps the same step (`train.make_shard_map_step`, with an
# option notebook 09 uses to reduce in bfloat16). `check_against` runs both
# on this lesson's batch and compares the numbers. Change a cell above
# (`psum` for `pmean`, or drop the `pcast`), re-run it and this one, and
# read what differs; then put it back.

# %%
# Arguments of its own (fresh parameters, the first batch), so that this cell still
# runs after the lesson's last cell has freed `params` and `batches`.
p_try = jax.device_put(init_host, NamedSharding(mesh, P()))
x_try = jax.device_put(x_host[0], NamedSharding(mesh, P("data", None)))
y_try = jax.device_put(y_host[0], NamedSharding(mesh, P("data")))
display(
    check_against(
        train.make_shard_map_step(cfg, optimizer, mesh),
        make_shard_map_step(optimizer, mesh),
        p_try,
        optimizer.init(p_try),
        x_try,
        y_try,
    )
)
smap_step = jax.jit(make_shard_map_step(optimizer, mesh))
auto_step = jax.jit(train.make_train_step(cfg, optimizer))

# %% [markdown]
# ## 3. Collectives: explicit vs automatic

# %%
rep_smap = collectives.collective_report(smap_step, params, opt_state, *batches[0])
rep_auto = collectives.collective_report(auto_step, params, opt_state, *batches[0])
ideal = costs.gradient_bytes(cfg)
display(show.table(rep_smap.rows(), caption="Collectives of jit(shard_map step)"))
display(
    show.table(
        [
            {
                "step": "jit on sharded arrays (04)",
                "collectives": rep_auto.count,
                "inside loop": rep_auto.in_loop_count,
                "runs per step": rep_auto.runs_per_step,
                "bytes per step": rep_auto.bytes_per_step,
            },
            {
                "step": "shard_map + pmean",
                "collectives": rep_smap.count,
                "inside loop": rep_smap.in_loop_count,
                "runs per step": rep_smap.runs_per_step,
                "bytes per step": rep_smap.bytes_per_step,
            },
            {
                "step": "ideal",
                "collectives": 1,
                "inside loop": 0,
                "runs per step": 1,
                "bytes per step": ideal,
            },
        ],
        caption=f"Collectives per step, {lesson.devices.label}, JAX {jax.__version__}",
    )
)
backend = devs[0].platform
print(
    f"Measured on {backend} ({n} devices): shard_map step {rep_smap.in_loop_count} "
    "collective(s) inside a loop, "
    f"{rep_smap.runs_per_step} per step; jit step {rep_auto.in_loop_count} inside a loop, "
    f"{rep_auto.runs_per_step} per step."
)
if backend == "cpu":
    print(gpu_notebook.CPU_ONLY_CAVEAT)

# %%
# Both steps (and 04's device-axis step) compiled by XLA's GPU compiler for 8 x H200 and by
# the TPU compiler for a v5e 2x4 and a v6e 16x16 slice, without a GPU or a TPU (a fresh
# process, with the extras of `make gpu-compile` and `make tpu-compile`; else the stored result).
gpu_results = gpu_notebook.show_gpu_placement(cfg.profile, backend)

# %% [markdown]
# The explicit step's `pmean` is written after the backward loop, and both
# compilers keep it there: one all-reduce per step, of the gradients and the
# two metrics. Where the automatic version reduces is the backend compiler's
# decision (notebook 04), and the two tables show it: the CPU compiler
# reduces the shared block's gradient inside the loop, once per repeat;
# XLA's GPU compiler (measured with JAX 0.10.2 and 0.12.0.1) moves it out
# with `while-loop-all-reduce-code-motion` and `gpu-all-reduce-combiner` joins
# it to the rest, so on GPUs plain `jit` also reduces once per step. The TPU
# compiler (libtpu 0.0.42 and 0.0.50) places all three steps as the GPU
# compiler does: one all-reduce per step, after the loop, of the same bytes.
# The `shard_map` step does not depend on that pass: it says where the
# reduction goes, on every backend.

# %% [markdown]
# ## 4. Same parameters, three ways
#
# One step, then a few, from the same start: a single device, the automatic
# N-device step, and the `shard_map` step.

# %%
single = devs[0]
with jax.set_mesh(None):  # the one-device reference runs outside any global mesh
    one = placement.place_single_device(cfg, dataset, single, optimizer, init_host, global_batch)
p1, s1, batches_1 = one.params, one.opt_state, one.batches
pa, sa, ps, ss = params, opt_state, params, opt_state
rows = []
for k in range(3):
    # The N-device steps run as you set things up (under your global mesh, if you set one).
    pa, sa, ma = auto_step(pa, sa, *batches[k % cfg.n_batches])
    ps, ss, ms = smap_step(ps, ss, *batches[k % cfg.n_batches])
    with jax.set_mesh(None):  # the reference and the comparison, outside any global mesh
        p1, s1, m1 = auto_step(p1, s1, *batches_1[k % cfg.n_batches])
        if k == 0:  # AdamW hides a scaled gradient: compare the gradients too
            grad_diff, grad_scale = train.first_step_gradient_diff(s1, ss)
        rows.append(
            {
                "step": k + 1,
                "max |diff| shard_map vs 1 device": train.max_abs_diff(p1, ps),
                "max |diff| shard_map vs jit": train.max_abs_diff(pa, ps),
                "loss 1 device": float(m1["loss"]),
                "loss shard_map": float(ms["loss"]),
            }
        )
display(show.table(rows, caption="Parameters after each step"))
equiv = rows[-1]["max |diff| shard_map vs 1 device"]
equiv_jit = rows[-1]["max |diff| shard_map vs jit"]
# Same tolerances and reasons as notebook 04 (train.equivalence_tolerances).
EQUIV_TOL, GRAD_REL_TOL = train.equivalence_tolerances(devs[0].platform, cfg.learning_rate, steps=3)
GRAD_TOL = GRAD_REL_TOL * grad_scale  # relative to the largest gradient element
print(f"first-step gradients: max |diff| {grad_diff:.3g} (tolerance {GRAD_TOL:.3g})")
# Your shard_map step (section 2) against one device, each leaf against its own scale: a
# parameter by the change the 3 steps made, AdamW's moments and the metrics as they are.
same_training = checks.compare_steps(
    (ps, ss, ms),
    (p1, s1, m1),
    (params, opt_state),
    "Your shard_map step's parameters, AdamW state and metrics after 3 steps",
    "one device",
    backend,
    [checks.device_factor(n)],
)
print(same_training.message)
assert same_training.same, same_training.message
assert equiv < EQUIV_TOL, checks.beyond(
    f"the parameters after 3 steps, shard_map on {n} devices against one device,", equiv, EQUIV_TOL
)
assert equiv_jit < EQUIV_TOL, checks.beyond(  # the explicit and the automatic step agree too
    "the parameters after 3 steps, shard_map against jit,", equiv_jit, EQUIV_TOL
)
assert grad_diff < GRAD_TOL, checks.beyond(
    "the first step's gradients, shard_map against one device,",
    grad_diff,
    GRAD_TOL,
    f"{grad_diff / grad_scale:.2g} of the largest gradient element; a psum for a pmean?",
)

# %% [markdown]
# ## 5. Classic mistakes, made on purpose
#
# Each cell below runs a wrong version and checks what goes wrong, so the
# notebook fails loudly if a JAX upgrade changes the behaviour.
#
# **(a) A per-shard value returned as if it were replicated.** `out_specs=P()`
# promises that the value is the same on every device. With `check_vma=True`
# JAX knows the local loss varies over `data` and refuses:


# %%
def local_loss(p, x, y):
    return model.loss_and_metrics(p, x, y, cfg)[0]


try:
    jax.jit(
        jax.shard_map(
            local_loss, mesh=mesh, in_specs=(P(), P("data", None), P("data")), out_specs=P()
        )
    )(params, *batches[0])
    raise AssertionError("check_vma should refuse a varying value under out_specs=P()")
except ValueError as err:
    print("Refused:", checks.first_sentence(err))

# %% [markdown]
# With the check switched off the same code runs and returns **one device's**
# loss, not the global mean:

# %%
unchecked = jax.jit(
    jax.shard_map(
        local_loss,
        mesh=mesh,
        in_specs=(P(), P("data", None), P("data")),
        out_specs=P(),
        check_vma=False,
    )
)
wrong_loss = float(unchecked(params, *batches[0]))
with jax.set_mesh(None):  # one-device work, outside any global mesh (section 4)
    params_1dev = jax.device_put(init_host, single)
    true_loss = float(model.loss_and_metrics(params_1dev, x_host[0], y_host[0], cfg)[0])
b = cfg.per_device_batch  # device i holds rows i*b to (i+1)*b of the global batch
shard_losses = [
    float(
        model.loss_and_metrics(
            init_host, x_host[0][i * b : (i + 1) * b], y_host[0][i * b : (i + 1) * b], cfg
        )[0]
    )
    for i in range(n)
]
print(
    f"returned: {wrong_loss:.6f}   global mean: {true_loss:.6f}   "
    f"device 0's shard: {shard_losses[0]:.6f}"
)
assert abs(wrong_loss - shard_losses[0]) < 1e-4, checks.beyond(
    "the unchecked loss and device 0's shard loss", abs(wrong_loss - shard_losses[0]), 1e-4
)
assert abs(wrong_loss - true_loss) > 1e-6, (
    f"The unchecked loss {wrong_loss:.6f} equals the global mean {true_loss:.6f}: this JAX "
    "no longer returns one device's value under check_vma=False"
)

# %% [markdown]
# **(b) `psum` where `pmean` was meant** sums the N shards' mean gradients:
# the gradient comes out N times too large. AdamW normalises the step size
# and hides much of it, plain SGD would not; either way it is wrong.


# %%
def grads_with(reduce):
    def local(p, x, y):
        p = jax.lax.pcast(p, "data", to="varying")
        return reduce(jax.grad(local_loss)(p, x, y), "data")

    return jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data", None), P("data")), out_specs=P())
    )


g_mean = grads_with(jax.lax.pmean)(params, *batches[0])
g_sum = grads_with(jax.lax.psum)(params, *batches[0])
scale = float(jnp.linalg.norm(g_sum["w_block"]) / jnp.linalg.norm(g_mean["w_block"]))
print(f"|psum grad| / |pmean grad| = {scale:.3f} (N = {n})")
assert abs(scale - n) < 1e-3 * n, checks.beyond(
    f"|psum grad| / |pmean grad| and N = {n}", abs(scale - n), 1e-3 * n
)

# %% [markdown]
# **(c) Forgetting the cast to a per-device copy.** With `check_vma=True`,
# the gradient of a replicated input is already summed over `data`; adding
# `pmean` on top again gives N times the right gradient. The implicit sum is
# placed by the compiler (the count of collectives inside the loop is
# printed for this run's backend):


# %%
def local_no_cast(p, x, y):
    return jax.lax.pmean(jax.grad(local_loss)(p, x, y), "data")


no_cast = jax.jit(
    jax.shard_map(
        local_no_cast, mesh=mesh, in_specs=(P(), P("data", None), P("data")), out_specs=P()
    )
)
g_no_cast = no_cast(params, *batches[0])
scale_nc = float(jnp.linalg.norm(g_no_cast["w_block"]) / jnp.linalg.norm(g_mean["w_block"]))
rep_nc = collectives.collective_report(no_cast, params, *batches[0])
print(
    f"|grad without pcast| / |correct grad| = {scale_nc:.3f}; "
    f"collectives inside the loop on {backend}: {rep_nc.in_loop_count}"
)
assert abs(scale_nc - n) < 1e-3 * n, checks.beyond(
    f"|grad without pcast| / |correct grad| and N = {n}", abs(scale_nc - n), 1e-3 * n
)

# %% [markdown]
# **(d) A collective outside any mapped axis.** `lax.pmean(x, 'data')` under
# plain `jit` has no axis called `data` to reduce over:

# %%
try:
    jax.jit(lambda x: jax.lax.pmean(x, "data"))(jnp.ones(4))
    raise AssertionError("an unbound axis name should be an error")
except NameError as err:
    print("NameError:", checks.first_sentence(err))

# %% [markdown]
# ## 6. Benchmark: explicit vs automatic

# %%
res_auto, *_ = bench.benchmark(
    auto_step, params, opt_state, batches, cfg, label=f"{n} devices, jit"
)
res_smap, *_ = bench.benchmark(
    smap_step, params, opt_state, batches, cfg, label=f"{n} devices, shard_map"
)
display(show.records_table([res_auto, res_smap], dataset.source))
note = (
    "Simulated CPU devices add no compute: compare the two forms, not the devices."
    if lesson.devices.simulated
    else ""
)
fig = show.bar_chart(
    [res_auto.label, res_smap.label],
    [res_auto.examples_per_s, res_smap.examples_per_s],
    "examples/s",
    f"Explicit vs automatic, global batch {global_batch}",
    note,
)
_ = record.save_figure(fig, "throughput")

# %%
_ = record.figures(
    {
        "throughput": (res_smap.examples_per_s, "examples/s"),
        "throughput_jit": (res_auto.examples_per_s, "examples/s"),
        "ms_per_step": (res_smap.ms_per_step, "ms"),
        "ratio_shard_map_vs_jit": (res_smap.examples_per_s / res_auto.examples_per_s, "ratio"),
        "final_loss": (res_smap.final_loss, "loss"),
        "final_accuracy": (res_smap.final_accuracy, "fraction"),
        "max_abs_param_diff_vs_1_device": (equiv, "abs"),
        "max_abs_param_diff_vs_1_device_tolerance": (EQUIV_TOL, "abs"),
        "max_abs_param_diff_vs_jit": (equiv_jit, "abs"),
        "max_abs_param_diff_vs_jit_tolerance": (EQUIV_TOL, "abs"),
        "max_abs_grad_diff_vs_1_device": (grad_diff, "abs"),
        "max_abs_grad_diff_vs_1_device_tolerance": (GRAD_TOL, "abs"),
        "collectives_per_step_shard_map": (rep_smap.runs_per_step, "count"),
        "collective_bytes_per_step_shard_map": (rep_smap.bytes_per_step, "bytes"),
        "collectives_in_loop_shard_map": (rep_smap.in_loop_count, "count"),
        "psum_vs_pmean_gradient_scale": (scale, "ratio"),
    }
)

# %% [markdown]
# ## What you learned
#
# - `jax.shard_map` runs your function per device on local shards;
#   `in_specs`/`out_specs` connect local and global views.
# - The data-parallel step is: local gradient of a per-device copy,
#   `lax.pmean` over `data`, optimizer update outside.
# - `check_vma` catches a varying value returned as replicated; the
#   `psum`/`pmean` and missing-cast mistakes scale the gradient by N. The
#   missing cast is about semantics: differentiating an invariant input
#   sums its gradient over the axis.
# - Written by hand, the all-reduce is where you put it, after the loop;
#   section 3 counts it in the program compiled for this run's backend
#   and for GPUs, compiled on this machine without one (the optional
#   `make gpu-compile` extra). Plain `jit`
#   leaves that placement to the backend's compiler.
# - The compile column of the benchmark says `warm`: both steps ran before
#   it, and a recompile in the same process is not a cold compile.
#
# **Next:** [06_pmap](06_pmap.ipynb): the older `jax.pmap` way, and how it
# maps onto what you just wrote.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
from dpcourse.exercises import lesson05 as check

# %% [markdown]
# **05.1 · Shards of unequal size.** Section 2's `pmean` of the shards' mean
# gradients is the global mean gradient only because every shard holds the
# same number of examples. Real batches are often padded: a mask `m`
# `[global_batch]` (1.0 for a real example, 0.0 for padding) says which
# rows count, and the devices hold different numbers of real examples.
# Write `masked_grads(params, x, y, m)` that returns, replicated, the
# gradient of the global masked mean loss `sum(m * loss) / sum(m)`, using
# `jax.shard_map` on `mesh` (`m` is sharded like `y`). Each example's loss
# is `optax.softmax_cross_entropy_with_integer_labels(logits, y)` with
# `logits = model.forward(p, x, cfg.block_repeats, cfg.block_mix)`. The
# check calls it on its own padded batch and compares with one device.

# %% tags=["exercise", "ex05_1"]
masked_grads = ...  # replace with: def masked_grads(params, x, y, m): ...

# %%
check.masked_gradients(masked_grads, cfg, mesh)

# %% [markdown]
# **05.2 · What AdamW hides.** Someone wrote `lax.psum` where `lax.pmean`
# belongs, so every gradient is N times too large (section 5(b)). Starting
# from a fresh `optimizer.init`, by what factor is the norm of AdamW's
# **first update** too large (optax's defaults, this lesson's weight
# decay)? And by what factor is the norm of its second moment `nu` (the
# running mean of squared gradients, in the optimizer state) too large?
# Think about how AdamW turns a gradient into an update; the check measures
# both on this mesh.

# %% tags=["exercise", "ex05_2"]
adamw_factors = ...  # (update_factor, nu_factor)

# %%
check.adamw_psum_factors(adamw_factors, cfg, mesh)
