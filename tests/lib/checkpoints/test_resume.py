"""dpcourse.checkpoints.resume: a run stopped halfway and resumed from its checkpoint equals one that never stopped."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from jax.sharding import Mesh

from dpcourse import config, data, train
from dpcourse.checkpoints import checkpoint, provenance, resume

STEPS, N_BATCHES = 6, 5


@pytest.fixture(scope="module")
def setup(cpu_devices):
    cfg = config.make_config("smoke")
    dataset = data.load_fashion_mnist(source="synthetic", limit=cfg.max_train_examples, seed=cfg.seed)
    mesh = Mesh(np.array(cpu_devices), ("data",))
    return cfg, dataset, mesh, cfg.global_batch(len(cpu_devices))


def _half_saved(tmp_path, setup, form):
    cfg, dataset, mesh, batch = setup
    step_fn, noisy, xs, ys, state0 = resume.build(cfg, mesh, form, batch, dataset, N_BATCHES)
    straight, losses = resume.train_until(state0, step_fn, noisy, xs, ys, STEPS)
    half, _ = resume.train_until(state0, step_fn, noisy, xs, ys, STEPS // 2)
    run = checkpoint.run_description(cfg, batch)
    with checkpoint.open_manager(tmp_path) as manager:
        checkpoint.save(manager, STEPS // 2, half, run)
    return straight, losses, half, run, state0


def _args(tmp_path, setup, *extra):
    cfg, dataset, _, batch = setup
    run = ["--dir", str(tmp_path), "--profile", cfg.profile, "--data-source", dataset.source]
    return run + ["--global-batch", str(batch), "--n-batches", str(N_BATCHES), *extra]


@pytest.mark.parametrize("form", checkpoint.FORMS)
def test_resumed_from_half_way_the_run_is_bitwise_the_uninterrupted_one_on_the_cpu(tmp_path, setup, form, capsys):
    straight, losses, half, run, state0 = _half_saved(tmp_path, setup, form)
    # The loop steps the key and the data position with the step.
    assert int(straight["step"]) == int(straight["data_position"]) == STEPS and len(losses) == STEPS
    assert not np.array_equal(np.asarray(straight["key"]), np.asarray(half["key"]))
    args = _args(tmp_path, setup, "--until", str(STEPS), "--devices", "8", "--platform", "cpu", "--form", form)
    assert resume.main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["restored_step"] == STEPS // 2 and summary["final_step"] == STEPS
    mesh = setup[2]
    target = checkpoint.abstract_target(state0, checkpoint.state_shardings(state0, mesh, form))
    with checkpoint.open_manager(tmp_path) as manager:
        step, got = checkpoint.restore(manager, target, run)
    assert step == STEPS and train.max_abs_diff(straight, got) == 0.0


def test_resuming_a_missing_or_empty_directory_is_one_sentence_naming_where_to_train_from_step_0(
    tmp_path, setup, capsys
):
    """A mistyped missing folder was made, and the advice "train from step 0" named no command or cell."""
    assert resume.main(_args(tmp_path / "mistyped", setup, "--until", str(STEPS))) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: The checkpoint directory {tmp_path / 'mistyped'} does not exist (none was made)")
    assert "train from step 0 first as notebook 11 does (its section 2" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "mistyped").exists()
    (tmp_path / "empty").mkdir()
    assert resume.main(_args(tmp_path / "empty", setup, "--until", str(STEPS))) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'empty'} holds no complete step, so there is nothing to resume" in err
    assert "notebook 11" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == []  # the lock went with the run


# --- faults: each ends the command within seconds, in one sentence, and the last complete step restores whole ---
# A bound far above the few seconds these take on a quiet machine (JAX's import dominates), so that only a hang
# (Orbax's thread kept the process alive for minutes before) fails it.
EXIT_BOUND_S = 60


@pytest.fixture(scope="module")
def saved_two_steps(tmp_path_factory, setup):
    """Steps 2 and 4 saved once for the module: the folder, the states at step 2 and 4, the run and step 0."""
    cfg, dataset, mesh, batch = setup
    folder = tmp_path_factory.mktemp("two-steps")
    step_fn, noisy, xs, ys, state0 = resume.build(cfg, mesh, "replicated", batch, dataset, N_BATCHES)
    run = checkpoint.run_description(cfg, batch)
    states = {}
    with checkpoint.open_manager(folder) as manager:
        for k in (2, 4):
            states[k], _ = resume.train_until(state0, step_fn, noisy, xs, ys, k)
            checkpoint.save(manager, k, states[k], run)
            checkpoint.finish(manager)
    return folder, states, run, state0


@pytest.fixture
def two_steps(tmp_path, saved_two_steps):
    """A fresh copy of :func:`saved_two_steps` in ``tmp_path``: ``(states, run, state0)``."""
    folder, states, run, state0 = saved_two_steps
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    return states, run, state0


def _restores_whole(folder, setup, run, state0, step, expected):
    target = checkpoint.abstract_target(state0, checkpoint.state_shardings(state0, setup[2], "replicated"))
    with checkpoint.open_manager(folder) as manager:
        got_step, got = checkpoint.restore(manager, target, run)
    assert got_step == step and train.max_abs_diff(expected, got) == 0.0


def _command(folder, setup, *extra, code=None):
    """The resume command in a fresh process; ``code`` runs first in it (a planted fault) and then main."""
    args = _args(folder, setup, "--devices", "8", *extra)
    if code is None:
        return [sys.executable, "-m", "dpcourse.checkpoints.resume", *args]
    program = f"import os, sys\n{code}\n    status = resume.main({args!r})\nsys.stderr.flush()\nos._exit(status)\n"
    return [sys.executable, "-c", program]


def _run(command):
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S * 3)
    return done, time.monotonic() - start


def _damage(folder, kind):
    step = folder / "4"
    data = max((p for p in (step / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    if kind == "truncated data file":
        data.write_bytes(data.read_bytes()[:1000])
        return "cannot be read"
    if kind == "missing data file":
        data.unlink()
        return "cannot be read"
    if kind == "empty step folder":
        shutil.rmtree(step)
        step.mkdir()
        return "its folder is empty"
    (step / "_CHECKPOINT_METADATA").write_text('{"item_handlers": ')
    return "its metadata file _CHECKPOINT_METADATA cannot be read"


@pytest.mark.parametrize("kind", ["truncated data file", "missing data file", "empty step folder", "bad metadata"])
def test_a_damaged_latest_step_is_named_and_the_complete_one_before_it_restored(tmp_path, setup, kind, two_steps):
    states, run, state0 = two_steps
    what = _damage(tmp_path, kind)
    target = checkpoint.abstract_target(state0, checkpoint.state_shardings(state0, setup[2], "replicated"))
    with checkpoint.open_manager(tmp_path) as manager:
        with pytest.raises(checkpoint.CheckpointError, match=r"step 4 in .* is damaged .*restore it with step=2"):
            checkpoint.restore(manager, target, run)  # the package call, without warn: an error, nothing moved
        with pytest.raises(checkpoint.CheckpointError, match=r"is damaged .*: restore another step"):
            checkpoint.restore(manager, target, run, step=4, warn=print)  # a step asked for: never another
        said = []
        step, got = checkpoint.restore(manager, target, run, warn=said.append)
    assert step == 2 and train.max_abs_diff(states[2], got) == 0.0
    assert len(said) == 1 and what in said[0], said
    assert (
        said[0].startswith(f"step 4 in {tmp_path} is damaged (")
        and "step 2 is complete: resuming from step 2" in said[0]
    )
    assert (tmp_path / f"4{checkpoint.DAMAGED_SUFFIX}").is_dir()  # set aside, never deleted
    with checkpoint.open_manager(tmp_path) as manager:
        assert manager.all_steps() == [2]


def test_a_step_damaged_twice_is_set_aside_twice_and_never_stays_listed(tmp_path, setup, two_steps):
    """The second time, 4.damaged existed: the rename failed silently and step 4 stayed, refusing its new save."""
    states, run, state0 = two_steps
    target = checkpoint.abstract_target(state0, checkpoint.state_shardings(state0, setup[2], "replicated"))
    for kept in ("4.damaged", "4.damaged.2"):
        _damage(tmp_path, "bad metadata")
        said = []
        with checkpoint.open_manager(tmp_path) as manager:
            step, _ = checkpoint.restore(manager, target, run, warn=said.append)
            assert step == 2 and manager.all_steps() == [2] and f"(kept as {kept})" in said[0], said
            checkpoint.save(manager, 4, states[4], run)  # trained again from 2: saved anew
            checkpoint.finish(manager)
    assert sorted(p.name for p in tmp_path.iterdir() if "damaged" in p.name) == ["4.damaged", "4.damaged.2"]
    _restores_whole(tmp_path, setup, run, state0, 4, states[4])


def test_the_resume_command_goes_on_from_the_step_before_a_damaged_one_and_saves_it_anew(
    tmp_path, setup, capsys, two_steps
):
    states, run, state0 = two_steps
    _damage(tmp_path, "truncated data file")
    assert resume.main(_args(tmp_path, setup, "--until", "4", "--devices", "8")) == 0
    out, err = capsys.readouterr()
    assert err.startswith(f"step 4 in {tmp_path} is damaged (the data of ")
    assert len(err.splitlines()) == 1, err[-2000:]  # Orbax's tracebacks went to the log file
    assert json.loads(out.splitlines()[-1])["restored_step"] == 2
    _restores_whole(tmp_path, setup, run, state0, 4, states[4])  # trained again from 2: the same step 4


def test_a_full_disk_during_the_save_ends_the_command_in_seconds_with_one_sentence(tmp_path, setup, two_steps):
    states, run, state0 = two_steps
    plant = (
        "import errno\nfrom dpcourse.checkpoints import checkpoint, resume\n"
        "with checkpoint.fail_at_commit(OSError(errno.ENOSPC, 'No space left on device')):"
    )
    done, took = _run(_command(tmp_path, setup, "--until", "6", code=plant))
    assert done.returncode == 1 and took < EXIT_BOUND_S, (took, done.stderr[-2000:])
    assert done.stderr.startswith("error: Could not finish the save") and "no room left" in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr[-2000:]
    _restores_whole(tmp_path, setup, run, state0, 4, states[4])


def _after_training(monkeypatch, action) -> None:
    """The resume command (in this process) trains, then ``action()`` runs (a fault in the middle of the run), then it saves."""
    real = resume.train_until

    def train_until(*args, **kwargs):
        out = real(*args, **kwargs)
        action()
        return out

    monkeypatch.setattr(resume, "train_until", train_until)


def _one_sentence_in_process(tmp_path, setup, capsys, *parts, folder=None):
    start = time.monotonic()
    status = resume.main(_args(folder or tmp_path, setup, "--until", "6", "--devices", "8"))
    took, err = time.monotonic() - start, capsys.readouterr().err
    assert status == 1 and took < EXIT_BOUND_S, (took, err[-3000:])
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err[-3000:]
    for part in parts:
        assert part in err, err


def test_a_folder_that_turns_read_only_mid_run_ends_the_command_with_one_sentence(
    tmp_path, setup, two_steps, monkeypatch, capsys
):
    """The issue's example: a 123-line traceback (the lock's release raised over the sentence), then a hang."""
    states, run, state0 = two_steps
    if os.geteuid() == 0:  # root writes anywhere: a read-only bind mount, undone below
        if shutil.which("mount") is None:
            pytest.skip("no mount command to make the folder read-only as root")
        make = ["mount", "--bind", "-o", "ro", str(tmp_path), str(tmp_path)]
        undo = ["umount", str(tmp_path)]
    else:
        make, undo = ["chmod", "555", str(tmp_path)], ["chmod", "755", str(tmp_path)]
    _after_training(monkeypatch, lambda: subprocess.run(make, check=True, capture_output=True))
    try:
        _one_sentence_in_process(tmp_path, setup, capsys, "the directory cannot be written")
    finally:
        subprocess.run(undo, capture_output=True)
    assert (tmp_path / checkpoint.LOCK_NAME).exists()  # could not be removed; the next run takes it over
    _restores_whole(tmp_path, setup, run, state0, 4, states[4])
    monkeypatch.undo()
    assert resume.main(_args(tmp_path, setup, "--until", "4", "--devices", "8")) == 0  # the lock freed itself


def test_a_folder_deleted_mid_run_ends_the_command_with_one_sentence_not_a_new_folder(
    tmp_path, setup, two_steps, monkeypatch, capsys
):
    folder = tmp_path / "ckpt"
    shutil.copytree(tmp_path, folder, ignore=lambda d, names: ["ckpt"] if d == str(tmp_path) else [])
    _after_training(monkeypatch, lambda: shutil.rmtree(folder))
    _one_sentence_in_process(
        tmp_path, setup, capsys, f"The checkpoint directory {folder} was deleted, moved or unmounted", folder=folder
    )
    assert not folder.exists()  # not made again, empty, by the save


def test_no_usable_temporary_folder_still_ends_in_the_one_sentence(tmp_path, setup, two_steps, monkeypatch, capsys):
    """With 0 bytes free, an 18-line "No usable temporary directory" traceback replaced the sentence."""
    import errno
    import tempfile

    def no_temp():
        raise FileNotFoundError(errno.ENOENT, "No usable temporary directory found")

    monkeypatch.setattr(tempfile, "gettempdir", no_temp)
    with checkpoint.fail_at_commit(OSError(errno.ENOSPC, "No space left on device")):
        _one_sentence_in_process(
            tmp_path, setup, capsys, "Could not finish the save", "no room left", "no usable temporary folder"
        )


def test_a_full_disk_that_also_holds_the_temporary_folder_is_one_sentence(tmp_path, setup, two_steps):
    """The issue's example: 877 lines of "Logging error" and no sentence (a real full disk: root only)."""
    states, run, state0 = two_steps
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)]).returncode:
        pytest.skip("a small disk to fill needs root (mount -t tmpfs); the planted full disks above cover the rest")
    try:
        shutil.copytree(tmp_path, disk / "ckpt", ignore=lambda d, names: ["disk"] if d == str(tmp_path) else [])
        (disk / "tmp").mkdir()
        free = shutil.disk_usage(disk).free
        with open(disk / "filler", "wb") as fh:  # leave less than a step's files
            fh.write(b"\0" * max(0, free - 16384))
        start = time.monotonic()
        env = {**os.environ, "TMPDIR": str(disk / "tmp")}
        command = _command(disk / "ckpt", setup, "--until", "6")
        done = subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S * 3, env=env)
        took, err = time.monotonic() - start, done.stderr
        assert done.returncode == 1 and took < EXIT_BOUND_S, (took, err[-3000:])
        assert len(err.splitlines()) == 1 and "no room left" in err and f"{disk / 'ckpt'}:" in err, err[-3000:]
        (disk / "filler").unlink()
        _restores_whole(disk / "ckpt", setup, run, state0, 4, states[4])
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_a_file_given_as_the_folder_is_one_sentence_not_start_from_step_0(tmp_path, setup, capsys):
    (tmp_path / "file").write_text("not a folder")
    assert resume.main(_args(tmp_path / "file", setup, "--until", "6", "--devices", "8")) == 1
    err = capsys.readouterr().err
    assert "is a file, not a folder" in err and "step 0" not in err and len(err.splitlines()) == 1


def test_a_second_run_on_the_folder_is_refused_naming_the_first(tmp_path, setup, capsys, two_steps):
    states, run, state0 = two_steps
    with checkpoint.hold(tmp_path, "the first run"):
        assert resume.main(_args(tmp_path, setup, "--until", "6", "--devices", "8")) == 1
    err = capsys.readouterr().err
    assert f"is already held by this process (process {os.getpid()} on {socket.gethostname()}, started 20" in err
    assert "(the first run)" in err
    _restores_whole(tmp_path, setup, run, state0, 4, states[4])
    assert not (tmp_path / checkpoint.LOCK_NAME).exists()  # released when the first run ended


def test_the_step_rules_are_the_worker_s(tmp_path, setup, capsys, two_steps):
    states, run, state0 = two_steps
    assert resume.main(_args(tmp_path, setup, "--until", "4", "--devices", "8")) == 0  # already there
    out, err = capsys.readouterr()
    assert "already holds step 4: nothing to train or save" in err and json.loads(out)["final_step"] == 4
    assert resume.main(_args(tmp_path, setup, "--until", "3", "--devices", "8")) == 1  # past it
    assert "is at step 4, past --until 3: raise --until to at least 4" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        resume.main(_args(tmp_path, setup, "--devices", "8"))  # no --until: no step 0 holding step 4's state
    assert exited.value.code == 2 and "--until N is required" in capsys.readouterr().err
    with checkpoint.open_manager(tmp_path) as manager:
        assert manager.all_steps() == [2, 4]
    _restores_whole(tmp_path, setup, run, state0, 4, states[4])


def _rewrite_run(folder, change):
    path = folder / "4" / "run" / "metadata"  # step 4's run description, as Orbax's JsonSave wrote it
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


@pytest.mark.parametrize("made", ["a string", {"mesh": ["data", 8]}, {"versions": "0.10.2"}])
def test_a_record_of_where_a_step_was_made_of_another_shape_is_told_and_the_step_resumes(
    tmp_path, setup, capsys, two_steps, made
):
    key = provenance.KEY
    _rewrite_run(tmp_path, lambda run: {**run, key: made if isinstance(made, str) else {**run[key], **made}})
    assert resume.main(_args(tmp_path, setup, "--until", "6", "--devices", "8")) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["restored_step"] == 4 and "of another shape ($" in summary["restored_from"], summary


@pytest.mark.parametrize("kind", ["no global_batch", "invalid JSON"])
def test_a_latest_run_description_damaged_is_told_and_every_reader_takes_the_step_before(
    tmp_path, setup, capsys, two_steps, kind
):
    if kind == "invalid JSON":
        (tmp_path / "4" / "run" / "metadata").write_text('{"profile": ')
    else:
        _rewrite_run(tmp_path, lambda run: {k: v for k, v in run.items() if k != "global_batch"})
    with checkpoint.open_manager(tmp_path) as manager:  # lesson 11's section 9 reads the batch this way
        step, saved = checkpoint.newest_run(manager)
        assert (step, saved["global_batch"], manager.all_steps()) == (2, setup[3], [2, 4])
    assert resume.main(_args(tmp_path, setup, "--until", "4", "--devices", "8")) == 0
    out, err = capsys.readouterr()
    why = "'global_batch' is a required property" if kind != "invalid JSON" else "run/metadata cannot be read"
    assert err.startswith(f"step 4 in {tmp_path} is damaged (") and why in err and len(err.splitlines()) == 1, err
    assert json.loads(out.splitlines()[-1])["restored_step"] == 2


def test_a_step_folder_renamed_04_is_told_not_passed_over(tmp_path, setup, capsys, two_steps):
    os.rename(tmp_path / "4", tmp_path / "04")
    assert resume.main(_args(tmp_path, setup, "--until", "6", "--devices", "8")) == 1
    err = capsys.readouterr().err
    assert "error: The folder 04 in " in err and "rename it to 4" in err and len(err.splitlines()) == 1, err


def test_a_process_killed_while_writing_leaves_the_previous_step_latest_and_the_next_run_goes_on(
    tmp_path, setup, two_steps
):
    states, run, state0 = two_steps
    done, took = _run(_command(tmp_path, setup, "--kill-at", "writing"))
    assert done.returncode == -9 and took < EXIT_BOUND_S, done.stderr[-2000:]
    _restores_whole(tmp_path, setup, run, state0, 4, states[4])
    assert resume.main(_args(tmp_path, setup, "--until", "6", "--devices", "8")) == 0  # a new run saves over it


def test_a_fresh_process_resumes_on_the_notebooks_platform_but_never_on_tpu_chips_it_holds(setup):
    """On a TPU host 11's fresh processes could not open the chips, which the notebook held."""
    for platform, used in (("cpu", "cpu"), ("gpu", "gpu"), ("tpu", "cpu")):
        command = resume.command("a dir; rm -rf ~", setup[0], [type("D", (), {"platform": platform})], 4, 64, 5, "x")
        assert command[command.index("--platform") + 1] == used and "a dir; rm -rf ~" in command


def _listing(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


def test_a_checkpoint_of_another_profile_is_refused_in_one_sentence_and_nothing_is_written(tmp_path, setup, capsys):
    _half_saved(tmp_path, setup, "replicated")
    before = _listing(tmp_path)
    args = _args(tmp_path, setup, "--until", str(STEPS), "--devices", "8") + ["--profile", "cpu"]
    assert resume.main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: The checkpoint in ") and "profile 'smoke' (this run: 'cpu')" in err
    assert len(err.strip().splitlines()) == 1
    assert _listing(tmp_path) == before  # no step, no lock left, no file touched


def test_a_global_batch_the_new_devices_cannot_split_is_refused_naming_the_counts_that_work(tmp_path, setup, capsys):
    _half_saved(tmp_path, setup, "replicated")
    before = _listing(tmp_path)
    batch = setup[3]  # 64: 8 devices x 8 examples
    assert resume.main(_args(tmp_path, setup, "--until", str(STEPS), "--devices", "3")) == 1
    err = capsys.readouterr().err
    assert f"keeps its global batch of {batch}" in err and "does not divide evenly over 3 devices" in err
    assert "(1, 2, 4, 8, 16, 32, 64)" in err and len(err.strip().splitlines()) == 1
    assert _listing(tmp_path) == before
