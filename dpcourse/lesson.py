"""The opening of every lesson notebook, in one call.

:func:`start_lesson` configures devices (before JAX starts), picks the
profile, chooses the devices, loads the data, sets the results context and
shows the banners a learner must see (data source, simulated devices).
Notebook 01 does the same steps one by one to teach them.
A global mesh the learner sets that the lesson's own mesh cannot run under
is named in one sentence (:mod:`dpcourse.backend.mesh_guard`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcourse import config as _config
from dpcourse import data as _data
from dpcourse import devices as _devices
from dpcourse import record as _results
from dpcourse import show as _display
from dpcourse.backend import mesh_guard as _mesh_guard
from dpcourse.backend.mesh_guard import ForeignMeshError, check_global_mesh  # noqa: F401 - the lessons' names


def _data_mesh(devices: list):
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(devices), ("data",))


@dataclass
class Lesson:
    """What a notebook works with.

    Attributes:
        cfg: the workload configuration.
        devices: devices the lesson's measurements run on.
        dataset: prepared training data (host).
        notes: banners shown at the start (also useful in tests).
    """

    cfg: _config.Config
    devices: _devices.LessonDevices
    dataset: _data.Dataset | None
    notes: list

    @property
    def n_devices(self) -> int:
        return self.devices.count

    def check_global_mesh(self) -> None:
        """Refuse a global mesh that the lesson's 1-D ``data`` mesh over its devices cannot run under (:func:`check_global_mesh`)."""
        check_global_mesh(_data_mesh(self.devices.devices))


def start_lesson(
    notebook: str,
    profile: str | None = None,
    n_cpu_devices: int = 8,
    min_devices: int = 1,
    load_data: bool = True,
    show: bool = True,
) -> Lesson:
    """Set up a lesson notebook.

    Args:
        notebook: the notebook's name (``"04_sharding"``), stored in results.
        profile: from the ``parameters`` cell; None reads ``DPCOURSE_PROFILE``.
        n_cpu_devices: simulated CPU devices to configure.
        min_devices: devices the lesson needs; 1 uses the default device.
        load_data: load Fashion-MNIST (or the synthetic stand-in).
        show: display the banners (in a notebook).

    Raises:
        ValueError: unknown profile.
        DeviceSetupError: too few devices, no backend could start, or
            ``JAX_PLATFORMS`` changed after ``import jax`` (the messages say what
            to do).
        ForeignMeshError: a global mesh is set that the lesson's own cannot
            run under (:func:`check_global_mesh`). Backend-start variables changed after JAX started are
            shown as warnings, not raised: re-running this cell stays possible.
    """
    _devices.setup_devices(n_cpu_devices)
    import jax

    cfg = _config.get_config(profile)
    notes = []
    if min_devices > 1:
        chosen = _devices.lesson_devices(min_devices)
    else:
        default = _devices.start_backend()
        chosen = _devices.LessonDevices(default[:1], False, f"1 x {default[0].device_kind}")
    _devices.keep_arrays_on(chosen.devices)  # simulated devices on an accelerator's host hold every array
    for name in _devices.settings_changed_after_start():
        notes.append(
            _display.banner(
                f"{name} changed after JAX started in this kernel: JAX read it once, at start, and ignores "
                "the change. Restart the kernel to apply it.",
                "warning",
            )
        )
    if _devices.preallocation_switched_off() and jax.default_backend() == "gpu":
        notes.append(_display.banner(_devices.PREALLOCATION_NOTE, "note"))
    if chosen.simulated and jax.default_backend() != "cpu":
        notes.append(
            _display.banner(
                f"Only {len(jax.devices())} {jax.default_backend().upper()} device(s): this lesson runs on "
                f"{chosen.label}, which show placement and correctness, not speed; every array it makes "
                "stays on them.",
                "warning",
            )
        )
    if chosen.simulated and cfg.profile == "full":
        cfg = _config.make_config("cpu")
        notes.append(
            _display.banner(
                "The full-size workload would take far too long on simulated CPU devices: "
                "this lesson uses the 'cpu' profile instead.",
                "warning",
            )
        )
    if chosen.simulated and chosen.count > 1:
        notes.append(
            _display.banner(
                f"{chosen.count} simulated CPU devices share this machine's CPU cores: they show placement, "
                "collectives and correctness; timing ratios on them reflect scheduling, not scaling.",
                "note",
            )
        )
    dataset = None
    if load_data:
        dataset = _data.load_fashion_mnist(limit=cfg.max_train_examples, seed=cfg.seed)
        notes.append(_display.data_banner(dataset.source, dataset.note))
    _results.set_context(
        notebook=notebook,
        profile=cfg.profile,
        data_source=dataset.source if dataset is not None else "none",
        backend=chosen.devices[0].platform,
        device_kind=chosen.devices[0].device_kind,
        device_count=chosen.count,
    )
    _mesh_guard.guard(_data_mesh(chosen.devices))  # a mesh set in any later cell: one sentence
    check_global_mesh(_data_mesh(chosen.devices))  # a notebook run again in a kernel where a mesh is set
    from dpcourse.exercises import progress

    progress.record_lesson_start(notebook, progress.lesson_exercises(notebook))
    if show:
        _display.describe_figures()  # every chart shown carries a description of its data
    shown = _display.banner_group(notes)  # one box at the lesson's start, a line per note
    if show and shown is not None:
        try:
            from IPython.display import display

            display(shown)
        except ImportError:  # pragma: no cover
            print(shown)
    return Lesson(cfg, chosen, dataset, notes)
