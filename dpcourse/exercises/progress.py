"""The learner's own progress record: ``progress.json`` in their workspace, written by checkers and lessons.

Every exercise check (:func:`dpcourse.exercises.base.checker`) and every
lesson start (:func:`dpcourse.lesson.start_lesson`) updates one JSON file in
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

The learner may also edit it: each read checks it against :data:`SCHEMA`
(the shape above, with the course's own exercise ids), and a file of
another shape is set aside as ``progress.json.bad-<time>`` with one warning
and a new record started, so no check ever fails for it.
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
_warned_ids: set[str] = set()
_validator = None

# The course's exercises (so many per lesson), the only ids a record may hold, so a made-up one adds no
# column to the instructor's board (tests/lib/exercises/test_progress.py checks them against the checkers).
_HOW_MANY = {2: 3, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 2, 9: 3, 10: 2, 11: 2, 12: 3, 13: 3}
EXERCISES = tuple(f"ex{lesson:02d}_{n}" for lesson, most in _HOW_MANY.items() for n in range(1, most + 1))
MAX_BYTES = 256 * 1024  # a course's worth of exercises is about 20 KB
_TIME = {"type": ["number", "null"], "minimum": 0, "maximum": 1e11}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 1_000_000}
_EXERCISE = {"enum": list(EXERCISES)}
VERDICTS = ["correct", "wrong", "not attempted yet", "bad input", "cannot check here"]


def _table(names: dict, fields: dict, most: int) -> dict:
    """At most ``most`` entries with names of the schema ``names``, each an object of ``fields`` alone."""
    entry = {"type": "object", "additionalProperties": False, "properties": fields}
    return {"type": "object", "maxProperties": most, "propertyNames": names, "additionalProperties": entry}


# The record's shape (JSON Schema 2020-12). The instructor's board (hub/board.py) checks each record it
# reads against the same schema: it runs in the hub's own image, without this package, so it holds a
# copy, and tests/hub/test_board_records.py checks that the two are equal.
SCHEMA = {
    "type": "object",
    "required": ["exercises"],
    "additionalProperties": False,
    "properties": {
        "version": {"const": 1},
        "updated": _TIME,
        "lessons": _table(
            {"pattern": r"^\d\d(_[A-Za-z0-9_]{1,40})?$"},
            {
                **dict.fromkeys(("started", "finished", "last_start"), _TIME),
                "exercises": {"type": "array", "maxItems": 20, "items": _EXERCISE},
            },
            40,
        ),
        "exercises": _table(
            _EXERCISE,
            {
                **dict.fromkeys(("first", "last", "correct_at"), _TIME),
                **dict.fromkeys(("attempts", "wrong_tries"), _COUNT),
                "lesson": {"type": "string", "pattern": r"^(\d\d)?$"},
                "verdict": {"enum": VERDICTS},
                "mistake": {"type": "string", "maxLength": 120},
                "message": {"type": "string", "maxLength": 300},
            },
            200,
        ),
    },
}


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


class RecordError(ValueError):
    """A progress file that is not a record of :data:`SCHEMA`'s shape; ``why`` says how, in a phrase."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(
            f"{path} is not a progress record of the course's shape ({why}); delete it to start a new one."
        )
        self.why = why


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def shape_problem(data) -> str | None:
    """Why ``data`` is not of :data:`SCHEMA`'s shape (the field and the rule, a phrase), or None when it is."""
    global _validator
    import jsonschema

    if _validator is None:
        _validator = jsonschema.Draft202012Validator(SCHEMA)
    error = jsonschema.exceptions.best_match(_validator.iter_errors(data))
    if error is None:
        return None
    said = error.message if len(error.message) <= 100 else f"breaks the rule {error.validator}"
    if error.validator == "enum" and len(error.message) > 100:  # e.g. the course's exercise ids: name the one given
        said = f"{json.dumps(error.instance)[:40]} is not one of the {len(error.validator_value)} allowed values"
    return f"{'.'.join(str(p) for p in error.absolute_path) or 'the top level'}: {said}"


def read(path: Path) -> dict:
    """The record at ``path``; an empty one when there is none.

    Raises:
        RecordError: the file is not a progress record of :data:`SCHEMA`'s shape (the message names it and why).
    """
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return empty()
    except OSError as err:
        why = err.strerror or type(err).__name__
    else:
        why = None
        if len(raw) > MAX_BYTES:
            why = f"{len(raw)} bytes, more than the {MAX_BYTES} a record may have"
        else:
            try:
                data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
            except RecursionError:
                why = "nested too deeply"
            except UnicodeDecodeError:
                why = "not UTF-8 text"
            except ValueError as err:
                why = f"not JSON: {str(err)[:80]}"
            else:
                why = shape_problem(data)
    if why is not None:
        raise RecordError(path, why)
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
        except RecordError as err:  # a broken file is kept aside, never overwritten
            kept = stamped = path.with_name(f"{path.name}.bad-{time.strftime('%Y-%m-%dT%H-%M-%S')}")
            for n in range(2, 1000):  # two set aside in one second: both kept
                if not kept.exists():
                    break
                kept = stamped.with_name(f"{stamped.name}-{n}")
            os.replace(path, kept)
            warnings.warn(
                f"Your progress record {path} was not of the course's shape ({err.why}): it is kept as {kept.name} "
                "and a new one is started; your checks are not affected.",
                stacklevel=4,
            )
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
    except Exception as err:  # noqa: BLE001 - a check never fails for its record
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
    if exercise not in EXERCISES:
        if exercise not in _warned_ids and progress_path() is not None:
            _warned_ids.add(exercise)
            warnings.warn(
                f"{exercise!r} is not one of the course's exercises ({EXERCISES[0]} to {EXERCISES[-1]}): "
                "its checks are not recorded in your progress.",
                stacklevel=3,
            )
        return None
    return _safely(check_changes(exercise, verdict, mistake, message))


def record_lesson_start(notebook: str, exercises: list[str]) -> dict | None:
    """Record that lesson ``notebook`` (``"03_mesh"``) started, with the ids of its exercises."""

    if not re.fullmatch(SCHEMA["properties"]["lessons"]["propertyNames"]["pattern"], notebook):
        return None  # not one of the course's lessons ("03_mesh"): nothing to show on the board

    def change(record: dict, now: float) -> None:
        entry = record["lessons"].setdefault(notebook, {"started": now, "finished": None})
        entry["last_start"] = now
        entry["exercises"] = [e for e in exercises if e in EXERCISES]

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


def forget_lesson(notebook: str, path: Path) -> dict | None:
    """Forget the checks of lesson ``notebook``'s exercises (``"13_elastic"``) in the record at ``path``.

    The course's workspace calls it as it lays a fresh copy of the lesson
    (``make reset LESSON=13``, ``workspace catchup``): the record then no
    longer lists that lesson's exercises as right, and the lesson stays
    started but not finished. Returns the record written, or None where
    there is no record (none is made).

    Raises:
        OSError: the record cannot be written (a broken one is set aside, as by every write).
    """
    if not Path(path).is_file():
        return None
    number = notebook[:2]

    def change(record: dict, now: float) -> None:
        record["exercises"] = {k: v for k, v in record["exercises"].items() if lesson_of(k) != number}
        for name, entry in record["lessons"].items():
            if name[:2] == number:
                entry["finished"] = None

    return _update(change, Path(path))


def delete(path: Path | None = None) -> Path | None:
    """Delete the learner's record (and its lock file); returns the path deleted, or None when there was none."""
    path = progress_path() if path is None else path
    if path is None or not path.exists():
        return None
    path.unlink()
    with contextlib.suppress(FileNotFoundError):
        path.with_name(f".{path.name}.lock").unlink()
    return path
