"""dpcourse.checkpoints.checkpoint: restores onto other meshes, failures in one sentence, the last step kept, other runs refused."""

import errno

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import config, model, train
from dpcourse.checkpoints import checkpoint


@pytest.fixture(scope="module")
def cfg():
    return config.make_config("smoke")


def _state(cfg, step=3, width=None):
    cfg = cfg if width is None else cfg.with_overrides(width=width)
    params = model.init_params(cfg)
    return checkpoint.make_state(params, train.make_optimizer(cfg).init(params), step, jax.random.PRNGKey(0), step)


def _mesh(devs):
    return Mesh(np.array(devs), ("data",))


def _saved(tmp_path, cfg, cpu_devices, form="fsdp"):
    mesh = _mesh(cpu_devices)
    state = _state(cfg)
    placed = jax.device_put(state, checkpoint.state_shardings(state, mesh, form))
    run = checkpoint.run_description(cfg, 64)
    with checkpoint.open_manager(tmp_path / "ckpt") as manager:
        checkpoint.save(manager, 3, placed, run)
        checkpoint.finish(manager)
    return state, run


@pytest.mark.parametrize("form", checkpoint.FORMS)
def test_a_state_saved_on_8_devices_restores_equal_onto_4_devices_with_the_target_shardings(
    tmp_path, cfg, cpu_devices, form
):
    state, run = _saved(tmp_path, cfg, cpu_devices, form="fsdp" if form == "replicated" else "replicated")
    mesh4 = _mesh(cpu_devices[:4])
    shardings = checkpoint.state_shardings(state, mesh4, form)
    with checkpoint.open_manager(tmp_path / "ckpt") as manager:
        step, got = checkpoint.restore(manager, checkpoint.abstract_target(state, shardings), run)
    assert step == 3 and train.max_abs_diff(state, got) == 0.0
    assert all(jax.tree.leaves(jax.tree.map(lambda a, s: a.sharding == s, got, shardings)))
    if form == "fsdp":
        assert got["params"]["w_block"].sharding.spec == P("data", None)


@pytest.mark.parametrize(
    "code, phrase",
    [(errno.ENOSPC, "no room left"), (errno.EDQUOT, "no room left"), (errno.EROFS, "cannot be written")],
)
def test_a_full_disk_or_a_read_only_folder_during_a_save_is_one_sentence_and_no_corrupt_latest_step(
    tmp_path, cfg, cpu_devices, code, phrase
):
    state, run = _saved(tmp_path, cfg, cpu_devices)
    with checkpoint.open_manager(tmp_path / "ckpt") as manager:
        with checkpoint.fail_at_commit(OSError(code, "simulated")):
            checkpoint.save(manager, 4, state, run)
            with pytest.raises(checkpoint.CheckpointError) as caught:
                checkpoint.finish(manager)
        assert phrase in str(caught.value) and "\n" not in str(caught.value)
        assert "last complete step is unchanged" in str(caught.value)
        assert manager.latest_step() == 3
    assert checkpoint.half_written(tmp_path / "ckpt") == ["4" + checkpoint.TMP_SUFFIX]
    # Orbax 0.12.8 renames each item's temporary folder inside the step's, writes the step's
    # commit_success.txt, then renames the step's folder: the planted failure is at the last of these.
    inside = sorted(p.name for p in (tmp_path / "ckpt" / ("4" + checkpoint.TMP_SUFFIX)).iterdir())
    assert inside == ["_CHECKPOINT_METADATA", "commit_success.txt", "run", "state"], inside
    with checkpoint.open_manager(tmp_path / "ckpt") as manager:
        mesh = _mesh(cpu_devices)
        target = checkpoint.abstract_target(state, checkpoint.state_shardings(state, mesh, "fsdp"))
        assert checkpoint.restore(manager, target, run)[0] == 3


def test_a_checkpoint_from_another_profile_or_model_is_refused_naming_the_mismatch(tmp_path, cfg, cpu_devices):
    state, _ = _saved(tmp_path, cfg, cpu_devices)
    other = checkpoint.run_description(cfg.with_overrides(width=64), 64)
    target = checkpoint.abstract_target(state, checkpoint.state_shardings(state, _mesh(cpu_devices), "replicated"))
    with checkpoint.open_manager(tmp_path / "ckpt") as manager:
        with pytest.raises(checkpoint.CheckpointMismatch, match=r"width 32 \(this run: 64\)"):
            checkpoint.restore(manager, target, other)
        with pytest.raises(checkpoint.CheckpointMismatch, match="global_batch 64"):
            checkpoint.restore(manager, target, checkpoint.run_description(cfg, 32))


def test_a_state_of_another_layout_is_refused_in_one_sentence(tmp_path, cfg, cpu_devices):
    state, run = _saved(tmp_path, cfg, cpu_devices)
    wider = _state(cfg, width=64)
    target = checkpoint.abstract_target(wider, checkpoint.state_shardings(wider, _mesh(cpu_devices), "replicated"))
    with (
        checkpoint.open_manager(tmp_path / "ckpt") as manager,
        pytest.raises(checkpoint.CheckpointMismatch, match="does not fit the target state"),
    ):
        checkpoint.restore(manager, target, run)


def test_a_target_without_shardings_is_refused_before_anything_is_read(tmp_path, cfg, cpu_devices):
    state, run = _saved(tmp_path, cfg, cpu_devices)
    bare = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), state)
    with (
        checkpoint.open_manager(tmp_path / "ckpt") as manager,
        pytest.raises(checkpoint.CheckpointError, match="have no sharding"),
    ):
        checkpoint.restore(manager, bare, run)


def test_an_empty_directory_says_to_start_from_step_0(tmp_path, cfg, cpu_devices):
    state = _state(cfg)
    target = checkpoint.abstract_target(state, checkpoint.state_shardings(state, _mesh(cpu_devices), "replicated"))
    with (
        checkpoint.open_manager(tmp_path / "empty") as manager,
        pytest.raises(checkpoint.CheckpointError, match="No complete checkpoint.*step 0"),
    ):
        checkpoint.restore(manager, target, checkpoint.run_description(cfg, 64))


@pytest.mark.parametrize("below", ["", "ckpt"])
def test_a_file_as_the_directory_or_above_it_is_one_sentence_that_names_the_file(tmp_path, below):
    (tmp_path / "file").write_text("x")
    with pytest.raises(checkpoint.CheckpointError, match=f"{tmp_path / 'file'} is a file, not a folder") as caught:
        checkpoint.open_manager(tmp_path / "file" / below)
    assert "step 0" not in str(caught.value)
    with pytest.raises(checkpoint.CheckpointError, match="is a file, not a folder"):
        checkpoint.hold(tmp_path / "file" / below).__enter__()


def test_a_step_already_saved_is_one_sentence_not_orbax_s_traceback(tmp_path, cfg, cpu_devices):
    state, run = _saved(tmp_path, cfg, cpu_devices)
    with checkpoint.open_manager(tmp_path / "ckpt") as manager:
        with pytest.raises(checkpoint.CheckpointError, match="step 3 to .*: that step is already saved there"):
            checkpoint.save(manager, 3, state, run)
        assert manager.latest_step() == 3


def test_the_step_rule_of_the_resume_command_and_the_worker():
    assert checkpoint.steps_to_train(None, 4, "d", "--until") == 4
    assert checkpoint.steps_to_train(2, 4, "d", "--until") == 2
    assert checkpoint.steps_to_train(4, 4, "d", "--steps") == 0  # already there: nothing to do
    with pytest.raises(checkpoint.StepPastTarget, match="d is at step 6, past --steps 4: raise --steps to at least 6"):
        checkpoint.steps_to_train(6, 4, "d", "--steps")
    with pytest.raises(ValueError, match="--until must be >= 1"):
        checkpoint.steps_to_train(4, 0, "d", "--until")


def test_an_unknown_form_and_a_fault_without_a_kind_are_refused(cfg, cpu_devices):
    with pytest.raises(ValueError, match="replicated, fsdp"):
        checkpoint.state_shardings(_state(cfg), _mesh(cpu_devices), "zero3")
    with pytest.raises(ValueError, match="either an error"), checkpoint.fail_at_commit():
        pass


def test_sizes_count_every_array_once_and_the_files_on_disk(tmp_path, cfg, cpu_devices):
    state, _ = _saved(tmp_path, cfg, cpu_devices)
    n_params = model.param_count(cfg)
    # 12 bytes per parameter, plus AdamW's step count (4), the step, the position (4 each) and the key (8).
    assert checkpoint.leaf_bytes(state) == 12 * n_params + 4 + 4 + 4 + 8
    # Orbax compresses each chunk (zstd): random initial weights hardly shrink, AdamW's zero moments vanish.
    assert 4 * n_params < checkpoint.directory_bytes(tmp_path / "ckpt" / "3") < 12 * n_params
    placed = jax.device_put(state, NamedSharding(_mesh(cpu_devices), P()))
    assert checkpoint.leaf_bytes(placed) == checkpoint.leaf_bytes(state)


def test_orbax_s_own_log_of_a_failed_save_is_held_back_and_the_level_given_back():
    import logging

    logger = logging.getLogger("absl")
    before = logger.level
    with checkpoint.quiet_orbax_log():
        assert not logger.isEnabledFor(logging.ERROR)
    assert logger.level == before


@pytest.mark.parametrize("kind", ["Auto", "Explicit"])
@pytest.mark.parametrize("scope", ["with", "global"])
def test_a_restore_under_an_active_set_mesh_gives_the_target_shardings(tmp_path, cfg, cpu_devices, kind, scope):
    # Notebook 03 allows jax.set_mesh(mesh) globally or in a `with`; the restore must not take the
    # mesh in context for its own, nor trip over it (reported as google/orbax#3164).
    state, run = _saved(tmp_path, cfg, cpu_devices)
    axis_type = getattr(jax.sharding.AxisType, kind)
    mesh4 = Mesh(np.array(cpu_devices[:4]), ("data",), axis_types=(axis_type,))
    shardings = checkpoint.state_shardings(state, mesh4, "fsdp")
    if scope == "global":
        setter = jax.set_mesh(mesh4)  # set now, as a learner's global call; its exit puts the old one back
        try:
            with checkpoint.open_manager(tmp_path / "ckpt") as manager:
                step, got = checkpoint.restore(manager, checkpoint.abstract_target(state, shardings), run)
        finally:
            setter.__exit__(None, None, None)
    else:
        with jax.set_mesh(mesh4), checkpoint.open_manager(tmp_path / "ckpt") as manager:
            step, got = checkpoint.restore(manager, checkpoint.abstract_target(state, shardings), run)
    assert step == 3 and train.max_abs_diff(state, got) == 0.0
    assert all(jax.tree.leaves(jax.tree.map(lambda a, s: a.sharding == s, got, shardings)))


def _make_read_only(folder):
    """Make ``folder`` read-only (a bind mount as root, who writes anywhere; chmod otherwise); return the undo."""
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    if shutil.which("mount") is None:
        pytest.skip("no mount command to make the folder read-only as root")
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(folder)], capture_output=True)
    if done.returncode:
        pytest.skip(f"mount --bind -o ro failed here: {done.stderr.decode()[:200]}")
    return lambda: subprocess.run(["umount", str(folder)], check=True)


def test_a_folder_that_turned_read_only_fails_the_save_call_itself_not_a_thread_the_others_wait_for(
    tmp_path, cfg, cpu_devices
):
    """Several processes hung in Orbax's barriers for minutes when the step's folder was made in the background."""
    state, run = _saved(tmp_path, cfg, cpu_devices)
    folder = tmp_path / "ckpt"
    with checkpoint.open_manager(folder) as manager:
        undo = _make_read_only(folder)
        try:
            with pytest.raises(checkpoint.CheckpointError, match="save step 4 to .*cannot be written") as caught:
                checkpoint.save(manager, 4, state, run)
        finally:
            undo()
        assert caught.value.lasting  # a retry would fail the same way: the worker exits with 78
        assert manager.latest_step() == 3
