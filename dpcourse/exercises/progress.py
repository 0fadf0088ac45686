"""The learner's own progress record: ``progress.json`` in their workspace, written by checkers and lessons.

Every exercise check (:func:`dpcourse.exercises.base.checker`) and every
lesson start (:func:`dpcourse.session.start_lesson`) updates one JSON file in
the learner's workspace, so that the learner, and through the hub's
authenticated API the instructor's board (hub/board.py), can see where they
stand. Shape of the file (times are seconds since the epoch, UTC)::

    {"version": 1, "updated": 1764763200.0,
     "lessons": {"03_mesh": {"started": ..., "finished": ... or null,
                             "exercises": ["ex03_1", "ex03_2"]}},
     "exercises": {"ex03_1": {"lesson": "03", "verdict": "wrong",
                              "mistake": "whole-array", "message": "...",
                              "attempts": 2, "wrong_tries": 2,
                              "first": ..., "last": ..., "correct_at": null}}}

``attempts`` counts checks of an answer (not of the untouched ``...``);
``wrong_tries`` counts wrong or unusable answers since the last correct one.
A lesson is finished when each of its exercises has been checked correct
(lesson 01, which has none, only starts).

Where: ``$DPCOURSE_PROGRESS`` names the file (``off`` records nothing);
otherwise ``progress.json`` in ``$DPCOURSE_WORKSPACE`` when it holds a
workspace's manifest (``.course.json``), else in the nearest folder, from
the kernel's working directory up, that holds that manifest. Outside a
workspace (the course's own ``notebooks/``, CI runs) nothing is written. The file is the learner's: they
can open it in the lab and delete it at any time; it is made again, empty,
at the next check. Writes go through a temporary file and ``os.replace``
under a lock, so a reader never sees half a file and two kernels do not
lose each other's updates.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import warnings
from pathlib import Path

PROGRESS_ENV = "DPCOURSE_PROGRESS"
WORKSPACE_ENV = "DPCOURSE_WORKSPACE"  # the same variable as the course's workspace command
MANIFEST = ".course.json"  # the workspace's manifest (written by `workspace init`)
FILE = "progress.json"
VERSION = 1
STUCK_TRIES = 3  # wrong tries without a correct one after which the board calls a learner stuck
_ID = re.compile(r"^ex(\d\d)_\d+$")
_warned = False


def progress_path(cwd: Path | None = None) -> Path | None:
    """The progress file this kernel writes, or None when it records nothing (see the module)."""
    given = os.environ.get(PROGRESS_ENV, "").strip()
    if given.lower() in ("off", "0", "none"):
        return None
    if given:
        return Path(given).expanduser()
    workspace = os.environ.get(WORKSPACE_ENV, "").strip()
    if workspace and (Path(workspace).expanduser() / MANIFEST).is_file():
        return Path(workspace).expanduser() / FILE
    here = Path.cwd() if cwd is None else Path(cwd)
    for folder in (here, *here.parents):
        if (folder / MANIFEST).is_file():
            return folder / FILE
    return None


def empty() -> dict:
    """A record with nothing in it yet."""
    return {"version": VERSION, "updated": None, "lessons": {}, "exercises": {}}


def read(path: Path) -> dict:
    """The record at ``path``; an empty one when there is none.

    Raises:
        ValueError: the file is not a progress record (the message names it).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return empty()
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path} is not a readable progress record ({err}); delete it to start a new one.") from err
    if not isinstance(data, dict) or not isinstance(data.get("exercises"), dict):
        raise ValueError(f"{path} is not a progress record (no 'exercises' table); delete it to start a new one.")
    data.setdefault("lessons", {})
    return data


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path``'s lock file (POSIX); no lock where fcntl is missing (Windows)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: one kernel at a time is the usual case
        yield
        return
    lock = path.with_name(f".{path.name}.lock")
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _update(change, path: Path | None = None) -> dict | None:
    """Apply ``change(record, now)`` to the record under the lock and write it atomically; None if not recording."""
    path = progress_path() if path is None else path
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        try:
            record = read(path)
        except ValueError:  # a broken file is kept aside, never overwritten
            os.replace(path, path.with_name(f"{path.name}.bad-{time.strftime('%Y-%m-%dT%H-%M-%S')}"))
            record = empty()
        now = round(time.time(), 3)
        change(record, now)
        record["updated"] = now
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return record


def _safely(change) -> dict | None:
    """:func:`_update`, but a failure to write becomes one warning per kernel: a check never fails for it."""
    global _warned
    try:
        return _update(change)
    except OSError as err:
        if not _warned:
            _warned = True
            warnings.warn(
                f"Your progress could not be saved ({err}); checks still work. Set {PROGRESS_ENV}=off to stop trying.",
                stacklevel=3,
            )
        return None


def lesson_of(exercise: str) -> str:
    """``"ex03_1"`` -> ``"03"``; other labels -> ``""``."""
    found = _ID.match(exercise)
    return found[1] if found else ""


def check_changes(exercise: str, verdict: str, mistake: str, message: str):
    """The change one check makes to a record (used by :func:`record_check`; pure, for tests)."""

    def change(record: dict, now: float) -> None:
        entry = record["exercises"].setdefault(
            exercise,
            {"lesson": lesson_of(exercise), "attempts": 0, "wrong_tries": 0, "first": now, "correct_at": None},
        )
        attempted = verdict != "not attempted yet"
        if attempted:
            entry["attempts"] = entry.get("attempts", 0) + 1
        if verdict == "correct":
            entry["wrong_tries"] = 0
            entry["correct_at"] = now
        elif verdict in ("wrong", "bad input"):
            entry["wrong_tries"] = entry.get("wrong_tries", 0) + 1
        entry.update(verdict=verdict, mistake=mistake[:120], message=message[:300], last=now)
        # A lesson is finished once every one of its exercises has been checked correct.
        for lesson in record["lessons"].values():
            names = lesson.get("exercises") or []
            done = all(record["exercises"].get(n, {}).get("verdict") == "correct" for n in names)
            if exercise in names and lesson.get("finished") is None and done:
                lesson["finished"] = now

    return change


def record_check(exercise: str, verdict: str, mistake: str = "", message: str = "") -> dict | None:
    """Add one check's outcome to the learner's record; returns the record written, or None when not recording.

    Args:
        exercise: the exercise id, e.g. ``"ex03_1"``.
        verdict: the feedback's status ("correct", "wrong", "not attempted yet", "bad input",
            "cannot check here").
        mistake: the named mistake's short id for a wrong answer (``""`` otherwise; kept up to 120 characters).
        message: the sentence the learner saw (kept up to 300 characters).
    """
    return _safely(check_changes(exercise, verdict, mistake, message))


def record_lesson_start(notebook: str, exercises: list[str]) -> dict | None:
    """Record that lesson ``notebook`` (``"03_mesh"``) started, with the ids of its exercises."""

    def change(record: dict, now: float) -> None:
        entry = record["lessons"].setdefault(notebook, {"started": now, "finished": None})
        entry["last_start"] = now
        entry["exercises"] = list(exercises)

    return _safely(change)


def lesson_exercises(notebook: str) -> list[str]:
    """The exercise ids that ``dpcourse.exercises.lessonNN`` checks for ``notebook`` (``"03_mesh"``); [] for none."""
    import importlib

    try:
        module = importlib.import_module(f"dpcourse.exercises.lesson{notebook[:2]}")
    except ImportError:
        return []
    found = {getattr(v, "exercise", None) for v in vars(module).values() if callable(v)}
    return sorted(e for e in found if isinstance(e, str) and _ID.match(e) and e[2:4] == notebook[:2])


def delete(path: Path | None = None) -> Path | None:
    """Delete the learner's record (and its lock file); returns the path deleted, or None when there was none."""
    path = progress_path() if path is None else path
    if path is None or not path.exists():
        return None
    path.unlink()
    with contextlib.suppress(FileNotFoundError):
        path.with_name(f".{path.name}.lock").unlink()
    return path
