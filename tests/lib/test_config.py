"""Tests of dpcourse.config: the profiles a learner picks and their values."""

import dataclasses

import pytest

from dpcourse import config
from dpcourse.config import Config, get_config, make_config, profile_names, resolve_profile


def test_profile_names_are_the_documented_three():
    assert profile_names() == ["full", "cpu", "smoke"]


def test_full_profile_is_the_outline_workload():
    cfg = make_config("full")
    assert cfg.profile == "full"
    assert cfg.width == 1024
    assert cfg.block_repeats == 128
    assert cfg.block_mix == 0.10
    assert cfg.per_device_batch == 1024
    assert cfg.n_batches == 8
    assert cfg.learning_rate == 3e-4
    assert cfg.weight_decay == 1e-4
    assert (cfg.warmup_steps, cfg.repeats, cfg.steps) == (4, 3, 15)
    assert cfg.sweep_global_batches == (256, 512, 1024, 2048, 4096)
    assert cfg.max_train_examples is None  # all 60,000 examples
    assert cfg.seed == 0
    # The dataclass defaults ARE the full workload (profiles override them).
    assert dataclasses.replace(Config(), profile="full") == cfg


@pytest.mark.parametrize("name", ["cpu", "smoke"])
def test_reduced_profiles_are_smaller_than_full(name):
    cfg, full = make_config(name), make_config("full")
    assert cfg.profile == name
    assert cfg.width < full.width
    assert cfg.block_repeats < full.block_repeats
    assert cfg.per_device_batch < full.per_device_batch
    assert cfg.max_train_examples is not None
    # Each profile still runs the same model and optimiser recipe.
    assert (cfg.block_mix, cfg.learning_rate, cfg.weight_decay, cfg.seed) == (
        full.block_mix,
        full.learning_rate,
        full.weight_decay,
        full.seed,
    )
    # The benchmark plan stays valid: at least one timed repeat and step.
    assert cfg.repeats >= 1 and cfg.steps >= 1 and cfg.warmup_steps >= 0


def test_smoke_sweep_has_a_size_that_does_not_divide_by_8():
    # Notebook 07's "skipped with a reason" path must run in CI (smoke, 8 devices).
    sizes = make_config("smoke").sweep_global_batches
    assert any(s % 8 for s in sizes)
    assert any(s % 8 == 0 for s in sizes)


def test_global_batch_is_per_device_times_devices():
    cfg = make_config("full")
    assert cfg.global_batch(1) == 1024
    assert cfg.global_batch(4) == 4096


def test_config_is_frozen():
    cfg = make_config("cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.width = 1  # type: ignore[misc]


def test_with_overrides_returns_a_copy_and_rejects_unknown_fields():
    cfg = make_config("smoke")
    bigger = cfg.with_overrides(block_repeats=7)
    assert bigger.block_repeats == 7 and cfg.block_repeats == 2
    with pytest.raises(TypeError, match="Unknown Config field.*'not_a_field'.*Fields: profile, width"):
        cfg.with_overrides(not_a_field=1)


def test_unknown_profile_lists_the_valid_names():
    with pytest.raises(ValueError) as err:
        make_config("fast")
    message = str(err.value)
    assert "'fast'" in message
    for name in ("full", "cpu", "smoke"):
        assert name in message
    assert config.PROFILE_ENV in message


def test_environment_picks_the_profile(monkeypatch):
    monkeypatch.setenv(config.PROFILE_ENV, "smoke")
    assert get_config().profile == "smoke"
    # Case and spaces from a shell or a CI file are tolerated.
    monkeypatch.setenv(config.PROFILE_ENV, " CPU ")
    assert get_config().profile == "cpu"


def test_explicit_argument_beats_the_environment(monkeypatch):
    monkeypatch.setenv(config.PROFILE_ENV, "smoke")
    assert get_config("cpu").profile == "cpu"


def test_unknown_profile_in_the_environment_is_an_error(monkeypatch):
    monkeypatch.setenv(config.PROFILE_ENV, "tiny")
    with pytest.raises(ValueError, match="Valid profiles: full, cpu, smoke"):
        get_config()


@pytest.mark.parametrize("backend, expected", [("gpu", "full"), ("cuda", "full"), ("tpu", "full"), ("cpu", "cpu")])
def test_automatic_profile_follows_the_backend(monkeypatch, backend, expected):
    monkeypatch.delenv(config.PROFILE_ENV, raising=False)
    assert resolve_profile(None, backend=backend) == expected
    assert resolve_profile("auto", backend=backend) == expected
    monkeypatch.setenv(config.PROFILE_ENV, "auto")
    assert get_config(backend=backend).profile == expected


def test_automatic_profile_asks_jax_when_no_backend_given(cpu_devices):
    # The test process runs on simulated CPU devices: the CPU default.
    import jax

    expected = "full" if jax.default_backend() in ("gpu", "tpu") else "cpu"
    assert config.default_profile() == expected


@pytest.mark.parametrize("name", ["full", "cpu", "smoke"])
def test_every_profile_defaults_to_the_seeds_step(name):
    # Notebooks 04 to 08 run the course's step: lax.scan, float32.
    cfg = make_config(name)
    assert cfg.block_unroll == 1
    assert cfg.compute_dtype == "float32"


@pytest.mark.parametrize("name", ["full", "cpu", "smoke"])
def test_ladder_sizes_are_valid(name):
    cfg = make_config(name)
    assert 1 <= cfg.ladder_global_batch < cfg.ladder_large_batch
    assert cfg.matmul_size >= 1


@pytest.mark.parametrize("value", [1, 2, 8, 128, "full"])
def test_valid_block_unroll_values_are_accepted(value):
    assert make_config("smoke").with_overrides(block_unroll=value).block_unroll == value


@pytest.mark.parametrize("value", [0, -1, "Full", "yes", True, 2.0, None])
def test_unknown_block_unroll_lists_the_valid_values(value):
    with pytest.raises(ValueError, match=r"Unknown block_unroll.*int >= 1.*'full'"):
        make_config("smoke").with_overrides(block_unroll=value)


@pytest.mark.parametrize("value", ["float16", "bf16", "f32", None])
def test_unknown_compute_dtype_lists_the_valid_values(value):
    with pytest.raises(ValueError, match=r"Unknown compute_dtype.*float32, bfloat16"):
        make_config("smoke").with_overrides(compute_dtype=value)
    with pytest.raises(ValueError, match="Valid values: float32, bfloat16"):
        Config(compute_dtype=value)


@pytest.mark.parametrize("value", ["pallas_kernel", "custom", "", None])
def test_unknown_block_backward_lists_the_valid_values(value):
    with pytest.raises(ValueError, match=r"Unknown block_backward.*autodiff, saved_slope, pallas"):
        make_config("smoke").with_overrides(block_backward=value)
