# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Beyond one machine: multi-controller JAX
#
# **Goal.** Run the data-parallel step of notebook 05 the way it runs on
# several hosts: as several cooperating processes, each driving only its own
# devices and loading only its own part of every batch, joined by JAX's
# distributed runtime. Here the "hosts" are processes on this machine with
# simulated CPU devices each (2 processes x 4 devices with the course's 8
# CPU devices; a split that fits is chosen when the kernel has fewer); the
# result must equal the single-process run on as many devices. Then: what
# changes on real GPU hosts.
#
# **Assumes.** Notebook 05 (the `shard_map` step). Any machine: the processes
# use simulated CPU devices, even where GPUs exist.
#
# **Time**: under 30 s with `smoke`, under 30 s with `cpu`, on a 2-core CPU; under 30 s with `full`,
# on 1 x TPU v5 lite (measured; other work slows it: the run's details, its load included, are in
# `baselines/timings.json`).

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices in this kernel (the reference run)
N_PROCESSES = None  # processes ("hosts") on this machine; None: chosen (2 with 8 CPU devices)
DEVICES_PER_PROCESS = None  # simulated CPU devices per process; None: chosen (4 with 8)
STEPS = 3  # training steps to compare
LAUNCH_TIMEOUT_S = 180  # the whole multi-process run ends (every process) past this

# %%
import jax

from dpcourse.lesson import start_lesson
from dpcourse.multihost import plan as multihost_plan

lesson = start_lesson("08_multihost", PROFILE, N_CPU_DEVICES, min_devices=2, load_data=False)
cfg = lesson.cfg
# The reference run in this kernel needs N_PROCESSES x DEVICES_PER_PROCESS CPU
# devices: choose a split that fits the CPU devices this kernel has (or check
# yours; the error says which values to set).
N_PROCESSES, DEVICES_PER_PROCESS = multihost_plan.choose_split(
    len(jax.devices("cpu")),
    N_PROCESSES,
    DEVICES_PER_PROCESS,
)
N_DEVICES = N_PROCESSES * DEVICES_PER_PROCESS

# %%
import numpy as np
from IPython.display import display
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import config, costs, data, model, record, show, train
from dpcourse.multihost import distributed, launcher, ports, worker

if cfg.profile == "full":  # the worker processes run on CPU, where the full size takes far too long
    cfg = config.make_config("cpu")
    display(
        show.banner(
            "The multi-process run uses simulated CPU devices: this lesson uses the 'cpu' profile.",
            "warning",
        )
    )
cpu_devs = jax.devices("cpu")[:N_DEVICES]
lesson.check_global_mesh()  # a mesh you set with jax.set_mesh must be this lesson's, or none
dataset = data.load_fashion_mnist(limit=cfg.max_train_examples, seed=cfg.seed)
display(show.data_banner(dataset.source, dataset.note))
# Every figure below was measured on CPU devices (the workers' and this kernel's).
record.set_context(
    "08_multihost",
    cfg.profile,
    dataset.source,
    "cpu",
    cpu_devs[0].device_kind,
    N_DEVICES,
)
global_batch = cfg.global_batch(N_DEVICES)
print(
    f"profile {cfg.profile}; {N_PROCESSES} processes x {DEVICES_PER_PROCESS} devices; "
    f"global batch {global_batch}"
)

# %% [markdown]
# ## 1. One program, many controllers
#
# Until now one Python process drove every device: a **single controller**.
# Across hosts that cannot work: a process only reaches the devices of its
# own machine. JAX's answer is **multi-controller** execution:
#
# - **Every process runs the same program.** There is no "main" script
#   sending work to the others; each process traces and compiles the same
#   step and runs it on its own devices. Process 0 is special in two small
#   ways only: it hosts the coordinator, and by convention it alone prints
#   and writes record.
# - **`jax.distributed.initialize(coordinator_address, num_processes,
#   process_id)`** must come first, before anything starts a JAX backend.
#   Process 0 starts a small coordination service on `coordinator_address`;
#   every process (0 included) connects to it, and they exchange which
#   devices each has. The service also watches heartbeats, so that when a
#   process dies the others stop instead of waiting forever.
# - **Global vs local devices.** Afterwards `jax.devices()` lists the
#   devices of *all* processes (`jax.device_count()`), while
#   `jax.local_devices()` lists this process's (`jax.local_device_count()`).
#   A `Mesh` is built over the global devices; a global array has shards on
#   every process's devices, and each process holds only its own
#   (`addressable_shards`).
# - **Who loads which data.** No process has the whole global batch. Each
#   process loads the rows its own devices hold and builds its part of the
#   global array with **`jax.make_array_from_process_local_data(sharding,
#   local_rows, global_shape)`**.
# - **Collectives cross processes.** The `lax.pmean` of notebook 05 now
#   averages over devices in different processes: over TCP with **gloo** on
#   CPU (`jax_cpu_collectives_implementation`), with **NCCL** on GPUs.
#
# This notebook's kernel is an ordinary single process:

# %%
display(
    show.key_values(
        {
            "jax.process_index()": jax.process_index(),
            "jax.process_count()": jax.process_count(),
            "jax.device_count() (global)": jax.device_count(),
            "jax.local_device_count()": jax.local_device_count(),
        },
        caption="This kernel: one controller, every device local",
    )
)

# %% [markdown]
# ## 2. The program every process runs
#
# `dpcourse.multihost.distributed.initialize` reads three environment variables and
# passes them on; stripped of its checks, every process does
#
# ```python
# jax.config.update("jax_cpu_collectives_implementation", "gloo")
# jax.distributed.initialize(
#     coordinator_address=os.environ["DPCOURSE_COORDINATOR"],  # "unix:<folder>/coordinator.sock"
#     coordinator_bind_address=os.environ["DPCOURSE_COORDINATOR"], # process 0 listens there too
#     num_processes=int(os.environ["DPCOURSE_NUM_PROCESSES"]),     # 2 (N_PROCESSES)
#     process_id=int(os.environ["DPCOURSE_PROCESS_ID"]),           # 0 or 1 (0 to N_PROCESSES - 1)
#     initialization_timeout=20,   # seconds to wait for the others, then fail instead of hanging
# )
# ```
#
# and then the training program of `dpcourse.multihost.worker.train_worker`: the
# mesh over `jax.devices()` (global, in process order:
# `distributed.global_mesh`), the same initial parameters in every process
# (same seed), notebook 05's `shard_map` step unchanged, and results
# written by process 0 only. What is new is how a process gets its part of
# each batch. It reads from the sharding which rows its own devices hold,
# loads only those, and hands them to
# `jax.make_array_from_process_local_data` with the global shape. These
# two functions are the lesson's version of it (the workers run the
# package's, `worker.load_global_batches`); change them and re-run:


# %% tags=["lesson_process_rows"]
def rows_held(sharding, global_shape, devices, axis=1):
    """The [start, stop) ranges of dimension `axis` that `devices` hold, merged."""
    index = sharding.devices_indices_map(tuple(global_shape))
    spans = sorted({index[d][axis].indices(global_shape[axis])[:2] for d in devices})
    merged = [list(spans[0])]
    for start, stop in spans[1:]:
        if start <= merged[-1][1]:
            merged[-1][1] = max(stop, merged[-1][1])
        else:
            merged.append([start, stop])
    return [tuple(m) for m in merged]


def global_batches(mesh, dataset, n_batches, global_batch, local_devices):
    """This process's rows of every batch, as global arrays [n_batches, global_batch, ...]."""
    x_sharding = NamedSharding(mesh, P(None, "data", None))
    y_sharding = NamedSharding(mesh, P(None, "data"))
    x_shape = (n_batches, global_batch, data.N_FEATURES)
    rows = rows_held(x_sharding, x_shape, local_devices)
    x_local, y_local = distributed.process_local_batches(dataset, n_batches, global_batch, rows)
    x = jax.make_array_from_process_local_data(x_sharding, x_local, x_shape)
    y = jax.make_array_from_process_local_data(y_sharding, y_local, x_shape[:2])
    return rows, x, y


# %% [markdown]
# Which rows will each process load? This kernel has all the devices, so
# it can ask for each process's devices in turn (the mesh orders devices by
# process, as `distributed.global_mesh` does; process `p` gets devices
# `p x DEVICES_PER_PROCESS` onwards). Section 3 compares these with the
# rows each worker reports.

# %%
mesh = Mesh(np.array(cpu_devs), ("data",))
x_sharding = NamedSharding(mesh, P(None, "data", None))
x_shape = (cfg.n_batches, global_batch, data.N_FEATURES)
planned_rows = {
    p: rows_held(
        x_sharding,
        x_shape,
        cpu_devs[p * DEVICES_PER_PROCESS : (p + 1) * DEVICES_PER_PROCESS],
    )
    for p in range(N_PROCESSES)
}
for p, rows in planned_rows.items():
    print(f"process {p} loads rows {rows} of each global batch of {global_batch}")

# %% [markdown]
# ## 3. Launch the processes on this machine
#
# `launcher.launch_local` (the module `dpcourse.multihost.launcher`) starts
# `python -m dpcourse.multihost.worker` once per
# process (`N_PROCESSES`), each with its own environment, the coordinator
# on a Unix-domain socket in a folder only you may enter (gRPC reads
# `unix:/path` as such an address; on a shared machine, another user cannot
# connect to it, so cannot join, read or end your run), gloo's connections
# on 127.0.0.1 (inside a network of the run's own where Linux allows one),
# and `DEVICES_PER_PROCESS` simulated CPU
# devices. It waits at most `LAUNCH_TIMEOUT_S`; if one process fails, or
# time runs out, it ends **every** process it started and says which one
# failed and why.
#
# Every worker compiles the same step, on every launch. JAX's **persistent
# compilation cache** keeps compiled programs on disk: with
# `JAX_COMPILATION_CACHE_DIR` in their environment (read when JAX is
# imported; `jax.config.update("jax_compilation_cache_dir", path)` does the
# same inside a program), later launches load the step instead of compiling
# it. Process 0 writes the entries; every process reads them. On GKE, point
# it at a volume the pods share. The minimum compile time worth caching
# (`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`, 1 s by default) is set to 0,
# as this step compiles faster than that on CPU.

# %%
# One sentence, or None where processes can reach each other over TCP on 127.0.0.1 (some
# sandboxed hosts refuse every internet socket; on others the loopback is down): gloo needs it.
no_tcp = ports.tcp_unavailable()
run = None
if no_tcp:
    display(
        show.banner(
            f"{no_tcp.rstrip('.')}: the multi-process runs of sections 3 to 5 are skipped, "
            "and the rest of the lesson runs.",
            "warning",
        )
    )
else:
    print("workers' compilation cache:")
    for name, value in multihost_plan.worker_cache_env().items():
        print(f"  {name}={value}")
    run = launcher.launch_local(
        N_PROCESSES,
        DEVICES_PER_PROCESS,
        profile=cfg.profile,
        steps=STEPS,
        data_source=dataset.source,
        timeout_s=LAUNCH_TIMEOUT_S,
    )
    summary = run.summary
    display(
        show.table(
            [
                {"process": i, "variable": name, "value": value}
                for i, env in run.env.items()
                for name, value in env.items()
            ],
            caption="The environment each process got",
        )
    )
    display(
        show.table(
            [
                {
                    "process": r["process"],
                    "its devices (global ids)": str(r["devices"]),
                    "rows of each global batch it loaded": f"{r['rows'][0]}:{r['rows'][1]}",
                }
                for r in summary["layout"]
            ],
            caption=f"Who loads which data: global batch {summary['global_batch']}, "
            f"{summary['global_devices']} global devices",
        )
    )
    for i in sorted(run.stdout):
        printed = launcher.output_tail(run.stdout[i]) or "(nothing: only process 0 prints results)"
        print(f"--- process {i} printed ---\n{printed}")
    print(
        f"\nwall time of the {N_PROCESSES}-process run (start to last exit): {run.wall_s:.1f} s; "
        f"compile {summary['compile_s']:.2f} s; {summary['ms_per_step']:.1f} ms/step"
    )

# %% [markdown]
# Global device ids need not run from 0: JAX numbers each process's CPU
# devices in a range of its own (the table above shows the ids it chose).
# Each process logged its view on stderr: its local devices among the
# global ones, and its share of every batch. Both processes computed the same parameters:
# `replicas agree` compares a digest of every process's copy, gathered
# across processes with `jax.experimental.multihost_utils.process_allgather`.

# %%
if run is not None:  # the multi-process run of section 3 (skipped without TCP)
    for i in sorted(run.stderr):
        logged = [line for line in run.stderr[i].splitlines() if line.startswith("[process")]
        print(f"process {i}:", logged)
    assert summary["replicas_agree"], "the processes ended with different parameters"
    reported = {r["process"]: (r["rows"][0], r["rows"][1]) for r in summary["layout"]}
    planned = {p: (rows[0][0], rows[-1][1]) for p, rows in planned_rows.items()}
    if planned == reported:
        print("rows_held (your cell) planned the rows every worker loaded:", planned)
    else:
        display(
            show.banner(
                f"Your rows_held planned {planned}; the workers (the package's process_rows) "
                f"loaded {reported}: your cell picks other rows than the sharding gives each "
                "process.",
                "warning",
            )
        )

# %% [markdown]
# ## 4. Same result as one process with as many devices
#
# The reference: this kernel, one controller, a mesh of as many CPU devices,
# the same initial parameters, batches and step. The only difference in the
# code is how the batch gets onto the devices: here one process owns all
# rows and uses `jax.device_put`. Your `global_batches` run in this one
# process (all devices local) must build the very same arrays, and so must
# the package's `worker.load_global_batches`:

# %%
from dpcourse.exercises import checks

optimizer = train.make_optimizer(cfg)
params = jax.device_put(model.init_params(cfg), NamedSharding(mesh, P()))
opt_state = optimizer.init(params)
x_host, y_host = data.stacked_batches(
    dataset, cfg.n_batches, global_batch
)  # every row, in one process
x_stack = jax.device_put(x_host, NamedSharding(mesh, P(None, "data", None)))
y_stack = jax.device_put(y_host, NamedSharding(mesh, P(None, "data")))
_, x_mine, y_mine = global_batches(mesh, dataset, cfg.n_batches, global_batch, cpu_devs)
_, x_pkg, y_pkg = worker.load_global_batches(mesh, dataset, cfg.n_batches, global_batch)
display(checks.compare((x_mine, y_mine), (x_stack, y_stack), "global batches", "jax.device_put"))
display(
    checks.compare(
        (x_mine, y_mine),
        (x_pkg, y_pkg),
        "global batches",
        "worker.load_global_batches",
    )
)
step = jax.jit(train.make_shard_map_step(cfg, optimizer, mesh))
single_losses = []
for i in range(STEPS):
    k = i % cfg.n_batches
    params, opt_state, metrics = step(params, opt_state, x_stack[k], y_stack[k])
    single_losses.append(float(metrics["loss"]))
    if (
        i == 0
    ):  # AdamW's update hides a scaled gradient: keep its first moment, (1 - b1) x the gradient
        first_moment = jax.device_get(train.adam_first_moment(opt_state))

if run is not None:  # compared with the processes of section 3 (skipped without TCP)
    diff = train.max_abs_diff(params, run.params)
    grad_rel_diff = distributed.relative_diff(first_moment, run.first_moment)
    # Tolerance, as in notebooks 04 and 05: the gradient sums run in another
    # order (gloo between processes vs XLA inside one), which changes float32
    # results by a few units in the last place (about 1e-7 relative), and AdamW's
    # first steps move each weight by about the learning rate (3e-4), so honest
    # runs differ far below 1e-5 (measured: about 1e-7). A process that loaded
    # the wrong rows changes the gradient, and with it the sign of many updates:
    # differences of about 2 x 3e-4, sixty times the tolerance.
    MULTIHOST_TOL = 1e-5
    display(
        show.table(
            [
                {
                    "step": i + 1,
                    f"loss, 1 process x {N_DEVICES} devices": a,
                    f"loss, {N_PROCESSES} processes": b,
                }
                for i, (a, b) in enumerate(zip(single_losses, summary["losses"]))
            ],
            caption="Loss per step (global mean, before each update)",
        )
    )
    print(
        f"max |param diff| after {STEPS} steps: {diff:.3g} (tolerance {MULTIHOST_TOL:g}); "
        f"digests: 1 process {distributed.params_digest(jax.device_get(params))}, "
        f"{N_PROCESSES} processes {summary['params_digest']}"
    )
    assert diff < MULTIHOST_TOL, checks.beyond(
        f"the parameters after {STEPS} steps, {N_PROCESSES} processes against 1,",
        diff,
        MULTIHOST_TOL,
    )
    # The two digests differ: a digest changes with any bit, and float32 sums in
    # another order change the last bits. The difference above is what counts.
    # The first-step gradients, relative to their largest element: tolerance
    # train.GRAD_REL_TOL (1e-4, see its docstring). A pmean that averaged over
    # one process's devices only would give each process the gradient of its own
    # part of the batch, not of the global batch: a different gradient, not a
    # scaled one (measured at 2 processes x 4 devices: 0.56 relative
    # difference). A psum instead of a pmean would be N times too large.
    print(
        f"first-step gradients: max |diff| / max |gradient| = {grad_rel_diff:.3g} "
        f"(tolerance {train.GRAD_REL_TOL:g})"
    )
    assert grad_rel_diff < train.GRAD_REL_TOL, checks.beyond(
        "the first-step gradients relative to their largest element, processes against 1,",
        grad_rel_diff,
        train.GRAD_REL_TOL,
        "a pmean over one process's devices only, or a psum for a pmean?",
    )

# %% [markdown]
# ## 5. When it goes wrong: clear errors, in bounded time
#
# A multi-process run has new ways to fail, and the worst of them is a hang.
# Three on purpose:
#
# **(a) A global batch that does not divide by the global device count** is
# refused before any process starts (each worker checks again, where the
# invariant lives):

# %%
try:
    launcher.launch_local(
        N_PROCESSES,
        DEVICES_PER_PROCESS,
        profile=cfg.profile,
        global_batch=global_batch - 1,
    )
    raise AssertionError("an indivisible global batch should be refused")
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# **(b) A process that dies.** Process 1 exits right after joining; the
# others would wait forever in the first all-reduce for a partner that is gone.
# The launcher notices the exit, ends the others, and names the culprit:

# %%
if not no_tcp:  # processes start only where they can open a TCP socket
    try:
        launcher.launch_local(
            N_PROCESSES,
            DEVICES_PER_PROCESS,
            profile=cfg.profile,
            data_source=dataset.source,
            fail_process=1,
            timeout_s=LAUNCH_TIMEOUT_S,
        )
        raise AssertionError("the run should fail")
    except launcher.WorkerFailed as err:
        print(f"{type(err).__name__}: {err}")
        assert err.process_id == 1 and all(code is not None for code in err.exit_codes.values()), (
            f"expected process 1 to fail and every process to exit; got process {err.process_id}, "
            f"exit codes {err.exit_codes}"
        )

# %% [markdown]
# **(c) A process count that does not match.** Told there is one process
# more than start (3 for 2, by default), the coordinator waits for the
# missing one. The wait is
# bounded by `initialization_timeout` (3 s here; JAX's default is 300 s);
# JAX then ends the processes with `DEADLINE_EXCEEDED`, which the launcher
# translates. (An unreachable coordinator ends the same way.)

# %%
if not no_tcp:  # processes start only where they can open a TCP socket
    try:
        launcher.launch_local(
            N_PROCESSES,
            DEVICES_PER_PROCESS,
            profile=cfg.profile,
            data_source=dataset.source,
            num_processes=N_PROCESSES + 1,
            init_timeout_s=3,
            timeout_s=LAUNCH_TIMEOUT_S,
        )
        raise AssertionError("the run should fail")
    except launcher.WorkerFailed as err:
        print(f"{type(err).__name__} after {err.wall_s:.1f} s: {str(err).splitlines()[0]}")

# %%
if run is not None:
    _ = record.figures(
        {
            "multihost_wall_s": (run.wall_s, "s"),
            "multihost_processes": (N_PROCESSES, "count"),
            "multihost_ms_per_step": (summary["ms_per_step"], "ms"),
            "multihost_compile_s": (summary["compile_s"], "s"),
            "final_loss": (summary["losses"][-1], "loss"),
            "final_accuracy": (summary["accuracies"][-1], "fraction"),
            "max_abs_param_diff_vs_single_process": (diff, "abs"),
            "max_abs_param_diff_vs_single_process_tolerance": (MULTIHOST_TOL, "abs"),
            "rel_grad_diff_vs_single_process": (grad_rel_diff, "ratio"),
            "rel_grad_diff_vs_single_process_tolerance": (train.GRAD_REL_TOL, "ratio"),
        }
    )

# %% [markdown]
# ## 6. What changes on real hosts
#
# The program stays the same; what is around it changes.
# `deploy/multihost.yaml` runs it on GKE (see the README (Multi-host data parallelism)):
#
# | | here | GKE, `deploy/multihost.yaml` |
# |---|---|---|
# | processes | `launch_local`: 2 subprocesses | an Indexed Job, one pod per GPU node |
# | process id | set by the launcher | the pod's completion index (`JOB_COMPLETION_INDEX`) |
# | coordinator | a Unix-domain socket only you can reach | pod 0's headless Service, port 8476 |
# | devices per process | 4 simulated CPU devices | the node's GPUs (2 x L4 by default) |
# | collectives | gloo over loopback TCP | NCCL: PCIe in a node, TCP over the VPC between nodes |
# | a failure | the launcher ends every process | heartbeat timeout ends the others; the Job fails |
# | output | process 0's stdout | `kubectl logs` of pod 0 |
#
# Two things matter more on real hosts than here:
#
# - **The network between hosts is the slow link.** The gradient all-reduce
#   now crosses the VM's network card, not only PCIe inside a node. For the
#   full-size gradient, the ring all-reduce time over 4 GPUs at a few stated
#   link bandwidths (look up your machine type's network bandwidth in
#   Compute Engine's documentation; none is assumed here):

# %%
full = config.make_config("full")
grad = costs.gradient_bytes(full)
display(
    show.table(
        [
            {
                "link": name,
                "bandwidth GB/s": bw / costs.GB,
                "all-reduce ms (4 GPUs)": 1000 * costs.ring_allreduce_s(grad, 4, bw),
            }
            for name, bw in (
                ("PCIe Gen4 x16, inside a node", 32 * costs.GB),
                ("network, 100 Gbit/s", 100e9 / 8),
                ("network, 32 Gbit/s", 32e9 / 8),
                ("network, 10 Gbit/s", 10e9 / 8),
            )
        ],
        caption=f"Ring all-reduce of {grad / 1e6:.2f} MB (full size), bandwidth-bound estimate",
    )
)

# %% [markdown]
# - **Every process must see the same program and the same data order.**
#   Same code, same JAX version, same seed and the same shuffled dataset on
#   every host; here each process reads the whole (small) training set and
#   keeps its rows. At scale each host reads only its own files.
#
# ## What you learned
#
# - Multi-controller JAX: every process runs the same program;
#   `jax.distributed.initialize` joins them through process 0's coordinator,
#   before any other JAX call.
# - `jax.devices()` is global, `jax.local_devices()` is yours; meshes span
#   the global devices, and each process holds only its shards.
# - Each process loads only its rows and builds the global batch with
#   `jax.make_array_from_process_local_data`; the training step does not
#   change, and the result equals the single-process run.
# - Failures are bounded: an initialization timeout instead of a hang, a
#   launcher (or a Job) that ends every process when one fails; only process
#   0 prints and writes.
#
# **Where next.** Run the same program on several GKE GPU nodes:
# `deploy/multihost.yaml` and the README (Multi-host data parallelism).
#
# **Next:** [09_performance](09_performance.ipynb) asks how fast the step
# should be on one device, and makes it so.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
from dpcourse.exercises import lesson08 as check

# %% [markdown]
# **08.1 · Rows on another mesh.** This lesson's mesh lists each
# process's devices next to each other. Suppose instead the mesh listed
# them round-robin: process 0's first device, process 1's first device,
# ..., then every process's second device, and so on (the batch still split
# over `data`). Write `local_batch(x_global, process_id, num_processes,
# devices_per_process)` returning the rows of `x_global` that process
# `process_id` must load, in increasing order. The check tries several
# process counts.

# %% tags=["exercise", "ex08_1"]
# replace with: def local_batch(x_global, process_id, num_processes, devices_per_process): ...
local_batch = ...

# %%
check.local_batch(local_batch)

# %% [markdown]
# **08.2 · A global batch that fits the run.** For `N_PROCESSES` processes
# with `DEVICES_PER_PROCESS` devices each, give the smallest valid global
# batch of at least 100 examples, and the number of rows each process
# loads.

# %% tags=["exercise", "ex08_2"]
batch_answer = ...  # (global_batch, rows_per_process)

# %%
check.valid_global_batch(batch_answer, N_PROCESSES, DEVICES_PER_PROCESS)
