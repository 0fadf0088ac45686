"""The steps notebook 09 reads for overlap, as compile-only builders: ``build(cfg, mesh) -> (jitted, abstract_args)``.

The interface of :mod:`dpcourse.cross_compile.compile`. Two builders change
only how the course's plain-``jit`` step (:func:`dpcourse.cross_compile.steps.jit_step`)
is compiled: :func:`small_threshold` sets XLA's
``xla_gpu_all_reduce_combine_threshold_bytes`` (the size up to which the
all-reduce combiner merges all-reduces) to :data:`SMALL_COMBINE_THRESHOLD_BYTES`,
and :func:`o1` compiles at JAX's ``optimization_level="O1"``
(``jax_optimization_level``, an effort XLA's GPU compiler reads, among other
things, to decide whether to run its latency-hiding scheduler: ``IsLHSEnabled``
in ``xla/service/gpu/gpu_hlo_schedule.cc`` runs it when the
``xla_gpu_enable_latency_hiding_scheduler`` flag is set or
``IsPassEnabledAtOptimizationEffort<LatencyHidingScheduler>`` of
``xla/service/gpu/flag_utils.h`` says the module's effort asks for it; openxla/xla,
the revision jaxlib 0.10.2 builds is named in jax's ``third_party/xla/revision.bzl``).
``make placement`` shows the effect: the approximate L4 runs the scheduler only at
``O1``. :data:`STEPS` names the forms ``make placement`` and notebook 09 compare,
lesson 10's included.
"""

from __future__ import annotations

COMBINE_THRESHOLD_OPTION = "xla_gpu_all_reduce_combine_threshold_bytes"
# The smoke profile's gradient then goes in four all-reduces, the same with JAX 0.10.2 and 0.12.0.1
# (tests/lib/compiled/test_schedule.py; notebook 09 prints them): the input layer's weight (784 x 32 x 4 =
# 100,352 bytes) and the block's (32 x 32 x 4 = 4,096) each alone, the output layer's weight with the two
# metrics (32 x 10 x 4 + 8 = 1,288 bytes), and the three biases together ((32 + 32 + 10) x 4 = 296 bytes).
SMALL_COMBINE_THRESHOLD_BYTES = 4096
STEPS: dict[str, str] = {
    "plain": "dpcourse.cross_compile.steps:jit_step",
    "small_threshold": "dpcourse.cross_compile.overlap_steps:small_threshold",
    "o1": "dpcourse.cross_compile.overlap_steps:o1",
    "fsdp_gathered": "dpcourse.cross_compile.steps:fsdp_gathered",
    "accum_reduced": "dpcourse.cross_compile.steps:accum_reduced",
}
LABELS: dict[str, str] = {
    "plain": "plain jit step",
    "small_threshold": f"combine threshold {SMALL_COMBINE_THRESHOLD_BYTES:,} bytes",
    "o1": 'optimization_level="O1"',
    "fsdp_gathered": "FSDP, gathered once",
    "accum_reduced": "accumulation, reduced",
}


class _Lowered:
    """A lowered step whose ``compile`` adds its own XLA options and optimization level."""

    def __init__(self, lowered, options: dict, level: str | None):
        self.lowered, self.options, self.level = lowered, dict(options), level

    def compile(self, compiler_options: dict | None = None):
        import jax

        merged = {**(compiler_options or {}), **self.options}
        if self.level is None:
            return self.lowered.compile(merged or None)
        before = jax.config.jax_optimization_level
        jax.config.update("jax_optimization_level", self.level)
        try:
            return self.lowered.compile(merged or None)
        finally:
            jax.config.update("jax_optimization_level", before)

    def as_text(self) -> str:
        return self.lowered.as_text()


class CompiledWith:
    """A jitted step whose ``lower(...)`` gives a :class:`_Lowered` that compiles with ``options`` and ``level``."""

    def __init__(self, jitted, options: dict | None = None, level: str | None = None):
        self.jitted, self.options, self.level = jitted, dict(options or {}), level

    def lower(self, *args) -> _Lowered:
        return _Lowered(self.jitted.lower(*args), self.options, self.level)


def small_threshold(cfg, mesh):
    """The plain-``jit`` step compiled with a combine threshold of :data:`SMALL_COMBINE_THRESHOLD_BYTES`."""
    from dpcourse.cross_compile import steps

    fn, args = steps.jit_step(cfg, mesh)
    return CompiledWith(fn, {COMBINE_THRESHOLD_OPTION: SMALL_COMBINE_THRESHOLD_BYTES}), args


def o1(cfg, mesh):
    """The plain-``jit`` step compiled at ``optimization_level="O1"``."""
    from dpcourse.cross_compile import steps

    fn, args = steps.jit_step(cfg, mesh)
    return CompiledWith(fn, level="O1"), args
