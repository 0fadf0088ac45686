"""A workshop on one machine (make hub), tried as a room tries it: two learners at once in Chromium, an idle one, the instructor.

One real JupyterHub from hub/launch.py on 127.0.0.1 (ports HUB_TEST_PORT to +11, 8900-8911 by default), the
smoke profile, a 60 s idle timeout. Learners alice and bob sign in with the
workshop password, each choosing a password of their own, in their own browser contexts; a second
browser typing alice's name (or ``Alice``) and the workshop password is refused. They get their own servers and
workspaces, and run lesson 02 at the same time; neither can open the other's
server or files (403) and an edit of one does not reach the other; the change-password page refuses the
workshop password as alice's own, and a second browser with it still cannot sign in as her. Run as
root, each is a system user of their own: alice's kernel can read none of
the hub's files, nothing of bob's (nor write there), and no environment of a
process that is not hers, and no process of the hub holds a password in its
environment. The reset command the room card prints works in alice's
terminal. carol starts a server and leaves it idle until the culler stops
it; the instructor has the admin page and learners do not, and deleting a learner there lets them claim
their name again with a new password (a forgotten one); SIGINT stops
everything, leaving no process and no port. Timings go to
results/hub/timings.json.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import time
from pathlib import Path

import pytest
import requests
from hubprocess import (
    ADMIN_PASSWORD,
    AS_ROOT,
    PASSWORD,
    ROOT,
    descendants,
    hub_api,
    login,
    own_password,
    start_hub,
    xsrf,
)
from labpage import kernel_execute, notebook_text, run_all_from_menu, wait_for_kernel, wait_for_lab, wait_until_run

LESSON = "02_baseline.ipynb"
KEY_OUTPUT = "loss before training:"
# Longer than a server's start on a loaded machine (the culler counts from the spawn request).
CULL_TIMEOUT_S = 60
LESSON_TIMEOUT_S = 240


def sign_in(page, hub, user: str, password: str, workshop: str = "") -> None:
    """The hub's login form, typed in: the name, a password, and the workshop password (a new name's second field)."""
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.fill("input[name=otp]", workshop)
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
        sign_in(pages[user], hub, user, own_password(user), PASSWORD)  # claims the name

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
    out = kernel_execute(alice, LESSON, "import os; open('alice-was-here.txt', 'w').write('x'); print(os.getcwd())")
    assert out.strip() == str(hub.folder / "users" / "alice" / "workspace")
    assert alice.request.get(f"{hub.url}/user/alice/api/contents/alice-was-here.txt").status == 200
    assert bob.request.get(f"{hub.url}/user/bob/api/contents/alice-was-here.txt").status == 404
    out = kernel_execute(bob, LESSON, "import os; print(os.path.exists('alice-was-here.txt'), os.getcwd())")
    assert out.split() == ["False", str(hub.folder / "users" / "bob" / "workspace")]
    if AS_ROOT:
        learners_kept_apart(hub, alice)
    card_command_in_terminal(hub, alice)
    # The change-password page holds the sign-in's rules: the workshop password is never alice's own.
    alice.goto(f"{hub.url}/hub/auth/change-password")
    alice.fill("input[name=password]", PASSWORD)
    alice.click("#login_submit")
    assert "not the workshop password" in alice.inner_text(".alert-danger")

    # Neither can open the other's server or files.
    for me, other in (("alice", "bob"), ("bob", "alice")):
        page = pages[me]
        assert page.request.get(f"{hub.url}/user/{other}/api/contents/{LESSON}").status == 403
        assert page.goto(f"{hub.url}/user/{other}/lab").status == 403
        page.goto(f"{hub.url}/user/{me}/lab/tree/{LESSON}")  # back to work (keeps the server active)

    # A second browser with alice's name (and its upper case) and the workshop password is refused, said why.
    refused_from = time.monotonic()
    intruder = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    for name in ("alice", "Alice"):
        sign_in(intruder, hub, name, PASSWORD, PASSWORD)
        assert "/hub/login" in intruder.url and "The name 'alice' is taken" in intruder.inner_text("body")
    intruder.goto(f"{hub.url}/user/alice/lab")
    assert "/hub/login" in intruder.url, "a refused sign-in reached alice's server"
    intruder.context.close()
    hub.timings["two_refused_sign_ins_s"] = round(time.monotonic() - refused_from, 1)

    # The instructor has the admin view; a learner does not.
    instructor = login(hub, "instructor", ADMIN_PASSWORD)
    assert instructor.get(f"{hub.url}/hub/admin", timeout=30).status_code == 200
    assert alice.request.get(f"{hub.url}/hub/admin").status == 403
    # A forgotten password: the instructor deletes the user (the admin page's "Delete user" calls this), which
    # forgets the password; the learner claims the name again with a new one, and the old one opens nothing.
    assert hub_api(login(hub, "dora", follow=False), hub, "/user").json()["name"] == "dora"
    gone = instructor.delete(f"{hub.url}/hub/api/users/dora", headers={"X-XSRFToken": xsrf(instructor)}, timeout=30)
    assert gone.status_code == 204, gone.text
    assert hub_api(login(hub, "dora", "dora-new-password", follow=False), hub, "/user").json()["name"] == "dora"
    with pytest.raises(requests.HTTPError, match="403"):  # the hub answers a refused sign-in with 403
        login(hub, "dora", follow=False)

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


# Run in alice's kernel: everything of the hub's and of bob's it can read, write or list, and every
# environment under /proc it can read, with the owner of each process.
PROBE = """
import json, os, pathlib
hub_files, hub, bob = {hub_files!r}, pathlib.Path({hub!r}), pathlib.Path({bob!r})
found = {{"read": [], "listed": [], "wrote": [], "environ": {{}}, "me": os.getuid()}}
for path in [*hub_files, bob / "02_baseline.ipynb", bob / ".manifest.json"]:
    try:
        open(path, "rb").read(1)
        found["read"].append(str(path))
    except OSError:
        pass
for folder in (hub, bob.parent, bob):
    try:
        os.listdir(folder)
        found["listed"].append(str(folder))
    except OSError:
        pass
for path in (bob / "from-alice.txt", bob / "02_baseline.ipynb"):
    try:
        open(path, "a").close()
        found["wrote"].append(str(path))
    except OSError:
        pass
for proc in pathlib.Path("/proc").glob("[0-9]*"):
    try:
        text, uid = (proc / "environ").read_bytes().decode(errors="replace"), proc.stat().st_uid
    except OSError:
        continue
    pairs = dict(item.split("=", 1) for item in text.split("\\0") if "=" in item)
    found["environ"][proc.name] = {{"uid": uid, "env": pairs}}
print(json.dumps(found))
"""


def learners_kept_apart(hub, alice) -> None:
    """Alice's kernel, as her own system user, finds nothing of the hub's or bob's, and no one else's environment."""
    users = hub.folder / "users"
    hub_files = sorted(str(p) for p in hub.folder.iterdir() if p.is_file())
    assert {"jupyterhub.sqlite", "jupyterhub_cookie_secret", "password", "admin-password"} <= {
        Path(p).name for p in hub_files
    }
    probe = PROBE.format(hub_files=hub_files, hub=str(hub.folder), bob=str(users / "bob" / "workspace"))
    found = json.loads(kernel_execute(alice, LESSON, probe))
    assert found["me"] == (users / "alice").stat().st_uid != 0
    assert found["read"] == [] and found["listed"] == [] and found["wrote"] == [], found
    assert not (users / "bob" / "workspace" / "from-alice.txt").exists()
    environ = found["environ"]
    assert environ, "the kernel could not even read its own environment: the probe would find nothing anyway"
    assert {e["uid"] for e in environ.values()} == {found["me"]}, "alice read the environment of another user"
    secrets = {PASSWORD, ADMIN_PASSWORD, (hub.folder / "jupyterhub_cookie_secret").read_text().strip()}
    tokens = {e["env"].get("JUPYTERHUB_API_TOKEN") for e in environ.values()} - {None}
    assert len(tokens) == 1, "alice's processes hold more than her own server's token"
    for pid, entry in environ.items():
        assert "CONFIGPROXY_AUTH_TOKEN" not in entry["env"], pid
        assert not any(secret in value for secret in secrets for value in entry["env"].values()), pid
    # No process of the hub's holds a password in its environment (hub/launch.py keeps them in files).
    for pid in [hub.process.pid, *descendants(hub.process.pid)]:
        try:
            text = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert PASSWORD not in text and ADMIN_PASSWORD not in text, f"a password in the environment of {pid}"


def card_command_in_terminal(hub, page) -> None:
    """The fresh-copy command the room card prints, typed in a terminal of the learner's lab, does what it says."""
    spec = importlib.util.spec_from_file_location("card", ROOT / "hub" / "card.py")
    card = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(card)
    printed = card.render({"address": "https://room.example.org/", "password": "x" * 12, "admin": "instructor"})
    command = html.unescape(re.search(r"<code>(python -m coursetools workspace reset [^<]*)</code>", printed)[1])
    lesson_number = command.split("reset ")[1][:2]
    workspace = hub.folder / "users" / "alice" / "workspace"
    mine = next(workspace.glob(f"{lesson_number}_*.ipynb"))
    note = "a note alice wrote"
    edit = f'import pathlib; p = pathlib.Path({str(mine)!r}); p.write_text(p.read_text().replace(\'"source": [\', \'"source": ["# {note}\\\\n", \', 1))'
    kernel_execute(page, LESSON, edit)
    assert note in mine.read_text()
    said = page.evaluate(TERMINAL_RUN, [command, 120_000])
    assert re.search(r"CARD-DONE=0", said), f"{command!r} in alice's terminal: {said[-1500:]}"
    kept = list((workspace / "old").glob(f"*/{mine.name}"))
    assert len(kept) == 1 and note in kept[0].read_text() and note not in mine.read_text()
    if AS_ROOT:
        assert os.stat(mine).st_uid == os.stat(workspace).st_uid != 0  # alice's, not root's


# A new terminal in the lab (the same shell a learner gets), the command typed into it, its output back.
TERMINAL_RUN = """async ([command, timeoutMs]) => {
  const widget = await window.jupyterapp.commands.execute('terminal:create-new');
  const session = widget.content.session;
  const start = Date.now();
  while (session.connectionStatus !== 'connected') {
    if (Date.now() - start > timeoutMs) return 'the terminal never connected: ' + session.connectionStatus;
    await new Promise((r) => setTimeout(r, 100));
  }
  let out = '';
  const done = new Promise((resolve) => {
    session.messageReceived.connect((_, msg) => {
      if (msg.type === 'stdout') { out += msg.content[0]; if (/CARD-DONE=\\d+/.test(out)) resolve(); }
    });
  });
  session.send({type: 'stdin', content: [command + '; echo CARD-DONE=$?\\r']});
  await Promise.race([done, new Promise((r) => setTimeout(r, timeoutMs))]);
  widget.dispose();
  return out;
}"""
