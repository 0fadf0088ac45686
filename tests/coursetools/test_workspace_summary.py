"""Tests of coursetools.workspace_summary: make lab's start line counts the lessons and names the few to look at."""

from __future__ import annotations

from pathlib import Path

from coursetools.workspace import Action
from coursetools.workspace_summary import NAMED_AT_MOST, summary


def test_a_first_start_counts_without_naming_and_a_lesson_to_look_at_gets_its_own_line():
    copied = [Action(f"{n:02d}_x", "copied", f"{n:02d}_x: copied in.") for n in range(1, 12)]
    unreadable = Action("12_y", "unreadable", "12_y: not a readable notebook.")
    lines = summary(Path("W"), [*copied, unreadable])
    assert lines == ["workspace W: 12 lessons (11 copied in; 1 unreadable, left as it is (12_y)).", unreadable.message]
    assert len(copied) > NAMED_AT_MOST
