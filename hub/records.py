"""A learner's record (progress.json) as the instructor's board reads it: its schema, checked before it is used.

The shape dpcourse/exercises/progress.py writes and reads (tests/hub/test_board_records.py: the same schema).
Imported by hub/board.py from the same folder (on GKE both are mounted into the hub's pod); only jsonschema
(which jupyterhub requires) and the standard library.
"""

from __future__ import annotations

import json

import jsonschema

MAX_RECORD_BYTES = 256 * 1024  # a course's worth of exercises is about 20 KB
MAX_REASON = 160  # characters of the reason a row gives for an unreadable record
RETRY_S = 30.0  # seconds before asking again for a record the learner's server refused
_TIME = {"type": ["number", "null"], "minimum": 0, "maximum": 1e11}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 1_000_000}
# The course's exercises (so many per lesson), the only ids a record may hold: a made-up one adds no column.
_HOW_MANY = {2: 3, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 2, 9: 3, 10: 2, 11: 2, 12: 3, 13: 3}
EXERCISES = [f"ex{lesson:02d}_{n}" for lesson, most in _HOW_MANY.items() for n in range(1, most + 1)]
_ID = {"enum": EXERCISES}
VERDICTS = ["correct", "wrong", "not attempted yet", "bad input", "cannot check here"]


def _table(names: dict, fields: dict, most: int) -> dict:
    """At most ``most`` entries with names of the schema ``names``, each an object of ``fields`` alone."""
    entry = {"type": "object", "additionalProperties": False, "properties": fields}
    return {"type": "object", "maxProperties": most, "propertyNames": names, "additionalProperties": entry}


# The shape dpcourse/exercises/progress.py writes and reads: its SCHEMA (tests/hub/test_board_records.py: equal).
RECORD_SCHEMA = {
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
                "exercises": {"type": "array", "maxItems": 20, "items": _ID},
            },
            40,
        ),
        "exercises": _table(
            _ID,
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
_VALIDATOR = jsonschema.Draft202012Validator(RECORD_SCHEMA)


class RecordError(ValueError):
    """A learner's record the board cannot use; the message says why in a phrase."""


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def parse_record(text: str | bytes) -> dict:
    """The learner's record from the text of their ``progress.json``.

    Raises:
        RecordError: too large, not UTF-8, not JSON, or not of :data:`RECORD_SCHEMA`'s shape (names the field).
    """
    size = len(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    if size > MAX_RECORD_BYTES:
        raise RecordError(f"{size} bytes, more than the {MAX_RECORD_BYTES} a record may have")
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise RecordError("nested too deeply to be a record") from None
    except UnicodeDecodeError:
        raise RecordError("not UTF-8 text") from None
    except ValueError as err:
        raise RecordError(f"not JSON ({str(err)[:80]})") from None
    error = jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(data))
    if error is not None:  # the schema's own sentence, or the rule alone where that would quote a long value
        rule = f"breaks the rule {error.validator} {json.dumps(error.validator_value)[:40]}"
        if error.validator == "enum":  # e.g. the course's exercise ids: name the one given
            rule = f"{json.dumps(error.instance)[:40]} is not one of the {len(error.validator_value)} allowed values"
        said = error.message if len(error.message) <= 100 else rule
        where = ".".join(str(p) for p in error.absolute_path) or "the top level"
        raise RecordError(f"{where}: {said}"[:MAX_REASON])
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise RecordError("holds text that is not valid Unicode (a lone surrogate)") from None
    return data
