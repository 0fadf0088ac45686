"""A workshop on one machine (make hub), tried as a room tries it: two learners at once in Chromium, an idle one, the instructor.

One real JupyterHub from hub/launch.py on 127.0.0.1 (ports HUB_TEST_PORT to +11, 8900-8911 by default), the
smoke profile, a 60 s idle timeout. Learners alice and bob sign in with the
workshop password in their own browser contexts, get their own servers and
workspaces, and run lesson 02 at the same time; neither can open the other's
server or files (403) and an edit of one does not reach the other; carol
starts a server and leaves it idle until the culler stops it; the instructor
has the admin page and learners do not; SIGINT stops everything, leaving no
process and no port. Timings go to results/hub/timings.json.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from hubprocess import ADMIN_PASSWORD, ROOT, hub_api, login, start_hub
from labpage import notebook_text, run_all_from_menu, wait_for_kernel, wait_for_lab, wait_until_run

LESSON = "02_baseline.ipynb"
KEY_OUTPUT = "loss before training:"
# Longer than a server's start on a loaded machine (the culler counts from the spawn request).
CULL_TIMEOUT_S = 60
LESSON_TIMEOUT_S = 240


def sign_in(page, hub, user: str, password: str) -> None:
    """The hub's login form, typed in."""
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("#login_submit")
    page.wait_for_load_state()


@pytest.fixture()
def room(tmp_path):
    hub = start_hub(
        tmp_path / "hub",
        HUB_PROFILE="smoke",
        HUB_CULL_TIMEOUT=str(CULL_TIMEOUT_S),
        HUB_CULL_EVERY="5",
        HUB_ACTIVITY_INTERVAL="5",
        HUB_SERVER_ARGS="--LabApp.expose_app_in_browser=True",
    )
    hub.timings["hub_start_s"] = round(hub.started_s, 1)
    try:
        yield hub
    finally:
        took, left, ports = hub.stop()
        hub.timings["stop_s"] = round(took, 1)
        out = ROOT / "results" / "hub"
        out.mkdir(parents=True, exist_ok=True)
        (out / "timings.json").write_text(json.dumps(hub.timings, indent=2) + "\n")
        print(f"\nhub test timings: {json.dumps(hub.timings)}")
        assert not left, f"processes left after the hub stopped: {left}\n{hub.log_text()[-2000:]}"
        assert not ports, f"ports still listening after the hub stopped: {ports}"


def test_two_learners_an_idle_one_and_the_instructor(room, browser):
    hub = room
    pages = {}
    for user in ("alice", "bob"):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(90_000)
        pages[user] = context.new_page()
        sign_in(pages[user], hub, user, "room-test-password")

    # Both servers start at once; each learner lands in the lab on lesson 02 of their own workspace.
    started = {}
    for user, page in pages.items():
        started[user] = time.monotonic()
        page.goto(f"{hub.url}/user/{user}/lab/tree/{LESSON}")
    carol = login(hub, "carol")
    carol.get(f"{hub.url}/hub/spawn/carol", timeout=60)  # starts her server; then she does nothing
    carol_spawned = time.monotonic()
    for user, page in pages.items():
        wait_for_lab(page, timeout_s=120)
        hub.timings[f"server_start_{user}_s"] = round(time.monotonic() - started[user], 1)
        assert f"/user/{user}/lab" in page.url
        wait_for_kernel(page, LESSON)

    # Lesson 02 in both at the same time.
    run_started = time.monotonic()
    for page in pages.values():
        run_all_from_menu(page)
    for user, page in pages.items():
        state = wait_until_run(page, LESSON, LESSON_TIMEOUT_S)
        hub.timings[f"lesson02_{user}_s"] = round(time.monotonic() - run_started, 1)
        assert not state["timed_out"], f"{user}: lesson 02 did not finish in {LESSON_TIMEOUT_S} s: {state}"
        assert state["errors"] == 0 and state["counted"] == state["total"], f"{user}: {state}"
        assert KEY_OUTPUT in notebook_text(page, LESSON)

    # Each workspace is the learner's own: alice's edit stays in hers.
    alice, bob = pages["alice"], pages["bob"]
    from labpage import kernel_execute

    out = kernel_execute(alice, LESSON, "import os; open('alice-was-here.txt', 'w').write('x'); print(os.getcwd())")
    assert out.strip() == str(hub.folder / "users" / "alice" / "workspace")
    assert alice.request.get(f"{hub.url}/user/alice/api/contents/alice-was-here.txt").status == 200
    assert bob.request.get(f"{hub.url}/user/bob/api/contents/alice-was-here.txt").status == 404
    out = kernel_execute(bob, LESSON, "import os; print(os.path.exists('alice-was-here.txt'), os.getcwd())")
    assert out.split() == ["False", str(hub.folder / "users" / "bob" / "workspace")]

    # Neither can open the other's server or files.
    for me, other in (("alice", "bob"), ("bob", "alice")):
        page = pages[me]
        assert page.request.get(f"{hub.url}/user/{other}/api/contents/{LESSON}").status == 403
        assert page.goto(f"{hub.url}/user/{other}/lab").status == 403
        page.goto(f"{hub.url}/user/{me}/lab/tree/{LESSON}")  # back to work (keeps the server active)

    # The instructor has the admin view; a learner does not.
    instructor = login(hub, "instructor", ADMIN_PASSWORD)
    assert instructor.get(f"{hub.url}/hub/admin", timeout=30).status_code == 200
    assert alice.request.get(f"{hub.url}/hub/admin").status == 403

    # The culler stops carol's idle server; the working learners keep theirs.
    deadline = time.monotonic() + CULL_TIMEOUT_S + 60
    while time.monotonic() < deadline:
        servers = hub_api(instructor, hub, "/users/carol").json().get("servers", {})
        if "" not in servers:
            break
        time.sleep(2)
    else:
        pytest.fail(f"carol's idle server was not culled within {CULL_TIMEOUT_S + 60} s:\n{hub.log_text()[-2000:]}")
    # From her spawn request: her server idles from the moment it is up.
    hub.timings["culled_after_idle_s"] = round(time.monotonic() - carol_spawned, 1)
    culled = re.search(r"Culling server carol \(inactive for (\d+):(\d+):(\d+)\)", hub.log_text())
    assert culled, "the culler's log line for carol is missing"
    h, m, s = (int(x) for x in culled.groups())
    hub.timings["culler_saw_carol_idle_for_s"] = h * 3600 + m * 60 + s
    for user in ("alice", "bob"):
        assert "" in hub_api(instructor, hub, f"/users/{user}").json()["servers"], f"{user}'s server was culled"
    for page in pages.values():
        page.context.close()
