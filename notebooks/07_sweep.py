# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Global batch sweep
#
# **Goal.** Measure throughput over a range of global batch sizes on all
# devices, survive the sizes that cannot run, and compare the measurements
# with a simple cost model: a fixed time per step plus a time per example.
# Then change the model's depth and the per-device batch yourself with the
# controls at the end.
#
# **Assumes.** Notebooks 04 and 05 (the data-parallel steps). At least 2
# devices.
#
# **Time** (measured on a 2-core CPU with 8 simulated devices): `smoke`
# about 10 seconds; `cpu` 35 to 55 seconds.
# `full`: not yet measured on a GPU (none was available when this was
# written); a GPU run's `results.json` records it.

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for multi-device lessons

# %%
from dpcourse.session import start_lesson

lesson = start_lesson("07_sweep", PROFILE, N_CPU_DEVICES, min_devices=2)
cfg, dataset = lesson.cfg, lesson.dataset

# %%
import jax
import numpy as np
from IPython.display import display
from jax.sharding import Mesh

from dpcourse import bench, costs, memory, model, placement, results, train
from dpcourse import display as show

devs = lesson.devices.devices
n = len(devs)
mesh = Mesh(np.array(devs), ("data",))
optimizer = train.make_optimizer(cfg)
init_host = model.init_params(cfg)
print(f"{lesson.devices.label}; sweep over global batches {list(cfg.sweep_global_batches)}")

# %% [markdown]
# ## 1. One size, start to finish
#
# For each global batch: place fresh parameters and the batches, compile the
# explicit data-parallel step of notebook 05 for that shape, benchmark it.
# `bench.sweep` skips sizes that do not divide by the device count (with the
# reason), records a size that fails (for example out of memory) and goes on,
# and calls `cleanup` after every size so no buffers leak into the next one.

# %%
step = jax.jit(train.make_shard_map_step(cfg, optimizer, mesh))


def run_one(global_batch):
    placed = placement.place_data_parallel(cfg, dataset, mesh, optimizer, init_host, global_batch)
    result, _, _ = bench.benchmark(
        step,
        placed.params,
        placed.opt_state,
        placed.batches,
        warmup_steps=cfg.warmup_steps,
        repeats=cfg.repeats,
        steps=cfg.steps,
        label=f"global batch {global_batch}",
        n_devices=n,
        global_batch=global_batch,
    )
    return result


live_after = []


def cleanup():
    _, after = memory.free({})
    live_after.append(after)


baseline_live = memory.live_buffers()
points = bench.sweep(cfg.sweep_global_batches, n, run_one, cleanup)

# %%
display(
    show.table(
        [
            {
                "global batch": pt.global_batch,
                "per-device batch": pt.global_batch // n if pt.status == "ok" else None,
                "status": pt.status,
                "ms/step": pt.result.ms_per_step if pt.result else None,
                "examples/s": pt.result.examples_per_s if pt.result else None,
                "reason": pt.reason,
                "data": dataset.source,
            }
            for pt in points
        ],
        caption=f"Sweep on {lesson.devices.label}",
    )
)
print("live buffers before the sweep:", baseline_live)
print("after each size:", ", ".join(str(b.count) for b in live_after))
assert all(b.bytes <= baseline_live.bytes for b in live_after), "buffers leaked between sizes"

# %% [markdown]
# ## 2. The cost model against the measurement
#
# Fit `step time = overhead + per_example x global batch` to the sizes that
# ran. The overhead collects what does not grow with the batch (launching
# kernels, the optimizer update, the gradient all-reduce, whose size depends
# on the parameters only); the slope is the compute per example. Beside it,
# where the device's peak is known, the throughput the hardware could reach
# at that peak.

# %%
ok = [pt for pt in points if pt.status == "ok"]
sizes = [pt.global_batch for pt in ok]
step_s = [pt.result.ms_per_step / 1000.0 for pt in ok]
fit = None
try:
    fit = costs.fit_step_time(sizes, step_s)
except ValueError as err:
    print(f"No fit: {err}")
if fit is not None:
    errors = [(fit.examples_per_s(b) - pt.result.examples_per_s) / pt.result.examples_per_s for b, pt in zip(sizes, ok)]
    display(
        show.table(
            [
                {
                    "global batch": b,
                    "measured examples/s": pt.result.examples_per_s,
                    "model examples/s": fit.examples_per_s(b),
                    "model error": f"{e:+.1%}",
                }
                for b, pt, e in zip(sizes, ok, errors)
            ],
            caption=f"Fit: overhead {fit.overhead_s * 1e3:.2f} ms + {fit.per_example_s * 1e6:.2f} µs per example",
        )
    )
    if fit.through_origin:
        print(
            "The best straight line had a negative overhead, which is not physical: the fit was redone "
            "through zero, so the model is a constant throughput."
        )
    worst = max(errors, key=abs)
    print(
        f"Largest model error: {worst:+.1%}. "
        + (
            "The model describes these measurements well."
            if abs(worst) < 0.10
            else "The model misses some sizes by more than 10%: see the reading below."
        )
    )
    peak = costs.find_peak(devs[0].device_kind)
    if peak is not None:
        ar_s = costs.ring_allreduce_s(costs.gradient_bytes(cfg), n, peak.link_bytes_per_s)
        print(f"Of the overhead, the ring all-reduce over {peak.link} accounts for about {ar_s * 1e3:.3f} ms.")

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6.5, 3.6))
if ok:
    ax.plot(sizes, [pt.result.examples_per_s for pt in ok], "o-", label="measured")
if fit is not None:
    grid = np.geomspace(min(sizes), max(sizes), 50)
    ax.plot(grid, [fit.examples_per_s(b) for b in grid], "--", label="fit: overhead + per-example time")
peak = costs.find_peak(devs[0].device_kind)
if peak is not None and ok:
    bound = n * peak.peak("tf32") / model.train_flops_per_example(cfg)
    ax.axhline(bound, color="grey", linestyle=":", label=f"{n} x TF32 peak ({peak.name})")
for pt in points:
    if pt.status != "ok":
        ax.axvline(pt.global_batch, color="red", alpha=0.3)
ax.set_xscale("log", base=2)
ax.set_xlabel("global batch (examples)")
ax.set_ylabel("examples/s")
ax.set_title(f"Throughput vs global batch, {lesson.devices.label} ({dataset.source} data)", fontsize=9)
ax.legend(fontsize=8)
if lesson.devices.simulated:
    fig.text(
        0.01, -0.02, "Simulated CPU devices add no compute: read the shape of the curve, not its height.", fontsize=8
    )
fig.tight_layout()
results.save_figure(fig, "sweep")
# %% [markdown]
# **Reading it.** Where the model fits, throughput climbs with the batch
# while the fixed overhead is spread over more examples, and flattens once
# the time per example dominates; on real GPUs the flat part sits below the
# peak line, and the gap is the MFU lost to element-wise work, memory
# traffic and the all-reduce. Where it does not fit, the measurements say
# something the model leaves out. A common case on CPUs: throughput *falls*
# at the largest sizes, once a per-device batch's activations no longer fit
# the caches, so the time per example itself grows. On simulated devices
# the runs are also noisy (shared cores). Red lines mark sizes that were
# skipped or failed.

# %%
for pt in points:
    if pt.status == "ok":
        results.record(f"throughput_global_batch_{pt.global_batch}", pt.result.examples_per_s, "examples/s")
        results.record(f"ms_per_step_global_batch_{pt.global_batch}", pt.result.ms_per_step, "ms")
results.record("sizes_ok", len(ok), "count")
results.record("sizes_skipped", sum(pt.status == "skipped" for pt in points), "count")
results.record("sizes_failed", sum(pt.status == "failed" for pt in points), "count")
if fit is not None:
    results.record("fit_overhead", fit.overhead_s * 1e3, "ms")
    results.record("fit_per_example", fit.per_example_s * 1e6, "us")
if ok:
    best = max(ok, key=lambda pt: pt.result.examples_per_s)
    results.record("throughput", best.result.examples_per_s, "examples/s")
    results.record("final_loss", best.result.final_loss, "loss")
    results.record("final_accuracy", best.result.final_accuracy, "fraction")

# %% [markdown]
# ## 3. Try it yourself
#
# Change BLOCK_REPEATS (compute per example, same gradient size) and the
# per-device batch, then re-run the 1-device vs N-device comparison. With
# real GPUs, more compute per byte of gradient brings the ratio closer to N.
# A short benchmark (1 warm-up, 1 x 3 steps) keeps each click quick. Run
# headless, the controls show their defaults and the comparison below runs
# once with them.

# %%
import ipywidgets as widgets


def compare_devices(block_repeats, per_device_batch):
    """Throughput on 1 device vs all N devices for a modified config."""
    c = cfg.with_overrides(block_repeats=block_repeats, per_device_batch=per_device_batch, n_batches=2)
    opt = train.make_optimizer(c)
    gb = c.global_batch(n)
    host_params = model.init_params(c)
    one = placement.place_single_device(c, dataset, devs[0], opt, host_params, gb)
    many = placement.place_data_parallel(c, dataset, mesh, opt, host_params, gb)
    out = []
    for label, st, placed, k in (
        ("1 device", jax.jit(train.make_train_step(c, opt)), one, 1),
        (f"{n} devices", jax.jit(train.make_shard_map_step(c, opt, mesh)), many, n),
    ):
        r, _, _ = bench.benchmark(
            st,
            placed.params,
            placed.opt_state,
            placed.batches,
            warmup_steps=1,
            repeats=1,
            steps=3,
            label=label,
            n_devices=k,
            global_batch=gb,
        )
        out.append(r)
    return out


repeats_slider = widgets.IntSlider(
    value=cfg.block_repeats, min=1, max=max(4 * cfg.block_repeats, 8), description="BLOCK_REPEATS"
)
batch_slider = widgets.IntSlider(
    value=cfg.per_device_batch, min=1, max=4 * cfg.per_device_batch, description="per-device batch"
)
button = widgets.Button(description="re-run comparison")
output = widgets.Output()


def show_comparison(rows):
    display(show.records_table(rows, dataset.source))
    print(
        f"ratio {n} devices / 1 device: {rows[1].examples_per_s / rows[0].examples_per_s:.2f}"
        + (" (simulated devices: scheduling, not scaling)" if lesson.devices.simulated else "")
    )


def on_click(_):
    with output:
        output.clear_output()
        show_comparison(compare_devices(repeats_slider.value, batch_slider.value))


button.on_click(on_click)
display(widgets.VBox([repeats_slider, batch_slider, button, output]))

# %% [markdown]
# The comparison at the defaults, run once here so that it shows in every
# copy of the notebook (the widget area above stays empty until you click):

# %%
show_comparison(compare_devices(cfg.block_repeats, cfg.per_device_batch))

# %%
before, after = memory.free(globals(), "step")
print("freed:", before, "->", after)

# %% [markdown]
# ## What you learned
#
# - A sweep must survive its failures: skip what cannot divide, record what
#   fails, free buffers every time.
# - Throughput over batch size fits "fixed overhead + per-example time"; the
#   fixed part includes the gradient all-reduce, which does not grow with the
#   batch.
# - More compute per gradient byte (BLOCK_REPEATS, per-device batch) is what
#   lets data parallelism scale.
#
# **Next:** [08_multihost](08_multihost.ipynb) runs the same step as several
# cooperating processes with `jax.distributed`. To run the course on GKE
# GPUs, see the README.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
from dpcourse.exercises import lesson07 as check

# %% [markdown]
# **07.1 · Where does throughput stop growing?** Take only two points of the
# sweep, the smallest and the largest global batch that ran (`points`, with
# `pt.result.ms_per_step`), and fit `step_s = a + b x B` through them.
# Predict the plateau throughput (examples/s as B grows without bound) and
# the global batch at which throughput reaches 90 % of it. If `a` or `b`
# is not positive there is no plateau: answer `(None, None)`. Then compare
# with the sweep's table.

# %% tags=["exercise", "ex07_1"]
plateau_answer = ...  # (plateau_examples_per_s, global_batch_at_90_percent)

# %%
check.plateau(plateau_answer, points)

# %% [markdown]
# **07.2 · The all-reduce in the overhead.** Predict the time, in ms, of one
# ring all-reduce of this profile's float32 gradient (`costs.gradient_bytes(cfg)`)
# over 4 GPUs linked by PCIe Gen4 x16 (32 GB/s each way), bandwidth-bound.

# %% tags=["exercise", "ex07_2"]
allreduce_ms = ...  # a number, in ms

# %%
check.allreduce_ms(allreduce_ms, cfg)
