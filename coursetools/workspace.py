"""The learner's own copy of the lessons: a git-ignored folder that `make lab` serves.

A workspace (``workspace/`` at the repository root unless ``--dir`` or
``$DPCOURSE_WORKSPACE`` says otherwise) holds one ``NN_name.ipynb`` per lesson,
made from the course's ``notebooks/NN_name.ipynb`` (no ``.py`` twin, so each
lesson is listed once and saving always writes the learner's file), a
``results/`` folder for what lessons write, and ``.course.json``, the
manifest: for each lesson, the hash of the course version its copy came from.

What the commands do (each write goes through a temporary file and
``os.replace``, so an interrupted command leaves the old file or the new one):

- ``init``/``update``: a lesson new in the course is copied in; a lesson the
  course changed is replaced when the learner's copy is untouched (its cells'
  types and sources equal the version it came from; outputs do not count),
  and otherwise the new version is written to
  ``updates/YYYY-MM-DD/NN_name.ipynb``: the learner's file is never overwritten.
- ``reset``: moves the learner's copy to ``old/<timestamp>/NN_name.ipynb``,
  then lays a fresh copy of the course's version.
- ``catchup``: the same, with the exercises' solutions filled in (an
  instructor bringing a learner who fell behind to a lesson). The filled copy
  counts as the learner's own: later ``init``/``update`` runs (a server's
  start, a room-wide update) keep it, as they keep an edited copy.

Dates go into folder names, not file names, so every name stays short enough
for the lab's file browser at 1280 px.
- ``status``: one line per lesson.

The command line is ``python -m coursetools workspace init|update|reset|status
[--dir DIR] [LESSON ...]`` (see ``docs/jupyterlab.md``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from coursetools import paths
from dpcourse.exercises import progress

WORKSPACE_ENV = "DPCOURSE_WORKSPACE"
REPO_ROOT = paths.ROOT
COURSE_NOTEBOOKS = paths.NOTEBOOKS
MANIFEST = ".course.json"
RESULTS = "results"
OLD = "old"
UPDATES = "updates"
LESSON_RE = re.compile(r"^(\d\d)_[A-Za-z0-9_]+$")
MANIFEST_VERSION = 1


class WorkspaceError(RuntimeError):
    """Bad input (unknown lesson, a folder that is a file, an unreadable notebook); nothing was changed."""


_CAUSES = {
    errno.EROFS: ("the file system is read-only", "make it writable or choose another folder"),
    errno.EACCES: (
        "you may not write there (permission denied)",
        "make it writable (chmod u+w) or choose another folder",
    ),
    errno.EPERM: ("the operation is not permitted there", "make it writable or choose another folder"),
    errno.ENOSPC: ("the disk is full", "free some space there, then run the command again"),
    errno.EDQUOT: ("your disk quota is used up", "free some space there, then run the command again"),
    errno.ENAMETOOLONG: ("a file name is too long for that file system", "choose a folder with a shorter path"),
}


def file_system_error(err: OSError, root: Path, doing: str, kept: str = "") -> WorkspaceError:
    """One sentence for ``err`` met while ``doing`` in the workspace ``root``: the folder, the cause, what to do.

    Every file there is whole (each write goes through a temporary file that
    is removed on failure); ``kept`` adds where moved files are.
    """
    cause, fix = _CAUSES.get(err.errno or 0, (err.strerror or type(err).__name__, "fix that, then run it again"))
    where = f" ({err.filename})" if err.filename and Path(str(err.filename)).parent != Path(root) else ""
    return WorkspaceError(
        f"Cannot {doing} the workspace {root}: {cause}{where}. Each file there is whole{kept}; {fix} "
        f"(--dir DIR or ${WORKSPACE_ENV}=DIR picks another folder)."
    )


@dataclass(frozen=True)
class Action:
    """What a command did (or found) for one lesson: ``kind`` and a sentence for the learner."""

    lesson: str
    kind: str  # copied, replaced, offered, restored, reset, caught up, unchanged, edited, waiting, missing, new, unreadable
    message: str


def default_dir() -> Path:
    """``$DPCOURSE_WORKSPACE``, else ``workspace/`` at the repository root."""
    env = os.environ.get(WORKSPACE_ENV, "").strip()
    return Path(env).expanduser() if env else REPO_ROOT / "workspace"


# ---- notebooks -------------------------------------------------------------


def course_lessons(source: Path | None = None) -> dict[str, Path]:
    """The course's lessons: name (``"05_shard_map"``) -> its ``.ipynb`` in ``source``, sorted.

    Raises:
        WorkspaceError: ``source`` is not a folder or holds no lesson.
    """
    source = Path(source) if source is not None else COURSE_NOTEBOOKS
    if not source.is_dir():
        raise WorkspaceError(
            f"The course's notebooks folder {source} does not exist: run this from the course's clone."
        )
    found = {p.stem: p for p in sorted(source.glob("[0-9][0-9]_*.ipynb")) if LESSON_RE.match(p.stem)}
    if not found:
        raise WorkspaceError(f"No lesson (NN_name.ipynb) in {source}.")
    return found


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WorkspaceError(f"{path} is not a readable notebook ({err}).") from err
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise WorkspaceError(f"{path} is not a notebook (no list of cells).")
    return data


def learner_copy(course_notebook: Path) -> str:
    """The text of a workspace copy of ``course_notebook``: no outputs, no pairing metadata.

    Only ``kernelspec`` is kept of the notebook's metadata, so the copy never
    names a jupytext pair (each lesson stays one file in the workspace). Read
    and written as JSON in nbformat's layout (nbformat itself takes seconds to
    import, longer than the copy).

    Raises:
        WorkspaceError: the course's notebook is not a notebook (unreadable JSON,
            no cells, a cell without a known type or a source).
    """
    try:
        nb = _read_json(course_notebook)
        for number, cell in enumerate(nb["cells"], start=1):
            if cell.get("cell_type") not in ("code", "markdown", "raw") or "source" not in cell:
                raise WorkspaceError(f"{course_notebook}: cell {number} has no known cell_type or no source.")
    except WorkspaceError as err:
        raise WorkspaceError(
            f"The course's notebook cannot be used: {err} Restore it with `git checkout -- notebooks/` "
            "(maintainers: `make sync`)."
        ) from err
    nb["metadata"] = {k: v for k, v in nb.get("metadata", {}).items() if k == "kernelspec"}
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def content_hash(notebook: dict) -> str:
    """sha256 of the cells' types and sources: what a learner writes, not outputs or metadata."""
    cells = []
    for cell in notebook.get("cells", []):
        source = cell.get("source", "")
        cells.append([cell.get("cell_type"), "".join(source) if isinstance(source, list) else source])
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode()).hexdigest()


def _file_hash(path: Path) -> str | None:
    """content_hash of a workspace file; None when it cannot be read as a notebook."""
    try:
        return content_hash(_read_json(path))
    except WorkspaceError:
        return None


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


# ---- the workspace ---------------------------------------------------------


class Workspace:
    """One learner's folder and its manifest.

    Args:
        root: the workspace folder (created by :meth:`ensure`).
        source: the course's notebooks folder (``notebooks/`` of this clone by default).
    """

    def __init__(self, root: Path, source: Path | None = None) -> None:
        self.root = Path(root).expanduser().absolute()
        self.source = Path(source).absolute() if source is not None else COURSE_NOTEBOOKS
        self.manifest_path = self.root / MANIFEST
        self.notes: list[str] = []
        self._lessons: dict[str, Path] | None = None  # what is read of the course, kept (read_course)
        self._copies: dict[str, str] = {}
        self._solved: dict[str, str] = {}
        self._moved: list[str] = []  # what the command in progress moved to old/, for its error message

    # -- the course, read once --

    def lessons(self) -> dict[str, Path]:
        """The course's lessons (:func:`course_lessons` of ``source``), read once."""
        self._lessons = course_lessons(self.source) if self._lessons is None else self._lessons
        return self._lessons

    def course_copy(self, lesson: str) -> str:
        """The learner's copy of the course's ``lesson`` (:func:`learner_copy`), read once."""
        if lesson not in self._copies:
            self._copies[lesson] = learner_copy(self.lessons()[lesson])
        return self._copies[lesson]

    def solved(self, lesson: str) -> str:
        """:meth:`course_copy` with the exercises' solutions filled in (:func:`solved_copy`), read once."""
        if lesson not in self._solved:
            self._solved[lesson] = solved_copy(lesson, self.course_copy(lesson))
        return self._solved[lesson]

    def read_course(self, names: list[str] | None = None, solved: bool = False) -> None:
        """Read now what a command on ``names`` (all when none) needs of the course, raising as it would.

        Root on a learner's folder does this before it becomes the learner, who may not enter the clone.
        """
        for lesson in self.select(names, self.lessons()):
            self.solved(lesson) if solved else self.course_copy(lesson)  # read and kept

    # -- set-up and manifest --

    def refuse_a_file(self, doing: str = "made") -> None:
        """Raise :class:`WorkspaceError` (one sentence) when the workspace's path, or a folder above it, is a file."""
        for path in (self.root, *self.root.parents):
            if path.exists() and not path.is_dir():
                raise WorkspaceError(
                    f"{path} is a file, not a folder, so the workspace {self.root} cannot be {doing} there: "
                    f"move that file away or choose another folder with --dir (or ${WORKSPACE_ENV})."
                )
            if path.exists():
                break

    def ensure(self) -> None:
        """Create the folder and ``results/``; refuse a path that is a file."""
        self.refuse_a_file()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / RESULTS).mkdir(exist_ok=True)

    def load(self) -> dict:
        """The manifest (empty when there is none). An unreadable one is kept aside and rebuilt."""
        if not self.manifest_path.exists():
            return {"version": MANIFEST_VERSION, "lessons": {}}
        try:
            data = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("lessons"), dict):
                raise ValueError("no 'lessons' table")
            return data
        except (OSError, UnicodeDecodeError, ValueError) as err:
            kept = self.root / f"{MANIFEST}.bad-{_stamp()}"
            os.replace(self.manifest_path, kept)
            self.notes.append(
                f"The manifest {self.manifest_path.name} was unreadable ({err}); kept as {kept.name}. "
                "Lessons are matched against the course again; edited ones are kept."
            )
            return {"version": MANIFEST_VERSION, "lessons": {}}

    def save(self, manifest: dict) -> None:
        manifest["version"] = MANIFEST_VERSION
        _write_atomic(self.manifest_path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")

    def select(self, names: list[str] | None, lessons: dict[str, Path]) -> list[str]:
        """The lessons named (``05``, ``05_shard_map`` or ``05_shard_map.ipynb``); all when none.

        Raises:
            WorkspaceError: a name matches no lesson of the course.
        """
        if not names:
            return list(lessons)
        chosen = []
        for name in names:
            key = name.removesuffix(".ipynb").removesuffix(".py").rstrip("/").split("/")[-1]
            number = key.zfill(2) if key.isdigit() else None
            hits = [lesson for lesson in lessons if lesson == key or lesson[:2] == number]
            if not hits:
                raise WorkspaceError(
                    f"No lesson {name!r} in the course; lessons are {', '.join(lessons)} "
                    "(give the number, e.g. 05, or the name)."
                )
            chosen += [h for h in hits if h not in chosen]
        return chosen

    # -- commands --

    def update(self, names: list[str] | None = None) -> list[Action]:
        """Bring the workspace up to the course without overwriting the learner's work (see the module).

        Raises:
            WorkspaceError: an unknown lesson, an unreadable course notebook, or
                a file system error (:func:`file_system_error`: one sentence).
        """
        chosen = self.select(names, self.lessons())
        fresh = {lesson: self.course_copy(lesson) for lesson in chosen}  # all read before any write
        try:
            return self._update(chosen, fresh)
        except OSError as err:
            raise file_system_error(err, self.root, "write in") from None

    def _update(self, chosen: list[str], fresh: dict[str, str]) -> list[Action]:
        self.ensure()
        manifest = self.load()
        actions = [self._update_one(lesson, fresh[lesson], manifest) for lesson in chosen]
        self.save(manifest)
        return actions

    def _update_one(self, lesson: str, text: str, manifest: dict) -> Action:
        course = content_hash(json.loads(text))
        target = self.root / f"{lesson}.ipynb"
        entry = manifest["lessons"].get(lesson)
        now = _stamp()
        if not target.exists():
            _write_atomic(target, text)
            kind = "restored" if entry else "copied"
            manifest["lessons"][lesson] = {"course_hash": course, "copied": now}
            what = "copied in again (it was missing)" if entry else "copied in"
            return Action(lesson, kind, f"{lesson}: {what}.")
        mine = _file_hash(target)
        if mine is None:
            return Action(
                lesson,
                "unreadable",
                f"{lesson}: {target.name} is not a readable notebook, so it was left as it is; "
                f"`python -m coursetools workspace reset {lesson[:2]}` moves it to {OLD}/ and lays a fresh copy.",
            )
        if entry is None:  # a file the manifest does not know (a lost manifest, a copy made by hand)
            if mine == course:
                manifest["lessons"][lesson] = {"course_hash": course, "copied": now}
                return Action(lesson, "unchanged", f"{lesson}: up to date.")
            # Taken as an edit of the course's present version: kept, and the
            # next course change is offered in updates/.
            manifest["lessons"][lesson] = {"course_hash": course, "copied": None}
            return Action(lesson, "edited", f"{lesson}: yours, edited.")
        if entry.get("course_hash") == course:
            edited = mine != course
            return Action(
                lesson, "edited" if edited else "unchanged", f"{lesson}: {'yours, edited' if edited else 'up to date'}."
            )
        if mine == entry.get("course_hash"):  # untouched by the learner: take the course's new version
            _write_atomic(target, text)
            manifest["lessons"][lesson] = {"course_hash": course, "copied": now}
            return Action(
                lesson, "replaced", f"{lesson}: the course changed it; your copy was unchanged, so it was replaced."
            )
        offered = entry.get("offered")
        if offered and offered.get("course_hash") == course:
            if not (self.root / offered["file"]).exists():  # the learner removed it: not written again
                return Action(
                    lesson,
                    "edited",
                    f"{lesson}: yours, edited (the course's newer version is not in the workspace: "
                    f"`reset {lesson[:2]}` lays it, keeping yours in {OLD}/).",
                )
            return Action(
                lesson,
                "waiting",
                f"{lesson}: yours, edited; the course's new version is in {offered['file']}.",
            )
        beside = self._update_path(lesson, text)
        _write_atomic(self.root / beside, text)
        entry["offered"] = {"course_hash": course, "file": beside, "written": now}
        return Action(
            lesson,
            "offered",
            f"{lesson}: the course changed this lesson and you have edited yours, so yours is kept; "
            f"the course's new version is in {beside}.",
        )

    def _update_path(self, lesson: str, text: str) -> str:
        """``updates/<date>/<lesson>.ipynb``, relative to the workspace; a later time when that one is taken."""
        name = f"{UPDATES}/{time.strftime('%Y-%m-%d')}/{lesson}.ipynb"
        path = self.root / name
        if path.exists() and path.read_text(encoding="utf-8") != text:
            name = f"{UPDATES}/{_stamp()}/{lesson}.ipynb"
        return name

    def reset(self, names: list[str] | None = None, all_lessons: bool = False, solved: bool = False) -> list[Action]:
        """Move each named lesson's copy to ``old/`` (with a timestamp) and lay a fresh one.

        ``solved``: lay the course's version with the exercises' solutions
        filled in (catching a learner up), see :func:`solved_copy`.

        Raises:
            WorkspaceError: no lesson named and ``all_lessons`` not set, an unknown lesson,
                (``solved``) a lesson whose solutions do not match its exercises, or a file
                system error (one sentence; a copy already moved to ``old/`` stays there).
        """
        if not names and not all_lessons:
            raise WorkspaceError("Say which lesson to reset (e.g. `reset 05`), or `reset --all` for every lesson.")
        chosen = self.select(names, self.lessons())
        fresh = {lesson: self.course_copy(lesson) for lesson in chosen}
        # The manifest holds the course's version: a caught-up copy differs from it, so `init` and
        # `update` keep it as the learner's own (a later course change is offered in updates/).
        course = {lesson: content_hash(json.loads(text)) for lesson, text in fresh.items()}
        if solved:
            fresh = {lesson: self.solved(lesson) for lesson in fresh}
        self._moved = []
        try:
            return self._reset(chosen, fresh, course, solved)
        except OSError as err:
            kept = f" ({' and '.join(self._moved)} moved aside before it stopped)" if self._moved else ""
            raise file_system_error(err, self.root, "reset lessons in", kept) from None

    def _reset(self, chosen: list[str], fresh: dict[str, str], course: dict[str, str], solved: bool) -> list[Action]:
        self.ensure()
        manifest = self.load()
        stamp = _stamp()
        old_dir = _free_name(self.root / OLD / stamp)  # one folder per reset
        actions = []
        for lesson in chosen:
            kept = []
            entry = manifest["lessons"].get(lesson) or {}
            offered = (entry.get("offered") or {}).get("file")
            mine = (self.root / f"{lesson}.ipynb", old_dir / f"{lesson}.ipynb")
            waiting = (self.root / offered, old_dir / UPDATES / f"{lesson}.ipynb") if offered else None
            for path, old in (mine, waiting) if waiting else (mine,):
                if path.exists():
                    old.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(path, old)
                    kept.append(old.relative_to(self.root).as_posix())
                    self._moved.append(kept[-1])
            _write_atomic(self.root / f"{lesson}.ipynb", fresh[lesson])
            manifest["lessons"][lesson] = {"course_hash": course[lesson], "copied": stamp}
            self.save(manifest)
            progress.forget_lesson(lesson, self.root / progress.FILE)  # the fresh copy's exercises are not done
            where = f"; the old copy is {' and '.join(kept)}" if kept else ""
            what = (
                "the course's version with the solutions filled in" if solved else "fresh copy of the course's version"
            )
            actions.append(Action(lesson, "caught up" if solved else "reset", f"{lesson}: {what}{where}."))
        return actions

    def status(self, names: list[str] | None = None) -> list[Action]:
        """One line per lesson of the course (or per named lesson); writes nothing.

        Raises:
            WorkspaceError: the workspace's path (or a folder above it) is a file, or an unknown lesson.
        """
        self.refuse_a_file("read")
        lessons = {lesson: self.lessons()[lesson] for lesson in self.select(names, self.lessons())}
        try:
            manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            manifest["lessons"].items()
        except FileNotFoundError:
            manifest = {"lessons": {}}
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
            self.notes.append(
                f"The manifest {self.manifest_path.name} is unreadable ({err}); `update` keeps it aside and rebuilds it."
            )
            manifest = {"lessons": {}}
        out = []
        for lesson in lessons:
            target = self.root / f"{lesson}.ipynb"
            entry = manifest.get("lessons", {}).get(lesson)
            course = content_hash(json.loads(self.course_copy(lesson)))
            if not target.exists():
                out.append(
                    Action(
                        lesson,
                        "new" if entry is None else "missing",
                        f"{lesson}: not in the workspace yet (run update).",
                    )
                )
                continue
            mine = _file_hash(target)
            if mine is None:
                out.append(
                    Action(
                        lesson,
                        "unreadable",
                        f"{lesson}: not a readable notebook (reset {lesson[:2]} lays a fresh copy).",
                    )
                )
                continue
            base = (entry or {}).get("course_hash")
            offered = (entry or {}).get("offered")
            words = "edited" if mine != base else "unchanged"
            if base != course and not (offered and offered.get("course_hash") == course):
                out.append(
                    Action(lesson, "changed", f"{lesson}: {words}; the course has a newer version (run update).")
                )
            elif base != course:
                out.append(
                    Action(
                        lesson,
                        "waiting",
                        f"{lesson}: {words}; the course's new version is in {offered['file']}.",
                    )
                )
            else:
                out.append(
                    Action(lesson, "edited" if words == "edited" else "unchanged", f"{lesson}: {words}, up to date.")
                )
        return out


def solved_copy(lesson: str, text: str, solutions: Path | None = None) -> str:
    """``text`` (a learner's copy of ``lesson``) with each exercise cell's source replaced by its solution.

    The solutions are ``solutions/NN_name.py`` (dpcourse.exercises.solutions);
    a lesson without exercises comes back unchanged.

    Raises:
        WorkspaceError: an exercise without a solution or a solution without its exercise.
    """
    from coursetools import solutions as sol

    nb = json.loads(text)
    cells = {sol.cell_id(cell): cell for cell in nb["cells"] if cell["cell_type"] == "code" and sol.cell_id(cell)}
    if not cells:
        return text
    found = sol.read_solutions(lesson, solutions)
    if set(found) != set(cells):
        raise WorkspaceError(
            f"{lesson}: the solutions in {sol.solution_path(lesson, solutions)} do not match the lesson's exercises "
            f"({sorted(cells)} in the lesson, {sorted(found)} solved); nothing was changed."
        )
    for ident, cell in cells.items():
        cell["source"] = found[ident]
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _stamp() -> str:
    """Local time, as it goes into file names: 2026-12-01T20-31-05."""
    return time.strftime("%Y-%m-%dT%H-%M-%S")


def _free_name(path: Path) -> Path:
    """``path``, or ``path`` with -2, -3, ... after its name when it exists (a file or a folder)."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


# ---- the functions other modules call -------------------------------------


def init(dir: Path, source: Path | None = None) -> list[Action]:
    """Make (or bring up to date) the workspace ``dir`` from ``source`` (the course's notebooks/).

    The same as :func:`update`: on a new folder every lesson is copied in.
    """
    return Workspace(dir, source).update()


def update(dir: Path, lessons: list[str] | None = None, source: Path | None = None) -> list[Action]:
    """New lessons in, unchanged copies replaced, edited ones kept with the new version in ``updates/``."""
    return Workspace(dir, source).update(lessons)


def reset(
    dir: Path, lessons: list[str] | None = None, all_lessons: bool = False, source: Path | None = None
) -> list[Action]:
    """Fresh copies of the named lessons (or all); the old copies go to ``old/<timestamp>/``."""
    return Workspace(dir, source).reset(lessons, all_lessons=all_lessons)


def catch_up(dir: Path, lessons: list[str], source: Path | None = None) -> list[Action]:
    """The named lessons with the solutions filled in; the learner's copies go to ``old/<timestamp>/``."""
    return Workspace(dir, source).reset(lessons, solved=True)
