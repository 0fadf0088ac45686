"""dpcourse.cross_compile.overlap_steps: lesson 09's compile-only variants pass their option and level to XLA, and restore JAX's."""

import importlib

import jax

from dpcourse.config import make_config
from dpcourse.cross_compile import overlap_steps


class _Recorder:
    """A stand-in lowered program that records what ``compile`` was asked for."""

    def __init__(self):
        self.calls = []

    def compile(self, options=None):
        self.calls.append((options, jax.config.jax_optimization_level))
        return "compiled"


class _Jitted:
    def __init__(self):
        self.lowered = _Recorder()

    def lower(self, *args):
        return self.lowered


def test_every_named_builder_resolves_to_a_function():
    for name, spec in overlap_steps.STEPS.items():
        module, function = spec.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name
    assert set(overlap_steps.LABELS) == set(overlap_steps.STEPS)


def test_the_small_threshold_reaches_the_compiler_beside_the_callers_options():
    jitted = _Jitted()
    step = overlap_steps.CompiledWith(jitted, {overlap_steps.COMBINE_THRESHOLD_OPTION: 4096})
    assert step.lower().compile({"xla_dump_to": "/tmp/x"}) == "compiled"
    ((options, _level),) = jitted.lowered.calls
    assert options == {"xla_dump_to": "/tmp/x", overlap_steps.COMBINE_THRESHOLD_OPTION: 4096}


def test_o1_compiles_at_that_level_and_gives_jax_its_level_back():
    before = jax.config.jax_optimization_level
    jitted = _Jitted()
    overlap_steps.CompiledWith(jitted, level="O1").lower().compile()
    ((_options, level),) = jitted.lowered.calls
    assert str(level).endswith("O1") and jax.config.jax_optimization_level == before


def test_the_builders_lower_the_course_step_on_cpu_devices(cpu_devices):
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    for builder in (overlap_steps.small_threshold, overlap_steps.o1):
        step, args = builder(make_config("smoke"), mesh)
        assert isinstance(step, overlap_steps.CompiledWith) and args
