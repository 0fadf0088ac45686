"""dpcourse.checkpoints.across: a run moved between device layouts (or backends) half-way, proven against one that stayed."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from dpcourse import config, data
from dpcourse.checkpoints import across

STEPS, N_BATCHES = 6, 5


def test_the_tolerances_follow_the_precision_and_the_backends():
    assert across.tolerances(True, "default", 3e-4, 6) == {"gradient_rel": 1e-4, "param_abs": 1e-5}
    assert across.tolerances(False, "highest", 3e-4, 6) == {"gradient_rel": 1e-4, "param_abs": pytest.approx(3.6e-3)}
    assert across.tolerances(False, "default", 3e-4, 6)["gradient_rel"] == 1e-2
    with pytest.raises(ValueError, match="Unknown precision 'bf16': use one of default, highest"):
        across.tolerances(False, "bf16", 3e-4, 6)
    with pytest.raises(ValueError, match="holds no 'count' leaf"):
        across.optimizer_count({"mu": np.zeros(2)})


def test_the_chip_s_stored_comparison_holds_both_directions_at_both_precisions():
    stored = across.stored()
    got = {(r["move"], r["precision"]) for r in stored["runs"]}
    assert got == {(m, p) for m in ("tpu -> cpu", "cpu -> tpu") for p in across.PRECISIONS}
    assert stored["device_kind"] == "TPU v5 lite" and stored["versions"]["libtpu"]
    for r in stored["runs"]:
        assert r["passed"] and r["exact_equal"] and r["restore_max_abs_diff"] == 0.0, r
        assert r["exact_fields_moved"] == r["exact_fields_straight"]
    highest = max(r["gradient_rel_diff"] for r in stored["runs"] if r["precision"] == "highest")
    default = min(r["gradient_rel_diff"] for r in stored["runs"] if r["precision"] == "default")
    assert highest < default  # "highest" is the tight comparison
    assert [row["exact parts"] for row in across.rows(stored["runs"])] == ["bit for bit"] * 4
    assert across.stored_label(stored).startswith("stored: measured on 1 x TPU v5 lite and 8 simulated CPU devices")


def test_a_run_saved_on_8_devices_and_resumed_on_2_in_a_fresh_process_is_proven_the_same_training(
    tmp_path, cpu_devices
):
    cfg = config.make_config("smoke")
    dataset = data.load_fashion_mnist(source="synthetic", limit=cfg.max_train_examples, seed=cfg.seed)
    batch = cfg.global_batch(len(cpu_devices))
    first, second = cpu_devices, cpu_devices[:2]
    half, save_s = across.first_half(cfg, first, dataset, batch, STEPS, N_BATCHES, tmp_path)
    args = ["--dir", str(tmp_path), "--until", str(STEPS), "--devices", "2", "--platform", "cpu", "--profile", "smoke"]
    args += ["--data-source", dataset.source, "--global-batch", str(batch), "--n-batches", str(N_BATCHES)]
    # One fresh process (JAX's import, a restore, three steps, a save): 120 s bounds a loaded 2-core machine.
    done = subprocess.run(
        [sys.executable, "-m", "dpcourse.checkpoints.resume", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["restored_step"] == STEPS // 2 and not done.stderr.strip()
    told = summary["restored_from"]  # where the step was made, what changed, what that does to the numbers
    assert "was saved on 8 cpu devices (cpu, mesh data=8)" in told and "restored onto 2 cpu devices" in told
    assert "changed: device count 8 -> 2" in told and "differ from an uninterrupted run by rounding" in told
    proof = across.prove(cfg, first, second, dataset, batch, STEPS, N_BATCHES, half, tmp_path)
    assert proof["passed"] and proof["exact_equal"] and save_s > 0, proof
    assert proof["exact_fields_moved"]["optimizer_count"] == STEPS
    assert proof["param_abs_tol"] == 1e-5  # one backend: a different sum order alone


def _state(key, w, count=4):
    return {
        "params": {"w": np.asarray(w, np.float32)},
        "opt_state": ({"count": np.int32(count)},),
        "step": 4,
        "data_position": 4,
        "key": jax.random.PRNGKey(key),
    }


@pytest.mark.parametrize("moved", [_state(1, [1, 1]), _state(0, [1, 1], count=3), _state(0, [1, 1.1])])
def test_a_key_or_count_not_carried_over_or_parameters_apart_fail_the_proof(moved):
    straight = _state(0, [1, 1])
    grad = {"w": np.ones(2, np.float32)}
    tol = across.tolerances(True, "default", 3e-4, 4)
    assert across.compare(straight, straight, straight, straight, grad, grad, tol)["passed"]
    assert not across.compare(moved, straight, straight, straight, grad, grad, tol)["passed"]
