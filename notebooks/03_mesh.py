# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · The mesh: naming your devices
#
# **Goal.** Arrange all devices into a `Mesh` with one axis named `data`,
# and see what an axis name does (nothing, until a PartitionSpec or a
# collective uses it). Compare `jax.make_mesh` with `Mesh(...)`, see what
# code on an `Explicit`-axes mesh needs, look ahead at a 2-D (`data`,
# `model`) mesh, and at why the device topology matters.
#
# **Assumes.** Notebook 01. At least 2 devices (GPUs or simulated CPU devices).
#
# **Time**: under 30 s with `smoke`, under 30 s with `cpu`, on a 2-core CPU; under 30 s with `cpu`
# (on 8 simulated CPU devices), on 1 x TPU v5 lite (measured; other work slows it: the run's
# details, its load included, are in `baselines/timings.json`).

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for multi-device lessons

# %%
from dpcourse.lesson import start_lesson

lesson = start_lesson("03_mesh", PROFILE, N_CPU_DEVICES, min_devices=2, load_data=False)

# %%
import jax
import jax.numpy as jnp
import numpy as np
from IPython.display import display
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import devices, record, show, train
from dpcourse.exercises import checks

devs = lesson.devices.devices
lesson.check_global_mesh()  # a mesh you set with jax.set_mesh must be this lesson's, or none
n = len(devs)
print(f"{n} devices: {lesson.devices.label}")

# %% [markdown]
# ## 1. A 1-D mesh with the axis `data`
#
# A `Mesh` is an n-dimensional array of devices whose axes have names. For
# data parallelism one axis is enough: every device holds a replica of the
# parameters and a shard of the batch.

# %%
mesh = Mesh(np.array(devs), axis_names=("data",))
print(mesh)
print("shape:", dict(mesh.shape), " axis types:", mesh.axis_types)

# %% [markdown]
# ## 2. An axis name is only a label
#
# Nothing moves when a mesh is built. The name `data` gains meaning only when
# a `PartitionSpec` refers to it (split this array dimension over the `data`
# axis) or a collective reduces over it (`lax.pmean(x, "data")`). A spec that
# names an axis the mesh lacks is an error:

# %%
x = jnp.arange(n * 4, dtype=jnp.float32).reshape(n, 4)
sharded = jax.device_put(x, NamedSharding(mesh, P("data", None)))
print("P('data', None): each device holds", sharded.addressable_shards[0].data.shape)
replicated = jax.device_put(x, NamedSharding(mesh, P()))
print("P():             each device holds", replicated.addressable_shards[0].data.shape)
try:
    jax.device_put(x, NamedSharding(mesh, P("model", None)))
    raise AssertionError("an unknown axis name should be refused")
except (ValueError, KeyError) as err:
    print(
        "P('model', None) on a mesh without 'model':",
        type(err).__name__,
        checks.first_sentence(err),
    )

# %%
try:
    jax.debug.visualize_array_sharding(sharded)
except ValueError:  # JAX draws the picture with the optional rich package
    show.sharding(sharded, "sharded")  # one line on what rich adds, then the placement as a table

# %% [markdown]
# ## 3. `jax.make_mesh` or `Mesh(...)`?
#
# `Mesh(devices, names)` uses the devices in the order you give.
# `jax.make_mesh(shape, names)` picks the order itself: on TPUs from their
# physical topology; on GPUs it **sorts them by device id**, which does not
# look at the interconnect (NVLink or PCIe); on CPUs it keeps the order
# given (`create_device_mesh` in `jax/_src/mesh_utils.py`, JAX 0.10.2). The
# cell below hands it the devices in reverse and prints the order it used.
#
# The two also differ in their **axis types**: `Mesh(...)` gives `Auto`
# axes (the compiler decides how intermediate values are sharded),
# `jax.make_mesh` gives `Explicit` axes unless told otherwise (shardings
# become part of the array types, and mismatches are errors). The course's
# data-parallel lessons teach automatic partitioning, so they build `Auto`
# meshes; section 4 shows what code on an `Explicit` mesh needs.

# %%
made_mesh = jax.make_mesh((n,), ("data",), devices=devs)
made_auto = jax.make_mesh((n,), ("data",), axis_types=(AxisType.Auto,), devices=devs)
reversed_ids = [d.id for d in jax.make_mesh((n,), ("data",), devices=devs[::-1]).devices.flat]
print(
    f"make_mesh given device ids {[d.id for d in devs[::-1]]} on {devs[0].platform}: "
    f"mesh order {reversed_ids}"
)
display(
    show.table(
        [
            {"built with": "Mesh(np.array(devs), ('data',))", "axis types": str(mesh.axis_types)},
            {
                "built with": "jax.make_mesh((n,), ('data',))",
                "axis types": str(made_mesh.axis_types),
            },
            {
                "built with": "jax.make_mesh(..., axis_types=(AxisType.Auto,))",
                "axis types": str(made_auto.axis_types),
            },
        ],
        caption=f"Axis types in JAX {jax.__version__}",
    )
)

# %% [markdown]
# ## 4. Code on an `Explicit` mesh
#
# On `Explicit` axes the sharding is part of each array's type
# (`jax.typeof` shows it: `float32[8@data,4]` is 8 rows split over `data`).
# Three things change:
#
# - **`jax.set_mesh(mesh)`** puts the mesh in context. JAX needs it to give
#   every operation's result a sharding; inside it a bare `PartitionSpec` is
#   enough where a `NamedSharding` was. It works as a `with` block or, called
#   alone, globally. **Use the `with` form**: a global mesh stays in force in
#   every later cell, and `jit` then refuses arrays that live elsewhere, such
#   as a one-device baseline (`Received incompatible devices for jitted
#   computation`). The lessons' one-device references run under
#   `jax.set_mesh(None)`, which clears the context mesh for a block. A
#   global mesh other than a lesson's own, set in any cell, stops the first
#   cell that cannot run under it with one sentence naming the mesh and how
#   to clear it (`dpcourse.backend.mesh_guard`; `%tb` shows JAX's own error).
# - **Sharding-in-types**: each result's sharding follows from its inputs
#   (a sum over the sharded axis is replicated; over the other axis it stays
#   split). Where that is ambiguous, JAX raises an error and asks for an
#   `out_sharding`, instead of letting the compiler choose.
# - **`jax.sharding.reshard(x, spec)`** changes a sharding explicitly (the
#   compiler adds the collective).

# %%
explicit_mesh = jax.make_mesh((n,), ("data",), axis_types=(AxisType.Explicit,), devices=devs)
with jax.set_mesh(explicit_mesh):
    xe = jax.device_put(x, P("data", None))  # a bare PartitionSpec: the mesh is set
    print("x:                ", jax.typeof(xe))
    print("x.sum(axis=0):    ", jax.typeof(jax.jit(lambda a: a.sum(axis=0))(xe)))
    print("x.sum(axis=1):    ", jax.typeof(jax.jit(lambda a: a.sum(axis=1))(xe)))
    print("reshard(x, P()):  ", jax.typeof(jax.sharding.reshard(xe, P())))

# %% [markdown]
# Why the `with` form: under a context mesh, `jit` takes every argument to
# live on that mesh's devices. An array on one device is refused, and
# `jax.set_mesh(None)` clears the context for a block:

# %%
on_one_device = jax.device_put(jnp.ones(4), devs[0])
with jax.set_mesh(mesh):
    try:
        jax.jit(jnp.sum)(on_one_device)
        print("Under the context mesh: accepted by this JAX version.")
    except ValueError as err:
        print("Under the context mesh:", checks.first_sentence(err))
with jax.set_mesh(None):
    print("Under jax.set_mesh(None):", float(jax.jit(jnp.sum)(on_one_device)))

# %% [markdown]
# The course's steps run on both kinds of mesh: on `Auto` axes as they are,
# on `Explicit` axes inside `with jax.set_mesh(mesh):`. Given a batch on an
# `Explicit` mesh with no mesh set, they stop at once and name both fixes
# (newer JAX versions would otherwise fail deep inside the step):

# %%
try:
    train.check_mesh_context(xe)
    raise AssertionError("a batch on an Explicit mesh without jax.set_mesh should be refused")
except ValueError as err:
    print(err)

# %% [markdown]
# ## 5. Looking ahead: a 2-D mesh
#
# With more devices you can split two ways at once: the batch over `data` and
# the weight matrices over `model` (tensor parallelism, beyond this course).
# Here a `[rows, cols]` array is split over both axes; each device holds one
# block.

# %%
# `model` of size 2 when the device count is even; of size 1 (no split) when it is odd
mesh_2d = Mesh(np.array(devs).reshape((n // 2, 2) if n % 2 == 0 else (n, 1)), ("data", "model"))
print(mesh_2d)
w = jnp.arange(n * 4 * 2, dtype=jnp.float32).reshape(n, 8)
w_sharded = jax.device_put(w, NamedSharding(mesh_2d, P("data", "model")))
print("each device holds a block of shape", w_sharded.addressable_shards[0].data.shape)
show.sharding(w_sharded, "w_sharded")  # visualize_array_sharding's picture, or a table

# %% [markdown]
# ## 6. Why the topology matters
#
# In data parallelism every step ends with an all-reduce of the gradient over
# the `data` axis. A ring all-reduce sends about 2(N-1)/N times the gradient
# through the slowest link of the ring, so NVLink (hundreds of GB/s) and
# PCIe (about 32 GB/s each way for Gen4 x16) give very different step times
# for the same model.
# TPU chips link to their neighbours directly over ICI, in a 2D or 3D
# torus; a slice shorter than a full axis has no wraparound link on it (a
# v5e-8 is a 2 x 4 mesh), and an all-reduce over a line takes about twice
# as long as over a ring. Notebook 04 reads the all-reduce out of the
# compiled program, and the cost model of 02 and 07 puts numbers on both
# kinds of link.

# %%
topology = devices.gpu_topology()
print(
    topology
    if topology
    else "No nvidia-smi here: simulated CPU devices share host memory, there is no link to show."
)

# %%
_ = record.figures(
    {
        "mesh_devices": (n, "devices"),
        "mesh_axis_types_make_mesh": (str(made_mesh.axis_types), "text"),
        "make_mesh_order_of_reversed_ids": (str(reversed_ids), "text"),
    }
)

# %% [markdown]
# ## What you learned
#
# - A `Mesh` names the axes of an array of devices; building one moves nothing.
# - A `PartitionSpec` maps array dimensions to mesh axes; `P()` replicates.
# - `jax.make_mesh` orders TPUs by their topology and GPUs by device id (not
#   by interconnect); it defaults to `Explicit` axes, `Mesh(...)` to `Auto`.
# - On `Explicit` axes shardings are part of the types: set the mesh with
#   `with jax.set_mesh(mesh):` (a block, not globally), change a sharding with
#   `jax.sharding.reshard`. The course's lessons use `Auto` meshes.
# - The topology decides how expensive the gradient all-reduce is.
#
# **Next:** [04_sharding](04_sharding.ipynb) shards the batch and lets the
# compiler parallelise the training step.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
from dpcourse.exercises import lesson03 as check

# %% [markdown]
# **03.1 · Predict shard shapes.** On `mesh` (its `n` devices on the axis
# `data`), a float32 array of global shape `[48, 784]` is placed with
# `NamedSharding(mesh, spec)`. Predict the shape each device holds for the
# three specs `P('data', None)`, `P(None, 'data')` and `P()`, in that order.
# Where the split dimension does not divide by `n`, JAX refuses the
# placement: write `None` there. Write them as expressions in `n`, then
# print the real ones with `shard_table` or `addressable_shards` if you like.

# %% tags=["exercise", "ex03_1"]
shard_shapes = ...  # (shape under P('data', None), shape under P(None, 'data'), shape under P())

# %%
check.shard_shapes(shard_shapes, mesh)

# %% [markdown]
# **03.2 · The labels' sharding.** Data parallelism splits a batch of images
# `[global_batch, 784]` as section 2 split `x`. Build `label_sharding`, the
# `NamedSharding` on `mesh` for the batch's labels, int32
# `[global_batch]`, that puts each label on the device holding its image.

# %% tags=["exercise", "ex03_2"]
label_sharding = ...  # a NamedSharding

# %%
check.label_sharding(label_sharding, mesh)
