"""What a learner reads in a lesson's cells fits the screen and starts where the cell starts.

Found in the new-user trial: at 1280 px with the file browser open,
an output line of about 118 characters wraps, mid-word ("the backen / d's");
a code cell that opens with a blank line shows an empty first row.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
MAX_PRINTED = 100  # characters per printed line; the 100-character code lines fit too


def _literal_text(node: ast.AST) -> str | None:
    """The text of a string literal argument (implicit concatenation included); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_printed_literal_lines_fit_1280_px(path):
    too_long = []
    for cell in jupytext.read(path).cells:
        if cell.cell_type != "code":
            continue
        for call in (n for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Call)):
            if getattr(call.func, "id", None) != "print" or len(call.args) != 1:
                continue
            text = _literal_text(call.args[0])
            if text is None:
                continue
            too_long += [line for line in text.splitlines() if len(line) > MAX_PRINTED]
    assert not too_long, f"{path.name}: printed lines over {MAX_PRINTED} characters wrap mid-word: {too_long}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_code_cell_opens_with_a_blank_line(path):
    blank = [
        c.source.splitlines()[1:2] for c in jupytext.read(path).cells if c.cell_type == "code" and c.source[:1] == "\n"
    ]
    assert not blank, f"{path.name}: code cells that start with an empty line (next line shown): {blank}"


MAX_CODE_LINES = 500  # non-blank lines over a lesson's code cells: the harness belongs in the library


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_a_lesson_holds_at_most_500_lines_of_code(path):
    cells = [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]
    lines = sum(1 for source in cells for line in source.splitlines() if line.strip())
    assert lines <= MAX_CODE_LINES, f"{path.name}: {lines} non-blank lines of code; move harness to dpcourse"


def test_the_lab_guides_first_start_example_counts_the_lessons_there_are():
    """docs/jupyterlab.md shows what `make lab` prints on a first start; a new learner compares it."""
    import re

    text = (ROOT / "docs" / "jupyterlab.md").read_text()
    first = re.search(r"workspace: (\d+) lessons \((\d+) copied in\)\.", text)
    assert first, "docs/jupyterlab.md: no first-start example line ('N lessons (N copied in).')"
    assert int(first.group(1)) == int(first.group(2)) == len(LESSONS), first.group(0)


def _is_sentence(msg: ast.AST | None) -> bool:
    """Whether an ``assert``'s message is text a learner can read: a string, an f-string, or a call that makes one.

    A bare name, a tuple or a number (``assert x, x``) prints data with no
    sentence; no message at all prints a bare ``AssertionError``.
    """
    if msg is None:
        return False
    if isinstance(msg, ast.Constant):
        return isinstance(msg.value, str)
    if isinstance(msg, (ast.JoinedStr, ast.Call)):
        return True
    if isinstance(msg, ast.Attribute):  # a check's own sentence: same.message
        return msg.attr == "message"
    if isinstance(msg, ast.BinOp):
        return _is_sentence(msg.left) or _is_sentence(msg.right)
    return False


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_assert_in_a_lesson_says_in_a_sentence_what_went_wrong(path):
    bare = []
    for cell in jupytext.read(path).cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Assert) and not _is_sentence(node.msg):
                bare.append(ast.unparse(node)[:90])
    assert not bare, f"{path.name}: asserts a learner would see as a bare AssertionError or data: {bare}"


@pytest.mark.parametrize("path", LESSONS[:-1], ids=lambda p: p.stem)
def test_each_lesson_but_the_final_one_names_the_next_lesson_in_the_folder(path):
    following = LESSONS[LESSONS.index(path) + 1].stem
    text = path.read_text()
    assert f"**Next:** [{following}]({following}.ipynb)" in text, (
        f"{path.name}: its **Next:** line should link [{following}]({following}.ipynb), the lesson that follows"
    )


# What a learner must never read: the course goes on (a lesson is never "the last"), every time is
# measured, and no build machine's folder appears.
NEVER_SAID = ("last lesson", "not measured yet", "/work/", "/home/runner", "/tmp/")


@pytest.mark.parametrize("path", [*LESSONS, ROOT / "README.md"], ids=lambda p: p.stem)
def test_no_line_a_learner_reads_says_not_measured_or_last_lesson(path):
    text = path.read_text().lower()
    found = [phrase for phrase in NEVER_SAID if phrase in text]
    assert not found, f"{path.name} says {found}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_cell_ends_showing_what_recording_returns(path):
    """``record.figures`` returns the records (``[]`` outside a course run): a cell ending with it shows that list."""
    bare = []
    for cell in jupytext.read(path).cells:
        body = ast.parse(cell.source).body if cell.cell_type == "code" else []
        last = body[-1] if body else None
        call = last.value if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) else None
        if call is not None and ast.unparse(call.func).startswith("record."):
            bare.append(ast.unparse(last)[:80])
    assert not bare, f"{path.name}: cells that end by showing the records' list: {bare}"


def test_the_instructors_exercise_table_has_a_row_per_checked_exercise_in_course_order():
    """docs/instructor.md's table of exercises: one row for each exercise a checker checks, none more."""
    import re

    from dpcourse.exercises import progress

    checked = [e for lesson in LESSONS for e in progress.lesson_exercises(lesson.stem)]
    text = (ROOT / "docs" / "instructor.md").read_text()
    table = text.split("| exercise | the task | wrong answers the check recognises |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (\d\d)\.(\d+) \|", table, flags=re.M)
    assert [f"ex{lesson}_{n}" for lesson, n in rows] == checked


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_line_gives_a_tpu_a_pcie_link(path):
    """A TPU's chips all-reduce over ICI: a line naming both a TPU and PCIe once had a v5e-8 over "PCIe Gen4 x16 (assumed)"."""
    both = [
        line.strip()
        for line in path.read_text().splitlines()
        if "pcie" in line.lower() and ("tpu" in line.lower() or "v5e" in line.lower())
    ]
    assert not both, f"{path.name} names PCIe beside a TPU: {both}"


@pytest.mark.parametrize("path", [p for p in LESSONS if "MFU" in p.read_text()], ids=lambda p: p.stem)
def test_where_mfu_is_shown_the_lesson_says_which_peak_it_divides_by(path):
    """On a TPU the float32 step's matmuls are one bf16 pass, so MFU divides by the bf16 peak; on a GPU by TF32."""
    text = path.read_text()
    assert "bf16" in text and "TF32" in text, f"{path.name} shows MFU without saying which peak (TF32 or bf16)"


def test_lesson_12_reads_its_time_to_the_target_from_the_table_and_calls_it_no_bound():
    text = (ROOT / "notebooks" / "12_batch_size.py").read_text()
    section = text[text.index("## 7. Time to the target") : text.index("## 8.")]
    assert "time_to_target.reading(" in section, "the conclusion on device counts must be read from the table"
    assert "lower bound" not in section, "fitted steps x a modelled step is an estimate, not a bound"
    assert "with latency" in section and "extrapolated" in section


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_a_lesson_that_starts_processes_asks_first_whether_this_host_allows_tcp(path):
    """On a sandboxed TPU host no process may open a TCP socket: 11's multi-process section stopped there
    with ``TcpUnavailable`` in a cell (a real v5e host, 2026-12-06); 08 had said so in one sentence."""
    text = path.read_text(encoding="utf-8")
    launches = [i for i in (text.find("launch_local("), text.find("run_local(")) if i >= 0]  # lessons 08-11, 13
    if not launches:
        return
    asked = text.find("ports.tcp_unavailable()")
    assert 0 <= asked < min(launches), (
        f"{path.name} starts processes (launch_local, run_local) without asking ports.tcp_unavailable() first"
    )
