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
# **Time.** Under 10 seconds on every profile (no training here; measured on
# a 2-core CPU).
#
# **Three situations, one course.** With 2 or more GPUs the lessons run on
# them. With one GPU, or none, the multi-device lessons run on *simulated CPU
# devices*: XLA splits the host CPU into N logical devices. They behave like
# real devices for placement, collectives and correctness, but they share
# the same cores: **simulated devices add no compute, so they never give a
# real speed-up**. Timing ratios measured on them, above or below 1, come
# from how the same cores are scheduled and say nothing about GPUs.

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

from dpcourse import devices

n_cpu = devices.setup_devices(N_CPU_DEVICES)
print("simulated CPU devices requested:", n_cpu)
print("XLA_FLAGS =", os.environ.get("XLA_FLAGS"))

# %% [markdown]
# Only now do we touch JAX. `device_report` starts the backend and reads
# versions, the default backend and its devices. Memory per device is known
# on GPUs (`device.memory_stats()["bytes_limit"]`) and not reported for CPU
# devices.

# %%
from IPython.display import display

from dpcourse import config, results
from dpcourse import display as show

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
display(
    show.table(
        [
            {
                "id": d.id,
                "platform": d.platform,
                "kind": d.kind,
                "process": d.process_index,
                "memory GB": None if d.memory_bytes is None else d.memory_bytes / 1e9,
            }
            for d in report.devices
        ],
        caption="Devices of the default backend (memory n/a: not reported)",
    )
)

# %% [markdown]
# ## 2. The gate: enough devices for the multi-device lessons?
#
# Notebooks 03 to 07 need at least 2 devices (08 launches its own
# processes and needs 8 CPU devices in this kernel for its reference run). `lesson_devices` picks the
# GPUs when there are 2 or more, else the simulated CPU devices, and raises a
# clear error with the fix when there are neither.

# %%
try:
    lesson = devices.lesson_devices(min_devices=2)
    display(show.banner(f"Multi-device lessons will run on {lesson.label}.", "note"))
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
# Environment variables such as `XLA_PYTHON_CLIENT_MEM_FRACTION` (the share
# of GPU memory JAX preallocates) are also read only at start. Changing one
# now changes nothing, silently; `settings_changed_after_start` notices.
# Here we change one on purpose, look, and put it back.

# %%
saved = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.5"
changed = devices.settings_changed_after_start()
for name in changed:
    display(show.banner(f"{name} changed after JAX started: it is ignored until you restart the kernel.", "warning"))
assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in changed
if saved is None:
    del os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"]
else:
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = saved
assert devices.settings_changed_after_start() == []

# %% [markdown]
# ## 4. How are the GPUs connected?
#
# Data parallelism all-reduces the gradients every step, so the path between
# GPUs matters. `nvidia-smi topo -m` prints a matrix: `NV#` means # bonded
# NVLink links (hundreds of GB/s), `PIX`/`PXB` a PCIe switch, `PHB` a path
# through the PCIe host bridge of the CPU, `NODE`/`SYS` across NUMA nodes.
# NVIDIA L4 cards (the course's GKE node) have no NVLink: they talk over
# PCIe Gen4, about 32 GB/s each way, so expect `PHB` or `NODE` there.

# %%
topology = devices.gpu_topology()
if topology is None:
    print(
        "nvidia-smi is not available here (no NVIDIA GPU): no interconnect to show. "
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

# %%
from dpcourse import health

print(health.check_collectives(timeout_s=60))

# %%
results.set_context(
    notebook="01_setup",
    profile=profile,
    data_source="none",
    backend=report.backend,
    device_kind=report.device_kind,
    device_count=report.device_count,
)
results.record("device_count", report.device_count, "devices")
results.record("cpu_device_count", report.cpu_device_count, "devices")
results.record("lesson_device_count", 0 if lesson is None else lesson.count, "devices")

# %% [markdown]
# ## What you learned
#
# - Device settings must be in place before the first JAX operation; after
#   that they are ignored, so restart the kernel to change them.
# - `XLA_FLAGS` is appended to, never overwritten.
# - JAX shows its backend, devices, their kind and memory; simulated CPU
#   devices stand in for missing GPUs but never add speed.
# - The GPU interconnect (NVLink or PCIe) bounds how fast gradients can be
#   all-reduced.
#
# **Next:** [02_baseline](02_baseline.ipynb) trains the model on one device.
