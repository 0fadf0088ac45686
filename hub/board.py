"""The instructor's live board: a JupyterHub service showing each learner's lesson, exercises and mistakes.

Run by the hub as a managed service (hub/jupyterhub_config.py on `make hub`;
deploy/hub/config.yaml on GKE), at ``/services/board/``. Only a user with
the scope ``access:services!service=board`` (the role ``board-viewer``, the
instructor's) gets past the hub's OAuth; anyone else gets 403.

What it reads: each learner's own ``progress.json`` (written by the course's
checkers, see dpcourse/exercises/progress.py), fetched through the hub's proxy from
the learner's running server's contents API with the service's own token
(scope ``access:servers``), so it works the same whether the workspaces are
folders on this machine (`make hub`) or disks on a cluster (GKE). A stopped
server's record is shown as last read; on `make hub` it is read from the learner's folder
when the board has not read it yet (after a hub restart). A learner without a record is asked once;
then their folder's listing (unchanged: 304) says when one appears, so their server logs no 404 at
each refresh. Only jupyterhub, tornado, jsonschema (which
jupyterhub requires) and the standard library are imported: on GKE this runs in the hub's image.

Learners may edit their record: each is checked against :data:`RECORD_SCHEMA` (the
course's exercise ids alone) first, and one that fails is that learner's row, "record
unreadable: why", said once in the log; the other rows keep updating (:meth:`Room.read_record`).

Settings (environment; the hub sets the JUPYTERHUB_* ones):

- ``BOARD_SERVERS_URL``: the proxy's address from here (``http://127.0.0.1:8000`` on `make hub`, ``http://proxy-public`` on GKE)
- ``BOARD_REFRESH_S``: seconds between the page's refreshes (default 2)
- ``BOARD_WORKSPACES``: the folder of the learners' homes (``.hub/users`` on `make hub`):
  the board then offers catch-up and a fresh copy of a lesson (coursetools' workspace
  command, run here); unset on GKE, where the guide's kubectl commands do it
- ``BOARD_MISTAKES``: a file where the most common mistakes are kept across a restart of the hub
  (``.hub/board-mistakes.json`` on `make hub`); unset, they are kept while the board runs
- ``BOARD_VERIFY_TLS``: ``0`` accepts the proxy's certificate for another name (`make hub` with HUB_SSL_CERT)
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import os
import re
import stat
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from urllib.parse import quote, urlparse

# The scopes of the board's own token (role "board") and the one its viewers need (role "board-viewer");
# hub/jupyterhub_config.py uses these, and tests/hub checks deploy/hub/config.yaml against them.
SERVICE_SCOPES = ["list:users", "read:users", "read:users:activity", "read:servers", "access:servers"]
VIEWER_SCOPES = ["access:services!service=board"]
STUCK_TRIES = 3  # wrong tries without a correct one: "stuck" (dpcourse.exercises.progress.STUCK_TRIES)
RECORD = "progress.json"
TOP_MISTAKES = 8
MAX_ANSWER = 64 * 1024  # characters of an action's answer shown (a room of 30 says about 6 KB)

# The learner's record and its checks (hub/records.py, mounted beside this file on GKE).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import (  # noqa: E402
    EXERCISES,
    MAX_REASON,
    MAX_RECORD_BYTES,
    RECORD_SCHEMA,
    RETRY_S,
    VERDICTS,
    RecordError,
    parse_record,
)

__all__ = ["EXERCISES", "RECORD_SCHEMA", "VERDICTS", "RecordError", "parse_record"]


# ---- the room, from the records (pure: tested without a hub) ----------------------


def exercise_state(entry: dict | None) -> str:
    """One of correct, stuck, wrong, bad, none for a learner's entry of one exercise."""
    if not entry or entry.get("verdict") in (None, "not attempted yet", "cannot check here"):
        return "none"
    if entry["verdict"] == "correct":
        return "correct"
    if entry.get("wrong_tries", 0) >= STUCK_TRIES:
        return "stuck"
    return "bad" if entry["verdict"] == "bad input" else "wrong"


def current_lesson(record: dict) -> str:
    """The lesson last started or last checked (``"03_mesh"`` or ``"03"``); ``""`` for an empty record."""
    times = [(v.get("last_start") or v.get("started") or 0, name) for name, v in record.get("lessons", {}).items()]
    checked = [(v.get("last") or 0, v.get("lesson", "")) for v in record.get("exercises", {}).values()]
    latest = max([*times, *checked], default=(0, ""))
    if latest in checked:  # a check after the last start: name the lesson by its full name where known
        return next((name for name in record.get("lessons", {}) if name[:2] == latest[1]), latest[1])
    return latest[1]


def summarise(learners: dict[str, dict], now: float, seen: dict | None = None) -> dict:
    """The board's content from ``{name: {"record": dict|None, "server": str, "activity": float|None, "problem": str}}``.

    Returns a dict: ``exercises`` (ids in course order), ``rows`` (one per
    learner, sorted by name), ``counts`` (per exercise: correct, stuck, not
    attempted), ``mistakes`` (the most common named mistakes, with how many
    learners made each and one message). A learner with a ``problem`` (an
    unreadable record, see :func:`parse_record`) has a row that says it and
    counts in none of the totals. ``seen`` (kept by the caller between reads) remembers
    each named mistake and who made it, so a mistake corrected since stays on the list.
    """
    exercises: set[str] = set()
    for info in learners.values():
        if info.get("problem"):
            continue
        record = info.get("record") or {}
        for lesson in record.get("lessons", {}).values():
            exercises.update(lesson.get("exercises") or [])
        exercises.update(record.get("exercises", {}))
    order = sorted(exercises)
    rows, counts = [], {e: Counter() for e in order}
    seen = {} if seen is None else seen  # (exercise, mistake) -> {"who": names, "message": one message}
    for name in sorted(learners):
        info = learners[name]
        if info.get("problem"):  # its row says why; the activity is the hub's alone
            ago_s = None if info.get("activity") is None else max(0.0, now - info["activity"])
            rows.append({"name": name, "server": info.get("server", ""), "activity_ago_s": ago_s, **info})
            continue
        record = info.get("record") or {}
        entries = record.get("exercises", {})
        states = {e: exercise_state(entries.get(e)) for e in order}
        for e, state in states.items():
            counts[e]["correct" if state == "correct" else "stuck" if state == "stuck" else state] += 1
            entry = entries.get(e) or {}
            if entry.get("mistake") and state != "correct":
                known = seen.setdefault((e, entry["mistake"]), {"who": set(), "message": entry.get("message", "")})
                known["who"].add(name)
        last = max(entries.items(), key=lambda kv: kv[1].get("last") or 0, default=(None, {}))
        activity = max(filter(None, [record.get("updated"), info.get("activity")]), default=None)
        rows.append(
            {
                "name": name,
                "lesson": current_lesson(record),
                "server": info.get("server", ""),
                "activity_ago_s": None if activity is None else max(0.0, now - activity),
                "last": {"exercise": last[0], **{k: last[1].get(k) for k in ("verdict", "mistake", "message")}},
                "states": states,
                "entries": {e: entries.get(e) or {} for e in order},
            }
        )
    mistakes = sorted(seen.items(), key=lambda kv: (-len(kv[1]["who"]), kv[0]))[:TOP_MISTAKES]
    return {
        "exercises": order,
        "rows": rows,
        "counts": {
            e: {"correct": c["correct"], "stuck": c["stuck"], "not attempted": c["none"]} for e, c in counts.items()
        },
        "mistakes": [
            {"exercise": e, "mistake": m, "learners": len(it["who"]), "message": it["message"]}
            for (e, m), it in mistakes
        ],
    }


def ago(seconds: float | None) -> str:
    """``"12 s"``, ``"4 min"``, ``"2 h"``; ``"-"`` for never."""
    if seconds is None or seconds < 60:
        return "-" if seconds is None else f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:.0f} h"


SYMBOL = {"correct": "✓", "wrong": "✗", "stuck": "!", "bad": "?", "none": "·"}


def shown_name(name: str) -> str:
    """The learner's name as HTML, with its code points after it when it is not plain ASCII: look-alikes told apart."""
    if name.isascii() and name.isprintable():
        return html.escape(name)
    points = name.encode("ascii", "backslashreplace").decode()
    return f'{html.escape(name)} <small class="cp" title="the name\'s characters">{html.escape(points)}</small>'


def label(exercise: str) -> str:
    return exercise[2:].replace("_", ".") if exercise.startswith("ex") else exercise  # "ex03_1" -> "03.1"


def render_room(summary: dict) -> str:
    """The board's live part (a table and the mistakes), as an HTML fragment; every value escaped."""
    e = html.escape
    order = summary["exercises"]
    lessons = Counter(x[2:4] for x in order)
    head1 = "".join(f'<th colspan="{n}" class="lesson">{e(lesson)}</th>' for lesson, n in sorted(lessons.items()))
    head2 = "".join(f'<th class="ex">{e(label(x).split(".")[1])}</th>' for x in order)
    body = []
    for row in summary["rows"]:
        active = f"{e(ago(row['activity_ago_s']))}" + (
            "" if row["server"] == "running" else " <i>" + e(row["server"] or "no server") + "</i>"
        )
        if row.get("problem"):
            body.append(
                f'<tr data-learner="{e(row["name"])}" class="unreadable"><td class="who">{shown_name(row["name"])}</td>'
                f'<td class="lsn"></td><td class="act">{active}</td><td class="problem" colspan="{len(order) + 1}">'
                f"record unreadable: {e(row['problem'][:MAX_REASON])}</td></tr>"
            )
            continue
        cells = []
        for x in order:
            state, entry = row["states"][x], row["entries"][x]
            tip = f"{label(x)}: {entry.get('verdict', 'not attempted')}"
            if entry.get("attempts"):
                tip += f", {entry['attempts']} tries"
            if entry.get("mistake") and state != "correct":
                tip += f" - {entry['mistake']}: {entry.get('message', '')}"
            cells.append(f'<td class="s {state}" title="{e(tip)}">{SYMBOL[state]}</td>')
        last = row["last"]
        said = ""
        if last["exercise"]:
            said = f"{label(last['exercise'])} {last['verdict']}"
            if last.get("mistake") and last["verdict"] != "correct":
                said += f": {last['mistake']}"
        body.append(
            f'<tr data-learner="{e(row["name"])}"><td class="who">{shown_name(row["name"])}</td>'
            f'<td class="lsn">{e(row["lesson"][:14])}</td><td class="act">{active}</td>'
            f'<td class="lastck" title="{e(last.get("message") or "")}">{e(said)}</td>{"".join(cells)}</tr>'
        )
    foot = []
    for what, css in (("correct", "correct"), ("stuck", "stuck"), ("not attempted", "none")):
        numbers = "".join(f'<td class="n {css}">{summary["counts"][x][what]}</td>' for x in order)
        foot.append(f'<tr class="count"><td colspan="4" class="what">{what}</td>{numbers}</tr>')
    mistakes = "".join(
        f"<li><b>{e(label(m['exercise']))} {e(m['mistake'])}</b> · {m['learners']} "
        f"learner{'s' if m['learners'] != 1 else ''}<br><span>{e(m['message'][:140])}</span></li>"
        for m in summary["mistakes"]
    )
    return (
        f'<div class="room"><table><thead><tr><th rowspan="2">learner</th><th rowspan="2">lesson</th>'
        f'<th rowspan="2">active</th><th rowspan="2">last check</th>{head1}</tr><tr>{head2}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody><tfoot>{''.join(foot)}</tfoot></table>"
        f'<aside><h2>Most common mistakes</h2><ol id="mistakes">{mistakes or "<li>none yet</li>"}</ol></aside></div>'
    )


STYLE = """
body{font:12px/1.3 system-ui,sans-serif;margin:6px 10px;color:#222}
h1{font-size:15px;margin:0 0 4px}h2{font-size:13px;margin:0 0 4px}
.room{display:flex;gap:12px;align-items:flex-start}
table{border-collapse:collapse}th,td{padding:1px 4px;border-bottom:1px solid #eee;white-space:nowrap}
th{font-weight:600;text-align:left;background:#fafafa}th.lesson{text-align:center;border-left:2px solid #ddd}
th.ex,td.s,td.n{text-align:center;width:16px;padding:1px 2px}
td.who{max-width:110px;overflow:hidden;text-overflow:ellipsis}td.who .cp{display:block;white-space:normal;word-break:break-all}
td.lastck{max-width:190px;overflow:hidden;text-overflow:ellipsis}
td.lsn{max-width:90px;overflow:hidden}td.act i{color:#888}
.correct{color:#1b7a2f}.s.correct{background:#e7f5e9}.wrong{color:#a31515}.s.wrong{background:#fdecea}
.stuck{color:#fff}.s.stuck{background:#a31515;font-weight:700}.n.stuck{color:#a31515}
.bad{color:#8a5300}.s.bad{background:#fff4e0}.none{color:#999}
td.problem{color:#8a5300;background:#fff4e0;max-width:400px;overflow:hidden;text-overflow:ellipsis}
tr.count td{border-top:1px solid #ccc;font-size:11px}td.what{text-align:right;color:#555}
aside{width:250px;flex:none}aside ol{margin:0;padding-left:18px}aside li{margin-bottom:4px}
#act{margin:0 0 4px;font-size:11px}#act input,#act button{font-size:11px}#done{color:#1b5e20;margin:2px 0;max-height:9em;overflow:auto;white-space:pre-wrap}
small.cp{color:#8a5300;font-family:monospace}td.who{cursor:pointer}
aside span{color:#555;font-size:11px}#status{color:#888;font-size:11px}.legend{margin:0 0 4px;font-size:11px}
"""


ACTIONS_FORM = """<form id="act" onsubmit="return act(event)">Learner <input name="learner" size="14"
placeholder="name (click a row)"> <label><input type="checkbox" name="room"> every learner</label>
lesson <input name="lesson" size="4" placeholder="04">
<button name="action" value="catchup">Catch up (solutions filled in)</button>
<button name="action" value="reset">Fresh copy</button>
<small>the learner's copy is kept in old/</small><pre id="done"></pre></form>"""


def render_page(prefix: str, refresh_s: float, xsrf: str = "", actions: bool = False) -> str:
    """The board's page: a header and the live part, fetched again every ``refresh_s`` seconds.

    ``xsrf``: the page's XSRF token, sent with each refresh (the hub's OAuth
    accepts its cookie on a script's request only with it). ``actions``: show
    the catch-up and fresh-copy form (where the board can reach the workspaces).
    """
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Room board</title>
<style>{STYLE}</style></head><body>
<h1>Room board <span id="status">loading</span></h1>
<p class="legend"><span class="correct">✓ correct</span> · <span class="wrong">✗ wrong</span> ·
<b class="wrong">!</b> stuck ({STUCK_TRIES}+ wrong tries) · <span class="bad">? cannot check the answer</span> ·
<span class="none">· not attempted</span> · hover a cell for the mistake</p>{ACTIONS_FORM if actions else ""}
<div id="board"></div>
<script>
const url = {json.dumps(prefix + "room")};
const xsrf = {json.dumps(xsrf)};
async function act(event) {{
  event.preventDefault();
  const form = event.target, done = document.getElementById("done");
  const body = {{learner: form.learner.value, lesson: form.lesson.value.trim(),
                 room: form.room.checked, action: event.submitter.value}};
  done.textContent = "working...";
  const answer = await fetch({json.dumps(prefix + "action")}, {{method: "POST", credentials: "same-origin",
    redirect: "error", headers: {{"X-XSRFToken": xsrf, "Content-Type": "application/json"}},
    body: JSON.stringify(body)}});
  const said = answer.ok ? await answer.json() : {{ok: false, output: "HTTP " + answer.status}};
  done.textContent = (said.ok ? "done: " : "refused: ") + said.output;
  return false;
}}
document.addEventListener("click", (event) => {{  // a row's name fills the form with its exact characters
  const row = event.target.closest("td.who") && event.target.closest("tr[data-learner]");
  const form = document.getElementById("act");
  if (row && form) {{ form.learner.value = row.dataset.learner; form.room.checked = false; }}
}});
async function refresh() {{
  try {{
    const answer = await fetch(url, {{credentials: "same-origin", cache: "no-store", redirect: "error",
                                      headers: {{"X-XSRFToken": xsrf}}}});
    if (!answer.ok) throw new Error(answer.status);
    document.getElementById("board").innerHTML = await answer.text();
    document.getElementById("status").textContent = "updated " + new Date().toLocaleTimeString();
  }} catch (err) {{
    document.getElementById("status").textContent = "could not refresh (" + err.message + "); retrying";
  }}
  setTimeout(refresh, {refresh_s * 1000:.0f});
}}
refresh();
</script></body></html>"""


# ---- reading the room through the hub ---------------------------------------------


class Room:
    """The learners as the hub lists them and their records, read with the service's token."""

    def __init__(
        self,
        api_url: str,
        token: str,
        servers_url: str,
        verify_tls: bool = True,
        say=print,
        homes: Path | None = None,
        mistakes: Path | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.servers_url = servers_url.rstrip("/")
        self.verify_tls = verify_tls
        self.say = say  # the board's log (the hub's terminal): one line per change of a record's readability
        self.records: dict[str, dict] = {}  # last record read per learner (kept while a server is stopped)
        self.problems: dict[str, str] = {}  # why a learner's record is unreadable, while it is
        self.etags: dict[str, str] = {}  # the ETag of each record's model when it was last read
        self.users, self.users_etag = [], ""  # the hub's last answer to GET /users, and its ETag
        self.absent: dict[str, str] = {}  # learners whose record was not there: their folder's listing's ETag
        self.retry_at: dict[str, float] = {}  # when to ask again for a record its server refused
        self.homes = homes  # `make hub`: the learners' homes, where a stopped server's record is read from disk
        self.on_disk: dict[str, tuple] = {}  # (mtime, size) of each record last read from disk
        self.mistakes = mistakes  # `make hub`: where `seen` is kept across a restart of the hub (and the board)
        self.seen: dict = load_mistakes(mistakes) if mistakes else {}  # every named mistake seen, and who made it
        self.client = None
        self.read_at = 0.0
        self.cached: dict | None = None
        self.lock = asyncio.Lock()

    async def _get(self, url: str, etag: str = ""):
        """``(status, JSON body or None, the server's message on an error, ETag)``; ``etag`` given, unchanged is 304."""
        from tornado.httpclient import AsyncHTTPClient

        if self.client is None:  # made on the running loop; an answer over the limit is refused, not read
            self.client = AsyncHTTPClient(force_instance=True, max_body_size=16 * MAX_RECORD_BYTES)
        headers = {"Authorization": f"token {self.token}", **({"If-None-Match": etag} if etag else {})}
        try:
            answer = await self.client.fetch(
                url, headers=headers, request_timeout=10, validate_cert=self.verify_tls, raise_error=False
            )
        except OSError as err:  # refused, reset, a body too large
            return 0, None, str(err), ""
        if answer.code == 599 or answer.error and not answer.body:
            return (0 if answer.code == 599 else answer.code), None, str(answer.error), ""
        try:
            body = json.loads(answer.body) if answer.body else None
        except ValueError:
            return answer.code, None, "the answer was not JSON", ""
        said = str(body.get("message") or "") if isinstance(body, dict) and answer.code >= 400 else ""
        return answer.code, body, said, answer.headers.get("Etag", "")

    def note(self, name: str, problem: str) -> None:
        """Keep ``name``'s problem (``""``: none); the log hears of it when it changes, not at every refresh."""
        if problem == self.problems.get(name, ""):
            return
        if problem:
            self.problems[name] = problem
            self.records.pop(name, None)  # never shown as if it were still true
        else:
            del self.problems[name]
        self.say(f"board: {name}'s record is {f'unreadable: {problem}' if problem else 'readable again'}", flush=True)

    async def read_record(self, name: str, server_url: str) -> None:
        """Read ``name``'s record when it changed (else a 304, logged at debug) and is at most MAX_RECORD_BYTES.

        One the server refuses (4xx, logged as a warning) is asked for again after :data:`RETRY_S` s."""
        if time.monotonic() < self.retry_at.get(name, 0.0):
            return
        # JupyterHub escapes a name in its server's URL; quote() keeps those escapes and escapes what is left.
        folder = f"{self.servers_url}{quote(server_url.rstrip('/'), safe='/%:@~')}/api/contents/"
        if name in self.absent:  # no record last time: its folder's listing says when one appears (no 404 logged)
            code, listing, _, etag = await self._get(f"{folder}?content=1&type=directory", self.absent[name])
            if code == 304:
                return
            entries = listing.get("content") if code == 200 and isinstance(listing, dict) else None
            if not isinstance(entries, list):  # no listing now (a busy server's timeout): the record, in a while
                del self.absent[name]
                self.retry_at[name] = time.monotonic() + RETRY_S
                return
            if not any(isinstance(e, dict) and e.get("name") == RECORD for e in entries):
                self.absent[name] = etag
                return
            del self.absent[name]
        base = folder + RECORD
        code, model, said, etag = await self._get(f"{base}?content=0&type=file", self.etags.get(name, ""))
        if code == 304:
            return  # unchanged since the last read: the same record, or the same problem
        self.etags.pop(name, None)
        if code == 404:  # the learner deleted it, or has not checked anything yet: watch the folder instead
            self.records.pop(name, None)
            self.absent[name] = ""
            self.note(name, "")
            return
        if code != 200 or not isinstance(model, dict):
            self._refused(name, code, said)
            return
        size = model.get("size")
        if isinstance(size, int) and size > MAX_RECORD_BYTES:
            self.etags[name] = etag
            self.note(name, f"{size} bytes, more than the {MAX_RECORD_BYTES} a record may have")
            return
        code, model, said, _ = await self._get(f"{base}?content=1&format=text&type=file")
        if code != 200 or not isinstance(model, dict) or not isinstance(model.get("content"), str):
            self._refused(name, code, said)
            return
        self.etags[name] = etag
        try:
            self.records[name] = parse_record(model["content"])
        except RecordError as err:
            self.note(name, str(err))
            return
        self.note(name, "")

    def read_from_disk(self, name: str) -> None:
        """A stopped server's record from ``homes/NAME/workspace`` (after a hub restart), when it changed.

        The board runs as root on `make hub`: the file is read only when it is a
        regular file (no link followed at its name) owned by the learner's home's owner."""
        if "/" in name or name in (".", "..") or name in self.problems:
            return
        path = self.homes / name / "workspace" / RECORD
        try:
            handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return
        except OSError as err:
            self.note(name, f"cannot be read from disk ({err.strerror})")
            return
        with os.fdopen(handle, "rb") as file:
            facts = os.fstat(file.fileno())
            if self.on_disk.get(name) == (facts.st_mtime_ns, facts.st_size) and name in self.records:
                return
            self.on_disk[name] = (facts.st_mtime_ns, facts.st_size)
            if not stat.S_ISREG(facts.st_mode) or facts.st_uid != os.stat(self.homes / name).st_uid:
                self.note(name, "not a file of the learner's own")
                return
            text = file.read(MAX_RECORD_BYTES + 1)
        try:
            self.records[name] = parse_record(text)
        except RecordError as err:
            self.note(name, str(err))
            return
        self.note(name, "")

    def _refused(self, name: str, code: int, said: str) -> None:
        """Note that ``name``'s server gave no record, and why; a refusal (4xx) is not asked again for a while."""
        if 400 <= code < 500:
            self.retry_at[name] = time.monotonic() + RETRY_S
        said = re.sub(r"/(?:[^\s/()]+/)+", "", said)  # the server's folders: the file's name says enough
        said = said if len(said) <= 80 else "..." + said[-77:]
        what = {0: "did not answer", 400: "cannot read it as text", 403: "may not read it"}.get(
            code, f"answered {code}"
        )
        self.note(name, f"their server {what} ({said or f'HTTP {code}'})")

    async def learners(self) -> dict[str, dict]:
        """``{name: {"record", "server", "activity", "problem"}}`` for every user but admins; running servers read now."""
        code, users, _, etag = await self._get(f"{self.api_url}/users", self.users_etag)
        if code == 304:
            users, etag = self.users, self.users_etag
        elif code != 200 or not isinstance(users, list):
            raise RuntimeError(f"the hub's API answered {code} to GET /users: check the board role's scopes")
        self.users, self.users_etag = users, etag or ""
        found = {}

        async def one(user: dict) -> None:
            name = user["name"]
            server = (user.get("servers") or {}).get("", {})
            state = "running" if server.get("ready") else ("starting" if server.get("pending") else "stopped")
            if state == "running":
                await self.read_record(name, server["url"])
            elif self.homes is not None:
                self.read_from_disk(name)
            found[name] = {
                "record": self.records.get(name),
                "server": state,
                "activity": iso_seconds(user.get("last_activity")),
                "problem": self.problems.get(name, ""),
            }

        await asyncio.gather(*(one(u) for u in users if not u.get("admin") and u.get("kind", "user") == "user"))
        return found

    async def summary(self, max_age_s: float = 1.0) -> dict:
        """The room's summary, read again when older than ``max_age_s`` (several open boards share one read)."""
        async with self.lock:
            if self.cached is None or time.monotonic() - self.read_at > max_age_s:
                self.cached = summarise(await self.learners(), time.time(), self.seen)
                self.read_at = time.monotonic()
                if self.mistakes:
                    keep_mistakes(self.mistakes, self.seen)
            return self.cached


def load_mistakes(path: Path) -> dict:
    """The mistakes a board before this one kept in ``path`` (:func:`keep_mistakes`); none when it holds none it can use."""
    try:
        kept = json.loads(path.read_text())
        return {(e, m): {"who": set(who), "message": message} for e, m, who, message in kept}
    except (OSError, ValueError, TypeError):
        return {}


def keep_mistakes(path: Path, seen: dict) -> None:
    """Write ``seen`` to ``path`` (0600, replaced whole) when it differs from what is there."""
    text = json.dumps([[e, m, sorted(it["who"]), it["message"]] for (e, m), it in sorted(seen.items())])
    if path.is_file() and path.read_text() == text:
        return
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    os.chmod(partial, 0o600)
    os.replace(partial, path)


def iso_seconds(stamp: str | None) -> float | None:
    """The hub's ISO 8601 times (``2026-12-03T11:50:00.123456Z``) as seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None


def make_app():
    """The tornado application behind /services/board/ (the hub's OAuth in front of every page)."""
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from tornado import web

    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/board/")
    room = Room(
        os.environ["JUPYTERHUB_API_URL"],
        os.environ["JUPYTERHUB_API_TOKEN"],
        os.environ["BOARD_SERVERS_URL"],
        os.environ.get("BOARD_VERIFY_TLS", "1") != "0",
        homes=Path(os.environ["BOARD_WORKSPACES"]) if os.environ.get("BOARD_WORKSPACES") else None,
        mistakes=Path(os.environ["BOARD_MISTAKES"]) if os.environ.get("BOARD_MISTAKES") else None,
    )
    refresh_s = float(os.environ.get("BOARD_REFRESH_S", "2"))

    class Page(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        def get(self):
            self.set_header("Cache-Control", "no-store")
            self.write(render_page(prefix, refresh_s, self.xsrf_token.decode(), users is not None))

    class Fragment(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        async def get(self):
            self.set_header("Cache-Control", "no-store")
            self.write(render_room(await room.summary()))

    users = Path(os.environ["BOARD_WORKSPACES"]) if os.environ.get("BOARD_WORKSPACES") else None

    class Action(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        async def post(self):
            self.set_header("Content-Type", "application/json")
            if users is None:
                raise web.HTTPError(404, "this board cannot reach the workspaces: use the commands in the guide")
            from coursetools.room import BadBody, action_command, read_action  # the course's tools: on `make hub` only

            try:
                command = action_command(read_action(self.request.body), users, sys.executable)
            except ValueError as err:  # a body that is not a JSON object: 400; a request the course refuses: said
                self.set_status(400 if isinstance(err, BadBody) else 200)
                self.write(json.dumps({"ok": False, "output": str(err)}))
                return
            process = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
            output, _ = await process.communicate()
            text = output.decode(errors="replace").strip()  # the whole answer: one line per workspace on --room
            self.write(json.dumps({"ok": process.returncode == 0, "output": text[-MAX_ANSWER:]}))

    class Data(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        async def get(self):
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(await room.summary()))

    return web.Application(
        [
            (prefix, Page),
            (prefix + "room", Fragment),
            (prefix + "room.json", Data),
            (prefix + "action", Action),
            (prefix + "oauth_callback", HubOAuthCallbackHandler),
            (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
        ],
        cookie_secret=os.urandom(32),
    )


def main() -> None:
    """Serve the board where the hub says (``JUPYTERHUB_SERVICE_URL``)."""
    from tornado.ioloop import IOLoop

    where = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    make_app().listen(where.port, os.environ.get("BOARD_BIND", where.hostname))
    print(f"board: serving {os.environ.get('JUPYTERHUB_SERVICE_PREFIX')} on {where.hostname}:{where.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # the hub stops its services with SIGINT: a clean exit
        IOLoop.current().start()


if __name__ == "__main__":
    main()
