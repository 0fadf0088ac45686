# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 13 · When a process goes away: preemption, survivors, restarts
#
# **Goal.** Data-parallel jobs on preemptible machines lose processes: the
# course's GKE cluster can run its nodes as Spot VMs (Terraform's `spot`,
# off by default), which Compute Engine reclaims at any time. Lesson 11
# resumes from a checkpoint on any mesh, lesson 08's launcher names a dead
# process within seconds; here a loss stops being the end of the run. Catch a preemption
# notice (SIGTERM) in one process and save at a step **every process agrees
# on**; let the survivors of a killed process **rebuild the mesh on the
# live devices and keep training**, proven equal to a reference that makes
# the same change at the same step; bring the lost process back; and name,
# in one sentence each, the losses this machine's backend does not recover
# from. Then what a failure costs, and how often to save.
#
# **Assumes.** Notebooks 08 (the launcher, several processes), 10 (the
# global batch split over devices) and 11 (checkpoints). Several local
# processes of one CPU device each, on this machine's TCP loopback.
#
# **Time**: under 1 min with `smoke`, under 1 min with `cpu`, on a 2-core CPU; under 30 s with
# `full` (section 4 alone: that host opens no TCP socket), on 1 x TPU v5 lite (measured; other work
# slows it: the run's details, its load included, are in `baselines/timings.json`).

# %% tags=["parameters"]
PROFILE = None  # None: $DPCOURSE_PROFILE, else "full" on a GPU, "cpu" on a CPU
N_CPU_DEVICES = 3  # simulated CPU devices of this kernel, where the reference runs
N_PROCESSES = None  # local processes of one CPU device each (>= 2); None: one per device, at most 3
STEPS = 24  # training steps of every run; the agreed preemption step comes steps after the signal
STEP_S = 0.1  # the least time a step takes: the processes wait out the rest (a larger model's step)
PREEMPT_AFTER = 3  # section 1: SIGTERM to process 1 once it reported this step
LOSE_AT = 4  # section 2: the last process is lost (SIGKILL) at this step
LEAVE_AT = 8  # section 2: the survivors save here and leave; every process restarts from it
HEARTBEAT_TIMEOUT_S = 3  # seconds without a heartbeat before a process is called dead
STALL_S = 10.0  # the launcher ends a run silent this long in a step (joining, compiling: longer)
LAUNCH_TIMEOUT_S = 120.0  # each run ends (every process) past this

# %%
from dpcourse.lesson import start_lesson

lesson = start_lesson("13_elastic", PROFILE, N_CPU_DEVICES, min_devices=2)
cfg, dataset = lesson.cfg, lesson.dataset

# %%
import math
import os
import shutil
import textwrap
import time

import jax
from IPython.display import display

from dpcourse import record, show, train
from dpcourse.checkpoints import interval
from dpcourse.multihost import elastic, elastic_run, ports, preemption
from dpcourse.multihost import plan as multihost_plan
from dpcourse.multihost.preemption import PREEMPTED_EXIT_CODE

started = time.perf_counter()  # for section 5's time of this run
MULTIHOST_TOL = 1e-5  # lesson 08's bound: multi-process vs one process (the order of additions)


def say(sentence):
    """Print one sentence, wrapped at 100 characters."""
    print(textwrap.fill(sentence, 100))


# One sentence, or None where processes can open a TCP socket on 127.0.0.1 (notebook 08).
no_tcp = ports.tcp_unavailable()
# Each process is a whole JAX runtime on this machine's cores: more than 3 mostly wait for a core.
N_PROCESSES = N_PROCESSES or min(len(lesson.devices.devices), 3)
cpu = sorted(jax.devices("cpu"), key=lambda d: d.id)  # the reference trains on as many CPU devices
if not no_tcp and not 2 <= N_PROCESSES <= len(cpu):
    raise ValueError(
        f"N_PROCESSES must be from 2 (one is lost in section 2) to the {len(cpu)} CPU devices the "
        f"reference can use, got {N_PROCESSES}: change it, or N_CPU_DEVICES and restart the kernel."
    )
cpu = cpu[:N_PROCESSES]
# The workers train on the CPU: the full profile's model would take minutes there; they take cpu's.
profile = cfg.profile if cfg.profile in ("smoke", "cpu") else "cpu"
global_batch = math.lcm(N_PROCESSES, N_PROCESSES - 1) * 8  # split evenly before and after a loss
root = elastic_run.checkpoint_root()  # a temporary folder, removed when the kernel ends
compile_cache = multihost_plan.worker_cache_env()  # notebook 08's cache: the processes compile once
common = dict(profile=profile, data_source=dataset.source, step_s=STEP_S)
common.update(timeout_s=LAUNCH_TIMEOUT_S, stall_s=STALL_S)
# Runs that go on without a lost process see it gone about a heartbeat timeout later (others: 10 s).
survive = dict(recoverable=True, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
# The times against each other, before any run: one sentence naming them and a value that works.
elastic_run.check_pacing(STEPS, STEP_S, STALL_S, LAUNCH_TIMEOUT_S, HEARTBEAT_TIMEOUT_S, True)
print(f"{N_PROCESSES} processes x 1 CPU device; profile {profile}; global batch {global_batch}")
print(f"{STEPS} steps a run, each at least {STEP_S:g} s")
print(f"checkpoints go to a temporary folder, {root}; each run below starts on an empty one")
if no_tcp:
    skipped = "Sections 1 to 3 are skipped, and with them section 5's figures; section 4 runs."
    display(show.banner(f"{no_tcp} {skipped}", "warning"))
    _ = record.figures({"timed_part": ("section 4 alone: that host opens no TCP socket", "note")})

# %% [markdown]
# ## 1. Preemption, cleanly: save at the step every process agrees on
#
# A Spot VM, or a Kubernetes eviction, sends the processes on it **SIGTERM**
# and waits a grace period before SIGKILL: 30 s for a Pod by default, 15 s
# for ordinary Pods when GKE shuts a Spot node down (both in
# `dpcourse.checkpoints.interval`, with their sources). One process got the
# notice; every process must save the **same** step, or the checkpoint is
# half one step and half another. JAX's preemption service (on by default
# in `jax.distributed.initialize`) catches SIGTERM and spreads the notice
# through the coordination service; `multihost_utils.
# reached_preemption_sync_point(step)`, asked at every step, turns True in
# every process at the same step: the largest step any process had reached
# when the notice spread, plus one (its docstring). Each process saves that
# step with lesson 11's checkpoint and leaves with status 143 (128 + SIGTERM,
# what Kubernetes reports for a container SIGTERM ended; the GKE Job
# retries it without counting a failure). The loop is
# `dpcourse.multihost.elastic.train`:
#
# ```python
# for i in range(start, steps):
#     if multihost_utils.reached_preemption_sync_point(i):
#         save(i)                      # lesson 11's checkpoint, every process
#         return PREEMPTED_EXIT_CODE   # 143
#     ...                              # the step
# ```
#
# JAX counts from 0 in a fresh process, and a notice that spreads before a
# process first asks is agreed at step 1: a restarted run, resumed at step
# 12, would never reach it. So each process tells the service the step it
# resumes from right after joining, before the restore
# (`dpcourse.multihost.preemption.ask_from`): a notice during the start-up
# or the restore is then agreed at a step the run reaches.
#
# The launcher sends SIGTERM to process 1 once it reported step
# `PREEMPT_AFTER`; then the same command runs again, resumes, and
# finishes.

# %%
if not no_tcp:
    ck1 = elastic_run.fresh_folder(root / "preempted")  # a new run each time this cell runs
    pre = elastic_run.run_local(
        N_PROCESSES,
        STEPS,
        global_batch,
        checkpoint_dir=ck1,
        preempt_process=1,
        preempt_after_step=PREEMPT_AFTER,
        **common,
    )
    pre.require("sync point", "saved")  # else one sentence says how the run ended
    at_signal = {
        i: max(
            [e["step"] for e in es if e["event"] == "step" and e["t"] <= pre.signal_t], default=0
        )
        for i, es in pre.events.items()
    }
    agreed = {
        i: next((e["step"] for e in es if e["event"] == "sync point"), None)
        for i, es in pre.events.items()
    }
    committed_s = (
        max(e["t"] for es in pre.events.values() for e in es if e["event"] == "saved")
        - pre.signal_t
    )
    print(f"SIGTERM to process 1 when the processes had done steps {at_signal}")
    print(f"agreed step, by process: {agreed}; exit statuses: {pre.exit_codes}")
    print(f"steps in the checkpoint folder: {pre.checkpoint_steps}")
    grace = (interval.KUBERNETES_DEFAULT_GRACE_S, interval.GKE_SPOT_POD_SHUTDOWN_S)
    say(preemption.grace_sentence(committed_s, *grace))
    say(elastic_run.ending(pre))
    assert (
        set(pre.exit_codes.values()) == {PREEMPTED_EXIT_CODE} and len(set(agreed.values())) == 1
    ), "the processes did not all save one agreed step and leave preempted"

# %% [markdown]
# The agreed step comes after the steps done at the signal: JAX's handler
# only sets a flag, a thread looks at it once a second (`kListenInterval`
# in XLA's `xla/tsl/distributed_runtime/preemption/preemption_notifier.cc`),
# then the coordination service tells every process, and each takes the
# largest step reported plus one. Now the restart, as the Job's retry would
# run it, and the proof: the parameters after `STEPS` steps against one
# process that trained them without a stop, on as many devices. It resumes
# from a copy of that folder, so that the cell can run again.

# %%
if not no_tcp:
    ck1_restart = elastic_run.fresh_folder(root / "restarted")
    shutil.copytree(ck1, ck1_restart, dirs_exist_ok=True)  # section 1's checkpoint, as it was left
    resumed = elastic_run.run_local(
        N_PROCESSES, STEPS, global_batch, checkpoint_dir=ck1_restart, **common
    )
    resumed.require("resumed", "done")
    say(elastic_run.ending(resumed))
    straight = elastic.reference_params(
        profile, STEPS, global_batch, cpu, data_source=dataset.source
    )
    preempt_diff = train.max_abs_diff(straight, resumed.params)
    preempt_lost = max(agreed.values()) - resumed.first("resumed")["step"]  # steps done twice
    print(
        f"resumed from step {resumed.first('resumed')['step']}; trained to {resumed.last_step(0)}"
    )
    print(f"max |param diff| vs one uninterrupted process: {preempt_diff:.3g}")
    print(f"(tolerance {MULTIHOST_TOL:g}, lesson 08's)")
    assert preempt_diff <= MULTIHOST_TOL, "the resumed run is not the training that never stopped"

# %% [markdown]
# The difference is lesson 08's: the all-reduce between processes adds in
# another order than one process does (What you learned gives this run's
# difference and its steps done twice).
#
# ## 2. Carry on without the lost process
#
# A process killed with SIGKILL gets no notice. By default JAX's
# coordination service then ends every other process (lesson 08). With
# `jax.config.update("jax_enable_recoverability", True)` before
# `jax.distributed.initialize`, it keeps them: the survivors learn who is
# alive from `multihost_utils.live_devices(devices)`, a barrier among the
# live processes that returns the same device list in each. The loop
# passes that barrier before each step's all-reduce; when the list
# shrinks, it rebuilds the mesh on the live devices and compiles the step
# again. **The global batch stays**: the survivors split the same examples
# over fewer devices (lesson 10's per-device batch grows), so the
# gradient is the mean over the same examples as before.
#
# ```python
# with multihost_utils.live_devices(all_devices) as live:
#     pass                                   # the barrier only: nothing in flight can hang
# if live != devices:
#     mesh = Mesh(np.array(live), ("data",))  # the same global batch, over fewer devices
#     step = jax.jit(make_shard_map_step(cfg, optimizer, mesh, "data"))
# ```
#
# The last process kills itself (SIGKILL) at step `LOSE_AT`, between two
# steps. The survivors go on to step `LEAVE_AT`, save it (Orbax's barriers
# told to wait for the survivors only: by default they span every process
# and fail on the lost one), and leave with 143. Then every process starts
# again from that checkpoint: the rejoin.

# %%
if not no_tcp:
    ck2 = elastic_run.fresh_folder(root / "lost")  # a new run each time this cell runs
    lost_run = elastic_run.run_local(
        N_PROCESSES,
        STEPS,
        global_batch,
        checkpoint_dir=ck2,
        lose_process=N_PROCESSES - 1,
        lose_at=LOSE_AT,
        leave_at=LEAVE_AT,
        **common,
        **survive,
    )
    killed, seen, _ = lost_run.require("killed", "live", "saved")  # else: its ending, in a sentence
    next_step = min(
        e["t"] for e in lost_run.events[0] if e["event"] == "step" and e["step"] == LOSE_AT + 1
    )
    detect_s, going_s = seen["t"] - killed["t"], next_step - killed["t"]
    steps_0 = [e for e in lost_run.events[0] if e["event"] == "step"]  # in the order the run went
    shares = list(dict.fromkeys((e["devices"], global_batch // e["devices"]) for e in steps_0))
    print(f"process {N_PROCESSES - 1} killed at step {killed['step']}")
    print(f"live processes after: {seen['processes']}")
    # A kill is seen T/2 to T + 1 s on: the heartbeat window (elastic_run.seen_sentence says why).
    busy = lost_run.load if lost_run.busy() else None  # the evidence of a busy machine, or None
    say(
        preemption.seen_sentence(detect_s, going_s, HEARTBEAT_TIMEOUT_S, busy)
        + ", on the new mesh."
    )
    print("(devices, examples per device) of the steps:", shares)
    print(f"exit statuses: {lost_run.exit_codes}; steps saved: {lost_run.checkpoint_steps}")
    say(elastic_run.ending(lost_run))
    rejoined = elastic_run.run_local(N_PROCESSES, STEPS, global_batch, checkpoint_dir=ck2, **common)
    rejoined.require("resumed", "step", "done")
    rejoin_s = rejoined.first("step")["t"] - rejoined.started_t  # start, restore, compile, a step
    print(
        f"rejoin: {N_PROCESSES} processes resumed from step {rejoined.first('resumed')['step']}; "
        f"statuses {rejoined.exit_codes}"
    )
    print(f"from the restart to its first step: {rejoin_s:.1f} s")
    changed = elastic.reference_params(
        profile,
        STEPS,
        global_batch,
        cpu,
        LOSE_AT,
        cpu[: N_PROCESSES - 1],
        data_source=dataset.source,
    )
    lost_diff = train.max_abs_diff(changed, rejoined.params)
    # Steps done twice: the survivors' last step against the step every process resumed from.
    survivors_lost = max(e["step"] for e in lost_run.events[0] if e["event"] == "step")
    survivors_lost -= rejoined.first("resumed")["step"]
    print(f"max |param diff| vs one process making the same changes: {lost_diff:.3g}")
    print(f"(tolerance {MULTIHOST_TOL:g})")
    assert lost_diff <= MULTIHOST_TOL, "the survivors' training is not the reference's"

# %% [markdown]
# The reference trains steps 0 to `LOSE_AT` on `N_PROCESSES` devices and
# the rest on one fewer, with the same global batch; since the global
# batch stayed, that is also the run that never lost anything, up to the
# order of the additions.
#
# **Why the rejoin is a restart.** JAX's fault-tolerance guide lets a lost
# process come back into the running job. On the CPU that fails here:
# the collectives between processes (gloo) keep one connection context per
# set of devices, and the returning process cannot make its part again
# (measured while writing this lesson, JAX 0.10.2: `Gloo context
# initialization failed: ALREADY_EXISTS: key cpu:gloo/0,2048,4096/2`,
# while the survivors' old context failed with `Connection closed by
# peer`). So the survivors save and leave, and every process starts again
# from their checkpoint, as after a preemption: a start-up (What you
# learned gives this run's) instead of the steps since the last save.
#
# ## 3. What does not recover here, named
#
# Two losses end the run on this backend, each within a bound, each said in
# one sentence by `elastic_run.ending`:
#
# - **A process lost inside the all-reduce.** JAX's fault-tolerance guide
#   says its support works fully only on GPUs, where a collective in
#   flight is cancelled; the CPU's gloo cannot cancel one. The others'
#   all-reduce fails with a closed connection, or waits in it: in a probe
#   written for this lesson one survivor got the error while the other
#   still waited 30 s later, when it was killed. The launcher bounds that
#   wait by `STALL_S`.
# - **Process 0 lost.** It runs the coordination service, the one that
#   says who is alive; JAX ends every other process (SIGABRT) as soon as
#   their next call to it fails.
#
# Both runs save every 3 steps, so a checkpoint is there to restart from.

# %%
if not no_tcp:
    endings = {}
    for name, where, who in (
        ("in the all-reduce", "collective", N_PROCESSES - 1),
        ("process 0", "between", 0),
    ):
        run = elastic_run.run_local(
            N_PROCESSES,
            STEPS,
            global_batch,
            checkpoint_dir=elastic_run.fresh_folder(root / where),
            save_every=3,
            lose_process=who,
            lose_at=LOSE_AT,
            lose_where=where,
            **common,
            **survive,
        )
        (killed_at,) = run.require("killed")  # else: how it ended, in a sentence
        endings[name] = (run, run.ended_t - killed_at["t"])
        print(
            f"{name}: exit statuses {run.exit_codes}; ended {endings[name][1]:.1f} s after the kill"
        )
        say(elastic_run.ending(run))
    assert all(s <= STALL_S + 5 for _, s in endings.values()), "a failure outlasted its bound"

# %% [markdown]
# What this machine's backend recovers from, as measured above and in the
# probes written for this lesson (JAX 0.10.2, CPU, gloo):
#
# | loss | recovered? | evidence |
# |---|---|---|
# | SIGTERM to one process | yes: saved at the agreed step, restarted | section 1 |
# | SIGKILL between steps | yes: the survivors go on | section 2 |
# | the lost process back in the running job | no: gloo's context exists | section 2's note |
# | SIGKILL inside an all-reduce | no: fails or waits; restart from the checkpoint | section 3 |
# | SIGKILL of process 0 | no: every process ends; restart from the checkpoint | section 3 |
#
# ## 4. What a failure costs, and how often to save
#
# A loss costs the steps since the last save (redone) and the restart.
# Sections 1 and 2 redo no step by design (the save is at the agreed step,
# or the survivors keep the work; What you learned counts them). A loss
# that ends the run (section 3) sends it back to the last save, on average
# half a checkpoint interval. Saving more often cuts that and costs the
# saves themselves: Young's optimal interval `sqrt(2 x save x MTBF)`
# balances the two, and Daly's adds the next terms of the same expansion
# (`dpcourse.checkpoints.interval`, with both papers). For the course's
# GKE node (2 x L4 as a Spot VM: Google guarantees no preemption rate, so
# the MTBF is an assumption you set) and a large job whose failures were
# published (Llama 3 405B):

# %%
# An assumption: Compute Engine publishes Spot VMs' past preemption rates by machine type and
# region ("View the preemption rate and pricing of Spot VMs"); its advice.capacity API estimates
# an uptime (how long most of a request's Spot VMs run before preemption), not a rate.
SPOT_MTBF_H = 24.0
settings = [interval.gke_spot_l4(SPOT_MTBF_H * 3600.0), interval.llama3_405b()]
display(
    show.table(
        interval.table_rows(settings), caption="Optimal checkpoint interval (Daly) and its cost"
    )
)
for s in settings:
    for line in s.sources:
        say(f"{s.name}: {line}")

# %% [markdown]
# ## 5. What recovery took here
#
# This run's own figures, recorded here and read out in "What you learned"
# below: the times the protocol itself takes, to set against the tables'
# save and restart times; then this lesson's time and the machine's load
# (its header gives a quiet machine's).

# %%
figures = {}  # what section 5 records, and "What you learned" reads
if not no_tcp:
    in_allreduce_s = endings["in the all-reduce"][1]
    coordinator_s = endings["process 0"][1]
    figures = {
        "signal_to_committed_checkpoint_s": (committed_s, "s"),
        "preempted_steps_done_twice": (preempt_lost, "steps"),
        "survivors_steps_done_twice": (survivors_lost, "steps"),
        "kill_to_seen_gone_s": (detect_s, "s"),
        "kill_to_next_step_s": (going_s, "s"),
        "restart_to_first_step_s": (rejoin_s, "s"),
        "heartbeat_timeout_s": (HEARTBEAT_TIMEOUT_S, "s"),
        "preempted_resume_max_abs_param_diff": (preempt_diff, "abs"),
        "preempted_resume_max_abs_param_diff_tolerance": (MULTIHOST_TOL, "abs"),
        "survivors_max_abs_param_diff": (lost_diff, "abs"),
        "survivors_max_abs_param_diff_tolerance": (MULTIHOST_TOL, "abs"),
        "lost_in_allreduce_ended_s": (in_allreduce_s, "s"),
        "coordinator_lost_ended_s": (coordinator_s, "s"),
    }
    _ = record.figures(figures)
shutil.rmtree(root, ignore_errors=True)
took, load = time.perf_counter() - started, elastic_run.load_average()
load = f", at a 1-minute load average of {load:.1f} on {os.cpu_count()} cores" if load else ""
print(f"This run of the lesson, from its imports to here: {took:.0f} s{load}.")

# %% [markdown]
# ## What you learned
#
# This run's figures first (none where sections 1 to 3 were skipped):

# %%
for line in preemption.learned({name: value for name, (value, _) in figures.items()}):
    say(f"- {line}")

# %% [markdown]
# - **Preemption** is the clean case: the notice comes with a grace
#   period, and one protocol (the sync point, a save at the agreed step,
#   status 143) is made to lose no step, if the save fits the grace
#   period (one that outlasts it ends in SIGKILL, half-written).
# - **A process killed between steps** costs the survivors, by design, up
#   to a heartbeat timeout (and the second the service takes to look) and
#   a compile, with `jax_enable_recoverability` and a `live_devices`
#   barrier before each all-reduce; with the global batch kept, the
#   training is the same one. Bringing the process back is, on this
#   backend, a restart from the survivors' checkpoint.
# - **A loss inside a collective, or of process 0**, ends the run on the
#   CPU (section 3's table): bound every wait, say what happened, restart
#   from the latest checkpoint, and choose the checkpoint interval
#   (section 4) for what such a loss costs.
# - The **GKE Job** (`docs/multihost.md`) retries status 143 without
#   counting a failure, and keeps the checkpoints on the shared folder the
#   restarted pods read.
#
# **Next:** the exercises below; then `docs/multihost.md` runs these forms
# on GKE.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell tagged `exercise`: replace its `...` with your
# answer and run it, then run the check below it, which says in a sentence
# or two what is right, or what is wrong and why. An exercise left at `...`
# reports "not attempted yet"; nothing here stops the notebook. Worked
# solutions are in the repository's `solutions/` folder: try first.

# %%
from dpcourse.exercises import lesson13 as check

# %% [markdown]
# **13.1 · The agreed step.** Three processes had reached steps 41, 43
# and 42 when the preemption notice reached every one of them. At which
# step does `reached_preemption_sync_point` return True?

# %% tags=["exercise", "ex13_1"]
agreed_step = ...  # a step number

# %%
check.agreed_step(agreed_step)

# %% [markdown]
# **13.2 · The survivors' share.** Four processes of one device each train
# with a global batch of 96; one is lost and the survivors keep the global
# batch. How many examples does each live device take per step?

# %% tags=["exercise", "ex13_2"]
survivor_batch = ...  # examples per device

# %%
check.survivor_batch(survivor_batch)

# %% [markdown]
# **13.3 · How often to save.** A save holds training up for 30 s and the
# job fails on average every 6 hours. How many seconds of training should
# pass between two saves (Daly's optimal interval; Young's is close, and the
# check says which one you gave)?

# %% tags=["exercise", "ex13_3"]
checkpoint_interval = ...  # seconds

# %%
check.checkpoint_interval(checkpoint_interval)
