"""The instructor's board on a real hub (make hub), in Chromium: a wrong then right answer seen live, 403s, catch-up.

One JupyterHub from hub/launch.py on 127.0.0.1 (ports HUB_TEST_PORT to +11, 8900-8911 by default), the smoke
profile. Learner alice answers exercise 03.1 in her kernel, wrong then right;
the instructor's open board shows the mistake and then "correct" within a
few seconds (the latency goes to results/hub/board.json). Learner bob gets
403 on the board and on alice's record. The instructor catches bob up to
lesson 04 from the board and hands the room a fresh lesson 05 with the command
the guide gives; the workspaces then hold what the guide says. Bob's caught-up
lesson survives a restart of his server and a room-wide update; a malformed
record of his is his row alone on the board, and his server logged one 404 while he had none.
"""

from __future__ import annotations

# The file's name sorts it after test_gke_hub_config and test_launch: the session's browser keeps
# Playwright's event loop running (asyncio.run fails beside it), and a hub's ports take a while to close.
import json
import subprocess
import sys
import time

import pytest
from hubprocess import ADMIN_PASSWORD, PASSWORD, ROOT, hub_api, login, own_password, start_hub, xsrf
from labpage import kernel_execute, wait_for_kernel, wait_for_lab
from test_hub_room import sign_in

LESSON = "03_mesh.ipynb"
SEEN_WITHIN_S = 15  # the board refreshes every 2 s; a loaded machine gets more
START = (
    "from dpcourse.lesson import start_lesson\n"
    "from dpcourse.exercises import lesson03 as check\n"
    "from jax.sharding import Mesh\n"
    "lesson = start_lesson('03_mesh', 'smoke', 8, min_devices=2, load_data=False, show=False)\n"
    "mesh = Mesh(lesson.devices.devices, ('data',))\n"
    "print(lesson.n_devices)"
)
WRONG = (
    "print(check.shard_shapes(((48, 784), (48, 98), (48, 784)), mesh).status)"  # the whole array under P('data', None)
)
RIGHT = "print(check.shard_shapes(((6, 784), (48, 98), (48, 784)), mesh).status)"


@pytest.fixture()
def room(tmp_path):
    hub = start_hub(tmp_path / "hub", HUB_PROFILE="smoke", HUB_SERVER_ARGS="--LabApp.expose_app_in_browser=True")
    try:
        yield hub
    finally:
        took, left, ports = hub.stop()
        assert not left and not ports, f"left after the hub stopped: {left} {ports}\n{hub.log_text()[-2000:]}"


def wait_for_row(page, learner: str, text: str, timeout_s: float) -> float:
    """Seconds until the board's row of ``learner`` shows ``text``."""
    start = time.monotonic()
    page.wait_for_function(
        "([who, text]) => { const row = document.querySelector(`tr[data-learner='${who}']`);"
        " return row && row.innerText.includes(text); }",
        arg=[learner, text],
        timeout=timeout_s * 1000,
    )
    return time.monotonic() - start


def restart_server(hub, user: str, timeout_s: float = 150) -> None:
    """Stop ``user``'s server and start it again through the hub's API, as the instructor."""
    admin = login(hub, "instructor", ADMIN_PASSWORD)
    headers = {"X-XSRFToken": xsrf(admin)}
    api = f"{hub.url}/hub/api/users/{user}"
    for method, done in (("delete", lambda s: not s), ("post", lambda s: s.get("ready"))):
        answer = admin.request(method, f"{api}/server", headers=headers, timeout=timeout_s)
        assert answer.status_code in (201, 202, 204), (method, answer.status_code, answer.text)
        deadline = time.monotonic() + timeout_s
        while not done(hub_api(admin, hub, f"/users/{user}").json()["servers"].get("", {})):
            assert time.monotonic() < deadline, f"{user}'s server did not {method} within {timeout_s} s"
            time.sleep(1)


def workspace_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coursetools", "workspace", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_the_board_shows_a_mistake_then_correct_and_only_the_instructor_sees_it(room, browser):
    hub = room
    pages = {}
    for user, password in (
        ("alice", own_password("alice")),
        ("bob", own_password("bob")),
        ("instructor", ADMIN_PASSWORD),
    ):
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        context.set_default_timeout(90_000)
        pages[user] = context.new_page()
        sign_in(pages[user], hub, user, password, PASSWORD)
    alice, bob, instructor = pages["alice"], pages["bob"], pages["instructor"]
    for user in ("alice", "bob"):
        pages[user].goto(f"{hub.url}/user/{user}/lab/tree/{LESSON}")
    for user in ("alice", "bob"):
        wait_for_lab(pages[user], timeout_s=150)
    wait_for_kernel(alice, LESSON)
    assert kernel_execute(alice, LESSON, START).strip() == "8"

    answer = instructor.goto(f"{hub.url}/services/board/")
    assert answer.status == 200 and "/services/board/" in instructor.url
    wait_for_row(instructor, "alice", "03_mesh", SEEN_WITHIN_S)  # the lesson's start

    started = time.monotonic()
    assert kernel_execute(alice, LESSON, WRONG).strip() == "wrong"
    wait_for_row(instructor, "alice", "whole-array", SEEN_WITHIN_S)
    wrong_seen_s = time.monotonic() - started
    assert "whole-array" in instructor.inner_text("#mistakes")
    started = time.monotonic()
    assert kernel_execute(alice, LESSON, RIGHT).strip() == "correct"
    wait_for_row(instructor, "alice", "03.1 correct", SEEN_WITHIN_S)
    right_seen_s = time.monotonic() - started
    cell = instructor.get_attribute("tr[data-learner='alice'] td.s.correct", "title")
    assert cell.startswith("03.1: correct, 2 tries")
    out = ROOT / "results" / "hub"
    out.mkdir(parents=True, exist_ok=True)
    instructor.screenshot(path=str(out / "board-live.png"))
    figures = {"wrong_seen_after_s": round(wrong_seen_s, 2), "correct_seen_after_s": round(right_seen_s, 2)}
    (out / "board.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nboard latency: {figures}; screenshot {out / 'board-live.png'}")

    # A malformed record is that learner's row alone, said once in the log; the rest of the room keeps updating,
    # and a quiet room adds nothing to the hub's log (the board's unchanged reads are answered 304, logged at debug).
    (hub.folder / "users" / "bob" / "workspace" / "progress.json").write_text('{"exercises": {"ex03_1": "3"}}')
    wait_for_row(instructor, "bob", "record unreadable: exercises.ex03_1", SEEN_WITHIN_S)
    quiet_from = len(hub.log_text().splitlines())
    time.sleep(8)  # four refreshes
    assert "03.1 correct" in instructor.inner_text("tr[data-learner='alice']")
    assert instructor.inner_text("#status").startswith("updated")
    quiet = "\n".join(hub.log_text().splitlines()[quiet_from:])
    assert "(board@" not in quiet, quiet[-2000:]  # the hub and the servers log requests as NAME@ADDRESS
    assert hub.log_text().count("board: bob's record is unreadable") == 1
    # Before that, bob had no record: asked once, then his folder's listing (no 404 at each refresh).
    assert hub.log_text().count("404 GET /user/bob/api/contents/progress.json?content=0&type=file (board@") == 1

    # A learner can open neither the board nor another learner's record.
    assert bob.request.get(f"{hub.url}/services/board/").status == 403
    assert bob.request.get(f"{hub.url}/services/board/room.json").status == 403
    assert bob.request.get(f"{hub.url}/user/alice/api/contents/progress.json").status == 403
    assert alice.request.get(f"{hub.url}/user/alice/api/contents/progress.json").status == 200

    # The instructor catches bob up to lesson 04 from the board: the filled lesson, his copy kept.
    users = hub.folder / "users"
    instructor.fill("#act input[name=learner]", "bob")
    instructor.fill("#act input[name=lesson]", "04")
    instructor.click("#act button[value=catchup]")
    instructor.wait_for_function("() => /^(done|refused)/.test(document.getElementById('done').textContent)")
    said = instructor.inner_text("#done")
    assert said.startswith("done:") and "solutions filled in" in said and "old/" in said, said
    assert bob.request.post(f"{hub.url}/services/board/action", data='{"action": "reset"}').status == 403
    filled = json.loads((users / "bob" / "workspace" / "04_sharding.ipynb").read_text())
    assert len(list((users / "bob" / "workspace" / "old").glob("*/04_sharding.ipynb"))) == 1
    from coursetools import solutions

    solved = {solutions.cell_id(c): "".join(c["source"]) for c in filled["cells"] if solutions.cell_id(c)}
    assert solved == solutions.read_solutions("04_sharding")
    # A restart of bob's server (the culler, the admin page: its start runs `workspace init`) and a room-wide
    # update keep the filled lesson.
    restart_server(hub, "bob")
    done = workspace_command("update", "--room", str(users))
    assert done.returncode == 0, done.stderr
    assert json.loads((users / "bob" / "workspace" / "04_sharding.ipynb").read_text()) == filled

    # A fresh lesson 05 for the whole room: alice's edited copy is kept aside.
    mine = users / "alice" / "workspace" / "05_shard_map.ipynb"
    mine.write_text(mine.read_text().replace('"source": [', '"source": ["# alice\'s note\\n", ', 1))
    done = workspace_command("reset", "05", "--room", str(users))
    assert done.returncode == 0, done.stderr
    kept = list((users / "alice" / "workspace" / "old").glob("*/05_shard_map.ipynb"))
    assert len(kept) == 1 and "alice's note" in kept[0].read_text() and "alice's note" not in mine.read_text()
    for page in pages.values():
        page.context.close()
