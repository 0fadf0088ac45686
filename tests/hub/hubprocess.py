"""A real JupyterHub started the way `make hub` starts it (hub/launch.py), on 127.0.0.1, for the hub tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat as st_mode
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "hub" / "launch.py"
# Ports given to the hub tests: the hub at BASE_PORT (+1 proxy API, +2 hub, +3 board), learners' servers at
# +4 to +11, and +6 for test_launch's refusals. HUB_TEST_PORT moves them, so that two runs on one machine
# (two checkouts) do not meet.
BASE_PORT = int(os.environ.get("HUB_TEST_PORT", "8900"))
SERVER_PORTS = f"{BASE_PORT + 4}-{BASE_PORT + 11}"
AS_ROOT = os.geteuid() == 0
PASSWORD = "room-test-password"
ADMIN_PASSWORD = "instructor-test-password-0123456789"
# About 3 s on a quiet machine; importing JupyterHub alone took over 60 s on a
# machine shared by eight test runs.
START_TIMEOUT_S = 180


def listening(port: int) -> bool:
    """Whether anything accepts connections on 127.0.0.1:port."""
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


# Seconds the hub's children (proxy, servers) may take to end after the hub itself has exited.
STOP_GRACE_S = 10.0


def ports_in_use() -> list[int]:
    """The hub tests' ports that something listens on."""
    first, last = (int(p) for p in SERVER_PORTS.split("-"))
    return [
        p for p in (BASE_PORT, BASE_PORT + 1, BASE_PORT + 2, BASE_PORT + 3, *range(first, last + 1)) if listening(p)
    ]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def open_the_way(paths: list[Path]) -> list[Path]:
    """As root: let the learners' users enter the folders above the course and its Python (o+x), as `make hub` asks.

    hub/launch.py refuses to start, naming them, when learners cannot reach
    the course; on a test machine the course often lies under /root (0700).
    Returns the folders opened (others may enter them, not list them).
    """
    sys.path.insert(0, str(ROOT / "hub"))
    from launch import closed_folders

    opened = closed_folders(paths)
    for folder in opened:
        os.chmod(folder, st_mode.S_IMODE(os.stat(folder).st_mode) | st_mode.S_IXOTH)
    if opened:
        print(f"hub test: opened {' '.join(map(str, opened))} to other users (o+x) for the learners' servers")
    return opened


@dataclass
class Hub:
    """One running hub: its address, folder, process and timings."""

    url: str
    folder: Path
    process: subprocess.Popen
    log: Path
    started_s: float = 0.0
    timings: dict = field(default_factory=dict)
    scratch: Path | None = None  # as root: the folder made for HUB_DIR, removed at the stop
    ended: list[str] = field(default_factory=list)  # as root: what hub/end.py removed at the stop

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> tuple[float, list[int], list[int]]:
        """SIGINT, as Ctrl-C sends it; returns (seconds to exit, processes left, ports left)."""
        tree = [self.process.pid, *descendants(self.process.pid)]
        start = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        took = time.monotonic() - start
        # The hub has exited; the proxy and the servers it signalled may take a moment more on a
        # loaded machine. A stop is clean when they are all gone within STOP_GRACE_S.
        deadline = time.monotonic() + STOP_GRACE_S
        while True:
            left = [pid for pid in tree if Path(f"/proc/{pid}").exists() and _not_zombie(pid)]
            if (not left and not ports_in_use()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for pid in left:  # leave the machine clean even when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.scratch is not None:
            self.ended = end_workshop(self.folder)
            shutil.rmtree(self.scratch, ignore_errors=True)
        return took, left, ports_in_use()


def end_workshop(folder: Path) -> list[str]:
    """As root: the learners' system users, homes and scratch files removed (hub/end.py, as `make hub-end`)."""
    sys.path.insert(0, str(ROOT / "hub"))
    import end

    try:
        return end.end(folder)
    except end.EndError as error:
        return [f"not ended: {error}"]


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_hub(folder: Path, **settings: str) -> Hub:
    """Start hub/launch.py in the background of this process (SIGINT ignored there, as in a script's `&`).

    As root, the hub's folder is made under /tmp rather than at ``folder`` (pytest's temporary folders are
    closed to other users, and each learner is one); the log stays beside ``folder``. Without root the
    shared user is confirmed (HUB_SHARED_USER_OK=1).

    Raises:
        RuntimeError: the hub did not answer /hub/health within START_TIMEOUT_S (its log is in the message).
    """
    busy = ports_in_use()
    if busy:
        raise RuntimeError(f"ports {busy} are in use before the hub test: stop what listens there")
    log = folder.parent / f"{folder.name}.log"
    scratch = None
    if AS_ROOT:
        open_the_way([ROOT, Path(sys.executable).resolve(), Path(sys.prefix), Path(sys.base_prefix)])
        scratch = Path(tempfile.mkdtemp(prefix=f"hub-test-{BASE_PORT}-"))
        os.chmod(scratch, 0o711)
        folder = scratch / folder.name
    else:
        settings = {"HUB_SHARED_USER_OK": "1", **settings}
    env = dict(
        os.environ,
        HUB_DIR=str(folder),
        HUB_PORT=str(BASE_PORT),
        HUB_SERVER_PORTS=SERVER_PORTS,
        HUB_PASSWORD=PASSWORD,
        HUB_ADMIN_PASSWORD=ADMIN_PASSWORD,
        **settings,
    )
    handle = log.open("w")
    start = time.monotonic()

    def ignore_sigint():  # what `cmd &` in a non-interactive shell does
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    process = subprocess.Popen(
        [sys.executable, str(LAUNCH)], env=env, stdout=handle, stderr=subprocess.STDOUT, preexec_fn=ignore_sigint
    )
    hub = Hub(f"http://127.0.0.1:{BASE_PORT}", folder, process, log, scratch=scratch)
    deadline = start + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the hub exited with status {process.returncode}:\n{hub.log_text()[-3000:]}")
        try:
            if requests.get(f"{hub.url}/hub/health", timeout=2).status_code == 200:
                hub.started_s = time.monotonic() - start
                return hub
        except requests.RequestException:
            pass
        time.sleep(0.3)
    hub.stop()
    raise RuntimeError(f"the hub did not answer /hub/health within {START_TIMEOUT_S} s:\n{hub.log_text()[-3000:]}")


def xsrf(session: requests.Session) -> str:
    """The hub's XSRF cookie (the first one: servers set their own under /user/NAME/)."""
    for cookie in session.cookies:
        if cookie.name == "_xsrf":
            return cookie.value
    return ""


def own_password(user: str) -> str:
    """The password the learner ``user`` chooses at their first sign-in in these tests (hub/signin.py)."""
    return f"{user}-own-password"


def login(hub: Hub, user: str, password: str | None = None, follow: bool = True) -> requests.Session:
    """A signed-in HTTP session (the hub's login form, with its XSRF token): a learner with their own password
    (claiming the name with the workshop password the first time), or ``password`` (the instructor's).
    ``follow=False`` stops at the sign-in's answer (the hub's redirect would start the learner's server)."""
    session = requests.Session()
    session.get(f"{hub.url}/hub/login", timeout=10)
    answer = session.post(
        f"{hub.url}/hub/login?next=",
        data={"username": user, "password": password or own_password(user), "otp": PASSWORD, "_xsrf": xsrf(session)},
        timeout=60,
        allow_redirects=follow,
    )
    answer.raise_for_status()
    return session


def hub_api(session: requests.Session, hub: Hub, path: str) -> requests.Response:
    """GET the hub's REST API with the session's cookie (and the XSRF header cookie access needs)."""
    return session.get(f"{hub.url}/hub/api{path}", headers={"X-XSRFToken": xsrf(session)}, timeout=10)
