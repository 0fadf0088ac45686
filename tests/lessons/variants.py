"""Whole-lesson variants: a global mesh set after the lesson's mesh, optional display packages missing, or both; a learner's own mesh set in a cell.

Each whole-lesson run costs about half a minute, so one run carries both
kinds of variant: every (package, lesson) pair of the missing-package matrix
rides on one of that lesson's whole runs (a global-mesh run, or the solved
run of a lesson without one), one pair a run while there are runs free, and
the pairs left over on the run of that lesson with the fewest (07, with one
run in each environment, runs without ipywidgets and tqdm at once). A
failing run names its variant, so the cause is still one of a few changes.

``make test`` runs both JAX environments, so it shares the global-mesh runs
between them: ``DPCOURSE_TEST_MESH_KINDS=alternating-from-Auto`` gives 04
Auto, 05 Explicit, 06 Auto and so on, ``alternating-from-Explicit`` the other
kind of each lesson. Each environment still runs every lesson from 04 with a
global mesh and the whole missing-package matrix, and the two together run
every (lesson, kind) pair once. Unset (``both``, any run outside
``make test``), every lesson runs in both kinds.

Every run has the exercises' solutions filled in and strict checkers
(``runner.run_notebook(solutions=True)``), and then runs every code cell
again after the lesson's last (``coursetools.solutions.run_again``; not where
``DPCOURSE_TEST_RUN_AGAIN=0``, as in ``make test``'s newest lane), as the
Makefile's solutions-test does. Where ``DPCOURSE_TEST_PLAIN_PASS`` names a
folder (``make test``'s pinned lane), each lesson's first run starts instead
with the plain lesson, unsolved and not strict, as a learner runs it; then,
in the same kernel, every code cell of the run's variant again, solved and
strict. The first pass is notebook-test's run: its executed copy and its
records go to that folder, which browser-test and site-test show; the second
is the run again after Run All. Such a run carries no missing package and no
stand-in accelerator (the copy is what a learner sees): the environment
whose runs have no plain pass carries those. The lessons without a
global-mesh run (before 04, and ``OWN_PROCESSES``) get a solved run with their own mesh
(``SOLVED_ONLY``), so every lesson runs solved here once per environment and
``make test`` needs no solutions-test. ``DPCOURSE_TEST_LESSON_ENV`` (``NAME=value
...``) adds settings to the lesson's kernel alone: ``make test``'s pinned lane
runs the lessons as a learner without the GPU- or TPU-compile extra would.

A stand-in accelerator (``STAND_IN``) rides on every global-mesh run
without a plain pass: the kernel gets the device layout of a host with one
GPU or one TPU chip (``blocker/sitecustomize.py``: a second PJRT client of one device is
JAX's default backend, the lesson's devices are the simulated CPU devices of
the other), so an array the lesson makes without a device would land
outside its devices, as it lands on the chip there. The run must pass, and
a lesson on simulated devices must end with no array left on the default
backend. ``make test`` thus runs every lesson from 04 so once, in its
newest-JAX environment. 08's stand-in run is also on a host that refuses every
internet socket (``NO_TCP_LESSONS``; a sandboxed TPU host says errno 97): it
must say so in one sentence and run the rest.

The device count is a dimension of its own: each lesson's runs in a layer
get that lesson's count (``DPCOURSE_TEST_DEVICES``, one count or a
rotation, :func:`coursetools.nbmake_guard.lesson_device_count`), put into
their ``XLA_FLAGS`` as a learner would (unset: the test process's own 8), the
count the nbmake layers give the same lesson, so their compiles are shared.

A foreign mesh (``FOREIGN``: a mesh of the learner's own, ``FOREIGN_KINDS``,
set globally right after the lesson starts or in a cell of its own after
the lesson's first mesh) is tried in every lesson from 03: the lesson must
either run under it or stop with the one sentence of
``dpcourse.backend.mesh_guard``. Such a run stops a few cells in, so it costs a
kernel start, not a lesson (each lesson's kind is one it stops under:
``KIND_OF``); ``make test`` shares these runs between its two JAX
environments as it shares the mesh kinds (:func:`foreign_runs`).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import NamedTuple

from coursetools.nbmake_guard import lesson_device_count, lesson_env, with_device_count

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = Path(__file__).resolve().parent / "blocker"

# Lessons that train in processes of their own, not in the kernel (13: processes preempted, killed and started
# again): a mesh set globally in the kernel never reaches them, and the kernel's one computation, their reference,
# runs under a mesh of its own (tests/lib/multihost/test_elastic.py runs it under a learner's Explicit global mesh).
# A whole run starts 18 processes; notebook-test and solutions-test run them at 2 and 3 processes.
OWN_PROCESSES = ("13_elastic",)

# --- a global mesh (notebook 03, section 4, allows `jax.set_mesh(mesh)` without `with`) ---
MESH_LESSONS = [
    p.stem
    for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    if int(p.stem[:2]) >= 4 and p.stem not in OWN_PROCESSES
]
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


# --- a mesh of the learner's own, set globally in a lesson's cell ---
FOREIGN = "Foreign"
FOREIGN_LESSONS = [
    p.stem
    for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    if int(p.stem[:2]) >= 3 and p.stem not in OWN_PROCESSES
]
START_LINE = re.compile(r"^(?P<indent> *)lesson = start_lesson\(.*$", re.M)
# The first code line that builds a mesh or picks the lesson's devices: the foreign mesh goes in a cell after its cell.
FIRST_MESH_LINE = re.compile(r"^(?![ \t]*#).*\b(Mesh|make_mesh|lesson_devices)\(.*$", re.M)
POSITIONS = ("start", "later")  # right after start_lesson (in its cell), or a cell of its own after the first mesh
_D = "jax.devices()"
_T = "jax.sharding.AxisType"
# Each kind's mesh over the kernel's devices (Mesh keeps their order; make_mesh may not), and how the sentence names it.
FOREIGN_KINDS = {
    "2-D Explicit": (
        f"jax.sharding.Mesh(np.array({_D}[: len({_D}) // 2 * 2]).reshape(-1, 2), ('data', 'model'), "
        f"axis_types=({_T}.Explicit,) * 2)",
        r"\{'data': \d+, 'model': 2\} \(Explicit, Explicit axes\)",
    ),
    "2-D Auto": (
        f"jax.sharding.Mesh(np.array({_D}[: len({_D}) // 2 * 2]).reshape(-1, 2), ('data', 'model'))",
        r"\{'data': \d+, 'model': 2\} \(Auto, Auto axes\)",
    ),
    "half the devices": (
        f"jax.sharding.Mesh(np.array({_D}[: max(len({_D}) // 2, 1)]), ('data',))",
        r"\{'data': \d+\} \(Auto axes\)",
    ),
    "Explicit twin": (  # the lesson's own mesh with Explicit axes, set after its arrays are placed
        f"jax.sharding.Mesh(np.array({_D}), ('data',), axis_types=({_T}.Explicit,))",
        r"\{'data': \d+\} \(Explicit axes\)",
    ),
}
# Each lesson's kind: the 2-D Explicit mesh for the four lessons it stopped with JAX's own error (set after
# their mesh), the others chosen so that each half of FOREIGN_LESSONS (one JAX environment's, foreign_runs)
# tries every kind; a lesson not named here gets the 2-D Explicit mesh.
KIND_OF = {
    "03": "2-D Auto",
    "06": "Explicit twin",
    "07": "half the devices",
    "08": "half the devices",
    "09": "Explicit twin",
    "12": "2-D Auto",
}
SET_FOREIGN = "{i}import jax, numpy as np  # a mesh of the learner's own, set globally (notebook 03, section 4)\n{i}jax.set_mesh({mesh})\n"


def foreign_kind(lesson: str) -> str:
    return KIND_OF.get(lesson[:2], "2-D Explicit")


def refusal(kind: str) -> re.Pattern:
    """The one sentence a lesson may stop with under ``kind`` (dpcourse.backend.mesh_guard), as the runner's error line."""
    return re.compile(
        rf"^ForeignMeshError: A global mesh {FOREIGN_KINDS[kind][1]} is set \(jax\.set_mesh without `with`\), "
        r"and this lesson.*: clear it with jax\.set_mesh\(None\) \(or restart the kernel\), then run this cell again\.$"
    )


FOREIGN_REFUSAL = refusal("2-D Explicit")


def with_foreign_mesh(source: str, kind: str = "2-D Explicit", where: str = "start") -> str:
    """``source`` with a ``kind`` mesh set globally: right after its ``lesson = start_lesson(...)`` line (``start``),
    or in a cell of its own after the cell of its first mesh (``later``, :data:`FIRST_MESH_LINE`)."""
    if where == "start":
        match = START_LINE.search(source)
        assert match, "the lesson has no `lesson = start_lesson(...)` line"
        at, indent = match.end() + 1, match.group("indent")
    else:
        opened = START_LINE.search(source)
        match = FIRST_MESH_LINE.search(source, opened.end() if opened else 0)
        assert match, "the lesson builds no mesh and picks no devices"
        cell_end = source.find("\n# %%", match.end())
        at, indent = (len(source) if cell_end < 0 else cell_end + 1), ""
        source = source if source.endswith("\n") else source + "\n"
    inserted = SET_FOREIGN.format(i=indent, mesh=FOREIGN_KINDS[kind][0])
    return (
        source[:at]
        + ("" if where == "start" else "# %%\n")
        + inserted
        + ("" if where == "start" else "\n")
        + source[at:]
    )


def foreign_runs(setting: str | None = None) -> list[Variant]:
    """The foreign-mesh runs under ``setting`` (:func:`mesh_kinds_of`).

    ``both``: every lesson from 03 at both positions, with its kind (and
    the 2-D Explicit mesh where its kind is another). Alternating: every
    other lesson (one JAX environment's half), a cell after its first mesh,
    with its kind.
    """
    setting = setting or os.environ.get(KINDS_SETTING) or "both"
    mesh_kinds_of(MESH_LESSONS[0], setting)  # refuses an unknown setting
    if setting == "both":
        kinds = {lesson: dict.fromkeys([foreign_kind(lesson), "2-D Explicit"]) for lesson in FOREIGN_LESSONS}
        return [
            *(Variant(lesson, FOREIGN, foreign="2-D Explicit", where="start") for lesson in FOREIGN_LESSONS),
            *(
                Variant(lesson, FOREIGN, foreign=kind, where="later")
                for lesson in FOREIGN_LESSONS
                for kind in kinds[lesson]
            ),
        ]
    first = MESH_KINDS.index(setting.removeprefix("alternating-from-"))
    return [
        Variant(lesson, FOREIGN, foreign=foreign_kind(lesson), where="later")
        for i, lesson in enumerate(FOREIGN_LESSONS)
        if i % len(MESH_KINDS) == first
    ]


AGAIN_SETTING = "DPCOURSE_TEST_RUN_AGAIN"  # "0": no second pass (make test's newest lane: the cells are the same)


# --- optional display or progress packages missing (pyproject's `display` extra) ---
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
    missing: tuple[str, ...] = ()  # packages of DISPLAY made uninstalled in the kernel
    stand_in: bool = False  # the kernel's default backend is a stand-in accelerator (STAND_IN)
    foreign: str | None = None  # FOREIGN's kind (FOREIGN_KINDS)
    where: str = "start"  # FOREIGN's position (POSITIONS)
    plain: bool = False  # the run starts with the plain lesson, unsolved (PLAIN_SETTING)

    @property
    def id(self) -> str:
        parts = [
            self.lesson,
            *(["plain-then", self.mesh or "solved"] if self.plain else [self.mesh] if self.mesh else []),
        ]
        parts += [f"no-{package}" for package in self.missing]
        if self.mesh == FOREIGN:
            parts += [(self.foreign or "2-D Explicit").replace(" ", "-"), self.where]
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


# The lessons no global-mesh run fills in (before 04, and OWN_PROCESSES): each runs solved with its own mesh instead.
SOLVED_ONLY = [p.stem for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")) if p.stem not in MESH_LESSONS]


# make test's pinned lane: the folder that gets each plain pass's executed copy and records (Makefile PLAIN_PASS_DIR).
PLAIN_SETTING = "DPCOURSE_TEST_PLAIN_PASS"


def plain_pass_folder() -> Path | None:
    """``$DPCOURSE_TEST_PLAIN_PASS`` as a path (relative ones from the checkout), or None where it is unset."""
    value = os.environ.get(PLAIN_SETTING, "").strip()
    return ROOT / value if value else None


def plan(setting: str | None = None, plain: bool | None = None) -> tuple[list[Variant], list[Variant]]:
    """(the global-mesh runs, the solved runs of SOLVED_ONLY).

    With ``plain`` (default: whether :func:`plain_pass_folder` is set), each
    lesson's first run starts with the plain lesson. Each pair of the
    missing-package matrix rides on one of its lesson's runs without a plain
    pass: one that carries none yet, else the one that carries the fewest;
    the stand-in accelerator on every global-mesh run without one.
    ``setting``: which mesh kinds each lesson runs with (:func:`mesh_kinds_of`).
    """
    plain = plain_pass_folder() is not None if plain is None else plain
    runs = {(lesson, kind): () for lesson in MESH_LESSONS for kind in mesh_kinds_of(lesson, setting)}
    runs |= {(lesson, None): () for lesson in SOLVED_ONLY}
    first = {}  # lesson -> its run with the plain pass
    for key in runs if plain else ():
        first.setdefault(key[0], key)
    for package, lesson in MATRIX:
        free = [k for k in runs if k[0] == lesson and first.get(lesson) != k]
        if free:
            key = min(free, key=lambda k: len(runs[k]))
            runs[key] += (package,)
    variants = [
        Variant(lesson, kind, missing, bool(kind) and first.get(lesson) != key, plain=first.get(lesson) == key)
        for key, missing in runs.items()
        for lesson, kind in [key]
    ]
    return [v for v in variants if v.mesh], [v for v in variants if not v.mesh]


def execute(variant: Variant, tmp_path: Path, monkeypatch):
    """Run the variant of its lesson (smoke profile, solutions filled in, its lesson's device count); the runner's record."""
    import jupytext
    import nbformat

    from coursetools import runner
    from coursetools.solutions import fill_solutions, run_again

    source = (ROOT / "notebooks" / f"{variant.lesson}.py").read_text()
    if variant.mesh == FOREIGN:
        source = with_foreign_mesh(source, variant.foreign or "2-D Explicit", variant.where)
    elif variant.mesh:
        source = with_global_mesh(source, variant.mesh)
    count = lesson_device_count(variant.lesson)
    if count is not None:
        monkeypatch.setenv("XLA_FLAGS", with_device_count(os.environ.get("XLA_FLAGS", ""), count))
    for name, value in lesson_env().items():
        monkeypatch.setenv(name, value)
    if variant.missing or variant.stand_in:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(BLOCKER), os.environ.get("PYTHONPATH", "")]))
    if variant.missing:
        monkeypatch.setenv("DPCOURSE_BLOCK_IMPORTS", ",".join(variant.missing))
    if variant.stand_in:
        monkeypatch.setenv(STAND_IN, "1")
        source += STAND_IN_CHECK
        if variant.lesson in NO_TCP_LESSONS:
            source = with_no_tcp(source)
    nb = jupytext.reads(source, fmt="py:percent")
    again = os.environ.get(AGAIN_SETTING, "1") != "0"
    if variant.plain:  # the plain lesson, unsolved; then every code cell of the variant, solved and strict
        fill_solutions(nb, variant.lesson)
        nb = with_plain_pass_first(nb, variant.lesson)
    elif variant.mesh != FOREIGN and again:  # a whole run: solved, then every code cell again after the last
        fill_solutions(nb, variant.lesson)
        first_again = len(nb.cells) + 1  # after run_again's heading
        run_again(nb)
        if variant.mesh:  # the second pass starts as the first did: no global mesh until the mesh cell sets it
            nb.cells.insert(first_again, nbformat.v4.new_code_cell("import jax\n\njax.set_mesh(None)"))
    path = tmp_path / f"{variant.lesson}.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "out"
    out.mkdir()
    done = runner.run_notebook(
        path, out, out / "records.jsonl", profile="smoke", cell_timeout_s=600, solutions=not variant.plain
    )
    folder = plain_pass_folder()
    failed_later = done.error_cell is not None and done.error_cell >= plain_cells(variant.lesson)
    if variant.plain and folder and (done.status == "passed" or failed_later):  # the plain pass ran whole
        keep_plain_pass(out / path.name, out / "records.jsonl", folder)
    return done


# The first cell of a plain run's second pass: strict checkers from here on, and its records apart from the plain pass's.
SOLVED_PASS = (
    "import os\n\n"
    'os.environ["DPCOURSE_EXERCISES_STRICT"] = "1"  # the solved pass: every checker must report success\n'
    'os.environ["DPCOURSE_RESULTS"] += ".solved"  # the plain pass\'s records stay as it left them\n'
)


def _lesson(lesson: str):
    import nbformat

    return nbformat.read(ROOT / "notebooks" / f"{lesson}.ipynb", as_version=4)


def plain_cells(lesson: str) -> int:
    """How many cells the lesson has (markdown too): a plain run's first pass."""
    return len(_lesson(lesson).cells)


def with_plain_pass_first(solved, lesson: str):
    """The lesson's own notebook (``notebooks/NN.ipynb``), then ``solved``'s code cells but the parameters one."""
    import nbformat

    nb = _lesson(lesson)
    second = [
        c for c in solved.cells if c.cell_type == "code" and "parameters" not in c.get("metadata", {}).get("tags", [])
    ]
    nb.cells += [
        nbformat.v4.new_markdown_cell("The lesson again, solved: every code cell after the last one."),
        nbformat.v4.new_code_cell(SOLVED_PASS),
        *second,
    ]
    return nb


def keep_plain_pass(executed: Path, records: Path, folder: Path) -> None:
    """Write the plain pass of a plain run (its cells of ``executed``) into ``folder``, and add its records there.

    The copy is written whole and then renamed (never half a notebook where browser-test reads it); the
    records are added in one write, so that a reader sees a lesson's records all or none.
    """
    import nbformat

    name = executed.name
    nb = nbformat.read(executed, as_version=4)  # its metadata keeps the widgets' state (07's controls on the site)
    nb.cells = nb.cells[: plain_cells(executed.stem)]
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{name}.partial"
    nbformat.write(nb, partial)
    os.replace(partial, folder / name)
    text = records.read_text(encoding="utf-8") if records.exists() else ""
    if text:
        with open(folder / "records.jsonl", "a", encoding="utf-8") as out:
            out.write(text if text.endswith("\n") else text + "\n")


def run(variant: Variant, tmp_path: Path, monkeypatch) -> str:
    """Run the variant of its lesson (:func:`execute`) and return its code cells' outputs as JSON text.

    Raises AssertionError naming the failed code cell and the error, or the
    missing package's sentence when the lesson does not say what it would add.
    """
    import nbformat

    done = execute(variant, tmp_path, monkeypatch)
    count = lesson_device_count(variant.lesson)
    where = f"code cell {done.error_code_cell}"
    if variant.plain and done.error_cell is not None:  # which pass, and the cell as that pass counts it
        lesson = _lesson(variant.lesson)
        plain_code = sum(c.cell_type == "code" for c in lesson.cells)
        if done.error_cell < len(lesson.cells):
            where = f"the plain lesson's code cell {done.error_code_cell}"
        else:  # the second pass's first code cell sets it up; the lesson's own start at its second
            where = f"the solved pass's code cell {done.error_code_cell - plain_code - 1} (parameters left out)"
    assert done.status == "passed", f"{variant.id}{f' on {count} devices' if count else ''}: {where}: {done.error}"
    executed = nbformat.read(tmp_path / "out" / f"{variant.lesson}.ipynb", as_version=4)
    text = json.dumps([c.get("outputs", []) for c in executed.cells if c.cell_type == "code"])
    if variant.stand_in and variant.lesson in NO_TCP_LESSONS:
        assert NO_TCP_SAYS in text, f"{variant.id} on a host without TCP does not say so in its sentence"
    for package in variant.missing:
        assert SAYS[package] in text, f"{variant.lesson} without {package} does not say what it would add"
    return text
