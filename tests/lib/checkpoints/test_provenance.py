"""dpcourse.checkpoints.provenance: where a checkpoint was made, written with every save and told at every restore."""

import jax
import numpy as np
from jax.sharding import Mesh

from dpcourse import config, model, train
from dpcourse.checkpoints import checkpoint, provenance


def _placed(cfg, devices):
    params = model.init_params(cfg)
    state = checkpoint.make_state(params, train.make_optimizer(cfg).init(params), 3, jax.random.PRNGKey(0), 3)
    mesh = Mesh(np.array(devices), ("data",))
    return jax.device_put(state, checkpoint.state_shardings(state, mesh, "replicated")), mesh


def test_a_state_on_a_mesh_is_described_by_its_backend_devices_mesh_and_versions(cpu_devices):
    state, _ = _placed(config.make_config("smoke"), cpu_devices[:4])
    made = provenance.describe(state)
    assert (made["backend"], made["device_kind"], made["device_count"], made["mesh"]) == ("cpu", "cpu", 4, {"data": 4})
    assert made["versions"]["jax"] == jax.__version__ and "orbax-checkpoint" in made["versions"]
    assert made["saved_utc"].endswith("Z") and made["process_count"] == 1


def test_what_changed_and_what_it_does_to_the_numbers():
    base = {"backend": "cpu", "device_kind": "cpu", "device_count": 8, "mesh": {"data": 8}, "versions": {"jax": "1"}}
    assert provenance.changes(base, dict(base)) == []
    assert "the ones an uninterrupted run takes" in provenance.effect(base, dict(base))
    fewer = {**base, "device_count": 2, "mesh": {"data": 2}}
    assert provenance.changes(base, fewer) == ["device count 8 -> 2", "mesh {'data': 8} -> {'data': 2}"]
    assert "by rounding" in provenance.effect(base, fewer)
    chip = {**base, "backend": "tpu", "device_kind": "TPU v5 lite", "device_count": 1, "mesh": {"data": 1}}
    assert provenance.changes(base, chip)[0] == "backend cpu -> tpu"
    assert "one bfloat16 pass" in provenance.effect(base, chip) and "carry over exactly" in provenance.effect(
        base, chip
    )
    newer = {**base, "versions": {"jax": "2"}}
    assert provenance.changes(base, newer) == ["jax 1 -> 2"] and "last bits" in provenance.effect(base, newer)


def test_every_save_writes_it_and_every_restore_with_say_tells_it(tmp_path, cpu_devices):
    cfg = config.make_config("smoke")
    state, _ = _placed(cfg, cpu_devices)
    run = checkpoint.run_description(cfg, 64)
    with checkpoint.open_manager(tmp_path) as manager:
        checkpoint.save(manager, 3, state, run)
    _, fewer = _placed(cfg, cpu_devices[:2])
    target = checkpoint.abstract_target(state, checkpoint.state_shardings(state, fewer, "replicated"))
    told = []
    with checkpoint.open_manager(tmp_path) as manager:
        assert checkpoint.newest_run(manager)[1][provenance.KEY]["device_count"] == len(cpu_devices)
        checkpoint.restore(manager, target, run, say=told.append)
    assert len(told) == 1 and told[0].startswith("Step 3 (profile smoke) was saved on 8 cpu devices (cpu, mesh data=8)")
    assert "restored onto 2 cpu devices" in told[0] and "changed: device count 8 -> 2" in told[0]


def test_a_step_saved_without_it_says_so_and_still_restores(cpu_devices):
    state, _ = _placed(config.make_config("smoke"), cpu_devices[:1])
    sentence = provenance.restored_sentence(4, {"profile": "smoke"}, state)
    assert sentence.startswith("Step 4 (profile smoke) holds no record of where it was made")
