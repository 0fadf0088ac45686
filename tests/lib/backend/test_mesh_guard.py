"""Tests of dpcourse.backend.mesh_guard: a foreign global mesh named in one sentence, in IPython and in a plain script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dpcourse.backend import mesh_guard

CLEAR = "clear it with jax.set_mesh(None) (or restart the kernel), then run this cell again."


def _meshes(devs):
    import jax
    import numpy as np

    explicit = (jax.sharding.AxisType.Explicit,)
    own = jax.sharding.Mesh(np.array(devs), ("data",))
    half = len(devs) // 2
    foreign = {
        "2-D Explicit": jax.make_mesh((half, 2), ("data", "model"), axis_types=explicit * 2, devices=devs),
        "2-D Auto": jax.make_mesh((half, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2),
        "another axis name": jax.sharding.Mesh(np.array(devs), ("batch",)),
        "devices in another order": jax.sharding.Mesh(np.array(devs[::-1]), ("data",)),
        "half the devices": jax.sharding.Mesh(np.array(devs[:half]), ("data",)),
    }
    return own, jax.sharding.Mesh(np.array(devs), ("data",), axis_types=explicit), foreign


def _lesson_step_error(own):
    """The error JAX raises for the lesson's jitted step on its own mesh's arrays under whatever mesh is set."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    x = jax.device_put(np.ones((16, 8), np.float32), NamedSharding(own, P("data")))
    try:
        jax.block_until_ready(jax.jit(lambda a: a @ a.T)(x))
    except Exception as err:  # noqa: BLE001 - whatever JAX raises is the cause to name
        return err
    return None


def test_no_global_mesh_or_the_lessons_own_of_either_axis_type_explains_nothing(cpu_devices):
    import jax

    own, own_explicit, _ = _meshes(cpu_devices)
    error = ValueError("anything")
    assert mesh_guard.explain(error, own) is None
    for mesh in (own, own_explicit):
        with jax.set_mesh(mesh):
            assert mesh_guard.foreign_mesh(own) is None
    with jax.set_mesh(own):
        assert mesh_guard.explain(error, own) is None


def test_the_explicit_twin_of_the_lessons_mesh_is_foreign_once_a_cell_stops_under_it(cpu_devices):
    """Set before the lesson places its arrays the lessons run under it; set after, a step on them stops (JAX 0.10.2)."""
    import jax

    own, own_explicit, _ = _meshes(cpu_devices)
    with jax.set_mesh(own_explicit):
        assert mesh_guard.foreign_mesh(own) is None  # up front (check_global_mesh) it passes
        said = str(mesh_guard.explain(ValueError("context mesh ... should match the aval mesh"), own))
    assert said.startswith("A global mesh {'data': 8} (Explicit axes) is set") and "(Auto axes)" in said


def test_a_step_stopped_by_a_foreign_mesh_is_named_with_its_cause_in_one_sentence(cpu_devices):
    """A 2-D Explicit mesh set after the lesson's own: lessons 04, 05, 10 and 12 stopped with 26 to 80 lines of JAX."""
    import jax

    own, _, foreign = _meshes(cpu_devices)
    stopped = []
    for name, mesh in foreign.items():
        with jax.set_mesh(mesh):
            cause = _lesson_step_error(own)
            err = mesh_guard.explain(cause or IndexError("a later cell's error"), own)
        stopped += [name] if cause is not None else []
        cause = err.__cause__
        text = str(err)
        assert isinstance(err, mesh_guard.ForeignMeshError), name
        assert "\n" not in text and ". " not in text and text.endswith(CLEAR), name
        assert f"its own mesh {{'data': 8}} (Auto axes), stopped under it ({type(cause).__name__})" in text, name
        assert text.startswith(f"A global mesh {mesh_guard.describe(mesh)} is set"), name
    # other devices stop a step in every JAX the course admits; on 0.10.2 the 2-D Explicit mesh does too (the
    # lessons' error), and an Auto mesh of the same devices, whatever its shape, runs it
    assert {"devices in another order", "half the devices"} <= set(stopped)
    assert mesh_guard.describe(foreign["2-D Explicit"]) == "{'data': 4, 'model': 2} (Explicit, Explicit axes)"


def test_the_sentence_says_what_to_do_in_a_script_and_for_work_that_needs_no_mesh(cpu_devices):
    import jax

    own, _, foreign = _meshes(cpu_devices)
    with jax.set_mesh(foreign["2-D Auto"]):
        assert str(mesh_guard.explain(KeyError("k"), own, script=True)).endswith(
            "(KeyError): clear it (jax.set_mesh(None)), then run the script again."
        )
        assert "which needs no mesh, stopped" in str(mesh_guard.explain(KeyError("k"), None))
        assert mesh_guard.explain(KeyboardInterrupt(), own) is None  # an interruption is the learner's own
        assert mesh_guard.explain(mesh_guard.ForeignMeshError("x"), own) is None  # already the sentence


def test_a_state_that_cannot_be_read_shows_the_error_as_it_is(cpu_devices, monkeypatch):
    import jax

    own, _, foreign = _meshes(cpu_devices)

    def broken():
        raise RuntimeError("no mesh state")

    with jax.set_mesh(foreign["2-D Auto"]):
        monkeypatch.setattr(jax.sharding, "get_abstract_mesh", broken)
        assert mesh_guard.explain(ValueError("x"), own) is None


def test_start_lesson_installs_the_guard_with_the_lessons_mesh(cpu_devices, monkeypatch):
    from dpcourse import lesson

    given = []
    monkeypatch.setattr(mesh_guard, "guard", lambda mesh: given.append(mesh) or "script")
    started = lesson.start_lesson("04_sharding", "smoke", 8, min_devices=2, load_data=False, show=False)
    assert [(m.axis_names, [d.id for d in m.devices.flat]) for m in given] == [
        (("data",), [d.id for d in started.devices.devices])
    ]


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    opening = "from dpcourse.devices import setup_devices\nsetup_devices(8)\n"
    return subprocess.run(
        [sys.executable, "-c", opening + textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )


SETUP = """
import contextlib, io, json
import jax, numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
from dpcourse.backend import mesh_guard
mesh = Mesh(np.array(jax.devices()), ("data",))
x = jax.device_put(np.ones((16, 8), np.float32), jax.devices()[0])  # a one-device reference's array
foreign = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
"""

IPYTHON = (
    SETUP
    + """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.set_custom_exc((ZeroDivisionError,), lambda *a, **k: None)
print(mesh_guard.guard(mesh), shell.custom_exceptions)  # another handler is left in place
shell.set_custom_exc((), None)
shell.user_ns.update(globals())
cells = [
    "print(mesh_guard.guard(mesh), mesh_guard.guard(mesh))",
    "jax.set_mesh(foreign)",  # a cell of its own, after the lesson's mesh
    "y = jax.jit(lambda a: a @ a.T)(x)",
    "%tb",
    "1 / 0",
    "jax.set_mesh(None)",
    "y = jax.jit(lambda a: a @ a.T)(x)",
    "1 / 0",
    "jax.set_mesh(mesh)",  # the lesson's own
    "1 / 0",
    "def (",
]
seen = []
for cell in cells:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = shell.run_cell(cell)
    err = result.error_in_exec or result.error_before_exec
    seen.append([type(err).__name__ if err else None, [l for l in out.getvalue().splitlines() if l.strip()]])
print(json.dumps(seen))
"""
)


def test_in_ipython_a_mesh_set_in_a_later_cell_stops_the_next_step_with_the_sentence_alone():
    out = _run(IPYTHON)
    assert out.returncode == 0, out.stderr[-3000:]
    left, *_, last = out.stdout.splitlines()
    assert left == "left (<class 'ZeroDivisionError'>,)"
    seen = json.loads(last)
    assert seen[0] == [None, ["ipython ipython"]]
    error, lines = seen[2]  # the step under the foreign mesh
    assert error == "ForeignMeshError" and len(lines) == 2 and "%tb" in lines[0], lines
    assert "A global mesh {'data': 4, 'model': 2} (Explicit, Explicit axes) is set" in lines[1]
    assert lines[1].endswith(f"stopped under it (ValueError): {CLEAR}")
    tb = "\n".join(seen[3][1])  # %tb: JAX's own error, then the sentence it caused
    assert "incompatible devices" in tb and "direct cause" in tb and tb.rstrip().endswith(CLEAR)
    assert seen[4][0] == "ForeignMeshError" and "(ZeroDivisionError)" in seen[4][1][-1]
    assert seen[6] == [None, []]  # cleared: the step runs
    for plain in (seen[7], seen[9]):  # no mesh, or the lesson's own: IPython's traceback as before
        assert plain[0] == "ZeroDivisionError" and "Traceback" in " ".join(plain[1]) and len(plain[1]) > 2
    assert seen[10][0] == "SyntaxError" and "SyntaxError" in seen[10][1][-1]


def test_in_a_plain_script_the_sentence_is_the_whole_report():
    out = _run(
        SETUP
        + """
mesh_guard.guard(mesh)
mesh_guard.guard(mesh)  # a lesson started again wraps the hook once
jax.set_mesh(foreign)
jax.jit(lambda a: a @ a.T)(x)
"""
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("ForeignMeshError: A global mesh {'data': 4, 'model': 2} (Explicit, Explicit axes)")
    assert lines[0].endswith("(ValueError): clear it (jax.set_mesh(None)), then run the script again.")


def test_in_a_script_any_other_error_goes_to_the_previous_hook(cpu_devices, monkeypatch):
    import jax

    own, _, foreign = _meshes(cpu_devices)
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *exc: seen.append(exc[1]))
    # An earlier test in this worker may have left an IPython shell (get_ipython() then finds it): none here.
    monkeypatch.setattr("IPython.get_ipython", lambda: None)
    assert mesh_guard.guard(own) == "script" and mesh_guard.guard(own) == "script"
    error = ZeroDivisionError("division by zero")
    sys.excepthook(ZeroDivisionError, error, None)
    with jax.set_mesh(own):
        sys.excepthook(ZeroDivisionError, error, None)
    assert seen == [error, error]


def test_code_that_records_failures_stops_under_a_foreign_mesh_but_not_under_the_explicit_twin(cpu_devices):
    import jax

    own, own_explicit, foreign = _meshes(cpu_devices)
    cause = ValueError("Received incompatible devices for jitted computation")
    mesh_guard.guard(own)
    mesh_guard.stop_if_foreign(cause)  # no global mesh
    with jax.set_mesh(own_explicit):
        mesh_guard.stop_if_foreign(cause)  # the lessons run under it: a failure there is the run's own
    with jax.set_mesh(foreign["half the devices"]), pytest.raises(mesh_guard.ForeignMeshError) as err:
        mesh_guard.stop_if_foreign(cause)
    assert err.value.__cause__ is cause and str(err.value).startswith("A global mesh {'data': 4} (Auto axes) is set")
