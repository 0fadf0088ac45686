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
# 1 x TPU v5 lite (measured; the run's details are in `baselines/timings.json`).
#
# Single-device measurements here run on the first device of JAX's default
# backend: the GPU on a machine with one GPU, with the `full` workload. Only
# the multi-device part at the end uses simulated CPU devices when there are
# fewer than two GPUs; the banner below says which part ran where.

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for the multi-device part
TRACE_STEPS = 3  # steps captured in the profiler trace
SCHEDULES = True  # section 8 compiles 11 GPU schedules (H200, H100 SXM, L4); False skips them

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
from dpcourse.perf import breakdown, ceilings, fusions, ladder, roofline
from dpcourse.perf.single_device import measurement_device, where_banner

lesson.check_global_mesh()  # a mesh you set with jax.set_mesh must be this lesson's, or none
single = measurement_device(PROFILE)
device = single.device
multi = devices.lesson_devices(2)
multi_cfg = config.make_config("cpu") if multi.simulated and cfg.profile == "full" else cfg
display(show.banner(where_banner(single, multi.label, multi_cfg.profile, multi.simulated), "note"))
peak = costs.find_peak(device.device_kind)
print(
    "datasheet peaks:",
    peak.source if peak else f"none known for {device.device_kind!r} (no datasheet MFU)",
)

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
# a large matmul is the fastest thing the device does, and no step of the
# ladder gets above it (one v5e chip: 183 TFLOP/s for an 8192^3 bfloat16
# matmul, and 161 for the ladder's best step). On a CPU shared with other jobs it is the best
# rate *this run saw*: the load changes between the ceiling's measurement
# and a rung's, and a rung of small matmuls can fit the caches better than
# the ceiling's. There a fraction above 100 % can happen, and means the
# "ceiling" was not one; the ladder says so when it does.

# %%
measured = ceilings.measure_all(cfg.matmul_size, device)
runs_as = ceilings.precision_words(device.platform)
rows = []
for name, c in measured.items():
    is_bw = name == "memory bandwidth"
    sheet, sheet_words = (
        (None, "") if is_bw else ceilings.datasheet_rate(name, peak, device.platform)
    )
    if c.rate is None:
        rate = None
    elif is_bw:
        rate = f"{c.rate / 1e9:,.1f} GB/s"
    else:
        rate = f"{c.rate / 1e12:,.2f} TFLOP/s"
    rows.append(
        {
            "measured": name + ("" if is_bw or c.size is None else f" matmul {c.size}^3"),
            "on this device": runs_as.get(name, "one read and one write per value"),
            "status": c.status,
            "rate": rate,
            "datasheet": None if sheet is None else f"{sheet / 1e12:,.0f} TFLOP/s ({sheet_words})",
            "of datasheet": None if (sheet is None or c.rate is None) else f"{c.rate / sheet:.1%}",
            "reason": c.reason,
        }
    )
display(show.table(rows, caption=f"Ceilings of {single.label}"))
if measured["bfloat16"].rate and measured["float32 default"].rate:
    print(
        "bfloat16 matmul rate / float32-default rate on this device: "
        f"{measured['bfloat16'].rate / measured['float32 default'].rate:.2f}x"
    )

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
#   too large to stay on chip). No program of the step beats it, on any
#   backend, however its work is fused or overlapped.
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
f32_rate = measured["float32 default"].rate
bw = measured["memory bandwidth"].rate
bf16_cfg = cfg.with_overrides(compute_dtype="bfloat16")
work_rows, bound_rows = [], []  # two tables: what a step does, then the times it bounds
for label, c, rate in (
    ("float32", cfg, f32_rate),
    ("bfloat16", bf16_cfg, measured["bfloat16"].rate),
):
    bound = roofline.step_bound(c, batch, rate, bw) if rate and bw else None
    work_rows.append(
        {
            "compute": label,
            "FLOPs/step": costs.train_flops_per_step(c, batch),
            "least bytes/step": roofline.saved_activation_bytes_per_step(c, batch),
            "separate-kernel bytes/step": roofline.elementwise_bytes_per_step(c, batch),
            "block matmul FLOP/byte": roofline.block_matmul_intensity(c, batch),
            "ridge FLOP/byte (measured)": rate / bw if rate and bw else None,
        }
    )
    bound_rows.append(
        {
            "compute": label,
            "matmul ms": None if bound is None else bound.compute_s * 1e3,
            "least-bytes ms": None if bound is None else bound.memory_s * 1e3,
            "bound ms (max)": None if bound is None else bound.overlap_s * 1e3,
            "no-overlap ms (matmul + separate kernels)": None
            if bound is None
            else bound.serial_s * 1e3,
        }
    )
display(show.table(work_rows, caption=f"Work of one step at global batch {batch} (one device)"))
display(show.table(bound_rows, caption=f"Roofline at global batch {batch} (one device)"))
print(
    f"{roofline.passes_per_repeat()} passes over a [batch, {cfg.width}] activation per repeat; "
    f"input and output layers are {roofline.input_output_fraction(cfg):.1%} of the matmul FLOPs."
)
left_out = roofline.residual_bytes_per_step(cfg, batch) / roofline.elementwise_bytes_per_step(
    cfg,
    batch,
)
print(
    f"Left out of the separate-kernel count: the scan's saved residuals, written and read once, "
    f"would add {left_out:.0%} to its bytes.",
)

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
    package = jax.jit(model.forward, static_argnums=(2, 3, 4, 5))(init_host, x_few, *args)
    return mine, package


# The last two rungs differ from unrolled_bf16 in their batch and their backward pass only: their
# forward pass is its. The compiles are independent (an unrolled forward pass of 128 repeats takes
# seconds to compile): run them side by side.
forwards = list({(r.block_unroll, r.compute_dtype): r for r in rungs}.values())
with ThreadPoolExecutor() as pool:
    pairs = list(pool.map(mine_and_package, forwards))
for rung, (mine, package) in zip(forwards, pairs):
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
# recorded as failed with its reason and the ladder goes on.

# %%
runs = ladder.run_ladder(rungs, cfg, dataset, device, init_host)  # a tqdm bar, where installed
MB = 1e6
ladder_rows = []
for r in runs:
    res = r.result
    ladder_rows.append(
        {
            "rung": r.rung.name,
            "batch": r.rung.global_batch,
            "status": r.status,
            "ms/step": res.ms_per_step if res else None,
            "examples/s": res.examples_per_s if res else None,
            "MFU (datasheet)": r.mfu_datasheet(cfg, device.device_kind),
            "of measured ceiling": r.fraction_of_ceiling(cfg, measured),
            "compile s": res.compile_s if res else None,
            "program MB": None if r.program_bytes is None else r.program_bytes / MB,
            "peak MB": None if r.peak_bytes is None else r.peak_bytes / MB,
            "reason": r.reason[:60] + ("..." if len(r.reason) > 60 else ""),
        }
    )
shown = [k for k in ladder_rows[0] if any(row[k] is not None for row in ladder_rows)]
display(show.table(ladder_rows, f"The ladder on {single.label} ({dataset.source} data)", shown))
for r in runs:
    print(f"{r.rung.name}: {r.rung.label}" + (f"; failed: {r.reason}" if r.status != "ok" else ""))
print("program MB: arguments + outputs + temporaries of the compiled step (memory_analysis).")
if "peak MB" in shown:  # GPUs only
    print("peak MB: the backend's high-water mark since the process started, so it bounds")
    print("every rung so far, not each one alone.")
over = [row["rung"] for row in ladder_rows if (row["of measured ceiling"] or 0) > 1.0]
if over:
    print(
        f"{', '.join(over)} ran faster than the measured 'ceiling': on this machine it is not a "
        "ceiling (see section 1), so read the fractions as rough."
    )

# %% [markdown]
# **Reading it.** The plain `scan` keeps every repeat in a `while` loop
# whose body is a few small kernels, launched anew in every iteration, and
# XLA cannot fuse or schedule across iterations. (On a GPU a loop whose trip
# count is known runs its body that many times without evaluating the
# condition or returning to the host, `xla/backends/gpu/runtime/while_thunk.cc`;
# the launches per iteration remain.) Unrolling gives the compiler straight-line code, at the price
# of a longer compile (see the compile column). bfloat16 halves the bytes
# of every activation (the element-wise part of the roofline); on GPUs
# with bfloat16 tensor cores it also raises the matmul ceiling, while a CPU
# may run bfloat16 matmuls slower than float32 (section 1's ratio says which
# holds on this device). On a TPU the float32 rungs already run their
# matmuls as one bfloat16 pass, so bfloat16 gains less there: the bytes of
# the saved activations, not the matmul rate. What is left between the best
# rung and the ceiling could be the element-wise work of section 2 (bias,
# GELU, the residual mix and their backward), the optimizer's passes over
# the parameters, or the matmul kernels themselves: section 5 splits the
# step from its profiler trace and says which. Measured
# with JAX 0.10.2 on one TPU v5e (15.7 GiB): 53.7 ms per step for the scan in
# float32, 23.7 fully unrolled, 36.3 and 21.1 in bfloat16, and the unrolled
# bfloat16 step at global batch 8192 in 41.1 ms, 161 TFLOP/s: 82 % of the
# v5e's 197 TFLOP/s BF16 peak (Google Cloud's TPU v5e documentation). On
# a CPU the ladder mostly shows
# compile-time and correctness effects; its speeds say little about an
# accelerator.
#
# The last rung, `pallas_bf16_batch8192` (at the `full` profile), is the one
# before it with the block's backward pass written by hand as one Pallas
# kernel: on the same TPU v5e, 38.7 ms per step, 87 % of the 197 TFLOP/s.
# Section 5 reads from the chip's profile why, and section 4 checks its
# gradient. Off a TPU its kernel runs in Pallas's interpret mode (JAX
# operations standing in for the kernel: the same numbers, none of its
# speed), so there its time says nothing about the kernel.

# %% [markdown]
# **The fast step against the batch.** The ladder measured each rung at one
# global batch (and the last at a larger one). Here the fastest rung at
# that batch runs over a few batch sizes on the same single device (the GPU
# on a one-GPU machine): throughput grows with the batch until the device
# is busy, then flattens. Notebook 07 sweeps the course's step over N
# devices; setting its `BLOCK_UNROLL` and `COMPUTE_DTYPE` repeats that sweep
# with this step.

# %%
at_batch = [r for r in runs if r.status == "ok" and r.rung.global_batch == batch]
fastest = max(at_batch, key=lambda r: r.result.examples_per_s) if at_batch else None
if fastest is None:
    print("No rung ran at the ladder's batch, so there is no fast step to sweep.")
else:
    fast_cfg = fastest.rung.config(cfg)
    sizes = (batch // 2, batch, cfg.ladder_large_batch)
    same_step = {  # the ladder already measured this step at some of the sizes: taken as they are
        r.rung.global_batch: r.result
        for r in runs
        if r.status == "ok" and r.rung.config(cfg) == fast_cfg and r.rung.global_batch in sizes
    }
    points = ladder.sweep_single_device(
        fast_cfg, dataset, device, init_host, sizes, progress=False, measured=same_step
    )
    sweep_rows = [
        {
            "global batch": p.global_batch,
            "status": p.status,
            "ms/step": p.result.ms_per_step if p.result else None,
            "examples/s": p.result.examples_per_s if p.result else None,
            "reason": p.reason,
        }
        for p in points
    ]
    display(
        show.table(sweep_rows, caption=f"{fastest.rung.label} over the batch, on {single.label}"),
    )
    record.figures(
        {
            f"fast_step_examples_per_s_batch{p.global_batch}": (
                p.result.examples_per_s,
                "examples/s",
            )
            if p.result
            else (f"{p.status}: {p.reason}", "status")
            for p in points
        }
    )

# %% [markdown]
# **What is left to win?** The course's target for a GPU is half of the
# measured matmul rate in each precision. From the roofline: the step time
# that target means, the no-overlap estimate of section 2, and how much of
# that estimate is element-wise traffic rather than matmuls. Where the element-wise share is
# large, a bigger batch does not help (both grow with it); fewer bytes do:
# bfloat16 activations, element-wise work fused into the matmul's epilogue
# (bias and GELU), saving only what the backward pass needs.

# %%
budget_rows = []
for label, c, rate in (
    ("float32", cfg, f32_rate),
    ("bfloat16", bf16_cfg, measured["bfloat16"].rate),
):
    if not (rate and bw):
        continue
    bound = roofline.step_bound(c, batch, rate, bw)
    best_ms = min(
        (
            r.result.ms_per_step
            for r in runs
            if r.status == "ok"
            and r.rung.compute_dtype == c.compute_dtype
            and r.rung.global_batch == batch
        ),
        default=None,
    )
    budget_rows.append(
        {
            "compute": label,
            "50 % of ceiling: ms/step": costs.train_flops_per_step(c, batch) / (0.5 * rate) * 1e3,
            "best measured ms/step": best_ms,
            "bound ms (max)": bound.overlap_s * 1e3,
            "no-overlap ms (sum)": bound.serial_s * 1e3,
            "element-wise share of the estimate": f"{bound.unfused_s / bound.serial_s:.0%}",
        }
    )
display(show.table(budget_rows, caption=f"Step-time budget at global batch {batch}"))
for row in budget_rows:
    best_ms, bound_ms = row["best measured ms/step"], row["bound ms (max)"]
    if best_ms is None:
        continue
    holds = best_ms >= bound_ms
    print(
        f"{row['compute']}: best measured {best_ms:.2f} ms >= roofline bound "
        f"{bound_ms:.2f} ms: {holds}"
    )
    if not holds and device.platform == "cpu":
        print(
            "  On a CPU shared with other jobs the 'ceiling' is only the best rate this run "
            "saw (section 1),\n  so the bound it gives is not one; on an accelerator this stops "
            "the lesson."
        )
    elif not holds:
        raise AssertionError(
            f"The {row['compute']} step ran in {best_ms:.2f} ms, below its roofline bound "
            f"{bound_ms:.2f} ms: a ceiling of section 1 was measured too low (another process on "
            "the device?) or the bound counts work this step does not do. Run the lesson again "
            "on an idle device."
        )

# %%
by_name = {r.rung.name: r for r in runs}
ok_runs = [r for r in runs if r.status == "ok"]
points = []
for r in ok_runs:
    rc = r.rung.config(cfg)
    achieved = costs.achieved_flops_per_s(rc, r.rung.global_batch, r.result.ms_per_step)
    points.append((r.rung.name, roofline.step_intensity(rc, r.rung.global_batch), achieved))
if f32_rate and bw and points:
    fig = roofline.roofline_chart(
        f32_rate,
        bw,
        points,
        f"Roofline (measured float32-default ceiling and bandwidth), {single.label}",
        note="x: training FLOPs over the modelled element-wise bytes of the step; "
        "y: achieved FLOP/s.",
    )
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
n_steps_run = cfg.warmup_steps + cfg.repeats * cfg.steps
param_tol, grad_tol = train.equivalence_tolerances(device.platform, cfg.learning_rate, n_steps_run)
checks = {}
scan_run = by_name["scan_f32"]
if scan_run.status != "ok":
    print(
        f"scan_f32, the reference of these checks, failed ({scan_run.reason}): "
        "no rung could be checked."
    )
for name in [
    r.rung.name for r in ok_runs if r.rung.compute_dtype == "float32" and r.rung.name != "scan_f32"
]:
    other = by_name[name]
    if scan_run.status != "ok":
        break
    p_diff = train.max_abs_diff(scan_run.final_params, other.final_params)
    _, _, s_ref = ladder.run_steps(scan_run.compiled, cfg, device, init_host, check_batches, 1)
    _, _, s_other = ladder.run_steps(other.compiled, cfg, device, init_host, check_batches, 1)
    g_diff, g_scale = train.first_step_gradient_diff(s_ref, s_other)
    checks[name] = (p_diff, g_diff / g_scale)
display(
    show.table(
        [
            {
                "rung vs scan_f32": k,
                "max |param diff|": p,
                "tolerance": param_tol,
                "gradient diff (rel.)": g,
                "gradient tolerance": grad_tol,
                "equal?": "yes" if p <= param_tol and g <= grad_tol else "NO",
            }
            for k, (p, g) in checks.items()
        ],
        caption=f"Float32 rungs after {n_steps_run} steps",
    )
)

logit_err = ladder.logit_rel_error(init_host, check_batches[0][0], cfg)
logit_tol = ladder.bf16_logit_tolerance(cfg)
print(f"bfloat16 logits vs float32, relative (rms): {logit_err:.2%} (tolerance {logit_tol:.1%})")
assert logit_err <= logit_tol, (
    f"bfloat16 logits differ from float32 by {logit_err:.2%}, more than {logit_tol:.1%}:"
    " the bfloat16 rung computes something else; compare its cell with the float32 one"
)

n_curve = min(cfg.steps, 10)
bf16_diff = bf16_median = bf16_tol = None
gaps = {}
if scan_run.status == "ok":
    f32_losses, _, _ = ladder.run_steps(
        scan_run.compiled,
        cfg,
        device,
        init_host,
        check_batches,
        n_curve,
    )
    bf16_tol = min(ladder.bf16_loss_tolerance(v) for v in f32_losses)
    curve_rows = [
        {
            "rung": "scan_f32",
            "first loss": f32_losses[0],
            "last loss": f32_losses[-1],
            "median |loss diff|": 0.0,
            "max |loss diff|": 0.0,
        }
    ]
    for name in ("scan_bf16", "unrolled_bf16"):
        r = by_name[name]
        if r.status != "ok":
            continue
        losses, _, _ = ladder.run_steps(
            r.compiled,
            bf16_cfg,
            device,
            init_host,
            check_batches,
            n_curve,
        )
        gaps[name] = gap = ladder.loss_curve_gap(losses, f32_losses)
        curve_rows.append(
            {
                "rung": name,
                "first loss": losses[0],
                "last loss": losses[-1],
                "median |loss diff|": gap.median,
                "max |loss diff|": gap.largest,
            },
        )
    display(
        show.table(
            curve_rows,
            caption=f"Loss over the first {n_curve} steps (tolerance {bf16_tol:.3g})",
        )
    )
if gaps:
    bf16_median = max(g.median for g in gaps.values())
    bf16_diff = max(g.largest for g in gaps.values())
    print(f"bfloat16 tracks float32: median |loss diff| {bf16_median:.3g} <= {bf16_tol:.3g}")
    assert bf16_median <= bf16_tol, (
        f"The bfloat16 loss is {bf16_median:.3g} from the float32 loss at a typical step, "
        f"more than {bf16_tol:.3g} (2 %): the bfloat16 rung does not train as the float32 "
        "one does; check its casts and the optimizer's dtype."
    )
    worst_name, worst = max(gaps.items(), key=lambda kv: kv[1].largest)
    print(
        f"largest |loss diff| {worst.largest:.3g} ({worst_name}) at step "
        f"{worst.step_of_largest + 1}, where the float32 loss moved by "
        f"{worst.jump_at_largest:+.3f} from the step before"
    )
    if worst.largest > bf16_tol:
        print(
            "  A single step apart: where the loss jumps on a hard batch it is most sensitive "
            "to the parameters, and any rounding difference grows there"
            + (
                " (on a TPU even float32 at default and at highest precision differ there: default "
                "rounds every matmul input to bfloat16)."
                if device.platform == "tpu"
                else "."
            )
        )

# %% [markdown]
# The bfloat16 rungs at a larger global batch run on other examples than the
# float32 step above, so they are checked at their first step: the loss the
# rung computes before its first update, against the float32 step's loss on
# the same examples (its forward pass, batch by batch of the ladder's size,
# averaged), within the same 2 %. A float32 step at these batches is not
# run: its scan keeps every repeat's activations in float32.

# %%
f32_loss = jax.jit(lambda p, x, y: model.loss_and_metrics(p, x, y, cfg)[0])
init_dev = jax.device_put(init_host, device)
first_checks = {}
for r in ok_runs:
    if r.rung.compute_dtype != "bfloat16" or r.rung.global_batch == batch:
        continue
    gb = r.rung.global_batch
    xb, yb = placement.place_single_device(cfg, dataset, device, opt, init_host, gb).batches[0]
    (first,), _, _ = ladder.run_steps(
        r.compiled, r.rung.config(cfg), device, init_host, [(xb, yb)], 1
    )
    ref = float(
        np.mean(
            [f32_loss(init_dev, xb[i : i + batch], yb[i : i + batch]) for i in range(0, gb, batch)]
        )
    )
    first_checks[r.rung.name] = (abs(first - ref), ladder.bf16_loss_tolerance(ref), first, ref)
    del xb, yb
if first_checks:
    display(
        show.table(
            [
                {"rung": k, "first loss": f, "float32 loss": ref, "|diff|": d, "tolerance": t}
                for k, (d, t, f, ref) in first_checks.items()
            ],
            caption="bfloat16 at a larger batch against float32, first step, same examples",
        )
    )
    for k, (d, t, _, _) in first_checks.items():
        assert d <= t, (
            f"{k}'s first loss is {d:.3g} from float32's on the same examples, "
            f"more than {t:.3g} (2 %): "
            "the rung computes something else; compare its settings with unrolled_bf16's."
        )

# %% [markdown]
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
grad_f32 = jax.jit(jax.grad(lambda p, x, y: model.loss_and_metrics(p, x, y, cfg)[0]))
kernel_checks = {}
for r in ok_runs:
    if r.rung.block_backward == "autodiff":
        continue
    twin_cfg = r.rung.config(cfg).with_overrides(block_backward="autodiff")
    same = [
        t
        for t in ok_runs
        if t.rung.config(cfg) == twin_cfg and t.rung.global_batch == r.rung.global_batch
    ]
    if not same:
        print(f"{r.rung.name}: its twin with JAX's own backward pass did not run: not checked.")
        continue
    twin = same[0]
    gb = r.rung.global_batch
    xb, yb = placement.place_single_device(cfg, dataset, device, opt, init_host, gb).batches[0]
    with jax.default_matmul_precision("highest"):
        parts = [
            grad_f32(init_dev, xb[i : i + batch], yb[i : i + batch]) for i in range(0, gb, batch)
        ]
    reference = jax.tree.map(
        lambda *g: np.mean(np.stack([np.asarray(a) for a in g]), axis=0), *parts
    )
    errors = {}
    for run in (r, twin):
        _, _, state = ladder.run_steps(
            run.compiled, run.rung.config(cfg), device, init_host, [(xb, yb)], 1
        )
        errors[run.rung.name] = ladder.gradient_error(train.adam_first_moment(state), reference)
    kernel_checks[r.rung.name] = (errors[r.rung.name], errors[twin.rung.name], twin.rung.name)
    del xb, yb, parts
for name, (mine, twins, twin_name) in kernel_checks.items():
    print(
        f"{name}: first-step gradient {mine:.2%} from float32 (largest over the parameters of "
        f"|g - g_f32| / |g_f32|); {twin_name}, JAX's own backward pass: {twins:.2%}"
    )
    assert mine <= ladder.KERNEL_GRADIENT_FACTOR * twins, (
        f"{name}'s gradient is {mine:.2%} from float32's, more than "
        f"{ladder.KERNEL_GRADIENT_FACTOR:g} x its twin's {twins:.2%}: its backward pass computes "
        "something else; compare dpcourse.perf.backward with JAX's derivative of the block."
    )

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
import os
import tempfile
from pathlib import Path

best = max(ok_runs, key=lambda r: r.result.examples_per_s) if ok_runs else None
trace_dir = record.output_dir("trace") or Path.cwd() / "results" / "09_performance_trace"
trace_dir.mkdir(parents=True, exist_ok=True)
if best is not None:
    best_batches = check_batches
    if best.rung.global_batch != batch:
        best_batches = placement.place_single_device(
            cfg, dataset, device, opt, init_host, best.rung.global_batch
        ).batches[:1]
    earlier = set(trace_dir.rglob("*"))  # the runner's folder keeps the traces of earlier runs
    # record.whole_folder: the trace lands whole in trace_dir, or not at all (a full disk).
    with (
        record.whole_folder(trace_dir) as fresh,
        jax.profiler.trace(str(fresh), create_perfetto_trace=True),
    ):
        ladder.run_steps(
            best.compiled,
            best.rung.config(cfg),
            device,
            init_host,
            best_batches,
            TRACE_STEPS,
        )
    files = sorted(p for p in trace_dir.rglob("*") if p.is_file() and p not in earlier)
    where = os.path.relpath(trace_dir)  # results/09_performance_trace in the lab
    where = (
        f"{trace_dir.name}, in the course run's output folder" if where.startswith("..") else where
    )
    print(f"trace of {TRACE_STEPS} steps of {best.rung.name} in {where}:")
    for p in files:
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
# with the step the benchmark measured. Here for the fastest rung, for the
# course's own step (`scan_f32`) and, when the fastest is the Pallas rung,
# for its twin that JAX differentiates:

# %%
twin_name = f"unrolled_bf16_batch{cfg.ladder_large_batch}"
profiled = [best, by_name.get("scan_f32")]
if best is not None and best.rung.block_backward != "autodiff":
    profiled.append(by_name.get(twin_name))
profiled = [r for r in profiled if r is not None and r.status == "ok"]
breakdowns = {}
for r in profiled:
    rc = r.rung.config(cfg)
    r_batches = best_batches if r.rung.global_batch == best.rung.global_batch else check_batches
    folder = Path(tempfile.mkdtemp(prefix=f"09_{r.rung.name}_"))
    path = breakdown.trace_steps(r.compiled, rc, device, init_host, r_batches, TRACE_STEPS, folder)
    ks, where_ran = (
        breakdown.kernels(path, breakdown.kernel_kinds(r.compiled.as_text())) if path else ([], "")
    )
    rate = measured[ceilings.ceiling_for(r.rung.compute_dtype)].rate
    if not ks or not rate:
        print(
            f"{r.rung.name}: this host's trace shows none of the program's kernels, "
            "so it cannot be split."
        )
        continue
    flops = costs.train_flops_per_step(rc, r.rung.global_batch)
    bd = breakdown.split(ks, TRACE_STEPS, r.result.ms_per_step, flops, rate, r.rung.name, where_ran)
    breakdowns[r.rung.name] = bd
    display(
        show.table(
            bd.rows(), f"{r.rung.name} on {single.label}: one step, from its trace ({where_ran})"
        )
    )
    print("\n".join(bd.sentences()))
if breakdowns and device.platform == "cpu":
    print(
        "On a CPU the kernels run on several threads and the profiler's own cost weighs on\n"
        "steps this short, so the traced step can differ from the benchmark's; the split is\n"
        "this host's, not a chip's."
    )

# The scan against the same program unrolled: the fastest rung with JAX's own backward pass.
unrolled = next(
    (
        n
        for n in (twin_name, best.rung.name if best else None)
        if n in breakdowns and n != "scan_f32"
    ),
    None,
)
if "scan_f32" in breakdowns and unrolled is not None:
    print()
    sentences = breakdown.scan_sentences(
        breakdowns["scan_f32"], breakdowns[unrolled], None, cfg.block_repeats
    )
    print("\n".join(sentences))
if (
    best is not None
    and best.rung.block_backward != "autodiff"
    and {best.rung.name, twin_name} <= set(breakdowns)
):
    print()
    print(breakdown.kernel_sentence(breakdowns[twin_name], breakdowns[best.rung.name]))

# %% [markdown]
# **Measured on one TPU v5e chip.** The same split, stored in the package
# with its dates and versions (`tools/tpu_breakdown.py` made it: the Pallas
# rung, its twin that JAX differentiates, the course's `scan` step and
# `scan(unroll=8)`, at the matmul rates this lesson measured on that
# machine), and what each lever tried toward
# 85 % of the chip's 197 TFLOP/s did there. On a TPU host, your own run's
# split is above; the stored one is the same machine type on another day.

# %%
chip = breakdown.stored()
if chip is None:
    print("No stored chip breakdown in this install of dpcourse.")
else:
    print(
        f"stored: {chip['device_kind']}, {chip['date']}, JAX {chip['jax']}, "
        f"libtpu {chip['libtpu']}, "
        f"profile {chip['profile']} (measured there, not on this machine)"
    )
    chip_bd = {name: breakdown.from_stored(data) for name, data in chip["breakdowns"].items()}
    for name in ("pallas_bf16_batch8192", "unrolled_bf16_batch8192", "scan_f32"):
        display(
            show.table(
                chip_bd[name].rows(),
                f"stored, {chip['device_kind']}: {name}, one step ({chip_bd[name].date})",
            )
        )
        print("\n".join(chip_bd[name].sentences()))
    print()
    print(
        breakdown.kernel_sentence(
            chip_bd["unrolled_bf16_batch8192"], chip_bd["pallas_bf16_batch8192"]
        )
    )
    wider = chip_bd["scan_unroll8_f32"]
    print()
    for line in breakdown.scan_sentences(
        chip_bd["scan_f32"], chip_bd["unrolled_bf16_batch8192"], wider, chip["repeats"]
    ):
        print(line)
    print(
        f"Compile: scan {chip_bd['scan_f32'].compile_s:.1f} s, "
        f"scan(unroll=8) {wider.compile_s:.1f} s, "
        f"unrolled {chip_bd['unrolled_bf16_batch8192'].compile_s:.0f} s "
        "(programs compiled side by side)."
    )
    display(
        show.table(
            chip["levers"],
            f"stored, {chip['device_kind']}: levers toward 85 % MFU "
            "(compile s: while the run's other programs compiled beside it)",
        )
    )
    best_lever = max(chip["levers"], key=lambda row: row["MFU (197 TFLOP/s)"])
    print(
        f"Best: {best_lever['variant']} at {best_lever['MFU (197 TFLOP/s)']:.1%} of 197 TFLOP/s; "
        + (
            "at least 85 %."
            if best_lever["MFU (197 TFLOP/s)"] >= 0.85
            else "no lever reached 85 %."
        )
    )

# %% [markdown]
# **Reading the chip's split.** In the stored runs (TPU v5e, 2026-12-06,
# JAX 0.10.2, libtpu 0.0.42.1; `python tools/tpu_breakdown.py --profile
# full`, then `--store` at this lesson's ceilings from `python -m
# coursetools.tpucheck --notebooks 09` on the same machine) the best rung
# JAX differentiates, `unrolled_bf16_batch8192`, spent 99.7 % of its 41.1 ms
# in matmul kernels: 35.0 ms is their FLOPs at the 190 TFLOP/s this lesson
# measured for one 8192-side matmul, 5.9 ms is what they took beyond it.
# Per repeat, at the rate, each of its three matmuls ([8192, 1024] x
# [1024, 1024]) takes 90.5 us; in its trace the kernels took about 103 us
# (forward), 100 us (weight gradient) and 119 us (input gradient, which
# also computes GELU's derivative again from the kept `h W + b`, a tanh and
# a cubic per element in float32 on the vector unit, and sums the bias
# gradient). The `scan` step's 53.6 ms was 34 % matmul kernels; beside
# them, per iteration, 131 us of element-wise kernels (`dynamic-update-slice`
# fusions writing each repeat's saved activations into the loop's stacked
# float32 buffers) and 127 us for a reduction (the block's bias gradient,
# summed over the batch in the backward loop's body): in the unrolled
# program both ran inside the matmuls' kernels. `scan(unroll=8)` ran its 16
# iterations with copy kernels of 69 ms per step (the slabs of 8 repeats'
# saved activations taken out of and put back into the stacked buffers,
# about 6.6 ms each) where the plain scan's copies took 2.2 ms, and its
# matmul kernels ran 16.3 ms beyond the rate: 113 ms in all, while it
# compiled in about the time of the plain scan (7.2 s against 5.3 s).
#
# **Levers tried toward 85 % of 197 TFLOP/s** (the table above; each the
# same model and mathematics up to bfloat16 rounding, at global batch 8192
# unless named). Twice the global batch, 81.7 %; the batch sent in
# bfloat16, 81.2 %; a hand-written backward pass keeping `h W + b`, 81.3 %;
# `xla_tpu_rwb_fusion=false`, 81.9 % (no change); saving only the matmuls'
# outputs (`jax.checkpoint`), 73.5 %, and a larger scoped VMEM, 72.9 %:
# both slower. Keeping GELU's derivative from the forward pass
# (`block_backward="saved_slope"`, `dpcourse.perf.backward`), 81.2 % (82.7 % at
# batch 16384): XLA still ran the two backward matmuls as two kernels, of
# about 107 and 116 us. But the same change made the course's `scan` step
# 1.84 times faster (29.2 ms against 53.7, 58 % of 197 TFLOP/s): per
# iteration its reduction fell from 127 to 23 us and its element-wise
# kernels from 131 to 29 us. The lever that reached 85 %: the whole
# backward pass of a repeat as one Pallas kernel (`pallas_bf16_batch8192`,
# `dpcourse.perf.backward.block_with_kernel`): 38.7 ms, 87.1 %. It reads the
# incoming gradient, the kept derivative and `h` once per tile of 512 rows,
# keeps `W` and the float32 weight gradient in the core's VMEM, and does
# both matmuls there: 200 us per repeat for the two (181 us at the rate),
# and the forward kernels fell to 93 us (JAX's own forward kernel computed
# the previous repeat's GELU again from its kept `h W + b`). What is left:
# 2.7 ms beyond the rate, and 0.7 ms adding the 128 repeats' float32 weight
# gradients outside the kernel. Tiles of 1024 rows gave 86.4 %.

# %% [markdown]
# The compiled program itself (`compiled.as_text()`, the optimised HLO):
# how many `while` loops and with what trip count, how many fused kernels
# and matmuls run per step.

# %%
texts = {r.rung.name: r.compiled.as_text() for r in ok_runs}
summaries = {name: hlo.summarize(text) for name, text in texts.items()}
display(
    show.table(
        [{"rung": k, **s.row()} for k, s in summaries.items()],
        caption=f"Compiled programs on {device.platform}",
    )
)

# %% [markdown]
# **The best rung, from its program.** Which of its kernels hold a matmul,
# and does the element-wise work (the GELU, the bias, the mix) run in kernels
# of its own, or inside the matmuls' kernels? `dpcourse.perf.fusions` counts
# the kernels of the program text. Measured with JAX 0.10.2 on one TPU v5e:
# the fully unrolled step has 389 kernels with a matmul (128 repeats x 3:
# forward, input gradient, weight gradient, plus the input and output
# layers), 323 of them also compute the GELU, and about 30 kernels do
# element-wise work alone; the CPU compiler keeps the GELU apart.

# %%
if best is not None:
    best_census = fusions.census(texts[best.rung.name])
    print(best_census.sentence(best.rung.name))
    rc = best.rung.config(cfg)
    achieved = costs.achieved_flops_per_s(rc, best.rung.global_batch, best.result.ms_per_step)
    mfu = best.mfu_datasheet(cfg, device.device_kind)
    print(
        f"{best.rung.name}: {best.result.ms_per_step:.2f} ms per step at global batch "
        f"{best.rung.global_batch}, {achieved / 1e12:,.3g} TFLOP/s"
        + (
            f" = {mfu:.0%} of {peak.name}'s datasheet peak"
            if mfu is not None
            else " (no datasheet peak for this device)"
        )
    )
    record.record(f"rung_{best.rung.name}_matmul_kernels", best_census.matmul_kernels, "kernels")
    record.record(
        f"rung_{best.rung.name}_matmul_kernels_with_gelu", best_census.matmul_with_gelu, "kernels"
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
from concurrent.futures import ThreadPoolExecutor

import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse.compiled import collectives

mesh = Mesh(np.array(multi.devices), ("data",))
n_dev = multi.count
gb = multi_cfg.global_batch(n_dev)
m_opt = train.make_optimizer(multi_cfg)
replicated = NamedSharding(mesh, P())
p_shape = jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
    model.init_params(multi_cfg),
)
o_shape = jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
    jax.eval_shape(m_opt.init, p_shape),
)
x_shape = jax.ShapeDtypeStruct(
    (gb, 784),
    jnp.float32,
    sharding=NamedSharding(mesh, P("data", None)),
)
y_shape = jax.ShapeDtypeStruct((gb,), jnp.int32, sharding=NamedSharding(mesh, P("data")))
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
lowered = {k: jax.jit(f).lower(p_shape, o_shape, x_shape, y_shape) for k, f in variants.items()}
with (
    ThreadPoolExecutor() as pool
):  # compiles are independent: use every core (nothing is timed here)
    texts = pool.map(lambda lo: lo.compile().as_text(), lowered.values())
reports = {k: collectives.parse_hlo(text) for k, text in zip(lowered, texts)}
grad_mb = costs.gradient_bytes(multi_cfg) / MB
display(
    show.table(
        [
            {
                "step": k,
                "collectives in program": r.count,
                "inside a loop": r.in_loop_count,
                "runs per step": r.runs_per_step,
                "MB per step": None if r.bytes_per_step is None else r.bytes_per_step / MB,
                "x float32 gradient": None
                if r.bytes_per_step is None
                else r.bytes_per_step / MB / grad_mb,
            }
            for k, r in reports.items()
        ],
        caption=f"Collectives on {multi.label}, global batch {gb} "
        f"({multi.devices[0].platform} compiler)",
    )
)
print(
    f"float32 gradient: {grad_mb:.3f} MB; "
    f"in bfloat16: {costs.gradient_bytes(multi_cfg, 2) / MB:.3f} MB"
)
bf16_key = "shard_map, unrolled, bfloat16, bf16 pmean"
written = hlo.written_all_reduce_bytes(lowered[bf16_key].as_text())
written_mb = sum(b for _, b in written) / MB
compiled_mb = reports[bf16_key].bytes_per_step / MB
print(
    f"{bf16_key}: the program JAX wrote all-reduces {written_mb:.3f} MB "
    f"({', '.join(sorted({d for d, _ in written}))}); "
    f"the {multi.devices[0].platform} compiler's program moves "
    f"{compiled_mb:.3f} MB"
    + (
        " (it promoted the bfloat16 all-reduce to float32)"
        if compiled_mb > 1.5 * written_mb
        else ""
    )
)
if multi.devices[0].platform == "cpu":
    display(
        show.banner(
            "These placements are the CPU compiler's. XLA's GPU compiler runs other passes "
            "(for example one that moves all-reduces out of while loops) and may place them "
            "differently: compile for the GPUs "
            "you will train on and read the report there.",
            "warning",
        )
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

fast_gpu = gpu_notebook.show_gpu_placement(
    cfg.profile,
    multi.devices[0].platform,
    steps={"fast": "dpcourse.cross_compile.steps:fast_jit_step"},
)
compiled_fast = [r for r in fast_gpu if r.error is None and r.platform in ("gpu", "tpu")]


def temporaries_words(memory):
    temp = memory.get("temp_size_in_bytes")
    if temp is None:
        return "temporaries not reported by this compile"
    if temp == 0:
        # a figure the compiler gave, not a missing one
        return (
            "temporaries 0 bytes (the compiler's figure: no device memory past arguments, outputs)"
        )
    return f"temporaries {temp:,} bytes"


for res in compiled_fast:
    f = res.steps["fast"]
    print(f"The fast step, {res.label}:")
    print(
        f"  {f.count} collective(s), {f.in_loop} inside a loop, "
        f"{f.bytes_per_step:,} bytes per step; " + temporaries_words(f.memory)
    )
with_cost = [r for r in compiled_fast if r.steps["fast"].cost]
made_at = with_cost[0].profile if with_cost else cfg.profile
with_cost = [r for r in with_cost if r.profile == made_at]  # one profile's sizes per table
if with_cost:
    # The model at the sizes the programs were compiled at (a stored one: the smoke profile's).
    compiled_cfg = cfg if made_at == cfg.profile else config.make_config(made_at)
    fast_c = compiled_cfg.with_overrides(block_unroll="full", compute_dtype="bfloat16")
    b_dev = fast_c.per_device_batch
    model_cost = {
        "FLOPs": costs.train_flops_per_step(fast_c, b_dev),
        "bytes": roofline.elementwise_bytes_per_step(fast_c, b_dev),
    }
    rows = []
    for k in model_cost:
        row = {"per device, per step": k, "roofline model": f"{model_cost[k]:,.0f}"}
        for res in with_cost:
            xla = res.steps["fast"].cost["flops" if k == "FLOPs" else "bytes accessed"]
            row[f"XLA, {res.target_label}"] = f"{xla:,.0f}"
            row[f"{res.target_label} / model"] = round(xla / model_cost[k], 2)
        rows.append(row)
    display(
        show.table(
            rows,
            caption=(
                f"Fast step, XLA's cost analysis and the model, batch {b_dev} per device "
                f"({with_cost[0].profile} profile{', stored' if with_cost[0].stored else ''})"
            ),
        )
    )

# %% [markdown]
# **Reading it.** With the repeats unrolled there is no loop: the GPU
# program's all-reduces all run once per step, after the backward pass.
# Measured with JAX 0.10.2 (smoke profile, 8 x H200): two of them, the
# gradients in bfloat16 (53,012 bytes, half the float32 gradient: under
# plain `jit` the SPMD partitioner reduces the bfloat16 gradients the
# bfloat16 matmuls produce, and the GPU compiler keeps that dtype, where the
# CPU compiler promotes it to float32) and the two float32 metrics apart
# (XLA combines all-reduces of one dtype only). The TPU compiler's programs
# (v5e 2x4 and v6e 16x16, libtpu 0.0.42) do the same: two all-reduces after
# the backward pass, 53,012 bytes of bfloat16 gradients and 8 of metrics.
#
# The FLOPs agree within about 15% (smoke: XLA 1.10 x the model for the
# H200, the TPU compiler's own cost analysis 1.14 x for the v5e and 1.11 x
# for the v6e): both count the matmuls, and XLA adds the element-wise FLOPs
# (GELU, the mix, the softmax, the optimizer), a few per value. The bytes do
# not agree, and the gap depends on the profile and the compiler (smoke: XLA
# counts about 100 x the model for the H200, the TPU compiler about 260 x). The
# model counts only the element-wise passes over `[batch, width]`
# activations per repeat; XLA's figure is the bytes every instruction of
# the optimised program reads and writes (each fusion at its boundary), so
# it also counts what the model leaves out: the weights every matmul reads
# (the `784 x width` input layer and `width^2` per repeat, large beside
# `[batch, width]` at small batches), the activations the forward pass
# saves for the backward one, the float32 master weights and their bfloat16
# copies, and the optimizer's passes over parameters, gradients and both
# Adam moments. XLA's count is also blind to caches: it charges each
# fusion's operands in full, as if none stayed in L2.

# %% [markdown]
# ## 7. Record the figures
#
# Every rung's figures go to `results.json` (`python -m coursetools compare`
# flags a rung that ran before and fails now, or a throughput that fell on
# the same hardware), with the ceilings, the checks and their tolerances,
# and the fractions of the measured ceilings that the course's speed targets
# are about (`..._target` records: 50 % of the measured rate on a GPU).

# %%
figs = {}
for name, c in measured.items():
    key = name.replace(" ", "_")
    figs[f"ceiling_{key}_status"] = (
        c.status if c.status == "ok" else f"failed: {c.reason}",
        "status",
    )
    figs[f"ceiling_{key}"] = (c.rate, "bytes/s" if name == "memory bandwidth" else "FLOP/s")
for r, row in zip(runs, ladder_rows):
    n = r.rung.name
    figs[f"rung_{n}_status"] = (r.status if r.status == "ok" else f"failed: {r.reason}", "status")
    if r.status == "ok":
        figs |= {
            f"rung_{n}_throughput": (r.result.examples_per_s, "examples/s"),
            f"rung_{n}_ms_per_step": (r.result.ms_per_step, "ms"),
            f"rung_{n}_compile_time": (r.result.compile_s, "s"),
            f"rung_{n}_mfu_datasheet": (row["MFU (datasheet)"], "fraction"),
            f"rung_{n}_fraction_of_measured_ceiling": (row["of measured ceiling"], "fraction"),
            f"rung_{n}_program_bytes": (r.program_bytes, "bytes"),
            f"rung_{n}_device_peak_bytes": (r.peak_bytes, "bytes"),
            f"rung_{n}_final_loss": (r.result.final_loss, "loss"),
        }
for name, (p, g) in checks.items():
    figs |= {
        f"max_abs_param_diff_{name}_vs_scan": (p, "abs"),
        f"max_abs_param_diff_{name}_vs_scan_tolerance": (param_tol, "abs"),
        f"max_abs_grad_rel_diff_{name}_vs_scan": (g, "relative"),
        f"max_abs_grad_rel_diff_{name}_vs_scan_tolerance": (grad_tol, "relative"),
    }
for name, (d, t, _, _) in first_checks.items():
    figs[f"first_loss_diff_{name}_vs_f32"] = (d, "loss")
    figs[f"first_loss_diff_{name}_vs_f32_tolerance"] = (t, "loss")
for name, (mine, twins, _) in kernel_checks.items():
    figs[f"grad_rel_diff_{name}_vs_f32"] = (mine, "relative")
    tol = ladder.KERNEL_GRADIENT_FACTOR * twins
    figs[f"grad_rel_diff_{name}_vs_f32_tolerance"] = (tol, "relative")
for name, bd in breakdowns.items():
    figs |= {
        f"breakdown_{name}_traced_ms": (bd.traced_ms, "ms"),
        f"breakdown_{name}_matmul_at_rate_ms": (bd.matmul_at_rate_ms, "ms"),
        f"breakdown_{name}_matmul_beyond_ms": (bd.matmul_beyond_ms, "ms"),
        f"breakdown_{name}_idle_ms": (bd.idle_ms, "ms"),
        f"breakdown_{name}_gap_to_measured": (bd.gap, "fraction"),
    }
    if device.platform == "tpu":  # one timeline: the parts must add up to the benchmark's step
        figs[f"breakdown_{name}_gap_to_measured_tolerance"] = (breakdown.AGREEMENT, "fraction")
    figs |= {
        f"breakdown_{name}_{k.replace('-', '_')}_ms": (v, "ms") for k, v in bd.other_ms.items()
    }
if bf16_diff is not None:
    figs["max_abs_loss_diff_bf16_vs_f32"] = (bf16_diff, "loss")
    figs["median_abs_loss_diff_bf16_vs_f32"] = (bf16_median, "loss")
    figs["median_abs_loss_diff_bf16_vs_f32_tolerance"] = (bf16_tol, "loss")
for dtype, key in (("float32", "f32"), ("bfloat16", "bf16")):
    fractions = [
        r.fraction_of_ceiling(cfg, measured)
        for r in ok_runs
        if r.rung.compute_dtype == dtype and r.rung.global_batch == batch
    ]
    fractions = [f for f in fractions if f is not None]
    if fractions:
        figs[f"best_{key}_fraction_of_measured_ceiling"] = (max(fractions), "fraction")
        figs[f"best_{key}_fraction_of_measured_ceiling_target"] = (0.5, "fraction")
if best is not None:
    figs["throughput"] = (best.result.examples_per_s, "examples/s")
    figs["best_rung"] = (best.rung.name, "name")
record.figures(figs)

# The collectives were counted on the multi-device run's devices: its own context.
multi_figs = {"bf16_pmean_written_all_reduce_bytes": (sum(b for _, b in written), "bytes")}
for k, r in reports.items():
    key = k.replace(",", "").replace(" ", "_").replace("(04)", "").strip("_").replace("__", "_")
    multi_figs[f"collectives_per_step_{key}"] = (r.runs_per_step, "count")
    multi_figs[f"collective_bytes_per_step_{key}"] = (r.bytes_per_step, "bytes")
_ = record.figures(
    multi_figs,
    backend=multi.devices[0].platform,
    device_kind=multi.devices[0].device_kind,
    device_count=n_dev,
    profile=multi_cfg.profile,
)

# %% [markdown]
# Last, free what this notebook put on the device: the ladder's runs (their
# parameters and compiled programs), the batches, the optimizer states of
# the checks. The cell then lists any name that still holds a device array
# (there should be none: the figures above are all on the host now).

# %%
from dpcourse import memory

to_free = ["runs", "by_name", "ok_runs", "best", "scan_run", "check_batches", "at_batch", "fastest"]
to_free += ["best_batches", "other", "r", "s_ref", "s_other", "mine", "package", "x_few", "params"]
to_free += ["init_dev", "profiled", "reference", "state"]
before, after = memory.free(globals(), *to_free)
print("freed:", before, "->", after)
held = {}  # the device arrays this notebook's names still hold
for name, value in list(globals().items()):
    if not name.startswith("_"):
        leaves = jax.tree.leaves(value) if isinstance(value, (dict, list, tuple, jax.Array)) else []
        if any(isinstance(a, jax.Array) for a in leaves):
            held[name] = sum(isinstance(a, jax.Array) for a in leaves)
print("still held by name:", held or "none")

# %% [markdown]
# ## 8. Where communication hides: the GPU compiler's schedule
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

OVERLAP_PROFILE = "smoke"
forms = overlap_steps.STEPS  # plain, small_threshold, o1, fsdp_gathered, accum_reduced
three = {k: forms[k] for k in ("plain", "small_threshold", "o1")}
hlo_tmp = tempfile.TemporaryDirectory(prefix="overlap-hlo-")
missing_extra = gpu_targets.extra_missing() if SCHEDULES else "skipped (SCHEDULES = False)"
pending = []
if not SCHEDULES:
    print("Section 8's GPU compiles are skipped: SCHEDULES = False in the parameters cell.")
elif missing_extra:
    print(
        "GPU compile without a GPU is not available here: the next cells read the stored compile."
    )
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

compiled_overlap = [res for p in pending for res in p.results()]
hlo_texts = {
    (res.target, name): Path(hlo_tmp.name) / f"gpu_{res.target}_8_{OVERLAP_PROFILE}_{name}.hlo"
    for res in compiled_overlap
    for name in res.steps
}
if SCHEDULES and missing_extra:  # the same compiles, stored by `make placement-store`
    compiled_overlap, hlo_texts = gpu_notebook.stored_overlap(OVERLAP_PROFILE)
    print(gpu_notebook.stored_overlap_line(compiled_overlap, missing_extra))
scheds, overlap_rows = {}, []
for res in compiled_overlap:
    if res.error:
        print(f"{res.label}: {res.error}")
        continue
    for name, step in res.steps.items():
        if step.error:
            print(f"{res.label}, {name}: {step.error}")
            continue
        text = hlo_texts[res.target, name]
        text = text.read_text() if isinstance(text, Path) else text
        sched = schedule.read_schedule(text, res.n_devices)
        scheds[res.target, name] = sched
        overlap_rows.append(
            {
                "GPU": res.target_label,
                "form": overlap_steps.LABELS[name],
                "collectives": len(sched.windows),
                "with compute inside": sum(w.has_compute for w in sched.windows),
                "is_sync": sum(w.is_sync is True for w in sched.windows),
                "bytes sent / device": round(sched.sent_bytes_per_step),
                "fraction in windows": round(sched.overlapped_fraction or 0.0, 3),
                "LHS ran": step.scheduler_ran,
                "temp bytes": step.memory.get("temp_size_in_bytes"),
            }
        )
jax_compiled = compiled_overlap[0].jax_version if compiled_overlap else "?"
if overlap_rows:
    display(
        show.table(
            overlap_rows,
            caption=f"Schedules compiled for 8 GPUs without a GPU, {OVERLAP_PROFILE} profile, "
            f"JAX {jax_compiled}",
        )
    )
    lhs = {r["GPU"]: r["LHS ran"] for r in overlap_rows if r["form"] == "plain jit step"}
    print(
        "latency-hiding scheduler ran (default options):",
        ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in lhs.items()),
    )

# %% [markdown]
# **The plain step.** Read its window on the H200:

# %%
plain = scheds.get(("h200", "plain"))
if plain is not None:
    display(show.table(plain.rows(), caption="Plain jit step, 8 x H200: each collective's window"))
    only = max(plain.windows, key=lambda w: w.payload_bytes)  # one, where the combiner merges all
    scalar = [w.name for w in only.work if w.scalar]
    print(
        f"{len(plain.windows)} collective(s); the largest: {only.kind} with a payload of "
        f"{only.payload_bytes:,} bytes ({only.sent_bytes:,.0f} sent per device in a ring, the "
        f"table's figure); matmul FLOPs in its window: {only.window_flops:,.0f}; "
        f"other work: {len(only.compute)}; scalar work: {scalar or 'none'}"
    )
    print(
        f"the combiner merged {only.payload_bytes:,} bytes of gradients into it, so its default "
        "threshold is at least that "
        "(XLA's source sets 30 MiB + 7 bytes: xla/service/collective_utils.h)"
    )

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
small = scheds.get(("h200", "small_threshold"))
if small is not None and plain is not None:
    display(show.table(small.rows(), caption="Combine threshold 4,096 bytes, 8 x H200"))
    busiest = max(small.windows, key=lambda w: (w.window_flops, w.window_bytes))
    print(
        f"{len(small.windows)} collectives instead of {len(plain.windows)}, "
        f"{small.sent_bytes_per_step:,.0f} bytes sent per device either way; the busiest window: "
        f"{busiest.name} (a payload of {busiest.payload_bytes:,} bytes per device, which the table "
        f"counts as {busiest.sent_bytes:,.0f} bytes sent in a ring), holding "
        + ", ".join(f"{w.name} ({w.what})" for w in busiest.compute)
    )
    for target in ("h100_sxm", "l4"):
        other = scheds.get((target, "small_threshold"))
        if other is not None:
            print(
                f"{gpu_targets.target(target).label}: {len(other.windows)} collectives, "
                f"{sum(w.has_compute for w in other.windows)} with compute inside, "
                f"{sum(w.is_sync is True for w in other.windows)} marked is_sync"
            )

# %% [markdown]
# **Default against `O1`**, per GPU: the collectives, the windows, whether
# the latency-hiding scheduler ran, and the peak temporary memory of the
# program (`memory_analysis()`, per device).

# %%
o1_rows = []
for res in compiled_overlap:
    if res.error or "o1" not in res.steps:
        continue
    for name in ("plain", "o1"):
        step, sched = res.steps[name], scheds.get((res.target, name))
        if step.error or sched is None:
            continue
        o1_rows.append(
            {
                "GPU": res.target_label,
                "compiled": overlap_steps.LABELS[name],
                "collectives": len(sched.windows),
                "with compute inside": sum(w.has_compute for w in sched.windows),
                "LHS ran": step.scheduler_ran,
                "temp bytes": step.memory.get("temp_size_in_bytes"),
                "code bytes": step.memory.get("generated_code_size_in_bytes"),
            }
        )
if o1_rows:
    display(show.table(o1_rows, caption=f"Default against O1, JAX {jax_compiled}"))
    for gpu in dict.fromkeys(r["GPU"] for r in o1_rows):
        default, higher = [r for r in o1_rows if r["GPU"] == gpu][:2]
        changed = [k for k in default if k not in ("GPU", "compiled") and default[k] != higher[k]]
        print(f"{gpu}: O1 changes {', '.join(changed) if changed else 'nothing in this table'}")

# %% [markdown]
# **FSDP gathered once and the reduced accumulation**, read the same way:

# %%
for name in ("fsdp_gathered", "accum_reduced"):
    sched = scheds.get(("h200", name))
    if sched is not None:
        display(show.table(sched.rows(), caption=f"{overlap_steps.LABELS[name]}, 8 x H200"))
        print(
            f"{overlap_steps.LABELS[name]}: {sched.sent_bytes_per_step:,.0f} bytes sent per "
            f"device, {sched.overlapped_fraction or 0:.0%} of them inside windows of compute"
        )
        for w in sched.windows:
            print(
                f"  {w.kind} ({w.sent_bytes:,.0f} bytes sent): {w.window_flops:,.0f} matmul "
                f"FLOPs and {w.window_bytes:,} bytes of work in its window "
                f"({len(w.compute)} instruction{'s' * (len(w.compute) != 1)})"
            )

# %% [markdown]
# **Which bound does the step earn?** The cost model now has two:
# `compute + communication` when nothing overlaps, and the overlapped bound
# `costs.overlapped_step_s`: for the fraction `f` of the bytes sent inside
# windows, `max(window compute, f x communication)`; the rest adds. Below,
# per form on the H200, the compute is XLA's FLOPs at the datasheet TF32
# peak (a lower bound) and the communication the ring at the NVLink
# datasheet rate.

# %%
h200_peak = costs.find_peak("NVIDIA H200")
bound_rows = []
steps_by_key = {(r.target, k): s for r in compiled_overlap for k, s in r.steps.items()}
for (target, name), sched in scheds.items():
    res_step = steps_by_key[target, name]
    if target != "h200" or not res_step.cost.get("flops"):
        continue
    compute_s = res_step.cost["flops"] / h200_peak.peak("tf32")
    comm_s = sched.sent_bytes_per_step / h200_peak.link_bytes_per_s
    window_s = min(compute_s, sum(w.window_flops for w in sched.windows) / h200_peak.peak("tf32"))
    frac = sched.overlapped_fraction or 0.0
    hidden_s = costs.overlapped_step_s(compute_s, comm_s, frac, window_s)
    bound_rows.append(
        {
            "form": overlap_steps.LABELS[name],
            "fraction in windows": round(frac, 3),
            "earns": costs.bound_for(frac),
            "sum, us": round((compute_s + comm_s) * 1e6, 3),
            "overlapped, us": round(hidden_s * 1e6, 3),
            "best case, us": round(1e6 * costs.overlapped_step_s(compute_s, comm_s, frac), 3),
        }
    )
if bound_rows:
    display(show.table(bound_rows, caption="Cost model, 8 x H200 datasheet (smoke size)"))
    earned = {r["form"]: r["earns"] for r in bound_rows}
    print(f"this course's plain step earns the {earned.get('plain jit step', '?')}")

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
here = schedule.read_schedule(lowered[cpu_key].compile().as_text(), n_dev)
print(
    f"this run's {multi.devices[0].platform} compiler, {cpu_key}: "
    f"{len(here.windows)} collective(s), scheduled: {here.scheduled}, "
    f"windows with compute: {sum(w.has_compute for w in here.windows)}"
)
for (target, name), sched in scheds.items():
    frac = sched.overlapped_fraction or 0.0
    record.record(f"overlap_fraction_{target}_{name}", frac, "fraction")
hlo_tmp.cleanup()

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
#   kernels go; read them before guessing. Split kernel by kernel, the
#   trace's parts add up to the benchmark's step; on a TPU v5e the best
#   rung JAX differentiates spends almost all its time in matmul kernels,
#   so levers that remove other work cannot close the rest of its gap,
#   while the `scan` step spends two thirds of its time in the loop's
#   kernels beside the matmuls.
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
ceiling_fraction = {row["rung"]: row["of measured ceiling"] for row in ladder_rows}
target_09_2, why = check.exercise_target(ceiling_fraction)
print(why)

# %% tags=["exercise", "ex09_2"]
rungs_at_target = ...  # a list of rung names from the table, e.g. ["scan_f32"]

# %%
check.rungs_reaching(rungs_at_target, ceiling_fraction, target_09_2)

# %% [markdown]
# **09.3 · Which bound, and what would change it?** The table below is the
# plain step's schedule on 8 x H200, from section 8. Which bound of the
# cost model does this program earn (one of `check.BOUNDS`), and which of
# `check.CHANGES` would put compute inside a window on this GPU (the
# section compiled both)? Answer with the pair.

# %%
fractions_09_3 = {}
if plain is not None:
    display(show.table(plain.rows(), caption="Plain jit step, 8 x H200"))
    fractions_09_3 = {
        label: (scheds[("h200", name)].overlapped_fraction or 0.0)
        for label, name in (
            ("plain", "plain"),
            (check.CHANGES[0], "small_threshold"),
            (check.CHANGES[1], "o1"),
        )
        if ("h200", name) in scheds
    }
print("bounds:", check.BOUNDS, "\nchanges:", check.CHANGES)

# %% tags=["exercise", "ex09_3"]
overlap_09_3 = ...  # a pair: (one of check.BOUNDS, one of check.CHANGES)

# %%
check.overlap_bound(overlap_09_3, fractions_09_3)
