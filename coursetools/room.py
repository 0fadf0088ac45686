"""The instructor's board's actions on `make hub`: a catch-up or fresh-copy request checked and made a workspace command."""

from __future__ import annotations

import re
from pathlib import Path

LESSON_NAME = re.compile(r"^\d\d(_[A-Za-z0-9_]+)?$")


def action_command(body: dict, users: Path, python: str) -> list[str]:
    """The workspace command for a board action: catch-up or a fresh copy, for one learner or every one (``*``).

    ``body`` is the board's request (``action``, ``lesson``, ``learner``);
    ``users`` the folder of the learners' homes (``.hub/users``).

    Raises:
        ValueError: an unknown action, a lesson that is not ``NN`` or ``NN_name``, or no such learner.
    """
    action, lesson, learner = body.get("action"), str(body.get("lesson", "")), str(body.get("learner", ""))
    if action not in ("catchup", "reset"):
        raise ValueError("the action is catchup or reset")
    if not LESSON_NAME.match(lesson):
        raise ValueError(f"give the lesson as its number, e.g. 04 (got {lesson[:20]!r})")
    command = [python, "-m", "coursetools", "workspace", action, lesson]
    if learner == "*":
        return [*command, "--room", str(users)]
    known = {p.parent.name for p in users.glob("*/workspace") if p.is_dir()}
    if learner not in known:
        raise ValueError(f"no learner {learner[:40]!r} with a workspace; * is every learner")
    return [*command, "--dir", str(users / learner / "workspace")]
