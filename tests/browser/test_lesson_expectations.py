"""The key outputs the browser tests look for still occur in the lessons' sources (or the library's, which shows them)."""

from __future__ import annotations

import pytest
from labserver import NOTEBOOKS
from lessons import KEY_OUTPUT, key_output


@pytest.mark.parametrize("lesson", sorted(KEY_OUTPUT))
def test_key_output_occurs_in_the_lesson(lesson):
    source = NOTEBOOKS / f"{lesson}.py"
    if not source.exists():
        pytest.fail(f"lessons.KEY_OUTPUT names {lesson}, which has no notebooks/{lesson}.py: remove or rename it.")
    text = source.read_text() + "".join(p.read_text() for p in (NOTEBOOKS.parent / "dpcourse").rglob("*.py"))
    for expected in KEY_OUTPUT[lesson]:
        assert expected in text, (
            f"{expected!r} is in neither notebooks/{lesson}.py nor dpcourse: update tests/browser/lessons.py"
        )


def test_a_lesson_added_later_gets_the_common_checks_only():
    assert key_output("99_not_written_yet") == ()
