"""Workload configuration: one frozen dataclass and its named profiles.

Taught in notebook 02 (the workload summary); every notebook picks its
profile in its ``parameters`` cell through :func:`get_config`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

PROFILE_ENV = "DPCOURSE_PROFILE"

# How the block repeats are written (notebook 09): an int k >= 1 is
# ``lax.scan(..., unroll=k)`` (1 is the default plain scan); "full" is a Python
# loop over the repeats (one copy of the block per repeat in the program).
FULL_UNROLL = "full"
# Dtype of the matmul inputs and activations; parameters, optimizer state and
# the loss stay float32 whichever is chosen (mixed precision, notebook 09).
COMPUTE_DTYPES = ("float32", "bfloat16")
# How the block's backward pass gets GELU's derivative (notebook 09): "autodiff" lets JAX
# differentiate the block, which keeps the pre-activation h W + b and computes the derivative
# again in the backward pass; "saved_slope" keeps the derivative the forward pass computes
# anyway (a custom VJP); "pallas" also runs the backward pass of each repeat as one Pallas kernel
# (bfloat16 only; dpcourse.perf.backward). All compute the same gradient up to the rounding of the kept values.
BLOCK_BACKWARDS = ("autodiff", "saved_slope", "pallas")


@dataclass(frozen=True)
class Config:
    """Sizes of the workload and of the benchmark.

    Batch sizes are in examples. ``per_device_batch`` is the batch each device
    sees; the global batch is ``per_device_batch * n_devices``.

    Attributes:
        profile: name of the profile these values came from.
        width: hidden width of the shared-block MLP (features).
        block_repeats: how many times the one hidden block is applied
            (the length of the ``lax.scan``).
        block_mix: residual mix ``h <- (1 - mix) * h + mix * block(h)``.
        per_device_batch: examples per device per step.
        n_batches: training batches stacked on the device(s) for the benchmark;
            step ``i`` uses batch ``i % n_batches``.
        learning_rate: AdamW learning rate.
        weight_decay: AdamW decoupled weight decay.
        warmup_steps: untimed steps run after compilation, before timing.
        repeats: timed repeats; the median over repeats is reported.
        steps: steps per timed repeat.
        sweep_global_batches: global batch sizes for notebook 07 (examples).
        max_train_examples: cap on the training examples loaded (None: all
            60,000 of Fashion-MNIST).
        seed: seed of the parameter initialisation and of the data shuffle.
        block_unroll: how the repeats are compiled: an int ``k >= 1`` for
            ``lax.scan(..., unroll=k)`` (1: the default scan, the default of
            every profile) or ``"full"`` for a Python loop over the repeats.
        compute_dtype: ``"float32"`` (default of every profile) or
            ``"bfloat16"``: matmuls and activations in bfloat16 with float32
            master weights and a float32 loss (mixed precision).
        block_backward: ``"autodiff"`` (default of every profile),
            ``"saved_slope"`` or ``"pallas"``: how the block's backward pass gets GELU's
            derivative (:data:`BLOCK_BACKWARDS`, notebook 09).
        ladder_global_batch: global batch of notebook 09's ladder (examples,
            one device).
        ladder_large_batch: the larger global batch of the ladder's last rung.
        matmul_size: side ``n`` of the square matmul timed for notebook 09's
            ceilings (``n x n`` by ``n x n``).
    """

    profile: str = "full"
    width: int = 1024
    block_repeats: int = 128
    block_mix: float = 0.10
    per_device_batch: int = 1024
    n_batches: int = 8
    learning_rate: float = 3e-4
    weight_decay: float = 1e-4
    warmup_steps: int = 4
    repeats: int = 3
    steps: int = 15
    sweep_global_batches: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    max_train_examples: int | None = None
    seed: int = 0
    block_unroll: int | str = 1
    compute_dtype: str = "float32"
    block_backward: str = "autodiff"
    ladder_global_batch: int = 4096
    ladder_large_batch: int = 8192
    matmul_size: int = 8192

    def __post_init__(self):
        check_block_unroll(self.block_unroll)
        check_compute_dtype(self.compute_dtype)
        check_block_backward(self.block_backward)

    def global_batch(self, n_devices: int) -> int:
        """Global batch in examples for ``n_devices`` devices."""
        return self.per_device_batch * n_devices

    def with_overrides(self, **changes) -> Config:
        """Return a copy with some fields replaced (the dataclass is frozen).

        Raises:
            TypeError: a name is not a field of :class:`Config` (the message lists the fields).
            ValueError: an invalid ``block_unroll``, ``compute_dtype`` or ``block_backward`` (the
                message lists the valid ones).
        """
        fields = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise TypeError(f"Unknown Config field(s) {', '.join(map(repr, unknown))}. Fields: {', '.join(fields)}.")
        return dataclasses.replace(self, **changes)


def check_block_unroll(value) -> int | str:
    """Check a ``block_unroll`` setting: an int >= 1 or ``"full"``.

    Raises:
        ValueError: anything else; the message lists the valid values.
    """
    if value == FULL_UNROLL or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(
        f"Unknown block_unroll {value!r}. Valid values: an int >= 1 (lax.scan unroll factor; "
        f"1 is the plain scan) or {FULL_UNROLL!r} (a Python loop over the repeats)."
    )


def _one_of(setting: str, value, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``; else ValueError naming the setting and listing them."""
    if value in choices:
        return value
    raise ValueError(f"Unknown {setting} {value!r}. Valid values: {', '.join(choices)}.")


def check_compute_dtype(value) -> str:
    """Check a ``compute_dtype`` setting.

    Raises:
        ValueError: not one of :data:`COMPUTE_DTYPES`; the message lists them.
    """
    return _one_of("compute_dtype", value, COMPUTE_DTYPES)


def check_block_backward(value) -> str:
    """Check a ``block_backward`` setting.

    Raises:
        ValueError: not one of :data:`BLOCK_BACKWARDS`; the message lists them.
    """
    return _one_of("block_backward", value, BLOCK_BACKWARDS)


# Each profile overrides the one default above (the `full` workload of the
# outline) instead of copying it.
PROFILES: dict[str, dict] = {
    # The workload as specified: GPU default.
    "full": {},
    # The whole course in a few minutes on a 2-core CPU with 8 simulated
    # devices. Benchmarks: 2 untimed steps (the first step after a compile is
    # the slow one), then the median of 3 x 5 timed steps.
    "cpu": dict(
        width=256,
        block_repeats=16,
        per_device_batch=128,
        warmup_steps=2,
        repeats=3,
        steps=5,
        sweep_global_batches=(128, 256, 512, 1024, 2048),
        max_train_examples=16_384,
        ladder_global_batch=128,
        ladder_large_batch=256,
        matmul_size=512,
    ),
    # The smallest sizes that still reach every code path (CI).
    "smoke": dict(
        width=32,
        block_repeats=2,
        per_device_batch=8,
        n_batches=2,
        warmup_steps=1,
        repeats=2,
        steps=2,
        sweep_global_batches=(12, 32, 64),
        max_train_examples=512,
        ladder_global_batch=16,
        ladder_large_batch=32,
        matmul_size=64,
    ),
}


def profile_names() -> list[str]:
    """Names of the profiles, in the order they are documented."""
    return list(PROFILES)


def make_config(profile: str) -> Config:
    """Build the :class:`Config` of a named profile.

    Raises:
        ValueError: ``profile`` is not one of :func:`profile_names`; the
            message lists the valid names.
    """
    if profile not in PROFILES:
        raise ValueError(
            f"Unknown profile {profile!r}. Valid profiles: {', '.join(PROFILES)}. "
            f"Set {PROFILE_ENV} to one of them, or pass it to get_config()."
        )
    return Config(profile=profile, **PROFILES[profile])


def default_profile(backend: str | None = None) -> str:
    """The automatic profile: ``full`` on a GPU backend, ``cpu`` otherwise.

    Args:
        backend: a JAX platform name (``"gpu"``, ``"cpu"``, ...). ``None``
            asks JAX for its default backend, which starts the backend: call
            :func:`dpcourse.devices.setup_devices` first.
    """
    if backend is None:
        import jax

        backend = jax.default_backend()
    return "full" if backend in ("gpu", "cuda", "rocm", "tpu") else "cpu"


def resolve_profile(profile: str | None = None, backend: str | None = None) -> str:
    """Pick the profile name: the argument, else ``DPCOURSE_PROFILE``, else automatic.

    An empty string or ``"auto"`` counts as not given.

    Raises:
        ValueError: the chosen name is not a known profile.
    """
    name = profile or os.environ.get(PROFILE_ENV) or "auto"
    name = name.strip().lower()
    if name == "auto":
        name = default_profile(backend)
    make_config(name)  # validates
    return name


def get_config(profile: str | None = None, backend: str | None = None) -> Config:
    """The configuration every notebook uses (see :func:`resolve_profile`).

    Raises:
        ValueError: unknown profile name (the message lists the valid ones).
    """
    return make_config(resolve_profile(profile, backend))
