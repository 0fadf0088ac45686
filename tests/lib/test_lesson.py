"""Tests of dpcourse.lesson: the opening of every lesson (8 simulated CPU devices, conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from dpcourse import devices
from dpcourse import lesson as session


def plain_notes(lesson: session.Lesson) -> list[str]:
    return [str(note) for note in lesson.notes]


def test_every_lesson_warns_about_a_backend_setting_changed_after_start(cpu_devices, monkeypatch):
    # the late-change check ran only in notebook 01; every lesson runs it now.
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    lesson = session.start_lesson("99_test", profile="smoke", load_data=False, show=False)
    warnings = [n for n in plain_notes(lesson) if "XLA_PYTHON_CLIENT_ALLOCATOR" in n]
    assert len(warnings) == 1
    assert warnings[0].startswith("[WARNING]") and "Restart the kernel" in warnings[0]


def test_a_lesson_without_late_changes_shows_no_such_warning(cpu_devices):
    lesson = session.start_lesson("99_test", profile="smoke", load_data=False, show=False)
    assert not [n for n in plain_notes(lesson) if "changed after JAX started" in n]


@pytest.mark.parametrize("ours, backend, shown", [(True, "gpu", True), (False, "gpu", False), (True, "cpu", False)])
def test_the_preallocation_note_shows_on_a_gpu_when_the_course_switched_it_off(
    cpu_devices, monkeypatch, ours, backend, shown
):
    import jax

    monkeypatch.setattr(devices, "_preallocation_switched_off", ours)
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    lesson = session.start_lesson("99_test", profile="smoke", load_data=False, show=False)
    assert (devices.PREALLOCATION_NOTE in " ".join(plain_notes(lesson))) is shown


def test_the_start_banners_say_once_that_simulated_devices_share_the_cores():
    """the device note repeated itself ("(share the same cores): ... share the same CPU cores")."""
    lesson = session.start_lesson("04_sharding", "smoke", 8, min_devices=2, load_data=False, show=False)
    if not lesson.devices.simulated:
        pytest.skip("real devices: no simulated-device note")
    text = " ".join(plain_notes(lesson)).lower()
    assert text.count("share") == 1 and "cpu cores" in text
    assert "share" not in lesson.devices.label


def test_a_lesson_opens_with_one_box_whatever_it_has_to_say(monkeypatch):
    """a lesson started with two banners (devices, data); now one box, a line for each."""
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    lesson = session.start_lesson("04_sharding", "smoke", 8, min_devices=2, show=True)
    assert len(shown) == 1
    assert len(str(shown[0]).split("\n[")) == len(lesson.notes)  # one line (and its details) per note


def _explicit(shape, names, devs):
    import jax

    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Explicit,) * len(shape), devices=devs)


def test_a_global_mesh_of_the_lessons_own_shape_passes_in_either_axis_type(cpu_devices):
    import jax
    import numpy as np

    own = jax.sharding.Mesh(np.array(cpu_devices), ("data",))
    session.check_global_mesh(own)  # none set
    for mesh in (own, _explicit((len(cpu_devices),), ("data",), cpu_devices)):
        with jax.set_mesh(mesh):
            session.check_global_mesh(own)


def test_a_foreign_global_mesh_is_named_in_one_sentence_with_how_to_clear_it(cpu_devices):
    """a 2-D Explicit mesh set before lesson 06 ended in JAX's 'The context mesh ... should match' error."""
    import jax
    import numpy as np

    own = jax.sharding.Mesh(np.array(cpu_devices), ("data",))
    half = len(cpu_devices) // 2
    foreign = [
        _explicit((half, 2), ("data", "model"), cpu_devices),
        jax.sharding.Mesh(np.array(cpu_devices[::-1]), ("data",)),  # the same shape over the devices in another order
        jax.sharding.Mesh(np.array(cpu_devices[:half]), ("data",)),
    ]
    for mesh in foreign:
        with jax.set_mesh(mesh), pytest.raises(session.ForeignMeshError) as err:
            session.check_global_mesh(own)
        text = str(err.value)
        assert "\n" not in text and text.count(". ") == 0 and text.endswith("then run this cell again.")
        assert "jax.set_mesh(None)" in text and "restart the kernel" in text
    assert "{'data': 4, 'model': 2} (Explicit, Explicit axes)" in _message(foreign[0], own)
    with jax.set_mesh(foreign[0]), pytest.raises(session.ForeignMeshError, match="this lesson needs no mesh"):
        session.check_global_mesh(None)


def _message(mesh, own):
    import jax

    with jax.set_mesh(mesh):
        try:
            session.check_global_mesh(own)
        except session.ForeignMeshError as err:
            return str(err)
    return ""


def test_a_lesson_started_again_under_a_foreign_mesh_says_so(cpu_devices):
    import jax

    foreign = _explicit((len(cpu_devices) // 2, 2), ("data", "model"), cpu_devices)
    with jax.set_mesh(foreign), pytest.raises(session.ForeignMeshError, match=r"A global mesh \{'data': 4"):
        session.start_lesson("04_sharding", "smoke", 8, min_devices=2, load_data=False, show=False)
    lesson = session.start_lesson("04_sharding", "smoke", 8, min_devices=2, load_data=False, show=False)
    with jax.set_mesh(foreign), pytest.raises(session.ForeignMeshError, match="its own mesh \\{'data': 8\\}"):
        lesson.check_global_mesh()


# The stand-in accelerator of the whole-lesson runs (tests/lessons/variants.py, STAND_IN).
STAND_IN_PATH = Path(__file__).resolve().parents[1] / "lessons" / "blocker"


@pytest.mark.slow  # starts a Python process that imports JAX
def test_on_an_accelerators_host_a_lesson_on_simulated_devices_makes_every_array_on_them(python_exe):
    """On a one-TPU host 05's shard losses ran on the chip, 10's step count sat there, 11's restore looked there.

    The child's default backend is a stand-in accelerator of one device (a
    second PJRT client, as a one-GPU or one-TPU host has; JAX_PLATFORMS
    ``standin,cpu`` as ``tpu,cpu`` there): an array made without a device
    lands on it until the lesson starts, and on the lesson's first simulated
    device afterwards.
    """
    code = """
    import json
    import jax, jax.numpy as jnp, numpy as np, optax
    from dpcourse import data, devices, model
    from dpcourse.lesson import start_lesson

    def on(devices, array):
        return all(any(d is e for e in devices) for d in array.devices())

    devices.setup_devices(8)
    before = on(jax.devices(), jnp.ones(3))
    lesson = start_lesson("05_shard_map", "smoke", 8, min_devices=2, load_data=False, show=False)
    mine, cfg = lesson.devices.devices, lesson.cfg
    x, y = np.zeros((4, data.N_FEATURES), np.float32), np.zeros(4, np.int32)
    made = {
        "jnp.ones": jnp.ones(3),
        "a jitted function of NumPy arrays": jax.jit(lambda a: a * 2)(np.ones(3)),
        "a loss of host parameters": model.loss_and_metrics(model.init_params(cfg), x, y, cfg)[0],
        "AdamW's step count": optax.adamw(1e-3).init({"w": np.ones(2, np.float32)})[0].count,
    }
    print(json.dumps({
        "simulated": lesson.devices.simulated,
        "default is the lesson's": any(jax.devices()[0] is d for d in mine),
        "before the lesson, on the stand-in": before,
        "outside": [name for name, a in made.items() if not on(mine[:1], a)],
    }))
    """
    env = {k: v for k, v in os.environ.items() if k not in devices.BACKEND_START_VARIABLES}
    env.update(
        JAX_PLATFORMS="standin,cpu",
        DPCOURSE_STAND_IN_ACCELERATOR="1",
        PYTHONPATH=os.pathsep.join([str(STAND_IN_PATH), env.get("PYTHONPATH", "")]),
    )
    out = subprocess.run(
        [python_exe, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, f"child failed:\n{out.stderr[-3000:]}"
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {
        "simulated": True,
        "default is the lesson's": False,
        "before the lesson, on the stand-in": True,
        "outside": [],
    }
