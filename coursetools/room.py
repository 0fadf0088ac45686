"""The instructor's board's actions on `make hub`: a catch-up or fresh-copy request checked and made a workspace command."""

from __future__ import annotations

import json
import re
from pathlib import Path

LESSON_NAME = re.compile(r"^\d\d(_[A-Za-z0-9_]+)?$")
EXAMPLE = '{"action": "catchup", "lesson": "04", "learner": "bob"}'


class BadBody(ValueError):
    """An action request whose body is not a JSON object (the board answers 400)."""


def read_action(body: bytes) -> dict:
    """The board's action request from the body it was sent: a JSON object (``action``, ``lesson``, ``learner``).

    Raises:
        BadBody: the body is not JSON, or is JSON of another shape (a list, a string, nested too deeply).
    """
    try:
        request = json.loads(body or b"{}")
    except RecursionError:
        request = None
    except ValueError as err:
        raise BadBody(f"The action's body is not JSON ({str(err)[:80]}): send an object such as {EXAMPLE}.") from None
    if not isinstance(request, dict):
        raise BadBody(f"The action's body is not a JSON object: send one such as {EXAMPLE}.")
    return request


def action_command(body: dict, users: Path, python: str) -> list[str]:
    """The workspace command for a board action: catch-up or a fresh copy, for one learner or every one.

    ``body`` is the board's request (``action``, ``lesson``, and ``learner``, or
    ``room: true`` for every learner); ``users`` the folder of the learners'
    homes (``.hub/users``). The learner is named exactly (a learner may be
    called ``*``), or by the name's escaped form (``zo\\u00eb``) when it holds
    characters that look like others.

    Raises:
        BadBody: ``body`` is not a dict.
        ValueError: an unknown action, a lesson that is not ``NN`` or ``NN_name``, or no such learner.
    """
    if not isinstance(body, dict):
        raise BadBody(f"The action's body is not a JSON object: send one such as {EXAMPLE}.")
    action, lesson, learner = body.get("action"), str(body.get("lesson", "")), str(body.get("learner", ""))
    if action not in ("catchup", "reset"):
        raise ValueError("the action is catchup or reset")
    if not LESSON_NAME.match(lesson):
        raise ValueError(f"give the lesson as its number, e.g. 04 (got {lesson[:20]!r})")
    command = [python, "-m", "coursetools", "workspace", action, lesson]
    if body.get("room") is True:
        return [*command, "--room", str(users)]
    known = {p.parent.name for p in users.glob("*/workspace") if p.is_dir()}
    if learner not in known and learner.isascii():
        escaped = learner.encode().decode("unicode_escape", errors="replace")
        learner = escaped if escaped in known else learner
    if learner not in known:
        raise ValueError(
            f"no learner {learner[:40]!r} with a workspace (click their row to fill in their exact name); "
            "tick 'every learner' for the whole room"
        )
    return [*command, "--dir", str(users / learner / "workspace")]
