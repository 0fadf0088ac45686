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
# Measure the all-reduce itself (a timed `psum`) beside the datasheet link.
# Then change the model's depth and the per-device batch yourself with the
# controls at the end.
#
# **Assumes.** Notebooks 04 and 05 (the data-parallel steps). At least 2
# devices.
#
# **Time**: under 30 s with `smoke`, under 30 s with `cpu`, on a 2-core CPU; under 30 s with `cpu`
# (on 8 simulated CPU devices), on 1 x TPU v5 lite (measured; other work slows it: the run's
# details, its load included, are in `baselines/timings.json`).

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for multi-device lessons
BLOCK_UNROLL = 1  # 1: lax.scan (the default); k: scan(unroll=k); "full": Python loop (see 09)
COMPUTE_DTYPE = "float32"  # "bfloat16": mixed precision with float32 master weights (notebook 09)

# %%
from dpcourse.lesson import start_lesson

lesson = start_lesson("07_sweep", PROFILE, N_CPU_DEVICES, min_devices=2)
# The step's form comes from the parameters cell: the defaults give the
# course's step; notebook 09's faster rungs are one change away.
cfg = lesson.cfg.with_overrides(block_unroll=BLOCK_UNROLL, compute_dtype=COMPUTE_DTYPE)
dataset = lesson.dataset

# %%
import jax
import numpy as np
from IPython.display import display
from jax.sharding import Mesh

from dpcourse import bench, config, costs, memory, model, placement, record, show, train

devs = lesson.devices.devices
lesson.check_global_mesh()  # a mesh you set with jax.set_mesh must be this lesson's, or none
n = len(devs)
mesh = Mesh(np.array(devs), ("data",))
optimizer = train.make_optimizer(cfg)
init_host = model.init_params(cfg)
sweep_sizes, rounded = bench.sizes_for_devices(
    cfg.sweep_global_batches, n
)  # e.g. 3 devices: 256 -> 255
print(f"{lesson.devices.label}; sweep over global batches {sweep_sizes}")
if rounded:
    print(
        f"rounded to multiples of {n} devices, so every device gets the same batch: "
        f"{', '.join(rounded)}"
    )

# %% [markdown]
# ## 1. One size, start to finish
#
# For each global batch: place fresh parameters and the batches, compile the
# explicit data-parallel step of notebook 05 for that shape, benchmark it.
# The profile's sizes were rounded above to multiples of the device count
# (`bench.sizes_for_devices`); `bench.sweep` skips any size that still does
# not divide (one you add by hand, say) with the reason, records a size
# that fails (for example out of memory) and goes on,
# and calls `cleanup` after every size so no buffers leak into the next one.
#
# The step **donates** its parameters and optimizer state
# (`donate_argnums=(0, 1)`): XLA may write the new values into the old
# buffers instead of holding both, which is the first thing to try when a
# step runs out of memory. A donated array is gone after the call (using it
# again raises an error), so only arrays the loop replaces are donated:
# here every size places fresh parameters and threads them from step to
# step, never reusing an input.

# %%
step = jax.jit(train.make_shard_map_step(cfg, optimizer, mesh), donate_argnums=(0, 1))


def run_one(global_batch):
    placed = placement.place_data_parallel(cfg, dataset, mesh, optimizer, init_host, global_batch)
    result, _, _ = bench.benchmark(
        step,
        placed.params,
        placed.opt_state,
        placed.batches,
        cfg,
        label=f"global batch {global_batch}",
    )
    return result


live_after = []


def cleanup():
    _, after = memory.free({})
    live_after.append(after)


baseline_live = memory.live_buffers()
points = bench.sweep(sweep_sizes, n, run_one, cleanup)

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
    errors = [
        (fit.examples_per_s(b) - pt.result.examples_per_s) / pt.result.examples_per_s
        for b, pt in zip(sizes, ok)
    ]
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
            caption=f"Fit: overhead {fit.overhead_s * 1e3:.2f} ms + "
            f"{fit.per_example_s * 1e6:.2f} µs per example",
        )
    )
    if fit.through_origin:
        print(
            "The best straight line had a negative overhead, which is not physical:\n"
            "the fit was redone through zero, so the model is a constant throughput."
        )
    # A two-parameter line through two points is exact: judge only from three or more.
    print(costs.judge_fit(len(ok), max(errors, key=abs)))

# %%
import matplotlib.pyplot as plt

peak = costs.find_peak(devs[0].device_kind)

fig, ax = plt.subplots(figsize=(6.5, 3.6))
if ok:
    ax.plot(sizes, [pt.result.examples_per_s for pt in ok], "o-", label="measured")
if fit is not None:
    grid = np.geomspace(min(sizes), max(sizes), 50)
    ax.plot(
        grid,
        [fit.examples_per_s(b) for b in grid],
        "--",
        label="fit: overhead + per-example time",
    )
if peak is not None and ok:
    # The peak of the precision a float32 matmul runs at: TF32 on a GPU, bf16 on a TPU.
    bound = n * peak.peak() / model.train_flops_per_example(cfg)
    ax.axhline(
        bound,
        color="grey",
        linestyle=":",
        label=f"{n} x {peak.float32_matmul.upper()} peak ({peak.name})",
    )
for pt in points:
    if pt.status != "ok":
        ax.axvline(pt.global_batch, color="red", alpha=0.3)
ax.set_xscale("log", base=2)
ax.set_xlabel("global batch (examples)")
ax.set_ylabel("examples/s")
ax.set_title(
    f"Throughput vs global batch, {lesson.devices.label} ({dataset.source} data)",
    fontsize=9,
)
ax.legend(fontsize=8)
if lesson.devices.simulated:
    fig.text(
        0.01,
        -0.02,
        "Simulated CPU devices add no compute: read the shape of the curve, not its height.",
        fontsize=8,
    )
fig.tight_layout()
sweep_png = show.figure(
    fig, "sweep"
)  # saves the PNG beside the results, shows it whatever the backend
# %% [markdown]
# **Reading it.** Where the model fits, throughput climbs with the batch
# while the fixed overhead is spread over more examples, and flattens once
# the time per example dominates; on real GPUs the flat part sits below the
# peak line. In this model the all-reduce is part of the fixed overhead,
# which the plateau has already spread to nothing, so the gap is the MFU
# lost inside the per-example time: element-wise work and memory traffic.
# Where it does not fit, the measurements say
# something the model leaves out. A common case on CPUs: throughput *falls*
# at the largest sizes, once a per-device batch's activations no longer fit
# the caches, so the time per example itself grows. On simulated devices
# the runs are also noisy (shared cores). Red lines mark sizes that were
# skipped or failed.
#
# ## 3. The all-reduce, measured
#
# The cost model's all-reduce term comes from a datasheet bandwidth. Measure
# it instead: time a `lax.psum` over all devices (inside `shard_map`, as the
# step does) at a few sizes up to the full model's gradient, and fit the ring
# model `t = 2 (N - 1) x latency + 2 (N - 1) / N x bytes / bandwidth`. The
# fitted bandwidth is the "bus bandwidth" a ring would need per link, the
# figure comparable with the datasheet's one-way link speed; the latency is
# the fixed cost of each of the ring's `2 (N - 1)` steps, which for a
# gradient of a few MB over NVLink can be the same order as the bandwidth
# term.

# %%
from dpcourse.perf import linkbench

full_grad = costs.gradient_bytes(config.make_config("full"))
link_points = linkbench.measure(mesh, [4_096, 65_536, 1_048_576, full_grad])
try:
    link = linkbench.fit_link(link_points, n)
except ValueError as err:  # timings too noisy to fit: show them, skip the model
    link = None
    print(f"No link fit: {err}")
display(
    show.table(
        [
            {
                "bytes per device": p.n_bytes,
                "size of": "the full profile's gradient" if p.n_bytes == full_grad else "",
                "measured µs": p.seconds * 1e6,
                "ring model µs": None
                if link is None
                else costs.ring_allreduce_s(p.n_bytes, n, link.bus_bytes_per_s, link.latency_s)
                * 1e6,
                "bus bandwidth GB/s": p.bus_bytes_per_s / costs.GB,
            }
            for p in link_points
        ],
        caption=f"Timed psum over {lesson.devices.label} (median of 3 x 8 chained all-reduces)",
    )
)
if link is not None:
    print(
        f"Fitted: {link.latency_s * 1e6:.2f} µs per ring step, "
        f"bus bandwidth {link.bus_bytes_per_s / costs.GB:.2f} GB/s."
    )
if lesson.devices.simulated:
    print(
        "Simulated devices: the 'link' is a copy through this host's memory; "
        "no datasheet link to compare."
    )
elif peak is not None:
    print(
        f"Datasheet: {peak.link}, {peak.link_bytes_per_s / costs.GB:.0f} GB/s each way "
        f"({peak.source})."
    )
else:
    print(
        f"No datasheet link is listed for {devs[0].device_kind}: "
        "the measurement is the only figure."
    )
for label, bytes_per_value in (("float32", 4), ("bfloat16", 2)) if link is not None else ():
    b = costs.gradient_bytes(cfg, bytes_per_value)
    t = costs.ring_allreduce_s(b, n, link.bus_bytes_per_s, link.latency_s)
    print(
        f"All-reduce of this lesson's {label} gradient ({b / 1e6:.3f} MB), "
        f"measured link: {t * 1e3:.3f} ms"
    )
if fit is not None:
    print(f"Fitted overhead per step, for scale: {fit.overhead_s * 1e3:.3f} ms.")

# %% [markdown]
# The same all-reduce of the `full` profile's gradient on the datasheet
# links, without and with their latencies: two GPU rings, with NCCL's
# latencies from its tuning tables (8.4 µs a call, 3.4 µs a ring step over
# NVLink, 5.7 µs over PCIe);
# and two TPU v5e slices over ICI, about 1 µs a hop (Austin et al., "How
# to Scale Your Model"). A v5e-8 is a 2 x 4 mesh without wraparound links,
# a v5e-256 a 16 x 16 torus; the model over a slice's axes is
# `costs.ici_allreduce_s`'s.

# %%
datasheet_rows = []
for label, kind, shape in (
    ("8 x L4, PCIe Gen4 x16", "NVIDIA L4", (8,)),
    ("8 x H200, NVLink4", "NVIDIA H200", (8,)),
    ("v5e-8, ICI", "TPU v5 lite", (2, 4)),
    ("v5e-256, ICI", "TPU v5 lite", (16, 16)),
):
    sheet = costs.find_peak(kind)
    if sheet.is_tpu:
        bare = costs.tpu_slice_allreduce_s(full_grad, sheet, shape, latency=False)
        with_latency = costs.tpu_slice_allreduce_s(full_grad, sheet, shape)
    else:
        bare = costs.ring_allreduce_s(full_grad, shape[0], sheet.link_bytes_per_s)
        with_latency = sheet.collective_latency_s + costs.ring_allreduce_s(
            full_grad, shape[0], sheet.link_bytes_per_s, sheet.hop_latency_s
        )
    datasheet_rows.append(
        {
            "machine": costs.slice_name(sheet, shape) if sheet.is_tpu else label,
            "link, each way": f"{sheet.link} {sheet.link_bytes_per_s / costs.GB:.0f} GB/s",
            "bandwidth only µs": bare * 1e6,
            "with latency µs": with_latency * 1e6,
        }
    )
display(
    show.table(
        datasheet_rows,
        caption=f"Modelled all-reduce of {full_grad / 1e6:.2f} MB (the full profile's gradient)",
    )
)

# %% [markdown]
# Three readings. **bfloat16 gradients** (cast before the `pmean`, back to
# float32 for the update) halve the all-reduce bytes and so its bandwidth
# term; the latency term stays. **No overlap is an estimate, not a
# bound**: the model adds the all-reduce after the compute, which is what
# this step does (gradients and metrics go in one all-reduce after the
# backward pass, and the update needs its result: nothing is left to
# overlap it with, whether or not XLA's latency-hiding scheduler runs, which
# it does for Hopper-class targets such as the H200), so the sum is the
# expected case; a datasheet link with no
# latency makes its all-reduce term err low, and a step that does overlap
# would be shorter. A profiler trace (`jax.profiler`) shows what happened.
# **Measured beats datasheet**: a ring can fall short of the
# link's peak, and on PCIe systems the path through the CPU's host bridge
# (`nvidia-smi topo -m`, notebook 01) sets the real figure.

# %%
figs = {
    "allreduce_full_profile_gradient": (link_points[-1].seconds * 1e6, "us"),
    "sizes_ok": (len(ok), "count"),
    "sizes_skipped": (sum(pt.status == "skipped" for pt in points), "count"),
    "sizes_failed": (sum(pt.status == "failed" for pt in points), "count"),
}
if link is not None:
    figs["allreduce_latency_per_step"] = (link.latency_s * 1e6, "us")
    figs["allreduce_bus_bandwidth"] = (link.bus_bytes_per_s / costs.GB, "GB/s")
for pt in ok:
    figs[f"throughput_global_batch_{pt.global_batch}"] = (pt.result.examples_per_s, "examples/s")
    figs[f"ms_per_step_global_batch_{pt.global_batch}"] = (pt.result.ms_per_step, "ms")
if fit is not None:
    figs["fit_overhead"] = (fit.overhead_s * 1e3, "ms")
    figs["fit_per_example"] = (fit.per_example_s * 1e6, "us")
if ok:
    best = max(ok, key=lambda pt: pt.result.examples_per_s)
    figs["throughput"] = (best.result.examples_per_s, "examples/s")
    figs["final_loss"] = (best.result.final_loss, "loss")
    figs["final_accuracy"] = (best.result.final_accuracy, "fraction")
_ = record.figures(figs)

# %% [markdown]
# ## 4. Try it yourself
#
# Change BLOCK_REPEATS (compute per example, same gradient size) and the
# per-device batch, then re-run the 1-device vs N-device comparison at the
# same global batch. With real GPUs, more compute per byte of gradient
# brings the speed-up closer to N. A short benchmark (1 warm-up, 1 x 3
# steps) keeps each click quick. Run headless, the controls show their
# defaults and the comparison below runs once with them; without
# `ipywidgets` the controls are skipped and the comparison still runs.
#
# The table reports per-device throughput and the **scaling efficiency**,
# N-device throughput / (N x one-device throughput): 1.0 is perfect. On real
# devices, N devices slower than one is flagged **communication-bound**
# (the all-reduce and synchronisation cost more than the extra devices
# add). The RNG setting `jax_threefry_partitionable` (how `jax.random`
# splits random bits over sharded arrays) is recorded with the figures, as
# it changes what the step computes when a model draws random numbers.
#
#
#
# The one-device run happens inside `with jax.set_mesh(one_device)`, a mesh
# of the first device only: if you made the lesson's mesh global
# (`jax.set_mesh(mesh)` without `with`, as notebook 03 allows), a
# one-device step would otherwise be refused, since its arrays live on one
# of the mesh's devices only.


# %%
def compare_devices(block_repeats, per_device_batch):
    """Throughput on 1 device vs all N devices, same global batch, for a modified config."""
    c = cfg.with_overrides(
        block_repeats=block_repeats,
        per_device_batch=per_device_batch,
        n_batches=2,
    )
    opt = train.make_optimizer(c)
    gb = c.global_batch(n)
    host_params = model.init_params(c)
    many = placement.place_data_parallel(c, dataset, mesh, opt, host_params, gb)
    one_device = Mesh(np.array(devs[:1]), ("data",))
    out = []
    for label, on_mesh, k in (("1 device", one_device, 1), (f"{n} devices", mesh, n)):
        with jax.set_mesh(on_mesh):
            if k == 1:
                placed = placement.place_single_device(c, dataset, devs[0], opt, host_params, gb)
                st = jax.jit(train.make_train_step(c, opt), donate_argnums=(0, 1))
            else:
                placed = many
                st = jax.jit(train.make_shard_map_step(c, opt, mesh), donate_argnums=(0, 1))
            r = run_comparison(st, placed, label, k, gb)
        out.append(r)
    return out


def run_comparison(st, placed, label, k, gb):
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
    return r


def show_comparison(rows):
    display(show.records_table(rows, dataset.source))
    sc = costs.scaling(
        rows[0].examples_per_s,
        rows[1].examples_per_s,
        n,
        simulated=lesson.devices.simulated,
    )
    display(
        show.key_values(
            {
                "per-device throughput, 1 device (examples/s)": sc.one_examples_per_s,
                f"per-device throughput, {n} devices (examples/s)": sc.per_device_examples_per_s,
                f"speed-up, {n} devices / 1": sc.speedup,
                "scaling efficiency": sc.efficiency,
                "jax_threefry_partitionable": jax.config.jax_threefry_partitionable,
            },
            caption=f"1 device vs {n}, global batch {rows[0].global_batch}",
        )
    )
    if sc.verdict == "simulated":
        display(
            show.banner(
                "Simulated devices: these ratios reflect scheduling on shared cores, not scaling.",
                "note",
            )
        )
    elif sc.verdict == "communication-bound":
        display(
            show.banner(
                f"Communication-bound: {n} devices are slower than one. Give each device "
                "more compute per gradient byte (larger per-device batch or BLOCK_REPEATS), "
                "or check the link (section 3).",
                "warning",
            )
        )
    return sc


widgets = show.optional_widgets()
if widgets is not None:
    # "initial": the label takes the width its text needs (else it is cut).
    label = {"description_width": "initial"}
    repeats_slider = widgets.IntSlider(
        value=cfg.block_repeats,
        min=1,
        max=max(4 * cfg.block_repeats, 8),
        description="BLOCK_REPEATS",
        style=label,
    )
    batch_slider = widgets.IntSlider(
        value=cfg.per_device_batch,
        min=1,
        max=4 * cfg.per_device_batch,
        description="per-device batch",
        style=label,
    )
    button = widgets.Button(description="re-run comparison")
    output = widgets.Output()

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
comparison = show_comparison(compare_devices(cfg.block_repeats, cfg.per_device_batch))
record.figures(
    {
        "scaling_efficiency": (comparison.efficiency, "ratio"),
        "per_device_throughput_n": (comparison.per_device_examples_per_s, "examples/s"),
        "scaling_verdict": (comparison.verdict or "scales", "text"),
        "jax_threefry_partitionable": (bool(jax.config.jax_threefry_partitionable), "flag"),
    }
)
record.figures(
    {"per_device_throughput_1": (comparison.one_examples_per_s, "examples/s")}, device_count=1
)
print(
    f"scaling efficiency {comparison.efficiency:.3f} "
    f"({comparison.verdict or 'real devices, faster than one'})"
)

# %% [markdown]
# ## What you learned
#
# - A sweep must survive its failures: skip what cannot divide, record what
#   fails, free buffers every time.
# - Throughput over batch size is modelled as "fixed overhead + per-example
#   time"; the fixed part includes the gradient all-reduce, which does not
#   grow with the batch, so where the model holds it stops counting at the
#   plateau. Whether it holds is a measurement: section 2's line says how
#   far it missed this run's sizes (simulated devices on a shared host can
#   miss it by far).
# - More compute per gradient byte (BLOCK_REPEATS, per-device batch) is what
#   lets data parallelism scale; scaling efficiency says how well it does.
# - The all-reduce can be measured (a timed `psum`): a latency per ring step
#   plus bytes over a bus bandwidth. bfloat16 gradients halve the bytes; the
#   cost model's "no overlap" sum is an estimate, not a bound.
# - Donating the step's parameters and optimizer state (`donate_argnums`)
#   lets XLA update them in place: the first answer to out-of-memory.
#
# **What comes next, past replicated data parallelism.** Every device here
# holds a full copy of the parameters and of AdamW's two moments, each as
# large as the parameters. Sharding the optimizer state (and then the
# gradients and parameters) over the `data` axis, ZeRO-style, keeps 1/N of
# it per device: with `jit`, give the optimizer state a
# `NamedSharding(mesh, P("data", ...))` on a dimension that divides by N.
# The all-reduce can then become a reduce-scatter of the gradients and an
# all-gather of the updated parameters, which together move the bytes of
# one ring all-reduce; read the compiled program's collectives (notebook
# 04) to see what XLA chose.
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
