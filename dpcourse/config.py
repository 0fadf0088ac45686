"""Workload configuration: one frozen dataclass and its named profiles.

Taught in notebook 02 (the workload summary); every notebook picks its
profile in its ``parameters`` cell through :func:`get_config`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

PROFILE_ENV = "DPCOURSE_PROFILE"


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

    def global_batch(self, n_devices: int) -> int:
        """Global batch in examples for ``n_devices`` devices."""
        return self.per_device_batch * n_devices

    def with_overrides(self, **changes) -> Config:
        """Return a copy with some fields replaced (the dataclass is frozen).

        Raises:
            TypeError: a name is not a field of :class:`Config`.
        """
        return dataclasses.replace(self, **changes)


# Each profile overrides the one default above (the `full` workload of the
# outline) instead of copying it.
PROFILES: dict[str, dict] = {
    # The workload as specified: GPU default.
    "full": {},
    # The whole course in a few minutes on a 2-core CPU with 8 simulated
    # devices, and still enough steps that the loss visibly falls.
    "cpu": dict(
        width=256,
        block_repeats=16,
        per_device_batch=128,
        warmup_steps=4,
        repeats=3,
        steps=10,
        sweep_global_batches=(256, 512, 1024, 2048, 4096),
        max_train_examples=16_384,
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
