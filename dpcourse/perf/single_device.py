"""Where a single-device measurement runs: the GPU when there is one, with its workload.

Used by notebook 09 (and meant for 02's baseline and any single-device
sweep): on a machine with one GPU the multi-device lessons fall back to
simulated CPU devices, but a measurement of ONE device belongs on the GPU,
with the profile the GPU gets (``full`` unless one is asked for). Only the
multi-device parts run on the simulated devices, and :func:`where_banner`
says which part ran where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpcourse import config as _config


@dataclass(frozen=True)
class MeasurementDevice:
    """The device and workload of a single-device measurement.

    Attributes:
        device: a ``jax.Device`` (the first device of JAX's default backend).
        cfg: the workload for it (the profile asked for, else the automatic
            one for that backend: ``full`` on a GPU, ``cpu`` on a CPU).
        label: e.g. ``"1 x NVIDIA H200 (gpu), full workload"``.
    """

    device: Any
    cfg: _config.Config
    label: str


def measurement_device(profile: str | None = None) -> MeasurementDevice:
    """Pick the device and workload for a single-device measurement.

    The first device of JAX's default backend: the GPU on a machine with
    one (or more) GPUs, else the CPU. The profile is ``profile``, else
    ``DPCOURSE_PROFILE``, else automatic for that backend (see
    :func:`dpcourse.config.resolve_profile`); unlike the multi-device
    lessons, a one-GPU machine is not switched to the ``cpu`` profile.
    Call :func:`dpcourse.devices.setup_devices` first (it starts nothing).

    Raises:
        ValueError: unknown profile name.
    """
    import jax

    device = jax.devices()[0]
    cfg = _config.get_config(profile, backend=device.platform)
    return MeasurementDevice(device, cfg, f"1 x {device.device_kind} ({device.platform}), {cfg.profile} workload")


def where_banner(single: MeasurementDevice, multi_label: str, multi_profile: str, simulated: bool) -> str:
    """One sentence for the notebook's banner: which part ran on which devices.

    Args:
        single: the single-device measurement's device (:func:`measurement_device`).
        multi_label: label of the multi-device part's devices
            (``LessonDevices.label``).
        multi_profile: the profile the multi-device part used.
        simulated: whether the multi-device part runs on simulated CPU devices.
    """
    text = f"Single-device measurements ran on {single.label}. The multi-device part ran on {multi_label}"
    text += f" with the {multi_profile} workload"
    if simulated and single.device.platform != "cpu":
        text += ": simulated CPU devices, for placement and collectives only (the CPU compiler's choices)."
    else:
        text += "."
    return text
