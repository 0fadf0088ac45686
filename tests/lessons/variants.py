"""Whole-lesson variants: a global mesh set after the lesson's mesh, one optional display package missing, or both; a learner's own mesh set before it.

Each whole-lesson run costs about half a minute, so one run carries both
kinds of variant where it can: every (package, lesson) pair of the
missing-package matrix is given to one of that lesson's global-mesh runs, and
only the pairs left over (lessons before 04, which have no global-mesh run,
or a lesson with more pairs than runs) run on their own. A failing run names its variant, so the cause is still one
of at most two changes.

``make test`` runs both JAX environments, so it shares the global-mesh runs
between them: ``DPCOURSE_TEST_MESH_KINDS=alternating-from-Auto`` gives 04
Auto, 05 Explicit, 06 Auto and so on, ``alternating-from-Explicit`` the other
kind of each lesson. Each environment still runs every lesson from 04 with a
global mesh and the whole missing-package matrix, and the two together run
every (lesson, kind) pair once. Unset (``both``, any run outside
``make test``), every lesson runs in both kinds.

Every run has the exercises' solutions filled in and strict checkers
(``runner.run_notebook(solutions=True)``), as the Makefile's solutions-test
does: so a lesson with a global-mesh run is run solved here, in both mesh
kinds, and the newest lane's solutions-test runs only the lessons before 04
(``SOLVED_ALONE``); the pinned one runs every lesson, on its own device count
and without the GPU-compile extra (docs/testing.md).

A stand-in accelerator (``STAND_IN``) rides on every Explicit global-mesh
run: the kernel gets the device layout of a host with one GPU or one TPU
chip (``blocker/sitecustomize.py``: a second PJRT client of one device is
JAX's default backend, the lesson's devices are the simulated CPU devices of
the other), so an array the lesson makes without a device would land
outside its devices, as it lands on the chip there. The run must pass, and
a lesson on simulated devices must end with no array left on the default
backend. ``make test`` thus runs every lesson from 04 so once, in one of its
two JAX environments. 08's stand-in run is also on a host that refuses every
internet socket (``NO_TCP_LESSONS``; a sandboxed TPU host says errno 97): it
must say so in one sentence and run the rest.

The device count is a dimension of its own, set per layer by the Makefile
(docs/testing.md says which layer runs which count): these runs' kernels get
``DPCOURSE_TEST_DEVICES`` simulated CPU devices, put into their ``XLA_FLAGS``
as a learner would (unset: the test process's own 8).

A foreign mesh (``FOREIGN``: a 2-D ``('data', 'model')`` mesh of Explicit
axes, set globally right after the lesson starts, before it builds its own
mesh) is tried in every lesson from 03: the lesson must either run under it
or stop with the one sentence of ``dpcourse.lesson.check_global_mesh``. Such
a run stops a few cells in, so it costs a kernel start, not a lesson; ``make
test`` shares these runs between its two JAX environments as it shares the
mesh kinds.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = Path(__file__).resolve().parent / "blocker"

# --- a global mesh (notebook 03, section 4, allows `jax.set_mesh(mesh)` without `with`) ---
MESH_LESSONS = [p.stem for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")) if int(p.stem[:2]) >= 4]
MESH_KINDS = ("Auto", "Explicit")
MESH_LINE = re.compile(r"^(?P<indent> *)mesh = .*$", re.M)
SET = {
    "Auto": "{i}jax.set_mesh(mesh)  # global, as notebook 03 allows\n",
    "Explicit": (
        "{i}mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, "
        "axis_types=(jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))\n"
        "{i}jax.set_mesh(mesh)  # global, as notebook 03 allows\n"
    ),
}


def with_global_mesh(source: str, kind: str) -> str:
    """``source`` (a lesson's py:percent text) with the mesh set globally after its first ``mesh = ...`` line."""
    match = MESH_LINE.search(source)
    assert match, "the lesson builds no `mesh = ...`"
    inserted = SET[kind].format(i=match.group("indent"))
    return source[: match.end() + 1] + inserted + source[match.end() + 1 :]


# --- a mesh of the learner's own, set before the lesson builds its mesh ---
FOREIGN = "Foreign"
FOREIGN_LESSONS = [p.stem for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")) if int(p.stem[:2]) >= 3]
START_LINE = re.compile(r"^(?P<indent> *)lesson = start_lesson\(.*$", re.M)
SET_FOREIGN = (
    "{i}import jax  # a 2-D mesh of the learner's own, set globally (notebook 03, section 4)\n"
    "{i}_own = jax.devices()[: len(jax.devices()) // 2 * 2]\n"
    "{i}jax.set_mesh(jax.make_mesh((len(_own) // 2, 2), ('data', 'model'), "
    "axis_types=(jax.sharding.AxisType.Explicit,) * 2, devices=_own))\n"
)
# The one sentence a lesson may stop with instead (dpcourse.lesson.check_global_mesh).
FOREIGN_REFUSAL = re.compile(
    r"^ForeignMeshError: A global mesh \{'data': \d+, 'model': 2\} \(Explicit, Explicit axes\) is set .*"
    r"clear it with jax\.set_mesh\(None\) \(or restart the kernel\), then run this cell again\.$"
)


def with_foreign_mesh(source: str) -> str:
    """``source`` with a 2-D Explicit mesh set globally right after its ``lesson = start_lesson(...)`` line."""
    match = START_LINE.search(source)
    assert match, "the lesson has no `lesson = start_lesson(...)` line"
    inserted = SET_FOREIGN.format(i=match.group("indent"))
    return source[: match.end() + 1] + inserted + source[match.end() + 1 :]


def foreign_lessons(setting: str | None = None) -> list[str]:
    """The lessons tried with a foreign mesh under ``setting`` (:func:`mesh_kinds_of`): every other one when alternating."""
    setting = setting or os.environ.get(KINDS_SETTING) or "both"
    mesh_kinds_of(MESH_LESSONS[0], setting)  # refuses an unknown setting
    if setting == "both":
        return FOREIGN_LESSONS
    first = MESH_KINDS.index(setting.removeprefix("alternating-from-"))
    return [lesson for i, lesson in enumerate(FOREIGN_LESSONS) if i % len(MESH_KINDS) == first]


# --- the device count of these runs' kernels ---
DEVICES_SETTING = "DPCOURSE_TEST_DEVICES"
COUNT_FLAG = "--xla_force_host_platform_device_count"


def with_device_count(flags: str, count: int) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) asking for ``count`` simulated CPU devices, any earlier count replaced."""
    kept = [token for token in flags.split() if not token.startswith(COUNT_FLAG + "=")]
    return " ".join([*kept, f"{COUNT_FLAG}={count}"])


def device_count(setting: str | None = None) -> int | None:
    """The device count these runs ask for (default ``$DPCOURSE_TEST_DEVICES``), or None: the test process's.

    Raises ValueError, naming the setting, for anything but a whole number >= 2.
    """
    setting = setting if setting is not None else os.environ.get(DEVICES_SETTING, "")
    if not setting:
        return None
    if not setting.isdigit() or int(setting) < 2:
        raise ValueError(f"{DEVICES_SETTING}={setting!r} is not a whole number >= 2: set one or unset it.")
    return int(setting)


# --- one optional display or progress package missing (pyproject's `display` extra) ---
DISPLAY = sorted(
    dep.split(">")[0].split("=")[0].strip()
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["display"]
)
# What each package adds, as the lesson says it when the package is missing.
SAYS = {"rich": "needs the rich package", "tqdm": "no progress bar", "ipywidgets": "ipywidgets cannot be imported"}
# The course's ways to reach each display package; a lesson that uses none of them, nor the package, never needs it.
REACHES = {
    "rich": ("show.sharding", "visualize_array_sharding"),
    "tqdm": ("show.progress", "bench.sweep"),
    "ipywidgets": ("optional_widgets",),
}


def _code(path: Path) -> str:
    """A lesson's code lines (its markdown and comments may name a package it never uses)."""
    return "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))


def lessons_reaching(package: str) -> list[str]:
    return [
        p.stem
        for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
        if any(word in _code(p) for word in (*REACHES[package], f"import {package}", f"from {package}"))
    ]


MATRIX = [(package, lesson) for package in DISPLAY for lesson in lessons_reaching(package)]


# --- a stand-in accelerator: the default backend is one device outside the lesson's (blocker/sitecustomize.py) ---
STAND_IN = "DPCOURSE_STAND_IN_ACCELERATOR"
STAND_IN_KIND = "Explicit"  # the global-mesh runs that carry it
# The last cell of such a run: a lesson on simulated devices leaves no array on the default backend.
STAND_IN_CHECK = (
    "\n# %%\nimport jax\n\n"
    "assert not any(jax.devices()[0] is d for d in jax.devices('cpu')), 'the stand-in is not the default backend'\n"
    "_left = jax.live_arrays() if lesson.devices.simulated else []  # the default backend's live arrays\n"
    "assert not _left, (\n"
    "    f'{len(_left)} array(s) left on the default backend {jax.devices()[0]}, outside the lesson\\'s '\n"
    "    f'{lesson.devices.label}: shapes {sorted({str(a.shape) for a in _left})}'\n"
    ")\n"
)

# Lessons whose stand-in run is also on a host that refuses every internet socket (a sandboxed TPU host:
# errno 97), set in the kernel right after the lesson starts: the lesson must say so and run the rest.
NO_TCP_LESSONS = ("08_multihost",)
NO_TCP_SAYS = "This machine lets no process open a TCP socket, not even on 127.0.0.1 (OSError: [Errno 97]"
SET_NO_TCP = (
    "{i}import socket as _socket  # this host refuses every internet socket, loopback included\n"
    "{i}class _Refusing(_socket.socket):\n"
    "{i}    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):\n"
    "{i}        if fileno is None and family in (-1, _socket.AF_INET, _socket.AF_INET6):\n"
    "{i}            raise OSError(97, 'Address family not supported by protocol')\n"
    "{i}        super().__init__(family, type, proto, fileno)\n"
    "{i}_socket.socket = _Refusing\n"
)


def with_no_tcp(source: str) -> str:
    """``source`` with every internet socket of the kernel refused (errno 97) right after ``lesson = start_lesson(...)``."""
    match = START_LINE.search(source)
    assert match, "the lesson has no `lesson = start_lesson(...)` line"
    inserted = SET_NO_TCP.format(i=match.group("indent"))
    return source[: match.end() + 1] + inserted + source[match.end() + 1 :]


# --- the runs ---
class Variant(NamedTuple):
    lesson: str
    mesh: str | None  # "Auto", "Explicit", FOREIGN or None (the lesson's own code)
    missing: str | None  # a package of DISPLAY made uninstalled in the kernel, or None
    stand_in: bool = False  # the kernel's default backend is a stand-in accelerator (STAND_IN)

    @property
    def id(self) -> str:
        parts = [self.lesson, *([self.mesh] if self.mesh else []), *([f"no-{self.missing}"] if self.missing else [])]
        return "-".join([*parts, *(["stand-in-accelerator"] if self.stand_in else [])])


KINDS_SETTING = "DPCOURSE_TEST_MESH_KINDS"
KINDS_CHOICES = ("both", *(f"alternating-from-{kind}" for kind in MESH_KINDS))


def mesh_kinds_of(lesson: str, setting: str | None = None) -> tuple[str, ...]:
    """The mesh kinds ``lesson`` runs with under ``setting`` (default: ``$DPCOURSE_TEST_MESH_KINDS``, else both).

    Raises ValueError for a setting outside ``KINDS_CHOICES``, naming them.
    """
    setting = setting or os.environ.get(KINDS_SETTING) or "both"
    if setting not in KINDS_CHOICES:
        raise ValueError(f"{KINDS_SETTING}={setting!r} is not one of {', '.join(KINDS_CHOICES)}: set one or unset it.")
    if setting == "both":
        return MESH_KINDS
    first = MESH_KINDS.index(setting.removeprefix("alternating-from-"))
    return (MESH_KINDS[(first + MESH_LESSONS.index(lesson)) % len(MESH_KINDS)],)


def plan(setting: str | None = None) -> tuple[list[Variant], list[Variant]]:
    """(the global-mesh runs, each carrying a missing package where one is free; the missing-package runs left over).

    ``setting``: which mesh kinds each lesson runs with (:func:`mesh_kinds_of`).
    """
    mesh_runs = {(lesson, kind): None for lesson in MESH_LESSONS for kind in mesh_kinds_of(lesson, setting)}
    alone = []
    for package, lesson in MATRIX:
        free = [k for k in MESH_KINDS if (lesson, k) in mesh_runs and mesh_runs[lesson, k] is None]
        if free:
            mesh_runs[lesson, free[0]] = package
        else:
            alone.append(Variant(lesson, None, package))
    mesh_variants = [
        Variant(lesson, kind, package, kind == STAND_IN_KIND) for (lesson, kind), package in mesh_runs.items()
    ]
    return mesh_variants, alone


def execute(variant: Variant, tmp_path: Path, monkeypatch):
    """Run the variant of its lesson (smoke profile, solutions filled in, ``device_count()`` devices); the runner's record."""
    import jupytext
    import nbformat

    from coursetools import runner

    source = (ROOT / "notebooks" / f"{variant.lesson}.py").read_text()
    if variant.mesh == FOREIGN:
        source = with_foreign_mesh(source)
    elif variant.mesh:
        source = with_global_mesh(source, variant.mesh)
    count = device_count()
    if count is not None:
        monkeypatch.setenv("XLA_FLAGS", with_device_count(os.environ.get("XLA_FLAGS", ""), count))
    if variant.missing or variant.stand_in:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(BLOCKER), os.environ.get("PYTHONPATH", "")]))
    if variant.missing:
        monkeypatch.setenv("DPCOURSE_BLOCK_IMPORTS", variant.missing)
    if variant.stand_in:
        monkeypatch.setenv(STAND_IN, "1")
        source += STAND_IN_CHECK
        if variant.lesson in NO_TCP_LESSONS:
            source = with_no_tcp(source)
    path = tmp_path / f"{variant.lesson}.ipynb"
    nbformat.write(jupytext.reads(source, fmt="py:percent"), path)
    out = tmp_path / "out"
    out.mkdir()
    return runner.run_notebook(path, out, out / "records.jsonl", profile="smoke", cell_timeout_s=600, solutions=True)


def run(variant: Variant, tmp_path: Path, monkeypatch) -> str:
    """Run the variant of its lesson (:func:`execute`) and return its code cells' outputs as JSON text.

    Raises AssertionError naming the failed code cell and the error, or the
    missing package's sentence when the lesson does not say what it would add.
    """
    import nbformat

    done = execute(variant, tmp_path, monkeypatch)
    count = device_count()
    assert done.status == "passed", (
        f"{variant.id}{f' on {count} devices' if count else ''}: code cell {done.error_code_cell}: {done.error}"
    )
    executed = nbformat.read(tmp_path / "out" / f"{variant.lesson}.ipynb", as_version=4)
    text = json.dumps([c.get("outputs", []) for c in executed.cells if c.cell_type == "code"])
    if variant.stand_in and variant.lesson in NO_TCP_LESSONS:
        assert NO_TCP_SAYS in text, f"{variant.id} on a host without TCP does not say so in its sentence"
    if variant.missing:
        assert SAYS[variant.missing] in text, (
            f"{variant.lesson} without {variant.missing} does not say what it would add"
        )
    return text
