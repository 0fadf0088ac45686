# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 11 · Save, kill, resume: checkpoints that survive another mesh
#
# **Goal.** Training on real machines is interrupted: Spot GPU nodes are
# taken back, a workshop stops at lunch, a worker dies. Save everything a
# run needs to go on, with Orbax; restore it onto the same mesh and onto
# another (fewer devices, a 2-D mesh, one device), from replicated DP and
# from lesson 10's FSDP; and prove that a run stopped halfway and resumed
# in a fresh process is **the same training** as one that never stopped.
# Then the failures: a save that fails in the background, a process killed
# in the middle of a save, a full disk, a checkpoint from another model.
# Last, between sessions: save where the next Colab or Kaggle session finds
# it, resume there on whatever devices it has, and a run moved between a
# TPU chip and CPU devices, proven the same training.
#
# **Assumes.** Notebooks 04 (shardings), 08 (several processes) and 10
# (FSDP). 8 devices by default (half of them and 1 are taken from them);
# with another count, the restores onto other meshes use what there is.
#
# **Time**: 1-2 min with `smoke`, under 1 min with `cpu`, on a 2-core CPU; 1-2 min with `cpu` (on 8
# simulated CPU devices), on 1 x TPU v5 lite (measured; other work slows it: the run's details, its
# load included, are in `baselines/timings.json`).

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 8  # simulated CPU devices for multi-device lessons
STEPS = 6  # the run's length N: the interrupted run stops at N / 2
N_BATCHES = 5  # batches in the data stream (not a divisor of N / 2, so the position matters)
HIDE_STEPS = 4  # training steps run while an asynchronous save writes (section 7)
MULTIHOST = True  # section 6: save, kill and resume under the launcher (two multi-process runs)
LAUNCH_TIMEOUT_S = 240  # each multi-process run ends (every process) past this
SESSION_DIR = None  # section 9: a folder that outlives the session; None: the scratch folder

# %%
from dpcourse.lesson import start_lesson

lesson = start_lesson("11_checkpoint", PROFILE, N_CPU_DEVICES, min_devices=2)
cfg, dataset = lesson.cfg, lesson.dataset

# %%
import errno
import json
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from IPython.display import display
from jax.sharding import Mesh

from dpcourse import config, model, record, show, train
from dpcourse.checkpoints import across, checkpoint, cost_sentences, resume, scratch
from dpcourse.multihost import plan as multihost_plan
from dpcourse.multihost import ports

devs = lesson.devices.devices
lesson.check_global_mesh()  # a mesh you set with jax.set_mesh must be this lesson's, or none
n, backend = len(devs), devs[0].platform
global_batch = cfg.global_batch(n)  # fixed for the whole run, on every mesh it resumes on
mesh = Mesh(np.array(devs), ("data",))
# A temporary folder with room for every checkpoint below; removed when the kernel ends.
root = scratch.scratch_folder("dpcourse-checkpoints-", scratch.lesson_bytes(cfg))
# Notebook 08's persistent compilation cache, for this process and the fresh ones it starts.
compile_cache = multihost_plan.worker_cache_env()
jax.config.update("jax_compilation_cache_dir", compile_cache[multihost_plan.CACHE_ENV])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
print(f"{lesson.devices.label}; {model.param_count(cfg):,} parameters; global batch {global_batch}")
print(f"checkpoints go to a temporary folder, {root.name}")
print(f"compiled programs are cached in {compile_cache[multihost_plan.CACHE_ENV]} (notebook 08)")

# %% [markdown]
# ## 1. What a resumable state is
#
# A run that stops at step N / 2 must go on exactly as if it had not
# stopped. That needs five things, not one:
#
# | item | why the next step needs it |
# |---|---|
# | parameters | the model |
# | optimizer state | AdamW's two moments and its step count (its bias correction) |
# | step | how many steps are left, and the name of the next checkpoint |
# | PRNG key | the randomness of every later step (here: noise added to the inputs) |
# | data position | which batch comes next |
#
# The training loop of this lesson uses all five. Each step splits the key
# (one half for this step's input noise, one half carried on), reads the
# batch at the data position, and runs lesson 10's step. The setup
# (lesson 10's steps, the batches on the mesh, step 0) comes from
# `dpcourse.checkpoints.resume.build`; the loop is this cell:


# %%
def train_until(state, step_fn, noisy, xs, ys, until):
    """Train from `state` to step `until`; return the new state (a dict of the five items)."""
    state = dict(state)
    while int(state["step"]) < until:
        key, sub = jax.random.split(state["key"])
        i = int(state["data_position"]) % xs.shape[0]
        x = noisy(sub, xs[i])
        params, opt_state, _ = step_fn(state["params"], state["opt_state"], x, ys[i])
        state.update(params=params, opt_state=opt_state, key=key)
        state.update(step=state["step"] + 1, data_position=state["data_position"] + 1)
    return state


forms = {}  # form -> (step_fn, noisy, xs, ys, state at step 0)
for form in ("replicated", "fsdp"):
    forms[form] = resume.build(cfg, mesh, form, global_batch, dataset, N_BATCHES)
step_fn, noisy, xs, ys, state0 = forms["replicated"]
straight = train_until(state0, step_fn, noisy, xs, ys, STEPS)
half = train_until(state0, step_fn, noisy, xs, ys, STEPS // 2)
package_state, _ = resume.train_until(state0, step_fn, noisy, xs, ys, STEPS)
print("your loop vs the package's, max |diff|:", train.max_abs_diff(straight, package_state))
assert train.max_abs_diff(straight, package_state) == 0.0, (
    "your train_until and the package's reach different states from the same start: check that your"
    " loop advances the step and the data position once per step, as the cell above wrote them"
)

# %% [markdown]
# **What is lost if one is missing**, shown by running: resume from step
# N / 2 with one item replaced by its value at step 0 (what a restart that
# did not save it would use), train to step N, and compare with the run
# that never stopped:

# %%
lost_rows = []
for missing in (None, *checkpoint.STATE_KEYS):
    resumed = dict(half)
    if missing is not None:
        resumed[missing] = state0[missing]
    out = train_until(resumed, step_fn, noisy, xs, ys, STEPS)
    diff = train.max_abs_diff(straight["params"], out["params"])
    lost_rows.append({"missing": missing or "(nothing)", "max |param diff| vs straight": diff})
display(show.table(lost_rows, caption=f"Resumed at step {STEPS // 2} of {STEPS}, one item missing"))
assert lost_rows[0]["max |param diff| vs straight"] == 0.0, (
    "resuming with nothing missing did not reproduce the straight run: the state saved at step"
    f" {STEPS // 2} is incomplete; check that half and straight come from the same train_until"
)
unneeded = [r["missing"] for r in lost_rows[1:] if r["max |param diff| vs straight"] == 0]
assert not unneeded, (
    f"resuming without {unneeded} changed nothing, so this run cannot show why it is saved: run the"
    " cell again with the lesson's STEPS, or with more steps"
)

# %% [markdown]
# Every missing item changes the training, each for its own reason: fresh
# parameters start over; fresh AdamW moments forget the gradients' history
# (and its step count restarts the bias correction); a step of 0 runs N
# more steps instead of N / 2; the first key repeats noise already used;
# position 0 repeats batches already seen. None of these fails: each run
# just trains something else. Only the comparison catches it.
#
# ## 2. Save with Orbax, asynchronously
#
# `orbax.checkpoint.CheckpointManager` keeps numbered steps in one folder.
# A step can hold several items: here the state (`StandardSave`, any
# pytree of arrays) and a small JSON description of the run, which section
# 8 uses to refuse a checkpoint from another model. Saving is
# **asynchronous by default**: `save` returns once the arrays are copied
# off the devices, and a background thread writes them.

# %%
run = checkpoint.run_description(cfg, global_batch)  # the profile, the model's sizes, the batch
directory = scratch.fresh(root / "replicated")
manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(max_to_keep=3))
t0 = time.perf_counter()
manager.save(
    STEPS // 2,
    args=ocp.args.Composite(state=ocp.args.StandardSave(half), run=ocp.args.JsonSave(run)),
)
returned_s = time.perf_counter() - t0
latest_before = manager.latest_step()
manager.wait_until_finished()
written_s = time.perf_counter() - t0
print(f"save returned after {returned_s * 1e3:.0f} ms; written after {written_s * 1e3:.0f} ms")
print(
    "(the session's first save: it includes Orbax's one-off set-up; section 7 times saves after it)"
)
print(f"latest_step(): {latest_before} as save() returned, {manager.latest_step()} after the wait")
print("in the folder:", sorted(p.name for p in directory.iterdir()))

# %% [markdown]
# While the thread writes, the step lives in a folder named
# `<step>.orbax-checkpoint-tmp`; only when every array is written does
# Orbax rename it to `<step>`. The manager that saves does not wait for
# that: its `latest_step()` names the step as soon as `save` returns, as
# the line above shows (Orbax 0.12.8's `CheckpointManager.save` adds the
# step to its list before the write ends). Only a manager opened later,
# as a restart opens one, reads the folder and skips a temporary one. So
# the saving manager's `latest_step()` says which step was *started*.
#
# The background thread writes and commits the step whether anyone waits
# for it or not. Waiting does not make a checkpoint; it is where you
# **hear** how the save ended. Three calls wait, and each raises the
# background save's error, if it had one:
#
# - `wait_until_finished()` blocks until the background save is done;
# - the next `save()` first waits for the previous one (Orbax 0.12.8's
#   `CheckpointManager.save` calls `wait_until_finished()` before it
#   starts);
# - `close()` waits too and stops the thread; a program that ends without
#   it may end in the middle of a write.
#
# **A save that fails.** This save adds the last loss to the run's
# description, as a NumPy number, which JSON cannot write. `save` returns as
# if all were well; the failure is in the background thread, and the loop's
# next save brings it out:

# %%
loss_value = np.float32(2.5)  # a loss pulled from the device: a NumPy float32, not a float
bad_run = {**run, "last_loss": loss_value}
with checkpoint.quiet_orbax_log():  # Orbax also logs the error from its thread; it raises below
    started = manager.save(
        STEPS // 2 + 1,
        args=ocp.args.Composite(state=ocp.args.StandardSave(half), run=ocp.args.JsonSave(bad_run)),
    )
    print(f"save() returned {started}; the loop goes on training, then saves the next step")
    try:
        manager.save(
            STEPS // 2 + 2,
            args=ocp.args.Composite(state=ocp.args.StandardSave(half), run=ocp.args.JsonSave(run)),
        )
        surfaced = None
    except Exception as err:  # noqa: BLE001 - the background thread's error, whatever it is
        surfaced = err
print(f"the next save() raised {type(surfaced).__name__}: {surfaced}")
print("latest_step():", manager.latest_step())
assert surfaced is not None, (
    "the next save() did not raise the failed save's error: this Orbax version no longer waits"
    " for the previous save in save(), and the text around this cell no longer holds"
)
assert manager.latest_step() == STEPS // 2, (  # the failed step is not a checkpoint
    f"latest_step() is {manager.latest_step()}, not {STEPS // 2}: the failed save was listed as a"
    " checkpoint; run the cells of this section again from its first cell"
)

# %% [markdown]
# So a loop that saves regularly hears of a failed save at its next save
# at the latest, as an exception that stops it. Only a program's **last**
# save can fail unseen: a program that ends without waiting for it ends as
# if it had saved, and the failure shows when a restart finds an older
# step. Wait for the last save (`wait_until_finished()`), and close the
# manager.
#
# `dpcourse.checkpoints.checkpoint` keeps these calls in `save`, `finish` and
# `restore`, and turns an operating system's error into one sentence.
# A **full disk** during a save (simulated: the commit fails with
# `ENOSPC`, as it does when the disk fills up on the last write):

# %%
with (
    checkpoint.fail_at_commit(OSError(errno.ENOSPC, "No space left on device")),
    checkpoint.quiet_orbax_log(),
):
    checkpoint.save(manager, STEPS // 2 + 2, half, run)
    try:
        checkpoint.finish(manager)
        disk_error = None
    except checkpoint.CheckpointError as err:
        disk_error = err
print(disk_error)
print("latest_step():", manager.latest_step())
print("never committed:", checkpoint.half_written(directory))
assert disk_error is not None, (
    "the save on a full disk raised nothing: run this cell again, unchanged"
)
assert manager.latest_step() == STEPS // 2, (
    f"latest_step() is {manager.latest_step()} after the failed save, not {STEPS // 2}: run this"
    " section again from its first cell"
)
manager.close()

# %% [markdown]
# ## 3. Restore onto a target: same mesh, fewer devices, a 2-D mesh, one device
#
# A restore needs a **target**: for every leaf, its shape, its dtype and
# the sharding *this* run wants, as `jax.ShapeDtypeStruct`. Nothing is
# allocated until Orbax reads each array straight into its target's
# shards. The FSDP run saves too, so both forms can be restored anywhere:


# %%
def abstract_target(state, shardings):
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=s), state, shardings
    )


fsdp_step, _, _, _, fsdp_state0 = forms["fsdp"]
fsdp_half = train_until(fsdp_state0, fsdp_step, noisy, xs, ys, STEPS // 2)
with checkpoint.open_manager(scratch.fresh(root / "fsdp")) as fsdp_manager:
    checkpoint.save(fsdp_manager, STEPS // 2, fsdp_half, run)
saved = {"replicated": (directory, half), "fsdp": (root / "fsdp", fsdp_half)}
on_mesh = abstract_target(half, checkpoint.state_shardings(half, mesh, "replicated"))

fewer_name = f"{n // 2} device{'s' if n // 2 > 1 else ''}"  # half the devices, rounded down
meshes = {"same mesh": mesh, fewer_name: Mesh(np.array(devs[: n // 2]), ("data",))}
if n >= 4 and n % 2 == 0:
    meshes["2-D mesh"] = Mesh(np.array(devs).reshape(n // 2, 2), ("data", "model"))
if n // 2 > 1:
    meshes["1 device"] = Mesh(np.array(devs[:1]), ("data",))
restore_rows = []
for source, (folder, saved_state) in saved.items():
    with ocp.CheckpointManager(folder) as reader:
        for mesh_name, target_mesh in meshes.items():
            for target_form in ("replicated", "fsdp"):
                shardings = checkpoint.state_shardings(saved_state, target_mesh, target_form)
                target = abstract_target(saved_state, shardings)
                got = reader.restore(
                    STEPS // 2, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
                )["state"]
                placed = jax.tree.map(lambda a, s: a.sharding == s, got, shardings)
                restore_rows.append(
                    {
                        "saved from": source,
                        "onto": f"{mesh_name} {dict(target_mesh.shape)}",
                        "as": target_form,
                        "max |diff|": train.max_abs_diff(saved_state, got),
                        "shardings are the target's": all(jax.tree.leaves(placed)),
                    }
                )
display(show.table(restore_rows, caption="Restored leaves against the saved state"))

# %% [markdown]
# Every restored leaf equals the saved one, and every sharding is the
# target's, whatever mesh the checkpoint was saved from (on the 2-D mesh the
# FSDP target shards over its first axis, `data`, and replicates over
# `model`):

# %%
for r in restore_rows:
    assert r["max |diff|"] == 0.0, f"restored values differ: {r}"
    assert r["shardings are the target's"], f"a restored leaf is not on the target's sharding: {r}"
print(f"{len(restore_rows)} restores: values equal and shardings the target's in every one")

# %% [markdown]
# **The classic failure: no target sharding.** A target built without a
# sharding (or copied from the checkpoint's own metadata, which describes
# the *saved* mesh) asks Orbax for nothing, and Orbax puts each leaf back
# where it was saved:

# %%
fewer_mesh = meshes[fewer_name]
no_sharding = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), fsdp_half)
# Orbax looks the saved devices up among jax.devices(): on a one-GPU or one-TPU host those are
# the accelerator's, not this lesson's simulated CPU devices.
saved_devices_visible = all(any(d is e for e in jax.devices()) for d in devs)
try:
    with ocp.CheckpointManager(root / "fsdp") as reader:
        wrong = reader.restore(
            STEPS // 2, args=ocp.args.Composite(state=ocp.args.StandardRestore(no_sharding))
        )["state"]
except ValueError as err:
    if saved_devices_visible or "Topology mismatch" not in str(err):
        raise
    print(
        f"Orbax looks the saved devices up among jax.devices(), here {len(jax.devices())} "
        f"{jax.default_backend()} device(s), not this lesson's {lesson.devices.label}, "
        f"and fails: {err}"
    )
else:
    w_in = wrong["params"]["w_in"].sharding
    print(
        f"wanted {dict(fewer_mesh.shape)}; got a mesh of {w_in.mesh.size} devices, spec {w_in.spec}"
    )
    assert w_in.mesh.size == n, (  # the saved mesh, silently
        f"the leaf came back on {w_in.mesh.size} devices, not the {n} it was saved from: this Orbax"
        " version restores onto the target's mesh, and the text below no longer holds"
    )

# %% [markdown]
# Nothing fails here, which is the trouble (on a host with one GPU or TPU chip, where this
# lesson's devices are simulated, it fails as described next). In a process with fewer
# devices than the saved mesh the same restore fails with Orbax's
# `ValueError: Topology mismatch detected. The checkpoint was saved with a
# different topology than the current one. ...` (the saved shardings name
# devices that process does not have); on GPUs, a checkpoint saved sharded and restored this way
# onto a mesh that was meant to replicate it, or the other way round, puts
# the wrong bytes on each device, up to running out of memory. The rule:
# **build the target from this run's mesh and specs, never from the
# checkpoint.** `dpcourse.checkpoints.checkpoint.restore` refuses a target without one.
#
# ## 4. Resume in a fresh process: the same training
#
# The real test of a checkpoint: a **new process**, with nothing in memory
# but what it reads from disk, restores step N / 2 and trains to step N.
# `python -m dpcourse.checkpoints.resume` does that (the package's `train_until`, the
# same loop), for replicated DP and for FSDP on all the lesson's devices, and for
# replicated DP on half of them, in three processes at once; each works
# on its own copy of the checkpoint folder. Nothing of this process's memory
# reaches them; its compiled programs do, through the persistent
# compilation cache of notebook 08 that the first cell turned on (a fresh
# process on the same devices loads the step instead of compiling it, as
# a restarted job on the same machines would). (TPU chips are held by this
# notebook's process, and no other can open them: there the fresh processes
# resume on as many simulated CPU devices.)

# %%
fewer = f"replicated, {fewer_name}"
jobs = {f"replicated, {n} devices": ("replicated", n), f"fsdp, {n} devices": ("fsdp", n)}
jobs[fewer] = ("replicated", n // 2)
procs = {}
for label, (form, n_dev) in jobs.items():
    folder = scratch.copy_folder(saved[form][0], root / f"resume {label}")
    command = resume.command(folder, cfg, devs, n_dev, global_batch, N_BATCHES, dataset.source)
    command += ["--form", form, "--until", str(STEPS)]
    procs[label] = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
print(
    f"started {len(procs)} processes, each restores step {STEPS // 2} and trains to step {STEPS}:"
)
t0 = time.perf_counter()
for label, proc in procs.items():
    said = proc.communicate()[1]
    print(f"  {label}: exit status {proc.returncode} after {time.perf_counter() - t0:.0f} s")
    assert proc.returncode == 0, f"the fresh process ({label}) failed: {said.strip()[-2000:]}"

# %% [markdown]
# Each process saved step N. Read it back here and compare it with the
# run that never stopped, of the same form: on the same device count the
# arithmetic is the same, so the CPU gives **bitwise** equal parameters; on
# half the devices the gradient's sum runs in another order, so the written
# tolerance of notebooks 04-06 applies. (So it does if you rebuilt `mesh`
# with Explicit axes: the fresh processes train on Auto axes, and the two
# programs may round a last bit differently, as notebook 10 shows.)

# %%
fsdp_straight = train_until(fsdp_state0, fsdp_step, noisy, xs, ys, STEPS)
straight_by_form = {"replicated": straight, "fsdp": fsdp_straight}
EQUIV_TOL, _ = train.equivalence_tolerances(backend, cfg.learning_rate, steps=STEPS)
AUTO_AXES = jax.sharding.AxisType.Explicit not in mesh.axis_types  # as the fresh processes' mesh
resume_rows, resume_diffs, resume_tols = [], {}, {}
for label, (form, n_dev) in jobs.items():
    reference = straight_by_form[form]
    target = abstract_target(reference, checkpoint.state_shardings(reference, mesh, form))
    with checkpoint.open_manager(root / f"resume {label}") as reader:
        step_read, got = checkpoint.restore(reader, target, run)
    resume_diffs[label] = train.max_abs_diff(reference, got)
    bitwise = backend == "cpu" and n_dev == n and AUTO_AXES  # the same device count
    resume_tols[label] = 0.0 if bitwise else EQUIV_TOL
    resume_rows.append(
        {
            "resumed run": label,
            "step": step_read,
            "max |diff| vs straight (whole state)": resume_diffs[label],
            "required": "0 (bitwise)" if bitwise else f"< {EQUIV_TOL:g}",
        }
    )
    assert resume_diffs[label] == 0.0 if bitwise else resume_diffs[label] < EQUIV_TOL, (
        f"the run resumed on {label} differs from the straight run by {resume_diffs[label]:.3g}:"
        " the restored state is not the saved one; run this section again from its first cell"
    )
display(show.table(resume_rows, caption=f"Stopped at {STEPS // 2}, resumed to {STEPS} elsewhere"))

# %% [markdown]
# ## 5. Killed in the middle of a save
#
# A preempted machine does not finish its save. Here a fresh process
# restores step N / 2, starts saving it again as step N / 2 + 1, and is
# killed (SIGKILL) after writing every array and before the commit, the
# worst moment:

# %%
killed_dir = root / "killed"
scratch.copy_folder(directory, killed_dir)
command = resume.command(killed_dir, cfg, devs, n, global_batch, N_BATCHES, dataset.source)
killed = subprocess.run([*command, "--kill-at-commit"], capture_output=True, text=True)
print("exit status:", killed.returncode, "(-9: killed by SIGKILL)")
with checkpoint.open_manager(killed_dir) as reader:
    print("latest_step():", reader.latest_step())
    print("never committed:", checkpoint.half_written(killed_dir))
    after_kill_step, after_kill = checkpoint.restore(reader, on_mesh, run)
killed_step = killed_dir / f"{STEPS // 2 + 1}{checkpoint.TMP_SUFFIX}"  # the step saved when killed
commit_file_there = (killed_step / "commit_success.txt").exists()
print(f"{killed_step.name} holds commit_success.txt: {commit_file_there}")
assert killed.returncode == -9, (
    f"the process meant to be killed exited with status {killed.returncode} instead; its last"
    f" output says why:\n{killed.stderr[-2000:]}"
)
assert after_kill_step == STEPS // 2 and train.max_abs_diff(half, after_kill) == 0.0, (
    f"after the kill the folder restores step {after_kill_step}, not the last committed step"
    f" {STEPS // 2} with its values: the half-written step was read as a checkpoint"
)
assert commit_file_there, (
    f"the killed step's folder {killed_step.name} holds no commit_success.txt: this Orbax version"
    " no longer writes it before the rename, and the text below no longer holds"
)

# %% [markdown]
# The half-written step stays a `.orbax-checkpoint-tmp` folder, which a
# manager opened afterwards never lists and a restore never reads; the
# previous step is the latest and restores whole. The folder stays on disk:
# saving another step leaves it, saving the same step again replaces it,
# and a manager opened with
# `ocp.CheckpointManagerOptions(cleanup_tmp_directories=True)` (off by
# default in Orbax 0.12.8) removes every such folder as it starts.
#
# The commit file is no proof of a complete step: Orbax 0.12.8 writes
# `commit_success.txt` into every step just before the rename, so the
# killed step above holds one too (the line printed above). Only on
# Google Cloud Storage paths (`gs://`) does Orbax skip the rename by
# default, and there the file marks a complete step. On a local or shared
# disk, judge a step by its folder's name, as a manager does.
#
# ## 6. Several processes: save, kill one, resume on another process count
#
# With several processes (notebook 08), **every process calls save and
# restore**: each writes the shards it holds, and they agree through the
# distributed runtime before the commit. A replicated leaf is written once,
# in parts: Orbax 0.12.8 saves **replica-parallel** by default, each
# replica writing its own slice along a dimension the replica count
# divides (a leaf without one is written whole by replica 0; the default
# is off where `JAX_PLATFORMS` names `gpu` or `cuda`). The folder must be
# one that all of them see: on one machine any folder, on several a shared
# volume or a bucket. Below, 2 processes x
# 4 devices train with a checkpoint every 2 steps, and process 1 dies at
# step 3; then 4 processes x 2 devices resume the job from the latest step
# (on 8 devices; on 6, 2 x 3 then 3 x 2; other counts skip this section).

# %%
multi_diff = None  # set where this section runs
# Two process counts over all n devices: 2 x n/2 is killed, n/2 x 2 resumes. On 4 devices the
# only other split, 4 x 1, failed its save when tried (JAX 0.10.2, orbax-checkpoint 0.12.8:
# "the input arrays must have one shard each"), so 4 and the odd counts skip this section.
SPLITS = ((2, n // 2), (n // 2, 2)) if n in (6, 8) else None
# One sentence, or None where processes can open a TCP socket on 127.0.0.1 (notebook 08).
no_tcp = ports.tcp_unavailable() if MULTIHOST and SPLITS else None
skipped = f"{no_tcp} This section's multi-process runs are skipped; the rest of the lesson runs."
if no_tcp:
    display(show.banner(skipped, "warning"))
elif MULTIHOST and SPLITS:
    multi = resume.across_process_counts(
        cfg, devs, SPLITS, root / "multihost", STEPS, dataset.source, global_batch, LAUNCH_TIMEOUT_S
    )
    multi_diff = multi["max |param diff| vs straight"]
    multi_row = {**multi, "required": f"< {EQUIV_TOL:g}"}
    display(show.table([multi_row], caption="Resumed on another process count"))
    assert multi["latest step after the kill"] == multi["resumed from"] == 2, (
        f"both should be 2, the last step saved before the kill: {multi}"
    )
    assert multi_diff < EQUIV_TOL, (
        f"the run resumed on {SPLITS[1][0]} processes differs from the straight one by more than"
        f" {EQUIV_TOL:g}: the restored state or the data position was not the saved one"
    )
else:
    print(f"skipped: MULTIHOST is False, or {n} devices do not split two ways (needs 6 or 8)")

# %% [markdown]
# (The worker of notebook 08 trains without input noise, so its state's
# key is not used; the comparison is with one process training straight
# through on the same devices. Collectives across processes sum in another order
# than within one, hence the tolerance.)
#
# **On GKE.** `deploy/multihost-checkpoint.yaml` runs this worker as an
# Indexed Job that survives a Spot preemption: every pod mounts one
# `ReadWriteMany` Filestore share as its checkpoint folder; a
# `podFailurePolicy` does not count a preempted pod against `backoffLimit`,
# so the Job replaces every pod (a JAX process cannot rejoin the others'
# run) and each process resumes from the latest complete step; a save cut
# short by the grace period stays a temporary folder, never half a step.
# docs/multihost.md ("Checkpoints and Spot preemption") has the commands.
#
# ## 7. What a checkpoint costs
#
# **Size.** Parameters in float32 and AdamW's two moments: 4 + 8 = 12 bytes
# per parameter, against the folder's bytes on disk (Orbax compresses
# little: trained weights look random):

# %%
n_params = model.param_count(cfg)
size_rows = []
for form, (folder, state) in saved.items():
    on_disk = checkpoint.directory_bytes(folder / str(STEPS // 2))
    size_rows.append(
        {
            "form": form,
            "bytes on disk": on_disk,
            "parameters x 12": 12 * n_params,
            "arrays (every leaf once)": checkpoint.leaf_bytes(state),
            "disk / (parameters x 12)": f"{on_disk / (12 * n_params):.2f}",
        }
    )
display(show.table(size_rows, caption=f"Checkpoint of step {STEPS // 2}, {n_params:,} parameters"))
for row in size_rows:
    disk, arrays = row["bytes on disk"], row["arrays (every leaf once)"]
    print(cost_sentences.size_sentence(row["form"], disk, arrays))
print(cost_sentences.forms_sentence({row["form"]: row["bytes on disk"] for row in size_rows}))

# %% [markdown]
# Replicated or sharded, the checkpoint holds every leaf once, so the saved
# form moves the folder's size only by its metadata (the last line above
# says by how much in this run). Against the arrays, two things move the
# folder's size, and the lines above give this run's balance: Orbax's
# metadata files add a few kilobytes (they matter only at this lesson's
# small sizes), and Orbax compresses each array with zstd (on by default
# in 0.12.8), which takes several percent off trained weights and moments
# (float32's exponent bytes repeat) and shrinks AdamW's all-zero moments at
# step 0 to almost nothing.
#
# **Time.** A synchronous save blocks the loop for the whole write; an
# asynchronous one only for the copy off the devices, and the write runs
# while the next steps train. Measured on this machine:


# %%
def timed_steps(state, k):
    t = time.perf_counter()
    out = train_until(state, step_fn, noisy, xs, ys, int(state["step"]) + k)
    jax.block_until_ready(out["params"])
    return time.perf_counter() - t


timed_steps(half, 1)  # compiled already; warm the loop
for asynchronous in (False, True):  # Orbax's one-off set-up of each kind of save, not timed
    folder = scratch.fresh(root / ("warm-up async" if asynchronous else "warm-up sync"))
    with checkpoint.open_manager(folder, asynchronous=asynchronous) as warm:
        checkpoint.save(warm, 0, half, run)
steps_s = timed_steps(half, HIDE_STEPS)
with checkpoint.open_manager(scratch.fresh(root / "sync"), asynchronous=False) as sync_manager:
    t0 = time.perf_counter()
    checkpoint.save(sync_manager, 1, half, run)
    sync_save_s = time.perf_counter() - t0
with checkpoint.open_manager(scratch.fresh(root / "async")) as async_manager:
    t0 = time.perf_counter()
    checkpoint.save(async_manager, 1, half, run)
    async_blocked_s = time.perf_counter() - t0
    timed_steps(half, HIDE_STEPS)
    checkpoint.finish(async_manager)
    async_total_s = time.perf_counter() - t0
with checkpoint.open_manager(root / "async") as reader:
    t0 = time.perf_counter()
    checkpoint.restore(reader, on_mesh, run)
    restore_s = time.perf_counter() - t0
time_rows = [
    {"what": f"{HIDE_STEPS} steps, no save", "s": f"{steps_s:.3f}"},
    {"what": "synchronous save (the loop waits)", "s": f"{sync_save_s:.3f}"},
    {"what": "asynchronous save: the loop waits", "s": f"{async_blocked_s:.3f}"},
    {"what": f"asynchronous save + {HIDE_STEPS} steps + wait", "s": f"{async_total_s:.3f}"},
    {"what": "restore (latest step, onto the mesh)", "s": f"{restore_s:.3f}"},
]
display(show.table(time_rows, caption=f"Save and restore, {cfg.profile} profile, {backend}"))
lines = cost_sentences.hiding_lines(
    steps_s, sync_save_s, async_blocked_s, async_total_s, HIDE_STEPS
)
print("\n".join(lines))
hidden = steps_s + sync_save_s - async_total_s  # recorded below

# %% [markdown]
# The asynchronous save blocks the loop only for its first part (the
# "loop waited" line); the rest runs in a thread beside the steps, and
# the last line above says how much of it this run hid. On simulated CPU
# devices the write and the steps share the same cores, so little or
# nothing may hide; on GPUs the steps run on the devices and the write on
# the host. A save every few minutes at a few seconds each is the usual
# trade.
#
# ## 8. A checkpoint from another run is refused
#
# A checkpoint folder reused by another profile or model would restore
# arrays of the wrong shapes, or, worse, of the right shapes and the wrong
# meaning. Each step carries the run's description; `checkpoint.restore`
# reads it first and names what differs. A checkpoint saved by the `cpu`
# profile's model, restored by this run:

# %%
other_name = "cpu" if cfg.profile != "cpu" else "smoke"
other_cfg = config.make_config(other_name)
other_params = model.init_params(other_cfg)
other_state = checkpoint.make_state(
    other_params, train.make_optimizer(other_cfg).init(other_params), 0, state0["key"], 0
)
other_run = checkpoint.run_description(other_cfg, global_batch)
with checkpoint.open_manager(scratch.fresh(root / "other")) as other_manager:
    checkpoint.save(other_manager, 0, other_state, other_run)
with checkpoint.open_manager(root / "other") as reader:
    try:
        checkpoint.restore(reader, on_mesh, run)
        refusal = None
    except checkpoint.CheckpointMismatch as err:
        refusal = err
print(refusal)
assert refusal is not None and "width" in str(refusal), (
    f"restoring the {other_name} profile's checkpoint into this model should be refused, naming the"
    f" width that differs; it gave: {refusal!r}"
)

# %% [markdown]
# ## 9. Between sessions: the next one may be another machine
#
# A free accelerator ends without warning: a Colab runtime disconnects, a
# Kaggle session stops at its limit, and the next session may have other
# devices (a TPU v5e-8 on Kaggle, one v5e chip on Colab, a laptop's
# simulated CPU devices). Save where the next session finds it, and resume
# there from the last complete step, whatever its devices:
#
# - **Colab**: mount Google Drive (`from google.colab import drive;
#   drive.mount("/content/drive")`) and set `SESSION_DIR =
#   "/content/drive/MyDrive/dpcourse-11"`; the next session mounts Drive
#   again and finds the same folder.
# - **Kaggle**: `SESSION_DIR = "/kaggle/working/dpcourse-11"`. *Save Version*
#   keeps `/kaggle/working` as the notebook's output; in the next session,
#   *Add Input* > that output, and copy its `dpcourse-11` from under
#   `/kaggle/input/` back to `/kaggle/working/` (inputs are read-only, and
#   the run saves its next step into the folder).
# - **Your machine**: any folder; it stays.
#
# Set `SESSION_DIR` in the parameters cell and run the lesson: this cell
# saves step N / 2 there. Stop the session, start a new one, and run the
# lesson again with the same `SESSION_DIR`: this cell then restores the
# latest step onto this session's devices (the global batch stays the
# checkpoint's), says where it was made and what changed, and trains on to
# step N. With `SESSION_DIR = None` the folder is the lesson's scratch
# folder, and the next session is played below by a fresh process on half
# the devices.

# %%
session_dir = Path(SESSION_DIR).expanduser() if SESSION_DIR else root / "session"
with checkpoint.open_manager(session_dir) as session:
    last, saved_run = checkpoint.newest_run(session)  # the newest step whose run description reads
    session_batch = (
        global_batch if last is None else saved_run["global_batch"]
    )  # kept by every session
    if last is None:  # the first session: save half-way, as a session that ends there would
        checkpoint.save(session, STEPS // 2, half, run)
        checkpoint.finish(session)
        print(f"saved step {STEPS // 2} to {session_dir}: stop here, and run the lesson again in")
        print("the next session with the same SESSION_DIR; section 9 then resumes from it")
    else:  # a later session: its devices, the checkpoint's global batch
        checkpoint.check_devices_for_batch(session_batch, n, str(session_dir))
        run_here = checkpoint.run_description(cfg, session_batch)
        here = resume.build(cfg, mesh, "replicated", session_batch, dataset, N_BATCHES)
        target = abstract_target(here[-1], checkpoint.state_shardings(here[-1], mesh, "replicated"))
        # A damaged newer step is named and set aside; the one before it is restored.
        last, state_here = checkpoint.restore(session, target, run_here, warn=print, say=print)
        if checkpoint.steps_to_train(last, STEPS, str(session_dir), "STEPS"):
            state_here = train_until(state_here, *here[:4], STEPS)
            checkpoint.save(session, STEPS, state_here, run_here)
            checkpoint.finish(session)
            print(f"trained steps {last + 1} to {STEPS}; step {STEPS} is saved in {session_dir}")
        else:
            print(f"step {STEPS} was saved already: nothing was trained; raise STEPS to train on")

# %% [markdown]
# **The next session, played here** (when `SESSION_DIR` is None): a fresh
# process (section 4's command) on half the devices restores the latest
# step of that folder and reports, in its summary, the sentence a new
# session prints: where the step was made, what changed, and what that
# does to the numbers.

# %%
session_diff = None  # your own SESSION_DIR: the next session is yours to start
if SESSION_DIR is None:
    next_devices = max(n // 2, 1)
    command = resume.command(
        session_dir, cfg, devs, next_devices, global_batch, N_BATCHES, dataset.source
    )
    next_session = subprocess.run([*command, "--until", str(STEPS)], capture_output=True, text=True)
    assert next_session.returncode == 0, (
        f"the next session's process failed with exit status {next_session.returncode}:"
        f" {next_session.stderr.strip()[-2000:]}"
    )
    print(json.loads(next_session.stdout.strip().splitlines()[-1])["restored_from"])
    with checkpoint.open_manager(session_dir) as reader:
        session_step, session_state = checkpoint.restore(reader, on_mesh, run)
    session_diff = train.max_abs_diff(straight, session_state)
    print(
        f"step {session_step} after the move from {n} to {next_devices} device(s): max |diff|"
        f" vs the run that never stopped {session_diff:.3g}"
        f" (tolerance {EQUIV_TOL:g}: another sum order)"
    )
    assert session_step == STEPS and session_diff < EQUIV_TOL, (
        f"the run resumed on {next_devices} device(s) reached step {session_step} and differs from"
        f" the straight run by {session_diff:.3g}: the restored state is not the saved one"
    )
else:
    print(f"{session_dir} is your folder: the next session is yours to start")
refused_on = next(k for k in range(n + 1, session_batch + 2) if session_batch % k)
try:
    checkpoint.check_devices_for_batch(session_batch, refused_on, str(session_dir))
except ValueError as err:
    print(f"a session with {refused_on} devices is refused, before anything is read: {err}")

# %% [markdown]
# A checkpoint keeps its global batch: another batch would be another
# training. So a session whose device count does not divide it is refused
# in one sentence that names the counts that do, and nothing is written.
# A checkpoint of another profile or model is refused the same way
# (section 8).
#
# **Across backends, proven.** The same move between a TPU chip and
# simulated CPU devices: train on one backend to step N / 2, save, restore
# on the other, train to step N, and compare with the same run
# uninterrupted on the second backend. Three parts, each with its
# tolerance (`dpcourse.checkpoints.across.tolerances` derives them):
#
# - **bit for bit**: the restored state is the saved one, leaf for leaf,
#   and at step N the step, data position, PRNG key and AdamW's step count
#   equal the uninterrupted run's;
# - **the backends' arithmetic**, at the hand-over: one gradient of the
#   restored state on both backends, relative to its largest element. A
#   TPU's default float32 matmul is one bfloat16 pass (inputs rounded to
#   8 significant bits, a relative error up to 2^-8, about 3.9e-3, each;
#   a sum's errors partly cancel): 1e-2. Under
#   `jax.default_matmul_precision("highest")` (six passes, float32's
#   accuracy) the backends differ only in float32 rounding and their exp
#   and log: 1e-4, as two CPU layouts;
# - **the parameters at step N**: AdamW moves a weight by about the
#   learning rate per step whatever its gradient, so where a gradient
#   element's sign differs between backends the two runs part by up to
#   2 x learning rate per step: 2 x lr x N.
#
# Where this lesson runs on a TPU, it measures the moves on its own chip;
# elsewhere it shows the chip's stored measurement:

# %%
move_runs, move_label = across.here_or_stored(dataset.source, scratch.fresh(root / "across"))
move_caption = f"Moved half-way between backends ({move_label})"
display(show.table(across.rows(move_runs), caption=move_caption))
assert all(r["passed"] for r in move_runs), f"a move failed its proof: {move_runs}"
for precision in across.PRECISIONS:
    picked = [r for r in move_runs if r["precision"] == precision]
    grad_rel = max(r["gradient_rel_diff"] for r in picked)
    param = max(r["param_max_abs_diff"] for r in picked)
    print(
        f"{precision}: the hand-over gradient differs by at most {grad_rel:.1e} of its largest"
        f" element, the parameters at the last step by at most {param:.1e}"
    )

# %% [markdown]
# What must be equal is, bit for bit, in both directions. The two lines
# above give each precision's largest differences: under `"highest"` the
# backends' gradients agree far more closely than at the default, and
# every difference stays within its bound. The moved run is the same
# training, within the arithmetic of the backend it ends on.

# %% [markdown]
# ## Records

# %%
resumed = {k: (resume_diffs[lb], resume_tols[lb]) for k, lb in zip(cost_sentences.RESUMED_AS, jobs)}
resumed.update(next_session=(session_diff, EQUIV_TOL), other_process_count=(multi_diff, EQUIV_TOL))
resumed = {key: pair for key, pair in resumed.items() if pair[0] is not None}  # sections that ran
for key, (diff, tolerance) in resumed.items():
    record.record(f"resume_max_abs_diff_{key}", diff, "abs")
    record.record(f"resume_max_abs_diff_{key}_tolerance", tolerance, "abs")
for row in size_rows:
    record.record(f"checkpoint_bytes_{row['form']}", row["bytes on disk"], "bytes")
record.record("sync_save_s", sync_save_s, "s")
record.record("async_save_blocking_s", async_blocked_s, "s")
record.record("async_save_hidden_s", hidden, "s")
_ = record.record("restore_s", restore_s, "s")
print(cost_sentences.resumed_sentence(resumed))

# %% [markdown]
# ## What you learned
#
# - A resumable state is parameters, optimizer state, step, PRNG key and
#   data position; leave one out and the resumed run trains something
#   else, without any error.
# - Orbax's `CheckpointManager` saves asynchronously: `save` returns
#   early, and the write, its commit and its failure happen in the
#   background. `wait_until_finished()`, the next `save()` and `close()`
#   wait for it and raise its error: only a program's last save can fail
#   unseen, so wait for it.
# - A restore target is `jax.ShapeDtypeStruct` leaves with **this** run's
#   shardings: the same checkpoint restores onto all the devices, half of
#   them or one, a 2-D mesh, replicated or FSDP. Without target shardings Orbax silently uses
#   the saved ones.
# - A resumed run equals one that never stopped: bitwise where the
#   arithmetic is the same (the same devices on the CPU), within rounding
#   on another mesh or process count; the line above this list says which
#   held in this run.
# - On a local disk a step is committed by one rename at the end: a kill,
#   a full disk or a read-only folder during a save leaves the previous
#   step the latest.
# - A checkpoint records where it was made (backend, devices, mesh,
#   versions); a restore says what changed and what that does to the
#   numbers. Saved to a folder that outlives the session (Drive on Colab,
#   `/kaggle/working` on Kaggle), it resumes in the next session on any
#   device count that divides its global batch, and on another backend:
#   bit for bit in step, data position, key and optimizer count, within
#   the backends' arithmetic in the parameters.
# - Every process of a multi-process run calls save and restore, into a
#   folder they all see; GKE adds a shared volume and a Job that resumes
#   after a Spot preemption.
#
# **The costs here** (the tables above, this run): the checkpoint's size on
# disk against parameters x 12 bytes in section 7, the synchronous and
# asynchronous save times and the restore time beside them.
#
# **Next:** [12_batch_size](12_batch_size.ipynb): a bigger global batch,
# and whether it reaches the target sooner.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
from dpcourse.exercises import lesson11 as check

# %% [markdown]
# **11.1 · How large is a checkpoint?** The full-size model has 1,863,690
# parameters, trained with AdamW in float32. How many bytes of arrays does
# one checkpoint of its resumable state hold (leave out the step, the key
# and the data position, a few bytes; count every array once)?

# %% tags=["exercise", "ex11_1"]
checkpoint_bytes = ...  # a number of bytes

# %%
check.checkpoint_bytes(checkpoint_bytes)

# %% [markdown]
# **11.2 · Where does it resume?** A run saves a checkpoint every 100
# steps. Its node is preempted at step 430, while the save of step 400 is
# still being written (Orbax's temporary folder exists, the commit has not
# happened). From which step does the restarted run resume?

# %% tags=["exercise", "ex11_2"]
resume_step = ...  # a step number

# %%
check.resume_step(resume_step)
