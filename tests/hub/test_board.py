"""The instructor's board (hub/board.py) from records alone: counts, stuck, mistakes, and 30 learners at 1280x800."""

from __future__ import annotations

import importlib.util
import random
import re

import pytest
from hubprocess import ROOT

spec = importlib.util.spec_from_file_location("board", ROOT / "hub" / "board.py")
board = importlib.util.module_from_spec(spec)
spec.loader.exec_module(board)

NOW = 1_800_000_000.0
EXERCISES = {
    "02_baseline": ["ex02_1", "ex02_2", "ex02_3"],
    **{f"0{n}_lesson": [f"ex0{n}_1", f"ex0{n}_2"] for n in range(3, 10)},
    "10_sharded": ["ex10_1", "ex10_2"],
}


def entry(verdict: str, tries: int = 1, mistake: str = "", at: float = NOW - 30) -> dict:
    wrong = 0 if verdict == "correct" else tries
    return {
        "lesson": "03",
        "verdict": verdict,
        "mistake": mistake,
        "message": f"{mistake or verdict}: what the learner saw",
        "attempts": tries,
        "wrong_tries": wrong,
        "last": at,
    }


def record(exercises: dict, lessons=("03_mesh",)) -> dict:
    return {
        "version": 1,
        "updated": max([e["last"] for e in exercises.values()], default=NOW - 100),
        "lessons": {name: {"started": NOW - 600, "exercises": ["ex03_1", "ex03_2"]} for name in lessons},
        "exercises": exercises,
    }


def test_counts_say_correct_stuck_and_not_attempted_per_exercise():
    learners = {
        "ann": {"record": record({"ex03_1": entry("correct", 2)}), "server": "running", "activity": NOW - 5},
        "ben": {"record": record({"ex03_1": entry("wrong", 3, "whole-array")}), "server": "running"},
        "cyd": {"record": record({"ex03_1": entry("wrong", 1, "whole-array")}), "server": "stopped"},
        "dee": {"record": None, "server": "running"},
    }
    summary = board.summarise(learners, NOW)
    assert summary["exercises"] == ["ex03_1", "ex03_2"]
    assert summary["counts"]["ex03_1"] == {"correct": 1, "stuck": 1, "not attempted": 1}
    assert summary["counts"]["ex03_2"] == {"correct": 0, "stuck": 0, "not attempted": 4}
    assert summary["mistakes"][0] == {
        "exercise": "ex03_1",
        "mistake": "whole-array",
        "learners": 2,
        "message": "whole-array: what the learner saw",
    }
    rows = {r["name"]: r for r in summary["rows"]}
    assert rows["ben"]["states"]["ex03_1"] == "stuck" and rows["cyd"]["states"]["ex03_1"] == "wrong"
    assert rows["ann"]["lesson"] == "03_mesh" and rows["ann"]["activity_ago_s"] == 5
    assert rows["dee"]["lesson"] == "" and rows["dee"]["activity_ago_s"] is None


def test_a_check_after_the_last_start_names_the_lesson_checked():
    rec = record({"ex05_1": {**entry("wrong", 1, "no-mean", at=NOW), "lesson": "05"}})
    rec["lessons"]["05_shard_map"] = {"started": NOW - 900}
    assert board.current_lesson(rec) == "05_shard_map"


def test_what_a_learner_typed_is_escaped_on_the_board():
    rec = record({"ex03_1": {**entry("wrong", 1, "<b>x</b>"), "message": "<script>alert(1)</script>"}})
    page = board.render_room(board.summarise({"<img src=x>": {"record": rec, "server": "running"}}, NOW))
    assert "<script>" not in page and "<img" not in page and "&lt;script&gt;" in page


def generated_room(n: int, seed: int = 7) -> dict:
    """``n`` learners spread over the course as a room at mid-morning might be."""
    rng = random.Random(seed)
    mistakes = ["whole-array", "other-dimension", "replicated-split", "no-mean", "mask-ignored", "per-device-batch"]
    learners = {}
    order = [e for names in EXERCISES.values() for e in names]
    for i in range(n):
        reached = rng.randint(0, len(order))
        exercises = {}
        for k, ex in enumerate(order[:reached]):
            verdict = rng.choice(["correct"] * 5 + ["wrong", "bad input"]) if k < reached - 1 else "wrong"
            exercises[ex] = {
                **entry(
                    verdict,
                    rng.randint(1, 5),
                    rng.choice(mistakes) if verdict != "correct" else "",
                    NOW - 60 * (reached - k),
                ),
                "lesson": ex[2:4],
            }
        name = f"learner-{i + 1:02d}" if i % 5 else f"a-rather-long-learner-name-{i}"
        name += "\u200d" * (i == 3)  # a look-alike of "learner-04": the board shows its code points
        learners[name] = {"record": record(exercises, tuple(EXERCISES)), "server": "running", "activity": NOW - i * 40}
    for lesson, names in EXERCISES.items():
        for info in learners.values():
            info["record"]["lessons"][lesson]["exercises"] = names
    return learners


def test_thirty_learners_fit_1280x800_in_chromium(browser):
    summary = board.summarise(generated_room(30), NOW)
    assert len(summary["rows"]) == 30 and len(summary["exercises"]) == 19
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        shell = board.render_page("/services/board/", 2, actions=True).split("<script>")[0]
        page.set_content(shell.replace('<div id="board"></div>', f'<div id="board">{board.render_room(summary)}</div>'))
        size = page.evaluate(
            "() => [document.documentElement.scrollWidth, document.documentElement.scrollHeight,"
            " document.querySelectorAll('tbody tr').length]"
        )
        out = ROOT / "results" / "hub"
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / "board-30-learners.png"))
        print(f"\nboard, 30 learners: {size[0]}x{size[1]} px; screenshot {out / 'board-30-learners.png'}")
        assert size[2] == 30
        assert size[0] <= 1280 and size[1] <= 800, f"the board needs {size[0]}x{size[1]} px"
        cut = (
            "() => [...document.querySelectorAll('td.who .cp')]"
            ".map(e => e.getBoundingClientRect().right > e.closest('td').getBoundingClientRect().right)"
        )
        assert page.evaluate(cut) == [False], "a look-alike's code points are missing or cut short"
        shown = page.inner_text("#mistakes")
        assert re.search(r"\d\d\.\d \S+ · \d+ learners", shown), shown
    finally:
        page.close()


def test_the_page_refreshes_itself_from_the_room_fragment():
    page = board.render_page("/services/board/", 2)
    assert '"/services/board/room"' in page and "setTimeout(refresh, 2000)" in page


@pytest.mark.parametrize("seconds, said", [(None, "-"), (5, "5 s"), (300, "5 min"), (7300, "2 h")])
def test_activity_is_said_in_the_unit_that_reads(seconds, said):
    assert board.ago(seconds) == said


def test_look_alike_names_are_told_apart_on_the_board():
    import unicodedata

    names = [unicodedata.normalize("NFC", "zoë"), unicodedata.normalize("NFD", "zoë"), "dana", "d\u0430na"]
    learners = {n: {"record": record({"ex03_1": entry("correct")})} for n in names}
    page = board.render_room(board.summarise(learners, NOW))
    shown = [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r'<td class="who">(.*?)</td>', page)]
    assert len(set(shown)) == 4, shown
    assert "zo\\xeb" in page and "zoe\\u0308" in page and "d\\u0430na" in page
