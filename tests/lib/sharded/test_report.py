"""dpcourse.sharded.report: lesson 10's state table and its sentence, the check that names a form that is not the
same training, and the GPU figures and the prediction read from a stored compile at the sizes it was made at."""

import re

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import config, model, train
from dpcourse.cross_compile import notebook as gpu_notebook
from dpcourse.cross_compile import steps as sharded_steps
from dpcourse.sharded import forms, report

CFG = config.make_config("smoke")


def _mesh(n):
    return Mesh(np.array(jax.devices("cpu")[:n]), ("data",))


def test_the_state_table_reads_each_forms_bytes_against_the_formula(cpu_devices, capsys):
    mesh, params = _mesh(8), model.init_params(CFG)
    state = train.make_optimizer(CFG).init(params)
    plan = forms.shard_specs(params, 8)
    sharded_params = jax.device_put(params, jax.tree.map(lambda s: NamedSharding(mesh, s), plan.specs))
    rep = jax.device_put((params, state), NamedSharding(mesh, P()))
    states = {"replicated DP": rep, "ZeRO-1": (rep[0], state), "FSDP": (sharded_params, state)}
    report.show_state_bytes(states, model.param_count(CFG), 8, cpu_devices[0])
    printed = capsys.readouterr().out
    assert "replicated DP 1.00 against 1.00 (as the formula says)" in printed
    # The state left whole in both: ZeRO-1 saves nothing, FSDP only its parameters' share.
    assert "ZeRO-1 1.00 against 2.40 (nothing sharded)" in printed, printed
    assert "FSDP 1.40 against 8.00 (short of the formula: some leaves stay whole)" in printed, printed


def test_the_ratio_sentence_says_which_way_each_form_lies_from_the_formula():
    text = report.ratio_sentence({"replicated DP": (1.0, 1.0), "ZeRO-1": (2.52, 2.67), "FSDP": (9.0, 8.0)})
    assert "replicated DP 1.00 against 1.00 (as the formula says)" in text
    assert "ZeRO-1 2.52 against 2.67 (short of the formula: some leaves stay whole)" in text
    assert "FSDP 9.00 against 8.00 (above the formula)" in text


def test_a_form_that_is_not_the_same_training_is_named(cpu_devices):
    params = model.init_params(CFG)
    state = train.make_optimizer(CFG).init(params)
    metrics = {"loss": np.float32(1.0), "accuracy": np.float32(0.5)}
    same = (params, state, metrics)
    moved = (jax.tree.map(lambda a: a + 1e-2, params), state, metrics)
    final = {"replicated DP": same, "ZeRO-1": same}
    assert report.check_same_training(final, (params, state), "cpu", 8, 4, 3, 1e-5) == {"replicated DP": 0, "ZeRO-1": 0}
    with pytest.raises(AssertionError, match="^FSDP: "):
        report.check_same_training({**final, "FSDP": moved}, (params, state), "cpu", 8, 4, 3, 1e-5)


@pytest.mark.parametrize("profile", ["cpu", "full"])
def test_a_stored_smoke_compile_is_read_with_the_smoke_sizes(profile, capsys):
    """A `cpu` run without the GPU-compile extra shows the `smoke` compile `make placement` stored: its figures once
    mixed the stored bytes with the `cpu` model's ("0% of the gradient") and section 7 skipped the comparison."""
    cfg = config.make_config(profile)
    jobs = [gpu_notebook.deviceless.Job("gpu", t, 8, profile) for t in ("h200", "l4")]
    stored = gpu_notebook.find_stored(jobs, sharded_steps.SHARDED_STEPS)
    assert stored and any(r.profile != profile for r in stored), [r.profile for r in stored]
    report.show_gpu_figures(stored, cfg, 4, forms.MIN_SHARD_ELEMENTS)
    report.compare_with_prediction(stored, cfg, 8, 4)
    printed = capsys.readouterr().out
    for res in stored:
        leaves = model.init_params(config.make_config(res.profile))
        share = (leaves["w_block"].nbytes + leaves["b_block"].nbytes) / sum(a.nbytes for a in leaves.values())
        said = "this run's sizes" if res.profile == profile else f"the {res.profile} profile's sizes, as compiled"
        assert f"{res.label} ({said}" in printed and f"{share:.0%} of the gradient" in printed, printed
        if res.profile != profile:
            assert f"{res.label}: compiled for the {res.profile} profile on 8 GPUs" in printed, printed
    # Like with like: replicated DP's all-reduce, placed as predicted, is within 10% of the prediction.
    assert re.search(r"replicated DP:\n.*\n    sent [\d,]+ B, predicted [\d,]+: [\d.]+x, within 10%", printed), printed
