"""dpcourse.multihost.elastic_run: real processes preempted or killed, every run ended within its bound, in one sentence."""

from __future__ import annotations

import os
import signal
import time

import pytest

from dpcourse.multihost import elastic, elastic_run, ports, preemption
from dpcourse.multihost.ports import tcp_unavailable
from dpcourse.multihost.preemption import PREEMPTED_EXIT_CODE
from dpcourse.train import max_abs_diff

no_tcp = pytest.mark.skipif(bool(tcp_unavailable()), reason="this machine lets no process open a TCP socket")

COMMON = dict(profile="smoke", data_source="synthetic", step_s=0.1, heartbeat_timeout_s=3, timeout_s=90, stall_s=10)
STEPS, PREEMPT_STEPS, BATCH = 8, 24, 8
TOL = 1e-5  # notebook 08's bound on multi-process vs one-process parameters (the order of the additions)


@pytest.fixture(scope="module")
def cpu_devices():
    import jax  # tests/conftest.py set this session's simulated CPU devices

    return sorted(jax.devices("cpu"), key=lambda d: d.id)[:2]


@no_tcp
def test_a_preempted_run_saves_one_agreed_step_a_notice_during_the_restore_too_and_the_restart_is_the_training(
    tmp_path, cpu_devices
):
    # JAX looks for SIGTERM once a second: the agreed step comes up to 10 steps of 0.1 s later, and more.
    pre = elastic_run.run_local(
        2, PREEMPT_STEPS, BATCH, checkpoint_dir=tmp_path, preempt_process=1, preempt_after_step=2, **COMMON
    )
    assert pre.exit_codes == {0: PREEMPTED_EXIT_CODE, 1: PREEMPTED_EXIT_CODE}, elastic_run.ending(pre)
    agreed = {e["step"] for es in pre.events.values() for e in es if e["event"] == "sync point"}
    assert len(agreed) == 1 and pre.checkpoint_steps == sorted(agreed), (agreed, pre.checkpoint_steps)
    assert pre.signal_t is not None and pre.first("saved")["t"] > pre.signal_t
    step = agreed.pop()
    assert elastic_run.ending(pre) == (
        f"Process 1 got the preemption notice (SIGTERM); every process saved step {step}, the step they agreed "
        f"on, and left with status 143: restart every process; each resumes from step {step}."
    )
    # A second notice while the restarted run restores (before its first step): agreed at a step the resumed
    # run reaches, saved, and every process leaves with 143 instead of training on to the end.
    again = elastic_run.run_local(
        2, PREEMPT_STEPS, BATCH, checkpoint_dir=tmp_path, preempt_process=1, preempt_on="restore", **COMMON
    )
    assert again.exit_codes == {0: PREEMPTED_EXIT_CODE, 1: PREEMPTED_EXIT_CODE}, elastic_run.ending(again)
    assert again.first("resumed")["step"] == step and again.first("done") is None
    assert again.signal_t < again.first("resumed")["t"] + 1.0  # the notice came while it restored
    second = again.first("sync point")["step"]
    assert step <= second < PREEMPT_STEPS and again.checkpoint_steps[-1] == second, again.checkpoint_steps
    resumed = elastic_run.run_local(2, PREEMPT_STEPS, BATCH, checkpoint_dir=tmp_path, **COMMON)
    assert resumed.exit_codes == {0: 0, 1: 0} and resumed.first("resumed")["step"] == second
    reference = elastic.reference_params("smoke", PREEMPT_STEPS, BATCH, cpu_devices, data_source="synthetic")
    assert max_abs_diff(reference, resumed.params) <= TOL


@no_tcp
def test_the_survivor_goes_on_with_the_whole_batch_and_the_restart_equals_the_changed_reference(tmp_path, cpu_devices):
    lost = elastic_run.run_local(
        2, STEPS, BATCH, checkpoint_dir=tmp_path, recoverable=True, lose_process=1, lose_at=2, leave_at=5, **COMMON
    )
    assert lost.exit_codes == {0: PREEMPTED_EXIT_CODE, 1: -signal.SIGKILL}, elastic_run.ending(lost)
    assert lost.first("live")["processes"] == [0] and lost.checkpoint_steps == [5]
    after = [e["devices"] for e in lost.events[0] if e["event"] == "step" and e["step"] > 2]
    assert after == [1, 1, 1], after  # steps 3, 4, 5 on the survivor's one device, the whole batch
    # JAX's service: a heartbeat every half timeout, stale past the timeout, looked for once a second.
    # ("killed" is stamped once the kill returned, late under load: half a second of margin below too)
    assert 3 / 2 - 0.5 <= lost.first("live")["t"] - lost.first("killed")["t"] < 3 + 1 + 2  # and a margin for load
    said = elastic_run.ending(lost)
    assert said.startswith("Process 1 was killed (SIGKILL, as planned) between steps 2 and 3; the survivors saw")
    assert said.endswith("saved step 5 and left with status 143: restart every process; each resumes from step 5.")
    with pytest.raises(elastic_run.CheckpointLeftover, match="already holds step 5 from an earlier run"):
        elastic_run.run_local(2, STEPS, BATCH, checkpoint_dir=tmp_path, lose_process=1, lose_at=2, **COMMON)
    rejoined = elastic_run.run_local(2, STEPS, BATCH, checkpoint_dir=tmp_path, **COMMON)
    assert rejoined.exit_codes == {0: 0, 1: 0} and rejoined.first("resumed")["step"] == 5
    assert rejoined.started_t < rejoined.first("resumed")["t"] < rejoined.first("step")["t"] < rejoined.ended_t
    reference = elastic.reference_params(
        "smoke", STEPS, BATCH, cpu_devices, 2, cpu_devices[:1], data_source="synthetic"
    )
    assert max_abs_diff(reference, rejoined.params) <= TOL
    # The same global batch over fewer devices is the same training: tests/lib/multihost/test_elastic.py.
    again = elastic_run.run_local(2, STEPS, BATCH, checkpoint_dir=tmp_path, **COMMON)  # a finished run, run again
    assert again.exit_codes == {0: 0, 1: 0} and again.first("resumed")["step"] == STEPS, elastic_run.ending(again)
    assert "without training a step: the checkpoint folder" in elastic_run.ending(again)


@no_tcp
@pytest.mark.parametrize("who, where", [(1, "collective"), (0, "between")], ids=["in-the-all-reduce", "process-0"])
def test_a_loss_this_backend_does_not_recover_from_ends_within_its_bound_in_one_sentence(tmp_path, who, where):
    run = elastic_run.run_local(
        2,
        STEPS,
        BATCH,
        checkpoint_dir=tmp_path,
        recoverable=True,
        save_every=2,
        lose_process=who,
        lose_at=3,
        lose_where=where,
        **COMMON,
    )
    said = elastic_run.ending(run)
    assert run.ended_t - run.first("killed")["t"] <= COMMON["stall_s"] + 5, said
    assert run.exit_codes[who] == -signal.SIGKILL and run.checkpoint_steps == [2], run.exit_codes
    assert said.count(". ") == 0 and said.endswith("restart every process from the latest checkpoint (step 2)."), said
    assert ("inside the all-reduce of step 4" if where == "collective" else "coordination service") in said


def _run(codes, events, stderr=None, stalled=False, steps=(2,), **fields):
    plan = dict(steps=8, checkpoint_dir="/tmp/ck", preempt_process=1, recoverable=True, heartbeat_timeout_s=3)
    plan.update(fields.pop("plan", {}))
    return elastic_run.ElasticRun(
        codes, events, stderr or {i: "" for i in codes}, fields.pop("signal_t", None), stalled, 10.0, 8.0,
        None, list(steps), plan=plan, **fields,
    )  # fmt: skip


def _e(event, t, **fields):
    return {"event": event, "t": t, **fields}


def test_each_ending_is_decided_from_what_happened():
    assert elastic_run.ending(_run({0: 0, 1: 0, 2: 0}, {})) == "Every process finished: exit status 0 from all 3."
    saved = {i: [_e("sync point", 1.0, step=6), _e("saved", 1.2, step=6)] for i in (0, 1)}
    preempted = elastic_run.ending(_run({0: 143, 1: 143}, saved, signal_t=0.5))
    assert preempted.startswith("Process 1 got the preemption notice (SIGTERM); every process saved step 6")
    # The same statuses after the launcher ended a silent run are no preemption (it ends with SIGKILL; here the
    # processes saved before the silence): no notice was sent, so none is named.
    assert "preemption notice" not in elastic_run.ending(_run({0: 143, 1: 143}, saved, stalled=True))
    # A kill between steps, then a silence past the bound (a heartbeat timeout longer than it): named as a kill
    # between steps, never as a loss inside the all-reduce.
    between = {0: [_e("step", 4.0, step=4)], 1: [_e("killed", 4.5, step=4, where="between")]}
    said = elastic_run.ending(_run({0: -9, 1: -9}, between, stalled=True, waited={0: "the liveness barrier"}))
    assert said.startswith("Process 1 was killed (SIGKILL, as planned) between steps 4 and 5, and then the run")
    assert "all-reduce" not in said
    inside = {0: [_e("alive", 4.0, step=3)], 1: [_e("killed", 4.5, step=3, where="collective")]}
    stalled = elastic_run.ending(_run({0: -9, 1: -9}, inside, stalled=True))
    assert "inside the all-reduce of step 4" in stalled and "5.5 s after the kill (its bound: 8 s" in stalled
    assert "(step 2)" in stalled
    # A planned kill after which the survivors finished: the planned kill, not a failure.
    finished = {0: [_e("done", 9.0, step=8)], 1: [_e("killed", 4.5, step=6, where="between")]}
    said = elastic_run.ending(_run({0: 0, 1: -9}, finished))
    assert said.startswith("Process 1 was killed (SIGKILL, as planned) between steps 6 and 7; the survivors went on")
    # A notice that came too late to be agreed on before the last step.
    late = elastic_run.ending(_run({0: 0, 1: 0}, {0: [], 1: []}, signal_t=9.0))
    assert "before the processes agreed on a step to save" in late
    timed = _run({0: -9, 1: -9}, {0: [], 1: []}, steps=())
    timed.timed_out, timed.load, timed.cores = 90.0, 0.5, 2
    assert elastic_run.ending(timed).startswith("The run passed its limit of 90 s while waiting for")
    crashed = elastic_run.ending(_run({0: 1, 1: -9}, {0: [], 1: []}, {0: "Traceback\nValueError: bad\n", 1: ""}))
    assert crashed == "Process 0 failed (exit status 1): ValueError: bad"


def test_a_run_a_busy_machine_stopped_says_so_and_that_a_rerun_will_do():
    busy = _run({0: -9, 1: -9}, {0: [_e("joined", 1.0)], 1: [_e("started", 1.0)]}, stalled=True, steps=())
    busy.load, busy.cores = 9.3, 2
    busy.waited = {0: "importing Orbax and loading the data (bound 60 s)"}
    said = elastic_run.ending(busy)
    assert said.startswith("The machine was too busy for this run (load average 9.3 on 2 cores): it went silent")
    assert said.endswith("nothing is wrong with the run: run the cell again, when fewer programs run.")
    joined = _run({0: 1, 1: -9}, {0: [], 1: []}, {0: "DEADLINE_EXCEEDED: Barrier timed out\n", 1: ""}, steps=())
    joined.load, joined.cores = 11.0, 2
    assert elastic_run.ending(joined).startswith("The machine was too busy for this run (load average 11.0")
    # The same silence with times that disagree (a step longer than the silence bound), or a join bound the
    # learner shortened, is the settings' doing: never "too busy", however loaded the machine.
    paced = dict(steps=24, step_s=12.0, stall_s=10.0, timeout_s=120.0)
    for plan, same in ((paced, busy), (dict(timeout_s=20.0), joined)):
        late = _run(same.exit_codes, same.events, same.stderr, same.stalled, steps=(), plan=plan)
        late.load, late.cores, late.waited = 9.3, 2, same.waited
        assert "too busy" not in elastic_run.ending(late)
    assert "outside the 1.5 to 4 s" in (said := preemption.seen_sentence(9.0, 10.0, 3)) and "busy" not in said
    assert "(a busy machine delays the barrier: load 7.5)" in preemption.seen_sentence(9.0, 10.0, 3, 7.5)


def test_the_silence_bound_starts_at_the_first_report_and_grows_with_what_a_process_waits_for():
    plan = dict(stall_s=10.0, timeout_s=120.0, recoverable=True, heartbeat_timeout_s=60)
    assert elastic_run.silence_bound(None, plan)[1] is None  # Python still starting: only the run's limit
    names = ("started", "joined", "loaded", "compiling", "alive")
    bounds = {name: elastic_run.silence_bound({"event": name}, plan)[1] for name in names}
    assert bounds["started"] > bounds["joined"] == bounds["loaded"] == bounds["compiling"] == elastic_run.COMPILE_S
    assert bounds["compiling"] > bounds["alive"] == 10.0
    # Between steps a recoverable run waits in the liveness barrier: up to a heartbeat timeout and the second
    # the service takes to look, so a long HEARTBEAT_TIMEOUT_S does not make a kill look like a hang.
    assert elastic_run.silence_bound({"event": "step"}, plan)[1] == 10.0 + 60 + 1
    assert elastic_run.silence_bound({"event": "step"}, {**plan, "recoverable": False})[1] == 10.0


@pytest.mark.parametrize(
    "change, said",
    [
        (dict(heartbeat_timeout_s=0), "heartbeat_timeout_s (HEARTBEAT_TIMEOUT_S) must be a whole number from 1"),
        (dict(heartbeat_timeout_s=1e9), "must be a whole number from 1 to 90"),
        (dict(heartbeat_timeout_s=2.5), "must be a whole number"),
        (dict(lose_process=1, lose_at=8), "lose_at (LOSE_AT): a step of the run, below steps"),
        (dict(preempt_process=1, preempt_after_step=30), "preempt_after_step (PREEMPT_AFTER)"),
        (dict(preempt_process=5, preempt_after_step=2), "preempt_process must be a whole number from 0 to 1"),
        (dict(lose_process=1, lose_at=4, leave_at=3, recoverable=True), "leave_at (LEAVE_AT): a step after lose_at"),
        (dict(leave_at=3), "give lose_process and recoverable=True too"),
        (dict(lose_process=1, lose_at=2, lose_where="inside"), "lose_where must be one of"),
        (dict(stall_s=float("nan")), "stall_s must be a number of seconds above 0"),
        (dict(step_s=-1), "step_s must be 0 or more seconds"),
        (dict(preempt_process=1, preempt_on="later"), "preempt_on must be one of"),
        (dict(step_s=12.0), "stall_s must be at least step_s + 5 s; set STALL_S = 22 (or STEP_S = 0)."),
        (dict(step_s=4.0, timeout_s=20), "take 32 s, and timeout_s (LAUNCH_TIMEOUT_S) = 20 s ends it before"),
        (dict(step_s=5.0, recoverable=True, heartbeat_timeout_s=30, timeout_s=60), "LAUNCH_TIMEOUT_S = 131"),
    ],
)
def test_a_parameter_that_cannot_work_is_refused_in_one_sentence_before_anything_starts(change, said):
    args = {**COMMON, **change}
    with pytest.raises(elastic_run.RunRefused) as refused:
        elastic_run.run_local(2, STEPS, BATCH, **args)
    assert said in str(refused.value) and str(refused.value).count(". ") == 0
    assert refused.value._render_traceback_() == [f"RunRefused: {refused.value}"]  # a notebook shows this alone
    with pytest.raises(ValueError, match="positive multiple of the 3 processes"):
        elastic_run.run_local(3, STEPS, 8)


def test_a_fresh_folder_is_empty_and_a_leftover_is_named_with_its_fix(tmp_path):
    (tmp_path / "ck" / "24").mkdir(parents=True)
    with pytest.raises(elastic_run.CheckpointLeftover) as left:
        elastic_run.run_local(2, STEPS, BATCH, checkpoint_dir=tmp_path / "ck", preempt_process=1, preempt_after_step=3)
    assert "already holds step 24 from an earlier run" in str(left.value)
    assert f"elastic_run.fresh_folder('{tmp_path / 'ck'}') empties this one" in str(left.value)
    assert list(elastic_run.fresh_folder(tmp_path / "ck").iterdir()) == []
    assert elastic_run.saved_steps(tmp_path / "ck") == [] and elastic_run.saved_steps(None) == []


def test_a_run_that_ended_early_stops_a_section_with_its_ending_alone():
    run = _run({0: 0, 1: 0}, {0: [], 1: []})
    with pytest.raises(elastic_run.RunEndedEarly) as early:
        run.require("killed")
    assert str(early.value) == "Every process finished: exit status 0 from all 2."
    assert run.require() == []


@no_tcp
def test_an_interrupted_run_ends_every_process_and_says_so_in_one_sentence(tmp_path, monkeypatch):
    def interrupt(procs, out, plan):
        raise KeyboardInterrupt

    monkeypatch.setattr(elastic_run, "_watch", interrupt)
    with pytest.raises(KeyboardInterrupt) as stopped:
        elastic_run.run_local(2, STEPS, BATCH, checkpoint_dir=tmp_path / "ck", **COMMON)
    said = str(stopped.value)
    assert said.startswith("You interrupted the run") and f"its checkpoint folder {tmp_path / 'ck'}" in said
    assert "statuses {0: -9, 1: -9}" in said  # ended at once, with SIGKILL (no save at a preemption)
    assert type(stopped.value) is KeyboardInterrupt  # what notebook runners read as an interrupt
    assert stopped.value._render_traceback_() == [f"KeyboardInterrupt: {said}"]  # a notebook shows this alone


@no_tcp
def test_a_run_keeps_to_its_user_another_learner_cannot_reach_its_coordinator(tmp_path, monkeypatch, other_user):
    """Learner B of a room, during learner A's lesson-13 run: the coordinator is a socket in A's 0700 folder."""
    with ports.private_network() as network:
        private = network.reason is None
    seen = {}

    def look(procs, out, plan):  # while the processes run: what another user could reach, then stop the run
        sock = out / "coordinator.sock"
        deadline = time.monotonic() + 60
        while not sock.exists() and time.monotonic() < deadline and all(p.poll() is None for p in procs.values()):
            time.sleep(0.05)
        seen["socket"], seen["mode"] = sock.exists(), out.stat().st_mode & 0o777
        mine = os.readlink("/proc/self/ns/net")
        seen["own_network"] = {os.readlink(f"/proc/{p.pid}/ns/net") != mine for p in procs.values()}
        if os.geteuid() == 0 and sock.exists():
            seen["other_user"] = other_user(str(sock))["coordinator"]
        raise KeyboardInterrupt

    monkeypatch.setattr(elastic_run, "_watch", look)
    with pytest.raises(KeyboardInterrupt):
        elastic_run.run_local(2, STEPS, BATCH, checkpoint_dir=tmp_path / "ck", **COMMON)
    assert seen["socket"] and seen["mode"] == 0o700, seen
    assert seen["own_network"] == {private}, seen  # gloo inside the run's own network where Linux allows one
    if os.geteuid() != 0:
        pytest.skip("only root can act as another user (make test runs as root in CI)")
    assert seen["other_user"] == "PermissionError", seen
