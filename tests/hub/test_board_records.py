"""The board (hub/board.py) reads each learner's record from their server: a bad one is that learner's row alone.

The learners' servers here are a small tornado app that answers the contents
API with jupyter_server's own file manager (what a learner's server runs), so
a file that is not UTF-8, a folder, or a symlink gets the answers a real
server gives; the hub's user list is one handler beside it. Ports 8200-8299.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

import pytest
from test_board import board

GOOD = {
    "version": 1,
    "updated": 1_800_000_000.0,
    "lessons": {"03_mesh": {"started": 1_799_999_000.0, "finished": None, "exercises": ["ex03_1", "ex03_2"]}},
    "exercises": {
        "ex03_1": {
            "lesson": "03",
            "verdict": "wrong",
            "mistake": "whole-array",
            "message": "Under P('data', None) you gave the whole array.",
            "attempts": 2,
            "wrong_tries": 2,
            "first": 1_799_999_100.0,
            "last": 1_799_999_900.0,
            "correct_at": None,
        }
    },
}


def changed(path: str, value) -> dict:
    """GOOD with the value at ``path`` (keys joined by ``/``) replaced."""
    record = json.loads(json.dumps(GOOD))
    *parents, last = path.split("/")
    here = record
    for key in parents:
        here = here[key]
    here[last] = value
    return record


def text(record) -> str:
    return json.dumps(record)


# Each: the file's bytes, and a word of the reason the row gives.
MALFORMED = {
    "wrong_tries a string": (text(changed("exercises/ex03_1/wrong_tries", "3")), "wrong_tries"),
    "exercises a string": (text(changed("exercises", "ex03_1")), "exercises"),
    "lessons a string": (text(changed("lessons", "03_mesh")), "lessons"),
    "exercise id without _": (text({**GOOD, "exercises": {"ex031": GOOD["exercises"]["ex03_1"]}}), "ex031"),
    "an exercise entry a string": (text(changed("exercises/ex03_1", "correct")), "ex03_1"),
    "an unknown verdict": (text(changed("exercises/ex03_1/verdict", "great")), "verdict"),
    "a lesson's exercises a string": (text(changed("lessons/03_mesh/exercises", "ex03_1")), "exercises"),
    "a lesson without its number": (text({**GOOD, "lessons": {"mesh": {}}}), "mesh"),
    "attempts negative": (text(changed("exercises/ex03_1/attempts", -1)), "attempts"),
    "attempts 10**30": (text(changed("exercises/ex03_1/attempts", 10**30)), "attempts"),
    "a field the course never writes": (text(changed("exercises/ex03_1/score", 5)), "score"),
    "no exercises table": (text({"version": 1, "lessons": {}}), "exercises"),
    "a message over 300 characters": (text(changed("exercises/ex03_1/message", "m" * 301)), "message"),
    "a 20 MB message": (text(changed("exercises/ex03_1/message", "m" * 20_000_000)), "bytes"),
    "too many exercises": (
        text({**GOOD, "exercises": {f"ex{n:02d}_{k}": {} for n in range(40) for k in range(6)}}),
        "exercises",
    ),
    "a list at the top": (text([GOOD]), "type"),
    "an empty file": ("", "JSON"),
    "half a file": (text(GOOD)[:40], "JSON"),
    "nested 100000 deep": ('{"exercises": {"ex03_1": {"message": ' + "[" * 100_000 + "]" * 100_000 + "}}}", "nested"),
    "NaN": (text(GOOD).replace("1800000000.0", "NaN"), "NaN"),
    "a number of 5000 digits": (text(GOOD).replace("1800000000.0", "9" * 5000), "JSON"),
    "a lone surrogate": (text(changed("exercises/ex03_1/message", "x")).replace('"x"', '"\\ud800"'), "Unicode"),
    "a made-up exercise": (text(changed("exercises/ex99_1", GOOD["exercises"]["ex03_1"])), "ex99_1"),
    "a lesson listing a made-up exercise": (text(changed("lessons/03_mesh/exercises", ["ex03_9"])), "exercises"),
}


def listen(app) -> tuple:
    """``(server, port)``: ``app`` served on 127.0.0.1 at the first port of 8250-8299 it can take (the tests' range)."""
    for port in range(8250, 8300):
        try:
            return app.listen(port, "127.0.0.1"), port
        except OSError:
            continue
    raise RuntimeError("no free port in 8250-8299: stop what listens there")


def in_thread(make):
    """Run the coroutine ``make()`` on its own event loop (the browser tests keep one running in this thread)."""
    out: dict = {}

    def target():
        try:
            out["value"] = asyncio.run(make())
        except BaseException as err:  # handed back to the test
            out["error"] = err

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(120)
    if "error" in out:
        raise out["error"]
    return out["value"]


class FakeRoom:
    """A hub's user list and learners' servers (jupyter_server's file manager), and the answers they gave."""

    def __init__(self, homes: Path, names: list[str], refuse=None, stopped=(), disk=None, mistakes=None) -> None:
        self.homes, self.names, self.stopped, self.disk, self.mistakes = homes, names, set(stopped), disk, mistakes
        self.refuse = refuse or {}  # learner -> (status, message) their server answers instead
        self.answers: list[tuple[str, str, int]] = []  # (learner, "content", "model" or "listing", status)

    def app(self):
        from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
        from tornado import web

        room = self
        managers = {name: AsyncLargeFileManager(root_dir=str(self.homes / name)) for name in self.names}

        class Users(web.RequestHandler):
            def get(self):
                self.write(
                    json.dumps(
                        [
                            {
                                "name": n,
                                "kind": "user",
                                "admin": False,
                                "last_activity": None,
                                "servers": {} if n in room.stopped else {"": {"ready": True, "url": f"/user/{n}/"}},
                            }
                            for n in room.names
                        ]
                    )
                )

        class Contents(web.RequestHandler):
            async def get(self, name):
                content = self.get_argument("content", "1") == "1"
                self.what = (name, "content" if content else "model")
                if name in room.refuse:
                    self.set_status(room.refuse[name][0])
                    self.write({"message": room.refuse[name][1]})
                    return
                try:
                    model = await managers[name].get(
                        board.RECORD, content=content, type="file", format="text" if content else None
                    )
                except web.HTTPError as err:
                    self.set_status(err.status_code)
                    self.write({"message": err.log_message % err.args if err.args else err.log_message})
                    return
                self.write(json.dumps(model, default=str))

            def on_finish(self):
                room.answers.append((*self.what, self.get_status()))

        class Listing(Contents):
            async def get(self, name):
                self.what = (name, "listing")
                self.write(json.dumps(await managers[name].get("", content=True, type="directory"), default=str))

        return web.Application(
            [
                ("/hub/api/users", Users),
                (r"/user/([^/]+)/api/contents/progress.json", Contents),
                (r"/user/([^/]+)/api/contents/", Listing),
            ]
        )

    def serve(self, work):
        """``work(board.Room)`` with this room served on 127.0.0.1; returns what it returns."""

        async def run():
            server, port = listen(self.app())
            try:
                said: list[str] = []
                room = board.Room(
                    f"http://127.0.0.1:{port}/hub/api",
                    "token",
                    f"http://127.0.0.1:{port}",
                    say=lambda s, **_: said.append(s),
                    homes=self.disk,
                    mistakes=self.mistakes,
                )
                return await work(room), said
            finally:
                server.stop()

        return in_thread(run)


def homes(tmp_path: Path, records: dict[str, str | bytes | None]) -> Path:
    for name, content in records.items():
        (tmp_path / name).mkdir(parents=True)
        if content is not None:
            path = tmp_path / name / board.RECORD
            path.write_bytes(content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content)
    return tmp_path


@pytest.mark.parametrize("shape", list(MALFORMED))
def test_a_malformed_record_is_refused_with_its_reason(shape):
    content, word = MALFORMED[shape]
    with pytest.raises(board.RecordError) as caught:
        board.parse_record(content)
    reason = str(caught.value)
    assert word.lower() in reason.lower() and len(reason) <= board.MAX_REASON, reason


def test_the_board_checks_records_against_the_schema_the_course_checks_its_own_against():
    from dpcourse.exercises import progress

    assert json.loads(json.dumps(board.RECORD_SCHEMA)) == json.loads(json.dumps(progress.SCHEMA))
    assert list(progress.EXERCISES) == board.EXERCISES and board.MAX_RECORD_BYTES == progress.MAX_BYTES


@pytest.mark.parametrize("shape", [s for s in MALFORMED if s != "a lone surrogate"])  # the course writes it escaped
def test_a_record_the_board_refuses_is_one_the_course_sets_aside(tmp_path, shape):
    from dpcourse.exercises import progress

    path = tmp_path / "progress.json"
    path.write_text(MALFORMED[shape][0])
    with pytest.raises(progress.RecordError):
        progress.read(path)


def test_a_record_the_course_writes_passes(tmp_path):
    from dpcourse.exercises import progress

    path = tmp_path / "progress.json"
    progress._update(
        lambda record, now: record["lessons"].setdefault("03_mesh", {"started": now, "finished": None}), path
    )
    for verdict in ("not attempted yet", "wrong", "bad input", "cannot check here", "wrong", "wrong", "correct"):
        progress._update(progress.check_changes("ex03_1", verdict, "w" * 200, "a long message " * 40), path)
    progress._update(progress.check_changes("ex03_2", "wrong", "whole-array", ""), path)
    record = board.parse_record(path.read_text())
    assert record["exercises"]["ex03_1"]["verdict"] == "correct"
    assert board.parse_record(json.dumps(progress.empty())) == progress.empty()


def rows_by_name(room_html: str) -> dict[str, str]:
    import re

    return dict(re.findall(r'<tr data-learner="([^"]+)"[^>]*>(.*?)</tr>', room_html))


def room_of(tmp_path: Path, bad: str | bytes | None, refreshes: int = 1):
    names = ["ann", "ben", "cyd"]
    fake = FakeRoom(homes(tmp_path, {"ann": text(GOOD), "ben": bad, "cyd": text(GOOD)}), names)

    async def work(room):
        for _ in range(refreshes):
            summary = await room.summary(max_age_s=0)
        return summary

    summary, said = fake.serve(work)
    return summary, said, fake


@pytest.mark.parametrize("shape", list(MALFORMED))
def test_one_malformed_record_harms_only_its_own_row(tmp_path, shape):
    summary, said, _ = room_of(tmp_path, MALFORMED[shape][0])
    rows = rows_by_name(board.render_room(summary))
    assert set(rows) == {"ann", "ben", "cyd"}
    assert "record unreadable:" in rows["ben"] and "whole-array" not in rows["ben"]
    for name in ("ann", "cyd"):
        assert "record unreadable" not in rows[name] and "03.1 wrong: whole-array" in rows[name]
    assert summary["counts"]["ex03_1"] == {"correct": 0, "stuck": 0, "not attempted": 0}
    assert said == [f"board: ben's record is unreadable: {summary['rows'][1]['problem']}"]


@pytest.mark.parametrize(
    "make, word",
    [
        (lambda home: (home / board.RECORD).write_bytes(b'{"exercises": {"ex03_1": {"message": "\xff"}}}'), "UTF-8"),
        (lambda home: (home / board.RECORD).mkdir(), "directory"),
        (lambda home: (home / board.RECORD).symlink_to("/proc/self/status"), "JSON"),
        (lambda home: (home / board.RECORD).symlink_to(home.parent / "ann" / "nowhere"), "non-file"),
    ],
    ids=["not UTF-8", "a folder", "a symlink to elsewhere", "a dangling symlink"],
)
def test_a_file_the_server_cannot_serve_as_a_record_is_said(tmp_path, make, word):
    home = homes(tmp_path, {"ann": text(GOOD), "ben": None, "cyd": text(GOOD)}) / "ben"
    make(home)
    fake = FakeRoom(tmp_path, ["ann", "ben", "cyd"])

    async def work(room):
        for _ in range(3):
            summary = await room.summary(max_age_s=0)
        return summary

    summary, said = fake.serve(work)
    rows = rows_by_name(board.render_room(summary))
    assert "03.1 wrong: whole-array" in rows["ann"] and "03.1 wrong: whole-array" in rows["cyd"]
    assert "record unreadable:" in rows["ben"] and word in rows["ben"], rows["ben"]
    assert len(said) == 1 and said[0].startswith("board: ben's record is unreadable: ")
    refused = [a for a in fake.answers if a[0] == "ben" and a[2] >= 400]
    # A refusal, which the server logs as a warning, is not asked again at once (a file that is no JSON is served).
    assert len(refused) == (0 if word == "JSON" else 1), fake.answers


def test_a_record_the_server_may_not_read_is_said(tmp_path):
    # jupyter_server's file manager answers 403 "Permission denied: PATH" where it may not read a file
    # (jupyter_server/services/contents/filemanager.py); root reads any file, so the answer is given here.
    homes(tmp_path, {"ann": text(GOOD), "ben": text(GOOD), "cyd": text(GOOD)})
    fake = FakeRoom(tmp_path, ["ann", "ben", "cyd"], refuse={"ben": (403, "Permission denied: progress.json")})
    summary, said = fake.serve(lambda room: room.summary(max_age_s=0))
    rows = rows_by_name(board.render_room(summary))
    assert "record unreadable: their server may not read it (Permission denied: progress.json)" in rows["ben"]
    assert "03.1 wrong: whole-array" in rows["ann"] and "03.1 wrong: whole-array" in rows["cyd"]


def test_a_record_made_bad_then_good_is_logged_once_each_and_never_shown_stale(tmp_path):
    home = homes(tmp_path, {"ann": text(GOOD), "ben": text(GOOD), "cyd": text(GOOD)}) / "ben"
    fake = FakeRoom(tmp_path, ["ann", "ben", "cyd"])

    async def work(room):
        shown = []
        for step in range(9):
            if step == 3:
                (home / board.RECORD).write_text(text(changed("exercises/ex03_1/wrong_tries", "3")))
            if step == 6:
                (home / board.RECORD).write_text(text(changed("exercises/ex03_1/verdict", "correct")))
            shown.append(rows_by_name(board.render_room(await room.summary(max_age_s=0)))["ben"])
        return shown

    shown, said = fake.serve(work)
    assert all("03.1 wrong: whole-array" in row for row in shown[:3])
    assert all("record unreadable: exercises.ex03_1.wrong_tries" in row for row in shown[3:6])
    assert all("03.1 correct" in row for row in shown[6:])
    assert said == [
        "board: ben's record is unreadable: exercises.ex03_1.wrong_tries: '3' is not of type 'integer'",
        "board: ben's record is readable again",
    ]


def test_an_unchanged_record_is_not_fetched_again_and_a_large_one_never(tmp_path):
    summary, said, fake = room_of(tmp_path, MALFORMED["a 20 MB message"][0], refreshes=4)
    assert ("ben", "content", 200) not in fake.answers  # only the file's model, which gives its size
    for name in ("ann", "ben", "cyd"):
        models = [status for who, what, status in fake.answers if who == name and what == "model"]
        assert models == [200, 304, 304, 304], (name, models)
    assert sorted(a for a in fake.answers if a[1] == "content") == [("ann", "content", 200), ("cyd", "content", 200)]
    assert len(said) == 1 and "20000" in said[0]


def test_a_learner_without_a_record_is_asked_once_then_their_folder_is_watched(tmp_path):
    fake = FakeRoom(homes(tmp_path, {"ann": text(GOOD), "ben": None}), ["ann", "ben"])

    async def work(room):
        for step in range(4):
            if step == 3:
                (tmp_path / "ben" / board.RECORD).write_text(text(GOOD))
            summary = await room.summary(max_age_s=0)
        return summary

    summary, said = fake.serve(work)
    asked = [(what, status) for who, what, status in fake.answers if who == "ben"]
    assert asked == [
        ("model", 404),
        ("listing", 200),
        ("listing", 304),
        ("listing", 200),
        ("model", 200),
        ("content", 200),
    ]
    assert "03.1 wrong: whole-array" in rows_by_name(board.render_room(summary))["ben"] and said == []


def test_thirty_learners_and_one_bad_record_refresh_measured(tmp_path):
    """Times the board's refresh (read, check, summarise, render) for 30 learners, one record malformed.

    The learners' servers are this file's small app (jupyter_server's file
    manager) in the same process, so the time includes their side too. Writes
    results/hub/board-refresh.json; a measurement, asserted only for what it shows.
    """
    import statistics
    import time

    from hubprocess import ROOT
    from test_board import generated_room

    learners = generated_room(30)
    records = {name: text(info["record"]) for name, info in learners.items()}
    bad = sorted(records)[7]
    records[bad] = MALFORMED["wrong_tries a string"][0]
    fake = FakeRoom(homes(tmp_path, records), sorted(records))

    async def work(room):
        times = {"first": [], "unchanged": []}
        for step in range(11):
            start = time.perf_counter()
            page = board.render_room(await room.summary(max_age_s=0))
            times["first" if step == 0 else "unchanged"].append(time.perf_counter() - start)
        return times, page

    (times, page), said = fake.serve(work)
    rows = rows_by_name(page)
    assert len(rows) == 30 and [n for n, row in rows.items() if "record unreadable" in row] == [bad]
    assert said == [f"board: {bad}'s record is unreadable: exercises.ex03_1.wrong_tries: '3' is not of type 'integer'"]
    figures = {
        "learners": 30,
        "bad_records": 1,
        "first_refresh_s": round(times["first"][0], 4),
        "unchanged_refresh_median_s": round(statistics.median(times["unchanged"]), 4),
        "unchanged_refreshes": len(times["unchanged"]),
        "fragment_bytes": len(page.encode()),
    }
    out = ROOT / "results" / "hub"
    out.mkdir(parents=True, exist_ok=True)
    (out / "board-refresh.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nboard refresh, 30 learners and one bad record: {figures}")


def test_a_board_action_whose_body_is_not_a_json_object_is_a_400_with_a_sentence(tmp_path, monkeypatch):
    from tornado import httpclient

    (tmp_path / "bob" / "workspace").mkdir(parents=True)
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://127.0.0.1:1/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "token")
    monkeypatch.setenv("BOARD_SERVERS_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("BOARD_WORKSPACES", str(tmp_path))
    app = board.make_app()
    action = next(
        r.target for r in app.wildcard_router.rules if r.matcher.regex.pattern.startswith("/services/board/action")
    )
    monkeypatch.setattr(action, "get_current_user", lambda self: {"name": "instructor", "kind": "user"})  # past OAuth
    monkeypatch.setattr(action, "check_xsrf_cookie", lambda self: None)

    async def post_each(bodies):
        server, port = listen(app)
        try:
            client, answers = httpclient.AsyncHTTPClient(), []
            for body in bodies:
                url = f"http://127.0.0.1:{port}/services/board/action"
                answer = await client.fetch(url, method="POST", body=body, raise_error=False)
                answers.append((answer.code, json.loads(answer.body)))
            return answers
        finally:
            server.stop()

    bodies = [b"[]", b'"catchup"', b"[" * 100_000 + b"]" * 100_000, b"{half", b'{"action": "rm", "lesson": "04"}']
    answers = in_thread(lambda: post_each(bodies))
    for code, said in answers[:4]:
        assert code == 400 and said["ok"] is False and said["output"].startswith("The action's body is not"), said
    assert answers[4] == (200, {"ok": False, "output": "the action is catchup or reset"})  # said on the page

    # A room-wide action's answer comes back whole: a line per workspace, 14 of them here (the command stubbed).
    import coursetools.room

    room_lines = [
        f"workspace {n:02d}: 05_shard_map.ipynb laid fresh, the learner's copy kept in old/" for n in range(14)
    ]
    stub = [sys.executable, "-c", f"print({chr(10).join(room_lines)!r})"]
    monkeypatch.setattr(coursetools.room, "action_command", lambda body, users, python: stub)
    ((code, said),) = in_thread(lambda: post_each([b'{"action": "reset", "lesson": "05", "room": true}']))
    assert code == 200 and said["ok"] and said["output"].splitlines() == room_lines


def test_after_a_hub_restart_a_stopped_servers_record_is_read_from_disk_and_only_the_learners_own(tmp_path):
    """`make hub`: the board has read nothing yet, every server is stopped, the records are in the homes."""
    import os

    users = tmp_path / "users"
    for name, content in (("ann", text(GOOD)), ("ben", text(GOOD)), ("cyd", text(GOOD))):
        (users / name / "workspace").mkdir(parents=True)
        (users / name / "workspace" / board.RECORD).write_text(content)
    (users / "ben" / "workspace" / board.RECORD).unlink()
    (users / "ben" / "workspace" / board.RECORD).symlink_to(users / "ann" / "workspace" / board.RECORD)
    if os.geteuid() == 0:  # cyd's home is another user's: a record owned by someone else is not theirs
        os.chown(users / "cyd", 4242, 4242)
    kept = tmp_path / "board-mistakes.json"
    fake = FakeRoom(users, ["ann", "ben", "cyd"], stopped={"ann", "ben", "cyd"}, disk=users, mistakes=kept)

    async def work(room):
        return [await room.summary(max_age_s=0) for _ in range(2)]

    (first, second), said = fake.serve(work)
    # ann corrects her mistake; the next restart's board still lists it (what the room got wrong), kept in a file.
    corrected = changed("exercises/ex03_1/verdict", "correct")
    corrected["exercises"]["ex03_1"]["mistake"] = ""
    for name in ("ann", "cyd"):
        (users / name / "workspace" / board.RECORD).write_text(text(corrected))
    (after, _), _ = fake.serve(work)
    assert [(m["mistake"], m["learners"]) for m in after["mistakes"]] == [("whole-array", 1)]
    assert "03.1 correct" in rows_by_name(board.render_room(after))["ann"]
    assert fake.answers == []  # no server asked
    rows = rows_by_name(board.render_room(second))
    assert "03.1 wrong: whole-array" in rows["ann"] and "stopped" in rows["ann"]
    assert "record unreadable: cannot be read from disk" in rows["ben"]  # a link is not followed
    if os.geteuid() == 0:
        assert "record unreadable: not a file of the learner&#x27;s own" in rows["cyd"]
    assert len(said) == (2 if os.geteuid() == 0 else 1)  # said once each, not at every refresh
