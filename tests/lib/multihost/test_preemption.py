"""dpcourse.multihost.preemption: the preempted status is the one a shell reports for a process SIGTERM ended."""

from __future__ import annotations

import signal
import subprocess
import sys

from dpcourse.multihost import preemption


def test_the_preempted_status_is_128_plus_sigterm():
    assert preemption.PREEMPTED_EXIT_CODE == 143 == 128 + signal.SIGTERM


def test_a_shell_reports_a_process_ended_by_sigterm_with_the_preempted_status():
    """A container's exit code, as Kubernetes reads it, is its main process's status through a shell: 128 + signal."""
    script = f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGTERM)'; echo $?"
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert int(out.stdout.split()[-1]) == preemption.PREEMPTED_EXIT_CODE


def test_the_grace_sentence_reads_its_verdict_from_the_numbers():
    inside = preemption.grace_sentence(0.67, 30.0, 15.0)
    assert inside == (
        "From the signal to the committed checkpoint: 0.67 s, inside both grace periods, 30 s (Kubernetes' "
        "default) and 15 s (a GKE Spot node's Pod): 22 times shorter than the shorter one."
    )
    for between in (20.0, 15.0):  # a save that ends as the grace period does is cut off
        said = preemption.grace_sentence(between, 30.0, 15.0)
        assert "inside 30 s (Kubernetes' default) but past 15 s (a GKE Spot node's Pod)" in said
    assert "past both grace periods" in preemption.grace_sentence(31.0, 30.0, 15.0)


def test_the_grace_sentence_refuses_a_time_that_is_not_one():
    import pytest

    for bad in (0.0, -1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(ValueError, match="a time in seconds > 0"):
            preemption.grace_sentence(bad, 30.0, 15.0)


def test_a_notice_before_jax_listens_is_held_then_passed_on():
    """SIGTERM during start-up is kept; after the join it goes to the handler then in place (here: the default)."""
    code = (
        "import os, signal; from dpcourse.multihost import preemption as p; p.hold_early_notice(); "
        "os.kill(os.getpid(), signal.SIGTERM); print('held', flush=True); p.pass_on_notice(service_on=False); "
        "print('not passed on', flush=True)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["held"] and done.returncode == -signal.SIGTERM
    quiet = "from dpcourse.multihost import preemption as p; p.hold_early_notice(); print(p.pass_on_notice(False))"
    done = subprocess.run([sys.executable, "-c", quiet], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False"] and done.returncode == 0


def test_the_step_a_run_starts_from_is_the_latest_numbered_folder(tmp_path):
    assert preemption.latest_saved_step(None) == 0 and preemption.latest_saved_step(tmp_path / "none") == 0
    for name in ("3", "12", "12.orbax-checkpoint-tmp-1", "lock"):
        (tmp_path / name).mkdir()
    assert preemption.latest_saved_step(tmp_path) == 12
