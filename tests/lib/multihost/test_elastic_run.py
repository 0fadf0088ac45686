"""dpcourse.multihost.elastic_run: real processes preempted or killed, every run ended within its bound, in one sentence."""

from __future__ import annotations

import signal

import pytest

from dpcourse.multihost import elastic, elastic_run
from dpcourse.multihost.ports import tcp_unavailable
from dpcourse.multihost.preemption import PREEMPTED_EXIT_CODE
from dpcourse.train import max_abs_diff

pytestmark = pytest.mark.skipif(bool(tcp_unavailable()), reason="this machine lets no process open a TCP socket")

COMMON = dict(profile="smoke", data_source="synthetic", step_s=0.1, heartbeat_timeout_s=3, timeout_s=90, stall_s=10)
STEPS, PREEMPT_STEPS, BATCH = 8, 24, 8
TOL = 1e-5  # notebook 08's bound on multi-process vs one-process parameters (the order of the additions)


@pytest.fixture(scope="module")
def cpu_devices():
    import jax  # tests/conftest.py set this session's simulated CPU devices

    return sorted(jax.devices("cpu"), key=lambda d: d.id)[:2]


def test_a_preempted_run_saves_one_agreed_step_and_its_restart_is_the_uninterrupted_training(tmp_path, cpu_devices):
    # JAX looks for SIGTERM once a second: the agreed step comes up to 10 steps of 0.1 s later, and more.
    pre = elastic_run.run_local(
        2, PREEMPT_STEPS, BATCH, checkpoint_dir=tmp_path, preempt_process=1, preempt_after_step=2, **COMMON
    )
    assert pre.exit_codes == {0: PREEMPTED_EXIT_CODE, 1: PREEMPTED_EXIT_CODE}, elastic_run.ending(pre)
    agreed = {e["step"] for es in pre.events.values() for e in es if e["event"] == "sync point"}
    assert len(agreed) == 1 and pre.checkpoint_steps == sorted(agreed), (agreed, pre.checkpoint_steps)
    assert pre.signal_t is not None and pre.first("saved")["t"] > pre.signal_t
    assert elastic_run.ending(pre).startswith(f"Every live process saved step {agreed.pop()} and left with status 143")
    resumed = elastic_run.run_local(2, PREEMPT_STEPS, BATCH, checkpoint_dir=tmp_path, **COMMON)
    assert resumed.exit_codes == {0: 0, 1: 0} and resumed.first("resumed")["step"] == pre.checkpoint_steps[0]
    reference = elastic.reference_params("smoke", PREEMPT_STEPS, BATCH, cpu_devices, data_source="synthetic")
    assert max_abs_diff(reference, resumed.params) <= TOL


def test_the_survivor_goes_on_with_the_whole_batch_and_the_restart_equals_the_changed_reference(tmp_path, cpu_devices):
    lost = elastic_run.run_local(
        2, STEPS, BATCH, checkpoint_dir=tmp_path, recoverable=True, lose_process=1, lose_at=2, leave_at=5, **COMMON
    )
    assert lost.exit_codes == {0: PREEMPTED_EXIT_CODE, 1: -signal.SIGKILL}, elastic_run.ending(lost)
    assert lost.first("live")["processes"] == [0] and lost.checkpoint_steps == [5]
    after = [e["devices"] for e in lost.events[0] if e["event"] == "step" and e["step"] > 2]
    assert after == [1, 1, 1], after  # steps 3, 4, 5 on the survivor's one device, the whole batch
    assert lost.first("live")["t"] - lost.first("killed")["t"] < 3 + 5  # the heartbeat timeout, and a margin
    rejoined = elastic_run.run_local(2, STEPS, BATCH, checkpoint_dir=tmp_path, **COMMON)
    assert rejoined.exit_codes == {0: 0, 1: 0} and rejoined.first("resumed")["step"] == 5
    assert rejoined.started_t < rejoined.first("resumed")["t"] < rejoined.first("step")["t"] < rejoined.ended_t
    reference = elastic.reference_params(
        "smoke", STEPS, BATCH, cpu_devices, 2, cpu_devices[:1], data_source="synthetic"
    )
    assert max_abs_diff(reference, rejoined.params) <= TOL
    unchanged = elastic.reference_params("smoke", STEPS, BATCH, cpu_devices, data_source="synthetic")
    assert max_abs_diff(unchanged, rejoined.params) <= TOL  # the same global batch: the same training
    again = elastic_run.run_local(2, STEPS, BATCH, checkpoint_dir=tmp_path, **COMMON)  # a finished run, run again
    assert again.exit_codes == {0: 0, 1: 0} and again.first("resumed")["step"] == STEPS, elastic_run.ending(again)


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
    assert ("all-reduce of step 4" if where == "collective" else "coordination service") in said


def _run(codes, events, stderr=None, stalled=False, steps=(2,)):
    return elastic_run.ElasticRun(
        codes, events, stderr or {i: "" for i in codes}, None, stalled, 10.0, 8.0, None, list(steps)
    )


def test_each_ending_is_read_from_the_run():
    assert elastic_run.ending(_run({0: 0, 1: 0, 2: 0}, {})) == "Every process finished: exit status 0 from all 3."
    saved = {0: [{"event": "saved", "t": 1.0, "step": 6}], 1: [{"event": "saved", "t": 1.0, "step": 6}]}
    assert "saved step 6" in elastic_run.ending(_run({0: 143, 1: 143}, saved))
    killed = {0: [], 1: [{"event": "killed", "t": 4.5, "step": 3, "where": "collective"}]}
    stalled = elastic_run.ending(_run({0: -9, 1: -9}, killed, stalled=True))
    assert "waited in it" in stalled and "after 5.5 s without news (its bound: 8 s)" in stalled
    assert "(step 2)" in stalled
    quiet = elastic_run.ending(_run({0: -9, 1: -9}, {0: [], 1: []}, stalled=True, steps=()))
    assert quiet.startswith("No process reported anything for 8 s")
    late = _run({0: -9, 1: -9}, {0: [], 1: []}, steps=())
    late.timed_out = 90.0
    assert elastic_run.ending(late).startswith("The run passed its limit of 90 s and the launcher ended it")
    mixed = elastic_run.ending(_run({0: 0, 1: 143}, {0: [], 1: []}))
    assert mixed == "The processes ended with statuses {0: 0, 1: 143}, and no step was saved at a preemption."
    crashed = elastic_run.ending(_run({0: 1, 1: -9}, {0: [], 1: []}, {0: "Traceback\nValueError: bad\n", 1: ""}))
    assert crashed == "Process 0 failed (exit status 1): ValueError: bad"


def test_a_batch_the_processes_cannot_split_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="dividing the global batch"):
        elastic_run.run_local(3, STEPS, 8)
