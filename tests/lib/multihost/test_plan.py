"""Tests of dpcourse.multihost.plan: notebook 08's process split and the workers' cache."""

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


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    assert multihost_plan.default_cache_dir() == tmp_path
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    assert multihost_plan.default_cache_dir().parts[-2:] == ("dpcourse", "jax-compilation")


def test_only_a_split_with_several_devices_per_process_may_save_a_checkpoint():
    for n_processes, local, folder in ((1, 1, "ckpt"), (2, 2, "ckpt"), (4, 2, "ckpt"), (2, 1, None)):
        multihost_plan.check_savable_split(n_processes, local, folder)
    with pytest.raises(multihost_plan.UnsavableSplit, match="2 processes with one device each cannot save") as caught:
        multihost_plan.check_savable_split(2, 1, "ckpt")
    assert isinstance(caught.value, ValueError) and caught.value.lasting  # the worker exits with 78 for it
