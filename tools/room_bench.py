"""Lesson 13 in N learners' servers at once on a real `make hub` room: how many runs pass (a benchmark, not a test).

    .venv/bin/python tools/room_bench.py --learners 3 --tries 5     (as root, as make hub; HUB_TEST_PORT, default 8970)

Starts the hub as the hub tests do (tests/hub/hubprocess.py: hub/launch.py on
127.0.0.1, the smoke profile; as root each learner a system user of their own),
signs each learner in as a learner does (the workshop password claims the name,
with a password of their own), starts their servers, and then, in every
learner's server at the same time, opens a notebook session on their workspace's
``13_elastic.ipynb`` and runs its code cells in order through the server's
kernel API with the learner's own token. Each try prints, per learner, "passed"
or the one sentence the lesson ended with (the error's name and message), the
wall time, and the 1-minute load average sampled during the run; the last line
counts the runs that passed. The learners' accounts, homes and passwords are
removed at the end (hub/end.py, as `make hub-end` does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "hub"))
import hubprocess  # noqa: E402
import requests  # noqa: E402
import websocket  # noqa: E402  (websocket-client, a dependency of jupyter_server)

LESSON = "13_elastic.ipynb"
READY_TIMEOUT_S = 600  # servers start one after another on few cores
RUN_TIMEOUT_S = 1200  # one lesson run, all cells
PORT = 8970  # the hub's first port unless HUB_TEST_PORT says otherwise: apart from make hub-test's 8900


@dataclass
class Learner:
    name: str
    token: str = ""
    url: str = ""


def seat(hub: hubprocess.Hub, name: str) -> Learner:
    """Sign ``name`` in (claiming the name with their own password), start their server, and make them a token."""
    session = hubprocess.login(hub, name)  # follows the hub's redirect, which starts the server
    headers = {"X-XSRFToken": hubprocess.xsrf(session)}
    answer = session.post(
        f"{hub.url}/hub/api/users/{name}/tokens", json={"note": "room benchmark"}, headers=headers, timeout=60
    )
    answer.raise_for_status()
    return Learner(name, answer.json()["token"], f"{hub.url}/user/{name}")


def wait_ready(hub: hubprocess.Hub, learners: list[Learner]) -> float:
    """Seconds until every learner's server is ready (their own token asks the hub)."""
    start = time.monotonic()
    waiting = list(learners)
    while waiting and time.monotonic() - start < READY_TIMEOUT_S:
        for learner in list(waiting):
            model = requests.get(f"{hub.url}/hub/api/users/{learner.name}", headers=auth(learner), timeout=30).json()
            server = (model.get("servers") or {}).get("", {})
            if server.get("ready"):
                waiting.remove(learner)
            elif not server.get("pending"):  # stopped or never started: ask again
                requests.post(f"{hub.url}/hub/api/users/{learner.name}/server", headers=auth(learner), timeout=60)
        time.sleep(2)
    if waiting:
        raise RuntimeError(f"servers not ready after {READY_TIMEOUT_S} s: {[w.name for w in waiting]}")
    return time.monotonic() - start


def auth(learner: Learner) -> dict[str, str]:
    return {"Authorization": f"token {learner.token}"}


def code_cells(learner: Learner) -> list[str]:
    """The code cells of the learner's own copy of the lesson (their workspace, through the contents API)."""
    answer = requests.get(f"{learner.url}/api/contents/{LESSON}", headers=auth(learner), timeout=60)
    answer.raise_for_status()
    cells = answer.json()["content"]["cells"]
    return [
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        for c in cells
        if c["cell_type"] == "code"
    ]


def execute(ws: websocket.WebSocket, session: str, code: str, deadline: float) -> tuple[dict, str]:
    """Run ``code`` in the kernel behind ``ws``; returns (execute_reply content, the text it printed)."""
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "username": "learner",
        "session": session,
        "msg_type": "execute_request",
        "version": "5.3",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}
    ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}))
    printed = []
    while True:
        ws.settimeout(max(1.0, deadline - time.time()))
        message = json.loads(ws.recv())
        kind = message["header"]["msg_type"]
        state = message["content"].get("execution_state") if kind == "status" else None
        if state in ("dead", "restarting"):  # the kernel ended (out of memory, killed): no reply will come
            return {"status": "error", "ename": "KernelDied", "evalue": f"the kernel is {state}"}, "".join(printed)
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if kind == "stream":
            printed.append(message["content"]["text"])
        elif kind == "execute_reply":
            return message["content"], "".join(printed)


def run_lesson(learner: Learner) -> dict:
    """The whole lesson in a new notebook session of the learner's server: passed, or how it ended."""
    start = time.monotonic()
    deadline = time.time() + RUN_TIMEOUT_S
    cells = code_cells(learner)
    model = {"path": LESSON, "name": LESSON, "type": "notebook", "kernel": {"name": "python3"}}
    answer = requests.post(f"{learner.url}/api/sessions", json=model, headers=auth(learner), timeout=120)
    answer.raise_for_status()
    session = answer.json()
    client = uuid.uuid4().hex  # this client's session, as a browser tab has one
    ws_url = (
        learner.url.replace("http", "ws", 1) + f"/api/kernels/{session['kernel']['id']}/channels?session_id={client}"
    )
    result = {"learner": learner.name, "passed": False, "ended": ""}
    try:
        ws = websocket.create_connection(ws_url, header=[f"Authorization: token {learner.token}"], timeout=120)
        try:
            for number, code in enumerate(cells, 1):
                reply, _ = execute(ws, client, code, deadline)
                if reply["status"] != "ok":
                    result["ended"] = f"code cell {number}: {reply.get('ename')}: {reply.get('evalue')}"
                    if reply.get("ename") not in ("RunEndedEarly", "RunRefused"):  # not one of the lesson's sentences
                        result["traceback"] = "\n".join(reply.get("traceback", []))[-3000:]
                    break
            else:
                result["passed"] = True
        finally:
            ws.close()
    except (websocket.WebSocketException, OSError) as error:
        result["ended"] = f"the kernel connection failed: {error!r}"
    finally:
        requests.delete(f"{learner.url}/api/sessions/{session['id']}", headers=auth(learner), timeout=120)
    result["wall_s"] = round(time.monotonic() - start, 1)
    return result


class LoadSampler(threading.Thread):
    """The 1-minute load average every 2 s, with the time of each sample."""

    def __init__(self):
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.wait(2.0):
            self.samples.append((time.monotonic(), os.getloadavg()[0]))

    def between(self, start: float, end: float) -> list[float]:
        return [load for t, load in self.samples if start <= t <= end] or [os.getloadavg()[0]]


def one_try(learners: list[Learner], sampler: LoadSampler) -> list[dict]:
    """Lesson 13 in every learner's server at the same time."""
    results: dict[str, dict] = {}
    barrier = threading.Barrier(len(learners))

    def go(learner: Learner):
        barrier.wait()
        start = time.monotonic()
        try:
            results[learner.name] = run_lesson(learner)
        except Exception as error:  # a hub or server problem: reported, the other learners go on
            results[learner.name] = {"learner": learner.name, "passed": False, "ended": f"{error!r}", "wall_s": None}
        loads = sampler.between(start, time.monotonic())
        results[learner.name]["load"] = {"mean": round(statistics.mean(loads), 1), "max": round(max(loads), 1)}

    threads = [threading.Thread(target=go, args=(learner,)) for learner in learners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [results[learner.name] for learner in learners]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=3, help="learners running the lesson at once (default 3)")
    parser.add_argument("--tries", type=int, default=5, help="times they all run it (default 5)")
    parser.add_argument(
        "--data-dir",
        help="a folder every learner may read with Fashion-MNIST (DPCOURSE_DATA_DIR); default: synthetic data",
    )
    args = parser.parse_args(argv)
    if args.learners < 1 or args.tries < 1:
        parser.error("--learners and --tries must be 1 or more")
    hubprocess.BASE_PORT = int(os.environ.get("HUB_TEST_PORT", PORT))
    first = hubprocess.BASE_PORT + 4
    hubprocess.SERVER_PORTS = f"{first}-{first + args.learners + 4}"
    data = {"DPCOURSE_DATA_DIR": args.data_dir} if args.data_dir else {"DPCOURSE_DATA": "synthetic"}
    hub = hubprocess.start_hub(Path(tempfile.mkdtemp()) / "hub", HUB_PROFILE="smoke", **data)
    print(f"hub at {hub.url} in {hub.started_s:.1f} s (log {hub.log})", flush=True)
    sampler = LoadSampler()
    sampler.start()
    passed = runs = 0
    try:
        learners = [seat(hub, f"room{n:02d}") for n in range(args.learners)]
        print(f"{len(learners)} servers ready in {wait_ready(hub, learners):.1f} s", flush=True)
        for attempt in range(1, args.tries + 1):
            for result in one_try(learners, sampler):
                runs += 1
                passed += result["passed"]
                outcome = "passed" if result["passed"] else result["ended"]
                load = result["load"]
                print(
                    f"try {attempt} {result['learner']}: {outcome} | {result['wall_s']} s | "
                    f"load {load['mean']} mean, {load['max']} max",
                    flush=True,
                )
                if "traceback" in result:
                    print(result["traceback"], flush=True)
    finally:
        sampler.stopping.set()
        hub.stop()  # as root, the learners' accounts, homes and scratch files go too (hub/end.py)
        print("\n".join(hub.ended), flush=True)
    print(
        f"{passed} of {runs} runs passed (learners at once: {args.learners}, tries: {args.tries}, "
        f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"
    )
    return 0 if passed == runs else 1


if __name__ == "__main__":
    sys.exit(main())
