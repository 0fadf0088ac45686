"""Tests of dpcourse.multihost.plan: notebook 08's process split and the workers' cache."""

import os

import pytest

from dpcourse.multihost import plan as multihost_plan
from dpcourse.multihost.plan import choose_split


@pytest.mark.parametrize(
    "available, split",
    [(8, (2, 4)), (16, (2, 4)), (6, (2, 3)), (4, (2, 2)), (3, (3, 1)), (2, (2, 1)), (5, (2, 2)), (7, (2, 3))],
)
def test_split_chosen_from_the_devices_available(available, split):
    # with 3 devices in the kernel, 3 x 1 instead of a fixed 2 x 4.
    assert choose_split(available) == split
    p, d = split
    assert p >= 2 and p * d <= available


def test_one_value_given_the_other_fits():
    assert choose_split(8, n_processes=4) == (4, 2)
    assert choose_split(8, devices_per_process=2) == (4, 2)
    assert choose_split(3, devices_per_process=1) == (3, 1)


def test_too_large_a_split_says_which_values_to_set():
    with pytest.raises(ValueError) as err:
        choose_split(3, 2, 4)
    message = str(err.value)
    assert "2 x 4 = 8 devices, more than the 3 here" in message
    assert "N_PROCESSES = 3 and DEVICES_PER_PROCESS = 1" in message


@pytest.mark.parametrize(
    "args, match",
    [
        ((1,), "at least 2 CPU devices"),
        ((8, 1), "at least 2 processes"),
        ((8, 0), "int >= 1"),
        ((8, None, 0), "int >= 1"),
        ((3, None, 2), "room for 1 process"),
        ((8, 9), "more than 8 CPU devices"),
    ],
)
def test_impossible_splits_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        choose_split(*args)


def test_worker_cache_env_sets_the_cache_and_keeps_the_learners_values(tmp_path):
    env = {}
    got = multihost_plan.worker_cache_env(tmp_path / "cache", env)
    assert got == {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    assert (tmp_path / "cache").is_dir() and env == got
    mine = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "mine"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2"}
    assert multihost_plan.worker_cache_env(tmp_path / "c2", dict(mine)) == mine
    assert (tmp_path / "mine").is_dir() and not (tmp_path / "c2").exists()


def test_only_a_split_with_several_devices_per_process_may_save_a_checkpoint():
    for n_processes, local, folder in ((1, 1, "ckpt"), (2, 2, "ckpt"), (4, 2, "ckpt"), (2, 1, None)):
        multihost_plan.check_savable_split(n_processes, local, folder)
    with pytest.raises(multihost_plan.UnsavableSplit, match="2 processes with one device each cannot save") as caught:
        multihost_plan.check_savable_split(2, 1, "ckpt")
    assert isinstance(caught.value, ValueError) and caught.value.lasting  # the worker exits with 78 for it


@pytest.mark.parametrize("home", ["file", "unset"])
def test_a_home_that_cannot_hold_the_cache_falls_back_to_a_private_temp_folder(monkeypatch, tmp_path, home):
    """HOME=/ for a learner, a file, or no HOME and no passwd entry: the cache moves, said in one sentence."""
    monkeypatch.setattr(multihost_plan.tempfile, "tempdir", str(tmp_path))
    env = {}
    if home == "file":  # mkdir fails under it (as under / for anyone but root)
        (tmp_path / "home").write_text("")
        env["HOME"] = str(tmp_path / "home")
    else:
        monkeypatch.setattr(multihost_plan.Path, "home", lambda: (_ for _ in ()).throw(RuntimeError("no home")))
    with pytest.warns(UserWarning, match=r"cannot hold the compilation cache .* set HOME or JAX_COMPILATION_CACHE_DIR"):
        got = multihost_plan.worker_cache_env(environ=env)
    folder = tmp_path / f"dpcourse-jax-compilation-{os.getuid()}"
    assert got["JAX_COMPILATION_CACHE_DIR"] == str(folder) and folder.is_dir()
    assert folder.stat().st_mode & 0o777 == 0o700


def test_a_temp_cache_folder_another_user_could_write_is_never_used(monkeypatch, tmp_path):
    monkeypatch.setattr(multihost_plan.tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"dpcourse-jax-compilation-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)  # made, or opened, by someone else: compiled programs there could be anyone's
    chosen = multihost_plan._private_temp_cache()
    assert chosen != planted and chosen.stat().st_mode & 0o777 == 0o700


def test_a_cache_folder_the_learner_named_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match=r"folder .*file/cache cannot be made .* set JAX_COMPILATION_CACHE_DIR"):
        multihost_plan.worker_cache_env(environ={"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "file" / "cache")})
