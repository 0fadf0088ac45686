# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Setup: what JAX sees
#
# **Goal.** Configure the devices *before* JAX starts, then look at what JAX
# sees: versions, backend, devices, memory, and (on a GPU node) how the GPUs
# are wired together. Every later notebook starts the same way.
#
# **Assumes.** Python and the course's pinned requirements (`make course` or
# `make lab` installs them). No earlier notebook.
#
# **Time**: under 30 s with `smoke`, under 30 s with `cpu`, on a 2-core CPU; under 30 s with `full`,
# on 1 x TPU v5 lite (measured; other work slows it: the run's details, its load included, are in
# `baselines/timings.json`).
#
# **Three situations, one course.** With 2 or more GPUs the lessons run on
# them. With one GPU, or none, the multi-device lessons run on *simulated CPU
# devices*: XLA splits the host CPU into N logical devices. They behave like
# real devices for placement, collectives and correctness, but they share
# the same cores: **simulated devices add no compute, so they never give a
# real speed-up**. Timing ratios measured on them, above or below 1, come
# from how the same cores are scheduled and say nothing about GPUs. The line
# under section 1's first table gives this host's cores and memory: what
# every simulated device shares.

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for multi-device lessons

# %% [markdown]
# ## 1. Configure devices before the backend starts
#
# JAX reads its device settings once, when the first JAX operation starts a
# backend. The count of simulated CPU devices comes from the XLA flag
# `--xla_force_host_platform_device_count` (in `XLA_FLAGS`) or the config
# option `jax_num_cpu_devices`. `setup_devices` appends the flag to whatever
# `XLA_FLAGS` already holds (it never overwrites your flags; a count you set
# yourself wins) and sets the option to the same count.

# %%
import os

from dpcourse import devices, record

n_cpu = devices.setup_devices(N_CPU_DEVICES)
print("simulated CPU devices requested:", n_cpu)
print("XLA_FLAGS =", os.environ.get("XLA_FLAGS"))

# %% [markdown]
# Only now do we touch JAX. `device_report` starts the backend and reads
# versions, the default backend and its devices.
#
# **Memory: two different figures**, in GiB (2^30 bytes), the unit of XLA's
# own messages. On a GPU, JAX reports
# `device.memory_stats()["bytes_limit"]`: the size of **JAX's allocator
# pool**, the most it will take, a fraction of the GPU's memory set by
# `XLA_CLIENT_MEM_FRACTION` (0.75 by default; on an H200 with 140.4 GiB,
# 0.75 x 140.4 = 105.3 GiB). It is not the device's memory: that total comes
# from the driver (`nvidia-smi`), shown beside it. What `nvidia-smi` lists
# for a process is larger than the pool, as it counts the CUDA context too
# (the 107,927 MiB of `docs/gpu.md`). On a TPU, `bytes_limit` is the chip's
# HBM that XLA may use, with no fraction taken: 15.75 GiB on a TPU v5e
# (16.91 x 10^9 bytes; measured on one v5e chip with JAX 0.10.2), the figure
# XLA's out-of-memory message gives as the HBM available; Google lists the
# chip's HBM as 16 GB (docs.cloud.google.com/tpu/docs/v5e), the TPU runtime
# keeping the rest. CPU devices report neither.

# %%
from IPython.display import display

from dpcourse import config, show
from dpcourse.backend import gpuinfo, host

report = devices.device_report()
profile = config.resolve_profile(PROFILE)
display(
    show.key_values(
        {
            "Python": report.python,
            "jax": report.jax,
            "jaxlib": report.jaxlib,
            "optax": report.optax,
            "default backend": report.backend,
            "process count": report.process_count,
            "devices (default backend)": report.device_count,
            "device kind": report.device_kind,
            "CPU devices (simulated when > 1)": report.cpu_device_count,
            "workload profile of the lessons": profile,
        },
        caption="What JAX sees",
    )
)
print(host.host_sentence(host.host_cores(), host.host_memory_bytes(), report.cpu_device_count))
# Every GPU's total, when all have the same memory (then nvidia-smi's row order does not matter).
gpu_total = (
    gpuinfo.uniform_gpu_memory(gpuinfo.gpu_memory_totals()) if report.backend == "gpu" else None
)
display(
    show.table(
        [
            {
                "id": d.id,
                "platform": d.platform,
                "kind": d.kind,
                "process": d.process_index,
                "memory limit GiB (bytes_limit)": None
                if d.memory_bytes is None
                else d.memory_bytes / 2**30,
                "device memory GiB (nvidia-smi)": None if gpu_total is None else gpu_total / 2**30,
                "pool / device": None
                if d.memory_bytes is None or gpu_total is None
                else d.memory_bytes / gpu_total,
            }
            for d in report.devices
        ],
        caption="Devices of the default backend (n/a: not reported, or unknown)",
    )
)

# %% [markdown]
# ## 2. The gate: enough devices for the multi-device lessons?
#
# Notebooks 03 to 07 need at least 2 devices (08 launches its own
# processes and needs 8 CPU devices in this kernel for its reference run).
# `lesson_devices` picks the GPUs (or TPU chips) when there are 2 or more,
# else the simulated CPU devices, and raises a clear error with the fix when
# there are neither. One sentence says where each part of the lessons runs
# (`dpcourse.backend.chips.describe`).

# %%
from dpcourse.backend import chips

try:
    lesson = devices.lesson_devices(min_devices=2)
    display(show.banner(chips.describe(), "note"))
except devices.DeviceSetupError as err:
    lesson = None
    display(show.banner(str(err), "error"))

# %% [markdown]
# ## 3. Settings changed too late are ignored
#
# Once the backend runs, asking for another device count cannot work. The
# helper refuses instead of pretending, and says what to do:

# %%
try:
    devices.setup_devices(n_cpu + 1)
    raise AssertionError("a late device change should have been refused")
except devices.DeviceSetupError as err:
    print("Refused, as it should be:\n", err)

# %% [markdown]
# Environment variables such as `XLA_CLIENT_MEM_FRACTION` (the share of
# GPU memory JAX's allocator may take) are also read only at start.
# (`XLA_CLIENT_MEM_FRACTION` is the current name; the older
# `XLA_PYTHON_CLIENT_MEM_FRACTION` is deprecated: jaxlib 0.10.2 reads the
# new name first and refuses to start the GPU backend when both are set.) Changing one now
# changes nothing, silently; `settings_changed_after_start` notices. Here we
# change one on purpose, look, and put it back.

# %%
MEM_FRACTION = "XLA_CLIENT_MEM_FRACTION"
saved = os.environ.get(MEM_FRACTION)
os.environ[MEM_FRACTION] = "0.5"
changed = devices.settings_changed_after_start()
for name in changed:
    display(
        show.banner(
            f"{name} changed after JAX started: it is ignored until you restart the kernel.",
            "warning",
        )
    )
assert MEM_FRACTION in changed, f"{MEM_FRACTION} changed after JAX started but was not reported"
if saved is None:
    del os.environ[MEM_FRACTION]
else:
    os.environ[MEM_FRACTION] = saved
assert devices.settings_changed_after_start() == [], (
    f"still reported as changed after the restore: {devices.settings_changed_after_start()}"
)

# %% [markdown]
# ## 4. How are the GPUs connected?
#
# Data parallelism all-reduces the gradients every step, so the path between
# GPUs matters. `nvidia-smi topo -m` prints a matrix (its legend follows it):
#
# - `NV#`: # bonded NVLinks. Each link carries about 25 GB/s per direction
#   on NVLink 3 (A100: 12 links, 600 GB/s in total) and NVLink 4
#   (H100/H200: 18 links, 900 GB/s in total), per NVIDIA's datasheets, so
#   hundreds of GB/s hold only for a large #: `NV2` is about 50 GB/s.
# - `PIX`: at most one PCIe bridge; `PXB`: several PCIe bridges, without
#   the CPU's host bridge; `PHB`: through a PCIe host bridge (the CPU).
# - `NODE`: across PCIe host bridges **within one NUMA node**.
# - `SYS`: across NUMA nodes (the link between CPU sockets); the only
#   entry that crosses them.
#
# NVIDIA L4 cards (the course's GKE node) have no NVLink: they talk over
# PCIe Gen4, about 32 GB/s each way at best, so expect `PIX`, `PXB`, `PHB`,
# `NODE` or `SYS` there. Notebook 07 measures what the link really gives.

# %%
topology = devices.gpu_topology()
if topology is None:
    print(
        "nvidia-smi is not available here (no NVIDIA GPU): no interconnect to show.\n"
        "Simulated CPU devices exchange data through the host's memory."
    )
else:
    print(topology)

# %% [markdown]
# ## 5. Can the devices complete a collective?
#
# A broken link between GPUs makes a collective *hang*, not fail. One tiny
# `shard_map` + `pmean` over every device of the default backend, in a
# separate process stopped after 60 s, finds that here instead of in the
# middle of a lesson, and says what to try. On a CPU it runs over the
# simulated devices in seconds (they cannot hang this way; the check is the same).
# On a TPU this kernel already holds the chips, and one process at a time can
# open them, so the check runs here, in this process.

# %%
from dpcourse.backend import health

print(health.check_collectives(timeout_s=60))

# %%
record.set_context(
    notebook="01_setup",
    profile=profile,
    data_source="none",
    backend=report.backend,
    device_kind=report.device_kind,
    device_count=report.device_count,
)
for metric, count in (
    ("device_count", report.device_count),
    ("cpu_device_count", report.cpu_device_count),
    ("lesson_device_count", 0 if lesson is None else lesson.count),
):
    record.figures(
        {
            metric: (count, "devices"),
        }
    )

# %% [markdown]
# ## 6. Compile once: the persistent compilation cache
#
# Every notebook compiles its steps afresh, and so does every worker
# process of notebook 08. JAX can keep compiled programs on disk and load
# them next time: set `jax_compilation_cache_dir` (environment variable
# `JAX_COMPILATION_CACHE_DIR`). Only compilations longer than
# `jax_persistent_cache_min_compile_time_secs` (1 s by default) are stored.
# For the whole course, set the variable before starting JupyterLab, e.g.
# `JAX_COMPILATION_CACHE_DIR=~/.cache/jax make lab`. Here, a scratch folder:

# %%
import shutil
import tempfile

import jax
import jax.numpy as jnp
from jax.experimental.compilation_cache import compilation_cache

before = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
cache_dir = tempfile.mkdtemp(prefix="jax-cache-")
jax.config.update("jax_compilation_cache_dir", cache_dir)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # store even this tiny program
jax.jit(lambda v: jnp.tanh(v) * 2.0)(jnp.ones(4)).block_until_ready()
entries = sorted(os.listdir(cache_dir))
print(
    f"{len(entries)} compiled program(s) in a temporary folder, {os.path.basename(cache_dir)}:",
    *entries[:3],
    sep="\n  ",
)
assert entries, "the persistent cache stored nothing"
# Back to this kernel's own setting (no cache unless you set one). JAX opens the cache once, at
# the first compile, so it must also be told to drop the scratch folder it opened.
jax.config.update("jax_compilation_cache_dir", before[0])
jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
compilation_cache.reset_cache()
shutil.rmtree(cache_dir)

# %% [markdown]
# ## What you learned
#
# - Device settings must be in place before the first JAX operation; after
#   that they are ignored, so restart the kernel to change them.
# - `XLA_FLAGS` is appended to, never overwritten.
# - JAX shows its backend, devices and their kind; on a GPU its
#   `bytes_limit` is JAX's allocator pool (`XLA_CLIENT_MEM_FRACTION` of the
#   device), not the device's memory; on a TPU it is the HBM XLA may use.
#   Simulated CPU devices stand in for missing GPUs but never add speed.
# - The GPU interconnect (NVLink or PCIe) bounds how fast gradients can be
#   all-reduced; `nvidia-smi topo -m` shows it (`SYS` alone crosses NUMA
#   nodes).
# - A persistent compilation cache (`JAX_COMPILATION_CACHE_DIR`) saves
#   recompiling the same programs in every notebook and process.
#
# **Next:** [02_baseline](02_baseline.ipynb) trains the model on one device.
