"""No lesson from 03 writes the device count it was written on into its code: counts, meshes and labels come from the run.

The lessons run on 2, 3, 4 and 8 simulated devices in ``make test``
(docs/testing.md); these scans catch the kind of fault that made a lesson
work on 8 devices only (a job labelled ``"replicated, 8 devices"`` looked up
as ``f"replicated, {n} devices"``, a literal count passed to
``start_lesson``, a section run only when ``n == 8``), before any lesson
runs. A new lesson ``notebooks/NN_name.py`` is scanned by its name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")) if int(p.stem[:2]) >= 3]
# A count of devices written into a string ("replicated, 8 devices"); an f-string's {n} devices is the run's,
# and "1 device" (a one-device reference) holds on every count.
LITERAL_LABEL = re.compile(r"""["'][^"'{}\n]*?\b(?:[2-9]|\d\d+) devices\b""")
# A literal device count handed to start_lesson (its third argument) instead of the parameters cell's.
LITERAL_START = re.compile(r"start_lesson\([^,()]+,[^,()]+,\s*\d+\b")
# A section kept to one device count (`if n == 8:`): it should work on the run's, or say for which it holds.
ONE_COUNT = re.compile(r"\b(?:n|n_devices|N_DEVICES|len\(devs\))\s*==\s*(?:[2-9]|\d\d+)\b")


def code_lines(path: Path) -> list[tuple[int, str]]:
    """The lesson's code lines (markdown and comments are text, not code), with their line numbers."""
    lines, in_markdown = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("# %%"):
            in_markdown = "[markdown]" in line
            continue
        if not in_markdown and not line.lstrip().startswith("#"):
            lines.append((number, line.split("  # ")[0]))
    return lines


def offending(path: Path) -> list[str]:
    return [
        f"{path.name}:{number}: {line.strip()}"
        for number, line in code_lines(path)
        if LITERAL_LABEL.search(line) or LITERAL_START.search(line) or ONE_COUNT.search(line)
    ]


def test_the_scan_finds_each_kind():
    found = [
        bool(p.search(text))
        for p, text in (
            (LITERAL_LABEL, 'jobs = {"replicated, 8 devices": ("replicated", n)}'),
            (LITERAL_START, 'lesson = start_lesson("08_multihost", PROFILE, 8, min_devices=2)'),
            (ONE_COUNT, "if MULTIHOST and n == 8:"),
        )
    ]
    assert all(found)
    fine = [
        'jobs = {f"replicated, {n} devices": 1}',
        'rows = {"loss 1 device": 1}',
        "start_lesson('x', PROFILE, N_CPU_DEVICES)",
        "if n == 1:",
    ]
    assert not any(p.search(t) for p in (LITERAL_LABEL, LITERAL_START, ONE_COUNT) for t in fine)


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_no_lesson_code_names_the_device_count_it_was_written_on(path):
    assert not offending(path), "a device count written into the lesson's code; take it from the run: " + "; ".join(
        offending(path)
    )
