# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 09 · How fast should the step be?
#
# **Goal.** Measure this device's ceilings (how fast a matmul can run in
# true float32, default float32 and bfloat16), place the course's step on a
# roofline, then climb a ladder of faster ways to write the *same* step:
# `lax.scan` unrolled, the repeats as a Python loop, bfloat16 compute with
# float32 master weights, a larger batch, the block's backward pass as one
# Pallas kernel. Check each rung is still correct,
# look inside with a profiler trace and the compiled program, and come back
# to data parallelism: where does the all-reduce land for the fast step?
#
# **Assumes.** Notebooks 02 (the step, MFU) and 04 (collectives in the
# compiled program).
#
# **Time**: under 30 s with `smoke`, under 30 s with `cpu`, on a 2-core CPU; 2-5 min with `full`, on
# 1 x TPU v5 lite (measured; other work slows it: the run's details, its load included, are in
# `baselines/timings.json`).
#
# Single-device measurements here run on the first device of JAX's default
# backend: the GPU on a machine with one GPU, with the `full` workload. Only
# the multi-device part at the end uses simulated CPU devices when there are
# fewer than two GPUs; the banner below says which part ran where.

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for the multi-device part
TRACE_STEPS = 3  # steps captured in the profiler trace
SCHEDULES = True  # section 7 compiles 11 GPU schedules (H200, H100 SXM, L4); False skips them

# %%
from dpcourse.lesson import start_lesson

lesson = start_lesson("09_performance", PROFILE, N_CPU_DEVICES, min_devices=1)
cfg, dataset = lesson.cfg, lesson.dataset

# %%
import jax
import jax.numpy as jnp
import numpy as np
from IPython.display import display

from dpcourse import config, costs, devices, model, placement, record, show, train
from dpcourse.compiled import hlo
from dpcourse.perf import breakdown, ceilings, fusions, ladder, report
from dpcourse.perf.single_device import measurement_device, where_banner

lesson.check_global_mesh()  # a mesh you set with jax.set_mesh must be this lesson's, or none
single = measurement_device(PROFILE)
device = single.device
multi = devices.lesson_devices(2)
multi_cfg = config.make_config("cpu") if multi.simulated and cfg.profile == "full" else cfg
display(show.banner(where_banner(single, multi.label, multi_cfg.profile, multi.simulated), "note"))
peak = costs.find_peak(device.device_kind)
print("datasheet peaks:", peak.source if peak else f"none known for {device.device_kind!r}")

# %% [markdown]
# ## 1. Ceilings: what this device can do
#
# MFU in notebook 02 divides the achieved FLOP/s by a **datasheet** peak.
# That peak is a promise of the hardware; what XLA actually reaches on it
# for a large matmul is the **measured ceiling**. Three precisions matter:
#
# - `precision="highest"`: true float32;
# - the default float32 precision, the course's step: on NVIDIA GPUs from
#   Ampere on it runs as TF32 (10-bit mantissa inputs, float32
#   accumulation); on a TPU the matrix units take bfloat16, so float32 at
#   default precision is one bfloat16 pass, and `highest` costs six passes
#   (`jax.lax.Precision`'s documentation): about a sixth of the rate;
# - bfloat16 inputs (float32 accumulation): mixed precision.
#
# The table's "on this device" column says which holds here, and each rate
# is set beside the datasheet peak of what it runs as (on a TPU the BF16
# peak for both float32 rates, a sixth of it for `highest`).
#
# Each rate is `2 n^3` FLOPs of an `n x n` matmul over its time, timed like
# the benchmark (compile apart, warm-up, repeats). A ceiling is the best the
# device does, so the fastest of five blocks counts (other work on the
# machine only ever slows a block down), at the better of two sizes, `n`
# and `2 n` (a matmul too small to fill the device would understate it).
# Beside them, the memory bandwidth of a simple element-wise pass, which
# bounds the step's element-wise work.
#
# **Where this is a ceiling.** On a GPU or TPU that runs only this notebook,
# a large matmul is about the fastest thing the device does, and no step of
# the ladder gets above it (on one v5e chip, in `baselines/`: a bfloat16
# ceiling of 189.7 TFLOP/s, the ladder's best step at 90 % of it), though a
# single kernel can beat the measured rate by a few per cent (section 5
# shows one). On a CPU shared with other jobs it is the best
# rate *this run saw*: the load changes between the ceiling's measurement
# and a rung's, and a rung of small matmuls can fit the caches better than
# the ceiling's. There a fraction above 100 % can happen, and means the
# "ceiling" was not one; the ladder says so when it does.

# %%
measured = ceilings.measure_all(cfg.matmul_size, device)
_ = report.ceiling_table(measured, peak, device.platform, single.label).show()

# %% [markdown]
# ## 2. The roofline of this workload
#
# Per step at the ladder's global batch: the training FLOPs (analytic, 6 x
# the forward multiply-accumulates) and two byte counts (the models and
# their assumptions are in `dpcourse.perf.roofline`). The block matmul's
# arithmetic intensity tells whether it is compute-bound (above the ridge
# point, FLOP/s over bytes/s of the measured ceilings); the element-wise
# work does a few FLOPs per value. Two times come out:
#
# - the **roofline bound**, the larger of the matmul time and the time of
#   the least bytes any program of this step must move: the backward pass
#   of every repeat needs one `[batch, width]` array of its forward pass,
#   written to device memory and read back once (the repeats' arrays are far
#   too large to stay on chip). However its work is fused or overlapped, a
#   program of the step beats it only where a ceiling it rests on was
#   measured below what the device can do (on the chip, section 5's stored
#   `scan` step ran its float32 matmul kernels 4 % above the measured rate).
# - the **no-overlap estimate**, for a step whose element-wise work runs as
#   separate kernels between the matmuls, as the GPU and CPU compilers run
#   it: each kernel reads its inputs from device memory and writes its
#   outputs there (15 passes over a `[batch, width]` array per repeat), and
#   the times add up. An estimate, not a bound: a compiler that fuses the
#   element-wise work into the matmuls' own kernels (a TPU's does, section
#   5 shows it) moves far fewer bytes, and one that overlaps does better.
#
# The separate-kernel count leaves out the residuals the scan saves for the
# backward pass (six `[repeats, batch, width]` stacks in the CPU and GPU
# compilers' programs); the line below the table gives their size.

# %%
batch = cfg.ladder_global_batch
_ = report.roofline_tables(cfg, batch, measured).show()

# %% [markdown]
# ## 3. The ladder
#
# The model's forward pass takes the two settings the ladder changes, from
# the config. Here it is, written out with what each rung changes (the
# ladder below runs the package's `model.forward`, the same code, which
# every other notebook uses with the defaults: the course's step):


# %% tags=["lesson_forward"]
def rung_forward(params, x, block_repeats, block_mix, block_unroll=1, compute_dtype="float32"):
    # bfloat16 rungs: cast the float32 master weights and the input, so the
    # matmuls and every activation (the residual stream h too) are bfloat16.
    p = jax.tree.map(lambda a: a.astype(compute_dtype), params)
    h = jax.nn.gelu(x.astype(compute_dtype) @ p["w_in"] + p["b_in"])

    def block(h, _):
        out = jax.nn.gelu(h @ p["w_block"] + p["b_block"])
        return (1.0 - block_mix) * h + block_mix * out, None

    if block_unroll == "full":  # unrolled rungs: a Python loop, no loop in the program
        for _ in range(block_repeats):
            h, _ = block(h, None)
    else:  # scan rungs: a while loop; unroll=k puts k blocks in each iteration
        h, _ = jax.lax.scan(block, h, None, length=block_repeats, unroll=block_unroll)
    return (h @ p["w_out"] + p["b_out"]).astype(jnp.float32)  # float32 logits


# %% [markdown]
# Your `rung_forward` against the package's, with every rung's settings, on a
# few examples (the logits must be the same numbers):

# %%
from concurrent.futures import ThreadPoolExecutor

from dpcourse.exercises import checks

x_few = jnp.asarray(dataset.images[:8])
rungs = ladder.default_rungs(cfg)
init_host = model.init_params(cfg)


def mine_and_package(rung):
    args = (cfg.block_repeats, cfg.block_mix, rung.block_unroll, rung.compute_dtype)
    mine = jax.jit(rung_forward, static_argnums=(2, 3, 4, 5))(init_host, x_few, *args)
    return mine, jax.jit(model.forward, static_argnums=(2, 3, 4, 5))(init_host, x_few, *args)


# The last rungs differ from unrolled_bf16 in their batch and backward pass only: its forward pass.
forwards = list({(r.block_unroll, r.compute_dtype): r for r in rungs}.values())
with ThreadPoolExecutor() as pool:  # independent compiles, side by side
    for rung, (mine, package) in zip(forwards, pool.map(mine_and_package, forwards)):
        print(f"{rung.name}: {checks.compare(mine, package, 'logits', 'model.forward')!r}")

# %% [markdown]
# Each rung starts from the same parameters, runs the same batches through
# the course's benchmark harness (`bench.benchmark`: compile apart, warm-up,
# repeats x steps, median) and is recorded. The rungs are compiled first,
# side by side (`ladder.run_ladder`: the compiles are independent, and a
# fully unrolled step takes tens of seconds to compile on a TPU host), so
# the compile column is each program's own compile time while the others
# compiled beside it. MFU is given twice: against the datasheet peak of its
# precision (TF32 for float32 and BF16 for bfloat16 on a GPU; BF16 for both
# on a TPU, where float32 at default precision is one bfloat16 pass) and
# against the matmul rate measured above for the same precision. A rung that
# fails (out of memory at the large batch, a dtype the backend lacks) is
# recorded as failed with its reason and the ladder goes on. The cell says
# as each compile starts and ends; the stop button ends it in one line.

# %%
runs = ladder.run_ladder(rungs, cfg, dataset, device, init_host)  # compiles, then a bar
caption = f"The ladder on {single.label} ({dataset.source} data)"
ladder_part = report.ladder_table(runs, cfg, measured, device.device_kind, caption).show()

# %% [markdown]
# **Reading it.** The plain `scan` keeps every repeat in a `while` loop
# whose body is a few small kernels, launched anew in every iteration, and
# XLA cannot fuse or schedule across iterations (on a GPU a loop whose trip
# count is known skips the condition and the host,
# `xla/backends/gpu/runtime/while_thunk.cc`; the launches remain).
# Unrolling gives the compiler straight-line code; whether it compiles
# longer depends on the compiler and the size (the line under the table
# reads this run's column: on the chip, in `baselines/`, 48 s for
# `unrolled_f32` against 5 s for `scan_f32`; at `smoke` on a CPU they are a
# few seconds or less, either way from run to run). bfloat16 halves the
# bytes of every activation; on GPUs with
# bfloat16 tensor cores it also raises the matmul ceiling, while a CPU may
# run bfloat16 matmuls slower (section 1's ratio says which holds here). On
# a TPU the float32 rungs already run their matmuls as one bfloat16 pass,
# so bfloat16 gains only the bytes there. Where the rest of the gap to the
# ceiling goes, section 5 reads from the profiler trace. On one TPU v5e
# (JAX 0.10.2, `baselines/`): 53.7 ms per step for the scan in float32,
# 23.7 fully unrolled, 36.3 and 21.1 in bfloat16, the unrolled bfloat16
# step at global batch 8192 in 41.1 ms (82 % of the 197 TFLOP/s BF16 peak,
# Google Cloud's TPU v5e documentation). On a CPU the ladder mostly shows
# compile-time and correctness effects.
#
# The last rung, `pallas_bf16_batch8192` at `full`, is the one before it
# with the block's backward pass as one Pallas kernel: on the same TPU
# v5e, 38.7 ms per step, 87 % of the 197 TFLOP/s. Off a TPU the kernel runs
# in Pallas's interpret mode (JAX operations standing in for it: the same
# numbers, none of its speed), so there its time says nothing about it.

# %% [markdown]
# **The fast step against the batch.** The ladder measured each rung at one
# global batch (and the last at a larger one). Here the fastest rung at
# that batch runs over a few batch sizes on the same single device (the GPU
# on a one-GPU machine). On an idle accelerator throughput grows with the
# batch until the device is busy, then flattens; on a shared CPU other jobs
# move it as much as the batch does. The table says which rows the ladder
# measured above (taken as they are) and which ran now, and the line under
# it reads what this run's numbers did. Notebook 07 sweeps the course's step over N
# devices; setting its `BLOCK_UNROLL` and `COMPUTE_DTYPE` repeats that sweep
# with this step.

# %%
_ = report.sweep_table(runs, cfg, dataset, device, init_host, single.label).show()

# %% [markdown]
# **What is left to win?** The course's target for a GPU is half of the
# measured matmul rate in each precision. From the roofline: the step time
# that target means, the no-overlap estimate of section 2, and how much of
# that estimate is element-wise traffic rather than matmuls. Where the element-wise share is
# large, a bigger batch does not help (both grow with it); fewer bytes do:
# bfloat16 activations, element-wise work fused into the matmul's epilogue
# (bias and GELU), saving only what the backward pass needs.

# %%
_ = report.budget_table(runs, cfg, measured, device.platform).show()
fig = report.roofline_figure(runs, cfg, measured, single.label)
if fig is not None:
    record.save_figure(fig, "roofline")

# %% [markdown]
# ## 4. Is every rung still correct?
#
# - **Unrolled equals scan.** Both rungs ran the same steps from the same
#   parameters on the same batches; the same arithmetic in a different
#   program may round differently, so they must agree within the course's
#   float tolerance (`train.equivalence_tolerances`: tight on a CPU, looser
#   where float32 matmuls run as TF32). The first-step gradients are
#   compared too (through AdamW's first moment), which the parameters alone
#   would hide.
# - **bfloat16 computes nearly the same logits.** bfloat16 keeps 8
#   significant bits (unit roundoff 2^-8), and every repeat rounds the
#   residual stream again, so the error grows with the repeats:
#   `ladder.bf16_logit_tolerance` allows `(4 + repeats) x 2^-8` relative
#   (its docstring gives the reason and the measurements it rests on).
# - **bfloat16 still trains.** The losses of the first steps agree within
#   `ladder.bf16_loss_tolerance` (2 % of the float32 loss) at a typical
#   step: the median over the steps (`ladder.loss_curve_gap`). A step where
#   the loss jumps on a hard batch magnifies any rounding difference (on a
#   TPU, float32 at default and at `highest` precision differ there too), so
#   the largest difference is shown with its step, not held to the
#   tolerance. At initialisation the logits are small, so the loss hardly
#   feels their error: this checks that training works, the logits check
#   the arithmetic.
#
# The extra steps run the compiled programs the ladder kept, so nothing
# recompiles.

# %%
opt = train.make_optimizer(cfg)
check_batches = placement.place_single_device(cfg, dataset, device, opt, init_host, batch).batches
_ = report.float32_checks(runs, cfg, device, init_host, check_batches).show()
_ = report.bfloat16_checks(runs, cfg, device, init_host, check_batches).show()

# %% [markdown]
# The bfloat16 rungs at a larger global batch run on other examples than the
# float32 step above, so they are checked at their first step: the loss the
# rung computes before its first update, against the float32 step's loss on
# the same examples (its forward pass, batch by batch of the ladder's size,
# averaged), within the same 2 %. A float32 step at these batches is not
# run: its scan keeps every repeat's activations in float32.
#
# The Pallas rung computes the same forward pass as `unrolled_bf16` (the
# logits check above) but its own backward pass, which the first loss does
# not see. So its first-step gradient (through AdamW's first moment, as for
# the float32 rungs) is compared with a float32 gradient of the same
# examples at `highest` precision (batch by batch of the ladder's size,
# averaged: the loss is a mean), and so is the gradient of its twin that JAX
# differentiates (`unrolled_bf16_batch8192` at `full`). Both round to
# bfloat16; the kernel rounds in another order and sums the weight gradient
# in float32, so its error must be no more than twice its twin's, the
# factor `ladder.KERNEL_GRADIENT_FACTOR`. A wrong kernel (a missing mix, a
# transposed weight) is wrong by the size of the gradient itself.


# %%
_ = report.large_batch_checks(runs, cfg, dataset, device, init_host).show()

# %% [markdown]
# ## 5. Look inside: a profiler trace and the compiled program
#
# `jax.profiler.trace` records what the device did during a few steps of
# the fastest rung. The trace lands in the `results/` folder beside this
# notebook (in the lab: your workspace's `results/09_performance_trace/`,
# in the file browser; under the runner: beside `results.json`). To open
# it with **XProf**, the profiler behind TensorBoard's profile tab (an
# optional extra, pinned in `requirements-xprof.txt`):
#
# ```
# .venv/bin/pip install -r requirements-xprof.txt
# .venv/bin/xprof --logdir=<the trace folder printed below> --port=6006
# ```
#
# then open http://127.0.0.1:6006 and pick the run: the trace viewer, the
# step-time overview and per-kernel statistics. (XProf reads the
# `.xplane.pb` file under `<folder>/plugins/profile/<session>/`.) Without
# installing anything, Perfetto (ui.perfetto.dev) opens the
# `perfetto_trace.json.gz` file.
#
# Look for the gaps between kernels (launch overhead, the `while` loop of a
# scan) and for how much time the element-wise fusions take beside the
# matmuls.

# %%
import functools


@functools.cache
def batches_of(global_batch):  # the placed batches of a size, made once
    return placement.place_single_device(cfg, dataset, device, opt, init_host, global_batch).batches


ok_runs = [r for r in runs if r.status == "ok"]
best = max(ok_runs, key=lambda r: r.result.examples_per_s)
trace_dir = record.output_dir("trace")
earlier = set(trace_dir.rglob("*"))  # the runner's folder keeps the traces of earlier runs
# record.whole_folder: the trace lands whole in trace_dir, or not at all (a full disk).
with (
    record.whole_folder(trace_dir) as fresh,
    jax.profiler.trace(str(fresh), create_perfetto_trace=True),
):
    best_batches = batches_of(best.rung.global_batch)
    ladder.run_steps(
        best.compiled, best.rung.config(cfg), device, init_host, best_batches, TRACE_STEPS
    )
print(f"trace of {TRACE_STEPS} steps of {best.rung.name} in {trace_dir}:")
for p in sorted(p for p in trace_dir.rglob("*") if p.is_file() and p not in earlier):
    print(f"  {p.relative_to(trace_dir)}  ({p.stat().st_size / 1e3:,.0f} kB)")

# %% [markdown]
# ### Where the time goes: the step, kernel by kernel
#
# The trace is a file you can read yourself: `*.trace.json.gz` is JSON, one
# event per kernel the program ran, named as the compiled program names its
# instruction (`fusion.12`, `copy.3`). On a TPU the events are the chip's
# own timeline; on a CPU, the thunks XLA's CPU runtime ran on the host's
# threads. `dpcourse.perf.breakdown` sorts the program's kernels from its
# text (a matmul, element-wise work, a reduction, a copy, the optimizer's
# update: a kernel that reads its state) and splits the traced steps into:
# the matmuls' FLOPs at the matmul rate section 1 measured, the time the
# matmul kernels took beyond that rate, the other kernels, and the idle time
# between kernels. The parts add up to the traced step, which is compared
# with the step the benchmark measured (each trace is read from a temporary
# folder, removed once read). Here for the fastest rung, for the
# course's own step (`scan_f32`) and, when the fastest is the Pallas rung,
# for its twin that JAX differentiates:

# %%
part, breakdowns = breakdown.profile(
    runs, cfg, device, init_host, batches_of, measured, TRACE_STEPS, single.label
)
_ = part.show()

# %% [markdown]
# **Measured on one TPU v5e chip.** The same split, stored in the package
# with its dates and versions (`tools/tpu_breakdown.py` made it: the Pallas
# rung, its twin that JAX differentiates, the course's `scan` step and
# `scan(unroll=8)`, at the matmul rates this lesson measured on that
# machine; the longest kernels of each are stored too), and what each lever tried toward
# 85 % of the chip's 197 TFLOP/s did there. On a TPU host, your own run's
# split is above; the stored one is the same machine type on another day.

# %%
_ = breakdown.stored_part().show()

# %% [markdown]
# **Reading the chip's split.** In the stored runs (TPU v5e, 2026-12-06,
# JAX 0.10.2, libtpu 0.0.42.1; `python tools/tpu_breakdown.py --profile
# full`, then `--store` at this lesson's ceilings from `python -m
# coursetools.tpucheck --notebooks 09` on the same machine) the best rung
# JAX differentiates, `unrolled_bf16_batch8192`, spent 99.7 % of its 41.1 ms
# in matmul kernels: 35.0 ms is their FLOPs at the bfloat16 ceiling this
# lesson measured there (189.7 TFLOP/s, the better of its two matmul
# sizes), 5.9 ms is what they took beyond it. Per repeat, at that rate, each
# of its three matmuls ([8192, 1024] x [1024, 1024]) takes 90.5 us; its
# longest kernels (the table) took about 123 us each. The `scan` step's
# 53.6 ms was 34 % matmul kernels; beside them, per iteration, element-wise
# kernels (`dynamic-update-slice` fusions writing each repeat's saved
# activations into the loop's stacked float32 buffers, about 52 us each)
# and 127 us in one reduction fusion of the backward loop's body: it sums
# the block's bias gradient and computes GELU's derivative again from the
# kept `h W + b`. With that derivative kept from the forward pass
# (`scan_f32_slope` in the stored file), the same reduction took 23 us: the
# bias sum itself is the small part. In the unrolled program that work ran
# inside the matmuls' kernels. `scan(unroll=8)` ran its 16 iterations with
# copy kernels of about 6.6 ms each (the slabs of 8 repeats' saved
# activations taken out of and put back into the stacked buffers) where
# the plain scan's copies took 2.2 ms, and it compiled in about the time of
# the plain scan (the compile line above).
#
# **Levers tried toward 85 % of 197 TFLOP/s** (the table above, each the
# same model and mathematics up to bfloat16 rounding): a larger batch, the
# batch sent in bfloat16, compiler flags, `jax.checkpoint`, a larger scoped
# VMEM, GELU's derivative kept from the forward pass
# (`block_backward="saved_slope"`, `dpcourse.perf.backward`: no gain for the
# unrolled step, but the course's `scan` step 1.84 times faster, 29.2 ms
# against 53.7). The lever that reached 85 %: the whole backward pass of a
# repeat as one Pallas kernel (`pallas_bf16_batch8192`,
# `dpcourse.perf.backward.block_with_kernel`). It reads the incoming
# gradient, the kept derivative and `h` once per tile of 512 rows, keeps
# `W` and the float32 weight gradient in the core's VMEM, and does both
# matmuls there: about 200 us per repeat for the two (its longest kernels
# in the table; 181 us at the rate), 2.7 ms beyond the rate in all.

# %% [markdown]
# The compiled program itself (`compiled.as_text()`, the optimised HLO):
# how many `while` loops and with what trip count, how many fused kernels
# and matmuls run per step.

# %%
texts = {r.rung.name: r.compiled.as_text() for r in ok_runs}
rows = [{"rung": k, **hlo.summarize(text).row()} for k, text in texts.items()]
display(show.table(rows, caption=f"Compiled programs on {device.platform}"))

# %% [markdown]
# **The best rung, from its program.** Which of its kernels hold a matmul,
# and does the element-wise work (the GELU, the bias, the mix) run in kernels
# of its own, or inside the matmuls' kernels? `dpcourse.perf.fusions` counts
# the kernels of the program text (the line below reads this run's
# program; the chip's run in `baselines/` recorded 261 kernels with a
# matmul for the Pallas rung, 131 of them also computing the GELU).

# %%
best_census = fusions.census(texts[best.rung.name])
print(best_census.sentence(best.rung.name))
rc, gb, ms = best.rung.config(cfg), best.rung.global_batch, best.result.ms_per_step
mfu = best.mfu_datasheet(cfg, device.device_kind)
print(
    f"{best.rung.name}: {ms:.2f} ms per step at global batch {gb}, "
    f"{costs.achieved_flops_per_s(rc, gb, ms) / 1e12:,.3g} TFLOP/s"
    + (f" = {mfu:.0%} of {peak.name}'s datasheet peak" if mfu is not None else "")
)
kernels = {"": best_census.matmul_kernels, "_with_gelu": best_census.matmul_with_gelu}
_ = record.figures(
    {f"rung_{best.rung.name}_matmul_kernels{k}": (n, "kernels") for k, n in kernels.items()}
)

# %% [markdown]
# ## 6. Back to data parallelism: where does the all-reduce land?
#
# Notebook 04 found that plain `jit` on sharded arrays puts gradient
# all-reduces inside the backward `scan` on the CPU backend, and that the
# device-axis step reduces once. With the repeats unrolled there is no loop
# left: how many all-reduces now, and how many bytes? Compile each step for
# the N devices and read its collectives (nothing runs: the arguments are
# only shapes and shardings). The last step computes in bfloat16 and casts
# its gradients to bfloat16 for the `pmean` (the `reduce_dtype` of
# `train.make_shard_map_step`), to halve the all-reduce bytes: compare the
# all-reduce the program asks for (the lowered StableHLO, before the
# compiler) with what the compiled program moves.

# %%
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse.compiled import collectives

mesh = Mesh(np.array(multi.devices), ("data",))
n_dev, gb = multi.count, multi_cfg.global_batch(multi.count)
m_opt = train.make_optimizer(multi_cfg)
replicated, by_rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))


def shaped(tree, sharding):  # shapes and placements only: enough to compile
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


p_shape = shaped(model.init_params(multi_cfg), replicated)
shapes = (
    p_shape,
    shaped(jax.eval_shape(m_opt.init, p_shape), replicated),
    jax.ShapeDtypeStruct((gb, 784), jnp.float32, sharding=by_rows),
    jax.ShapeDtypeStruct((gb,), jnp.int32, sharding=by_rows),
)
unrolled = multi_cfg.with_overrides(block_unroll="full")
unrolled_bf16 = unrolled.with_overrides(compute_dtype="bfloat16")
variants = {
    "plain jit, scan (04)": train.make_train_step(multi_cfg, m_opt),
    "plain jit, unrolled": train.make_train_step(unrolled, m_opt),
    "device-axis step, scan (04)": train.make_device_axis_step(multi_cfg, m_opt, n_dev),
    "shard_map, unrolled, bfloat16, bf16 pmean": train.make_shard_map_step(
        unrolled_bf16, m_opt, mesh, reduce_dtype="bfloat16"
    ),
}
lowered = {k: jax.jit(f).lower(*shapes) for k, f in variants.items()}
with ThreadPoolExecutor() as pool:  # independent compiles: every core (nothing is timed here)
    texts = dict(zip(lowered, pool.map(lambda lo: lo.compile().as_text(), lowered.values())))
reports = {k: collectives.parse_hlo(text) for k, text in texts.items()}
bf16_written = lowered["shard_map, unrolled, bfloat16, bf16 pmean"].as_text()
_ = report.collectives_part(reports, bf16_written, multi_cfg, multi).show(
    backend=multi.devices[0].platform,
    device_kind=multi.devices[0].device_kind,
    device_count=n_dev,
    profile=multi_cfg.profile,
)

# %% [markdown]
# **Reading it.** Read the counts *and* the bytes. One all-reduce per step
# is not enough: if the unrolled step's single all-reduce carries many
# times the gradient, XLA has combined one reduction per repeat into one
# instruction, and the bytes on the wire did not shrink. The device-axis
# step and the `shard_map` step reduce the accumulated gradient once, so
# they move one gradient's worth. In the `shard_map` step, compute in
# bfloat16 alone does not shrink the all-reduce: its `pmean` reduces the
# gradients of the float32 master weights, which are float32. (Under plain
# `jit` the SPMD partitioner places the all-reduces itself, on the
# bfloat16 values of the backward pass: they are bfloat16, and only the
# CPU compiler promotes them to float32.) Casting them to bfloat16 for the `pmean` asks for half the
# bytes, and a backend whose collectives reduce bfloat16 natively (NCCL
# does) can send half; XLA's CPU compiler instead promotes a bfloat16
# all-reduce to float32, as the line above shows when it happens. The mean
# is then rounded to 8 significant bits: check the loss when you do it.

# %% [markdown]
# ### Where the fast step's all-reduce lands on the GPU and the TPU
#
# The table above is this run's compiler's. The next cell compiles the fast
# step (plain `jit`, repeats unrolled, bfloat16 compute) with XLA's GPU
# compiler for 8 x H200 without a GPU (a fresh process, the extra of `make
# gpu-compile`) and with the TPU compiler for a v5e 2x4 and a v6e 16x16
# slice without a TPU (`make tpu-compile`), reads where its all-reduce
# lands, and sets XLA's own cost analysis of those programs beside the
# roofline model of section 2, per device (each device runs
# `per_device_batch` examples). Without an extra it shows the compile `make
# placement` stored (the smoke profile), labelled as stored, and the model
# beside it is taken at that profile's sizes. A program compiled for GPUs
# that are not here has no `compiled.cost_analysis()` (None); the GPU
# figures are XLA's `HloCostAnalysis` run over the same optimised GPU
# module. The TPU compiler gives its own.

# %%
from dpcourse.cross_compile import notebook as gpu_notebook
from dpcourse.perf import report

fast_gpu = gpu_notebook.show_gpu_placement(
    cfg.profile,
    multi.devices[0].platform,
    steps={"fast": "dpcourse.cross_compile.steps:fast_jit_step"},
)
_ = report.fast_step_part(fast_gpu, cfg).show()

# %% [markdown]
# **Reading it.** With the repeats unrolled there is no loop: each
# program's all-reduces run once per step, after the backward pass: the
# bfloat16 gradients (under plain `jit` the SPMD partitioner reduces the
# bfloat16 gradients the bfloat16 matmuls produce; the GPU and TPU compilers
# keep that dtype, the CPU compiler promotes it to float32) and, apart, the
# float32 metrics (XLA combines all-reduces of one dtype only).
#
# In the FLOPs row both count the matmuls, and XLA adds the element-wise
# FLOPs (GELU, the mix, the softmax, the optimizer), a few per value. The
# bytes row is another matter: the model counts only the element-wise
# passes over `[batch, width]` activations per repeat; XLA counts the bytes
# every instruction of the optimised program reads and writes (each fusion
# at its boundary, its operands in full, as if no cache held them): the
# weights every matmul reads, the saved activations, the float32 master
# weights and their bfloat16 copies, the optimizer's passes.

# %% [markdown]
# ## 7. Where communication hides: the GPU compiler's schedule
#
# Section 6 counted the collectives. The next question is whether their
# time is **hidden** behind compute. XLA's GPU compiler answers it in the
# program it emits: every collective is a start/done pair
# (`all-reduce-start` ... `all-reduce-done`), the instructions of each
# computation are listed in the order they will run (`is_scheduled=true`),
# and whatever sits strictly between a start and its done is what the
# compiler means to run while the bytes are on the wire: the collective's
# **window**. The start's `backend_config` also says `"is_sync"`: true means
# the compiler does not mean to overlap it.
#
# **Predict first**, then compile and read:
#
# 1. The plain data-parallel step combines all gradients into one
#    all-reduce. What can run inside its window?
# 2. `xla_gpu_all_reduce_combine_threshold_bytes` caps how many bytes the
#    combiner merges into one all-reduce. At 4,096 bytes, how many
#    all-reduces are there, and which ones get compute in their windows?
# 3. JAX's `optimization_level="O1"` asks the compiler for more effort.
#    What changes, on which GPU?
# 4. FSDP gathered once (lesson 10) moves the same bytes as three kinds of
#    collective; the reduced accumulation reduces once. Where are their
#    windows?
#
# The next cell compiles the smoke-size steps for 8 GPUs of three kinds
# without a GPU, in two fresh processes (the extra of `make gpu-compile`):
# the schedule's shape is the lesson, and small programs compile in
# seconds. Each compile also asks XLA to write out its latency-hiding
# scheduler's pass, so we can see whether that scheduler ran. Without the
# extra, the cells read the same compiles as `make placement-store` stored
# them (labelled stored, with their JAX version and date).

# %%
import tempfile

from dpcourse.compiled import schedule
from dpcourse.cross_compile import compile as gpu_compile
from dpcourse.cross_compile import overlap_steps
from dpcourse.cross_compile import targets as gpu_targets
from dpcourse.perf import report

OVERLAP_PROFILE = "smoke"
forms = overlap_steps.STEPS  # plain, small_threshold, o1, fsdp_gathered, accum_reduced
three = {k: forms[k] for k in ("plain", "small_threshold", "o1")}
hlo_tmp = tempfile.TemporaryDirectory(prefix="overlap-hlo-")
missing_extra = gpu_targets.extra_missing() if SCHEDULES else "skipped (SCHEDULES = False)"
pending = []
if not SCHEDULES:
    print("Section 7's GPU compiles are skipped: SCHEDULES = False in the parameters cell.")
elif missing_extra:
    print("No GPU compile without a GPU here: the next cells read the stored compile.")
else:
    h200 = gpu_compile.Job("gpu", "h200", 8, OVERLAP_PROFILE)
    others = [gpu_compile.Job("gpu", t, 8, OVERLAP_PROFILE) for t in ("h100_sxm", "l4")]
    pending = [
        gpu_compile.start_jobs([h200], forms, hlo_dir=hlo_tmp.name),
        gpu_compile.start_jobs(others, three, hlo_dir=hlo_tmp.name),
    ]
    print("compiling", len(forms) + 2 * len(three), "programs for H200, H100 SXM and L4 ...")

# %% [markdown]
# While they compile: the window is read from the compiled text alone.
# `schedule.read_schedule(text, n_devices)` walks each computation in
# order, pairs every start with its done, and lists the work in between:
# fusions and GEMMs with their matmul FLOPs and the bytes at their
# boundary (operands plus result, as XLA's cost analysis counts a fusion),
# loops with their body times the trip count. A window **holds compute**
# when its work runs matmul FLOPs, the compute the cost model below counts:
# element-wise work alone (a broadcast that fills a buffer with zeros, an
# optimizer update) is listed with its bytes but hides next to nothing,
# and scalar work (the step counter of Adam's bias correction, a few
# bytes) is bookkeeping. The bytes each device sends follow the ring formulas of
# notebook 04: `2 (N - 1) / N` of an all-reduce's buffer, `(N - 1) / N` of
# an all-gather's.

# %%
from pathlib import Path

if SCHEDULES and missing_extra:  # the same compiles, stored by `make placement-store`
    compiled_overlap, hlo_texts = gpu_notebook.stored_overlap(OVERLAP_PROFILE)
    print(gpu_notebook.stored_overlap_line(compiled_overlap, missing_extra))
else:
    compiled_overlap = [res for p in pending for res in p.results()]
    hlo_texts = {
        (res.target, name): Path(hlo_tmp.name) / f"gpu_{res.target}_8_{OVERLAP_PROFILE}_{name}.hlo"
        for res in compiled_overlap
        for name in res.steps
    }
# schedule.read_schedule(text, n_devices) of every compiled form; a line per failed compile
scheds, failed = schedule.read_compiled(compiled_overlap, hlo_texts)
hlo_tmp.cleanup()
_ = report.Part(lines=failed).show()
_ = report.Part(*schedule.overview(compiled_overlap, scheds, OVERLAP_PROFILE)).show()

# %% [markdown]
# **The plain step.** Read its window on the H200:

# %%
plain = scheds.get(("h200", "plain"))
_ = report.Part(*schedule.plain_reading(plain)).show()

# %% [markdown]
# **Why nothing hides.** The combiner merges every gradient into one
# all-reduce, so it can only start when the last gradient exists: after
# both loops of the backward pass. Everything after it, the AdamW update,
# needs its result. There is nothing left to run during the transfer, so
# the no-overlap sum of notebooks 02, 04 and 07 is the right model for this
# program, not only a bound.
#
# **A small combine threshold.** Now each large gradient has its own
# all-reduce. Which ones get compute in their windows?

# %%
_ = report.Part(*schedule.threshold_reading(scheds)).show()

# %% [markdown]
# **Default against `O1`**, per GPU: the collectives, the windows, whether
# the latency-hiding scheduler ran, and the peak temporary memory of the
# program (`memory_analysis()`, per device).

# %%
_ = report.Part(*schedule.o1_reading(compiled_overlap, scheds)).show()

# %% [markdown]
# **FSDP gathered once and the reduced accumulation**, read the same way:

# %%
_ = report.Part(*schedule.forms_reading(scheds)).show()

# %% [markdown]
# **Which bound does the step earn?** The cost model now has two:
# `compute + communication` when nothing overlaps, and the overlapped bound
# `costs.overlapped_step_s`: for the fraction `f` of the bytes sent inside
# windows, `max(window compute, f x communication)`; the rest adds. Below,
# per form on the H200, the compute is XLA's FLOPs at the datasheet TF32
# peak (a lower bound) and the communication the ring at the NVLink
# datasheet rate.

# %%
_ = report.Part(*schedule.bound_reading(compiled_overlap, scheds)).show()

# %% [markdown]
# **Reading it.** "overlapped" counts only the compute inside the windows
# (its matmul FLOPs); "best case" lets the whole step's compute hide the
# windows' bytes. A window that holds a small GEMM hides little: the bound
# moves only as far as that GEMM's time. At the smoke size every figure is
# microseconds; the full profile's step moves 7.45 MB per all-reduce, and
# the same schedule then decides tens of microseconds per step.
#
# **Honest limits.** This is the overlap the compiler *intends*, read from
# its program, not wall time: on a GPU a transfer and a kernel share memory
# bandwidth and streaming multiprocessors, and NCCL's kernels take some of
# them. On a machine with GPUs, the profiler trace of section 5 shows the
# measured overlap (the NCCL kernels on their own stream beside the
# fusions). The CPU compiler keeps collectives synchronous, with no start
# and done to put work between:

# %%
cpu_key = "device-axis step, scan (04)"
here = schedule.read_schedule(texts[cpu_key], n_dev)
print(
    f"this run's {multi.devices[0].platform} compiler, {cpu_key}: "
    f"{len(here.windows)} collective(s), scheduled: {here.scheduled}, "
    f"windows with compute: {sum(w.has_compute for w in here.windows)}"
)

# %% [markdown]
# A measured overlap needs real GPUs. On a machine with 8, run this lesson
# with the full profile and the small threshold, and open the trace:
#
# ```
# XLA_FLAGS=--xla_gpu_all_reduce_combine_threshold_bytes=4096 \
#   DPCOURSE_PROFILE=full .venv/bin/python -m coursetools run 09_performance
# ```
#
# `make placement` keeps the table of this section for every form and GPU
# (`results/placement/placement.json`) and fails when a fraction moves;
# docs/gpu.md gives the table measured with both JAX versions.


# %% [markdown]
# ## What you learned
#
# - MFU needs a stated peak: the datasheet's, or the ceiling measured on the
#   device in the same precision. The second says how much of the gap is
#   the step's own fault.
# - The roofline splits the step into compute-bound matmuls and
#   memory-bound element-wise work; its bound is the larger of the two
#   times, and their sum is the estimate for a step that overlaps nothing.
# - The same math compiles to very different programs: `lax.scan` keeps a
#   loop, a Python loop unrolls it, bfloat16 halves the bytes and, on GPUs,
#   raises the matmul ceiling (measure it: not every device does). Each
#   rung is checked against the course's step, with
#   a tolerance whose reason is written down.
# - A profiler trace and the compiled HLO show where the time and the
#   kernels go; read them before guessing. Split kernel by kernel on a
#   TPU's one timeline, the trace's parts add up to the benchmark's step
#   (the stored chip runs: within 0.3 %; on a CPU's threads they need not,
#   and section 5 says by how much they did not here); on a TPU v5e the best
#   rung JAX differentiates spends almost all its time in matmul kernels,
#   so levers that remove other work cannot close the rest of its gap,
#   while the `scan` step spends most of its time in the loop's kernels
#   beside the matmuls.
# - Where the profile says the time is inside the compiler's kernels, you
#   can write the kernel: the block's backward pass by hand, GELU's
#   derivative kept from the forward pass and both matmuls in one Pallas
#   kernel, took the chip past 85 % of its peak. Check such a kernel's
#   gradient against float32, not only its loss.
# - How you write the step changes the collectives too: count the
#   all-reduces and their bytes on the backend you will train on.
# - Whether communication hides is in the GPU compiler's schedule: the work
#   between a collective's start and done. The plain step's one combined
#   all-reduce has none (the optimizer waits for it), so it earns the
#   no-overlap sum; a small combine threshold opens windows where the
#   latency-hiding scheduler runs. The compile shows intent; a trace on
#   real GPUs shows the time.
#
# **Next:** [10_sharded](10_sharded.ipynb) shards what each device holds
# when the model or the batch does not fit. Before that, apply the fast step
# to notebook 07's sweep by setting `block_unroll` and `compute_dtype` in
# its configuration, and compare.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
import math  # noqa: F401 - for math.inf in 09.1

from dpcourse.exercises import lesson09 as check

# %% [markdown]
# **09.1 · When does the block matmul turn compute-bound on an H200?** On
# an NVIDIA H200, bfloat16 matmuls peak at 989 TFLOP/s (dense) and memory
# moves 4.8 TB/s (its datasheet), so its bfloat16 ridge point is 989 / 4.8
# = about 206 FLOP/byte (`check.H200_BF16_RIDGE`). In bfloat16 (2 bytes per
# value) the forward block matmul `[B, W] @ [W, W]` of the full profile
# (`W = 1024`) does `2 B W^2` FLOPs and moves both inputs and its output.
# Predict the smallest global batch `B` (a whole number of examples) at
# which its arithmetic intensity reaches that ridge point. If no batch gets
# there, answer `math.inf`.

# %% tags=["exercise", "ex09_1"]
ridge_batch_h200 = ...  # a whole number (a global batch), or math.inf

# %%
check.ridge_batch(ridge_batch_h200, check.FULL_WIDTH, check.H200_BF16_RIDGE, 2)

# %% [markdown]
# **09.2 · Which rungs reach the target?** The course's speed target is half
# of the measured matmul ceiling of the rung's own precision (the ladder's
# "of measured ceiling" column). Where no rung gets there (or every rung
# does), as on a CPU, "none" would be right whatever you did, so the cell
# below then picks a fraction that lies between two rungs, and prints it.
# List the rungs that reach the printed target on this device, by the names
# in the ladder table's first column. On a shared machine a rung's fraction
# moves from run to run, so a rung within 20 % of the target counts as
# right either way (within less where the rungs lie closer together: the
# cell prints it then).

# %%
ladder_rows = ladder_part.tables[0][0]
ceiling_fraction = {row["rung"]: row["of measured ceiling"] for row in ladder_rows}
target_09_2, why = check.exercise_target(ceiling_fraction)
print(why)

# %% tags=["exercise", "ex09_2"]
rungs_at_target = ...  # a list of rung names from the table, e.g. ["scan_f32"]

# %%
check.rungs_reaching(rungs_at_target, ceiling_fraction, target_09_2)

# %% [markdown]
# **09.3 · Which bound, and what would change it?** The table below is the
# plain step's schedule on 8 x H200, from section 7. Which bound of the
# cost model does this program earn (one of `check.BOUNDS`), and which of
# `check.CHANGES` would put compute inside a window on this GPU (the
# section compiled both)? Answer with the pair.

# %%
fractions_09_3 = {  # each form's fraction of bytes sent inside windows of compute, on the H200
    label: scheds["h200", name].overlapped_fraction or 0.0
    for label, name in (("plain", "plain"), *zip(check.CHANGES[:2], ("small_threshold", "o1")))
    if ("h200", name) in scheds
}
if plain is not None:
    display(show.table(plain.rows(), caption="Plain jit step, 8 x H200"))
print("bounds:", check.BOUNDS, "\nchanges:", check.CHANGES)

# %% tags=["exercise", "ex09_3"]
overlap_09_3 = ...  # a pair: (one of check.BOUNDS, one of check.CHANGES)

# %%
check.overlap_bound(overlap_09_3, fractions_09_3)
