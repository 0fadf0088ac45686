"""JupyterHub for a workshop on one machine (`make hub`): one server, workspace and password per learner.

Run as root, each learner's server runs as a system user of their own (hub/users.py);
without root, as the hub's own user (hub/launch.py asks the instructor to confirm that).

Settings come from the environment (hub/launch.py fills them in; docs/instructor.md):

- ``HUB_DIR``: the hub's state (database, cookie secret, proxy pid, passwords, the address
  learners open) and the learners' homes (``users/NAME``)
- ``HUB_PASSWORD``: the workshop password (8+ characters) with which a learner claims a new name
  (then signing in with a password of their own, hub/signin.py); hub/launch.py keeps it in
  ``HUB_DIR/password`` (0600) and takes it out of the environment, and this file reads it there
- ``HUB_ADMIN_PASSWORD``: the instructor's password (32+ characters), kept the same way in
  ``HUB_DIR/admin-password``
- ``HUB_PUBLIC_URL``: the address learners open, when it is not the hub's own (a TLS proxy in
  front, a DNS name); hub/launch.py writes the address in ``HUB_DIR/address`` for the room card
- ``HUB_SHARED_USER_OK``: ``1`` to start without root (every server then runs as one user)
- ``HUB_ADMIN``: the instructor's user name (default ``instructor``), who gets the admin view
- ``HUB_IP`` / ``HUB_PORT``: where learners connect (default 127.0.0.1:8000); the proxy's API
  and the hub itself listen on 127.0.0.1 at HUB_PORT+1 and HUB_PORT+2
- ``HUB_SERVER_PORTS``: ``FIRST-LAST`` ports for the learners' servers (default: free random ports)
- ``HUB_SSL_CERT`` / ``HUB_SSL_KEY``: serve HTTPS directly
- ``HUB_CULL_TIMEOUT`` / ``HUB_CULL_EVERY``: seconds of inactivity before a server is stopped
  (default 3600) and how often the culler looks (default 60)
- ``HUB_ACTIVITY_INTERVAL``: seconds between activity reports to the hub (default 300;
  must stay well below HUB_CULL_TIMEOUT, or a learner at work looks idle)
- ``HUB_PROFILE``: ``DPCOURSE_PROFILE`` for every learner's kernels (for example ``smoke``)
- ``DPCOURSE_DATA`` / ``DPCOURSE_DATA_DIR``: passed on to every learner's kernels as set here
  (dpcourse/data.py: where the data comes from and the folder it is read from)
- ``HUB_SERVER_ARGS``: extra command-line options for every learner's server (space-separated)
- ``HUB_GPUS``: GPU ids to hand out round-robin (default: every GPU ``nvidia-smi -L`` lists)
- ``HUB_BOARD_REFRESH_S``: seconds between the instructor's board refreshes (default 2); the
  board (hub/board.py, /services/board/) listens on 127.0.0.1 at HUB_PORT+3
"""

# ruff: noqa: F821  (`c` is the config object JupyterHub passes in)

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HUB_DIR = Path(os.environ.get("HUB_DIR", ROOT / ".hub")).resolve()
USERS_DIR = HUB_DIR / "users"
IP = os.environ.get("HUB_IP", "127.0.0.1")
PORT = int(os.environ.get("HUB_PORT", "8000"))
ADMIN = os.environ.get("HUB_ADMIN", "instructor")
BIN = Path(sys.executable).parent
PROXY = ROOT / "tools" / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
# The course's Python first on PATH: `python -m coursetools ...` works in a terminal of the lab.
COURSE_PATH = f"{BIN}{os.pathsep}{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
AS_ROOT = os.geteuid() == 0  # then each learner is a system user of their own (hub/users.py)
sys.path.insert(0, str(ROOT / "hub"))
import board  # noqa: E402 - hub/board.py: the service's scopes
import users  # noqa: E402 - hub/users.py: learners' system users


def kept_secret(name: str) -> str:
    """A password hub/launch.py keeps in ``HUB_DIR/name`` (0600): never read from the environment.

    Raises:
        RuntimeError: the file is missing (the hub was not started by hub/launch.py).
    """
    path = HUB_DIR / name
    if not path.is_file():
        raise RuntimeError(
            f"{path} is missing: start the hub with `make hub` (hub/launch.py keeps the passwords there)."
        )
    return path.read_text().strip()


def gpu_ids() -> list[str]:
    """The GPUs to share out: ``HUB_GPUS`` (``0,1,...``), else those ``nvidia-smi -L`` lists, else none."""
    given = os.environ.get("HUB_GPUS")
    if given is not None:
        return [g.strip() for g in given.split(",") if g.strip()]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(listing.splitlines()) if line.startswith("GPU ")]


def kernel_environment(user_id: int, gpus: list[str]) -> dict[str, str]:
    """The learner's environment: one GPU round-robin by user id with preallocation off, or 8 CPU devices."""
    env = {"JUPYTER_CONFIG_PATH": str(ROOT / "jupyter"), "PATH": COURSE_PATH}
    if os.environ.get("HUB_ACTIVITY_INTERVAL"):
        env["JUPYTERHUB_ACTIVITY_INTERVAL"] = os.environ["HUB_ACTIVITY_INTERVAL"]
    if os.environ.get("HUB_PROFILE"):
        env["DPCOURSE_PROFILE"] = os.environ["HUB_PROFILE"]
    for name in ("DPCOURSE_DATA", "DPCOURSE_DATA_DIR"):  # e.g. Fashion-MNIST in a folder every learner may read
        if os.environ.get(name):
            env[name] = os.environ[name]
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[user_id % len(gpus)]
        # Several learners' processes may share a GPU when there are more of
        # them than GPUs: none may take 75 % of its memory at start.
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    else:
        # The course's simulated devices (dpcourse.devices adds the device
        # count flag itself); keep JAX off a GPU backend that is not there.
        env["JAX_PLATFORMS"] = "cpu"
    return env


# Ports handed to servers that are starting or running (a server binds its
# port some seconds after the hook runs, so a free socket alone is not enough).
ASSIGNED_PORTS: dict[str, int] = {}


def free_port(first: int, last: int, taken: set[int]) -> int:
    """The first port in FIRST..LAST not in ``taken`` that nothing listens on (127.0.0.1)."""
    for port in range(first, last + 1):
        if port in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in HUB_SERVER_PORTS={first}-{last}: stop some servers or widen the range")


def make_workspace(folder: Path) -> None:
    """The learner's copy of the lessons (coursetools.workspace.init): new lessons copied in, edits never overwritten."""
    from coursetools import workspace

    workspace.init(folder)


GPUS = gpu_ids()
SERVER_PORTS = os.environ.get("HUB_SERVER_PORTS")


# A terminal in the lab: bash, not a login shell, whose /etc/profile would put the system's PATH
# back in front of the course's Python (jupyter_server_terminals adds -l unless told a command).
TERMINAL = "--ServerApp.terminado_settings=" + repr({"shell_command": [shutil.which("bash") or "/bin/sh"]})


async def pre_spawn_hook(spawner) -> None:
    """Before each server: its system user and home (as root), its workspace, GPU share, port, terminal."""
    home = USERS_DIR / spawner.user.name
    workspace = home / "workspace"
    if AS_ROOT:
        # The learner's own account and home; the workspace is made by them, never by root in their folder.
        USERS_DIR.mkdir(exist_ok=True)
        os.chmod(USERS_DIR, 0o711)  # each learner may enter it to reach their own home, not list it
        account = users.ensure_user(users.system_name(spawner.user.name), home, spawner.user.name)
        users.give_home(home, account)
        spawner.home_dir = str(home)
        environment = {"PATH": COURSE_PATH, "HOME": str(home), "LANG": os.environ.get("LANG", "C.UTF-8")}
        command = [str(BIN / "python"), "-m", "coursetools", "workspace", "init", "--dir", str(workspace)]
        await users.run_as(account, command, environment)
    else:
        make_workspace(workspace)
    spawner.notebook_dir = str(workspace)
    spawner.environment.update(kernel_environment(spawner.user.id, GPUS))
    if SERVER_PORTS:
        first, last = (int(p) for p in SERVER_PORTS.split("-"))
        ASSIGNED_PORTS.pop(spawner.user.name, None)
        spawner.port = free_port(first, last, set(ASSIGNED_PORTS.values()))
        ASSIGNED_PORTS[spawner.user.name] = spawner.port
    spawner.args = [*spawner.args, TERMINAL]
    if os.environ.get("HUB_SERVER_ARGS"):
        spawner.args = [*spawner.args, *os.environ["HUB_SERVER_ARGS"].split()]


def post_stop_hook(spawner) -> None:
    """The stopped server's port is free again."""
    ASSIGNED_PORTS.pop(spawner.user.name, None)


# -- The hub ------------------------------------------------------------------
c.JupyterHub.bind_url = f"http{'s' if os.environ.get('HUB_SSL_CERT') else ''}://{IP}:{PORT}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = PORT + 2
c.JupyterHub.db_url = f"sqlite:///{HUB_DIR / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(HUB_DIR / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(HUB_DIR / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True
c.JupyterHub.cleanup_proxy = True
if os.environ.get("HUB_ACTIVITY_INTERVAL"):
    c.JupyterHub.last_activity_interval = int(os.environ["HUB_ACTIVITY_INTERVAL"])
if os.environ.get("HUB_SSL_CERT"):
    c.JupyterHub.ssl_cert = os.environ["HUB_SSL_CERT"]
    c.JupyterHub.ssl_key = os.environ["HUB_SSL_KEY"]

# The node configurable-http-proxy (tools/hub, npm ci): the Python one on PyPI
# breaks cookie-authenticated POSTs (the hub refuses server starts with 403).
c.ConfigurableHTTPProxy.command = [str(PROXY)]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PORT + 1}"
c.ConfigurableHTTPProxy.pid_file = str(HUB_DIR / "proxy.pid")

# -- Who signs in ---------------------------------------------------------------
# Each learner's name is bound to a password of their own at their first sign-in
# (hub/signin.py); a new name is claimed with the workshop password. The instructor
# signs in as HUB_ADMIN with the admin password and gets the admin page (/hub/admin).
c.JupyterHub.authenticator_class = "signin.WorkshopAuthenticator"
c.WorkshopAuthenticator.workshop_password = kept_secret("password")
if (HUB_DIR / "admin-password").is_file():
    c.WorkshopAuthenticator.admin_password = kept_secret("admin-password")
c.WorkshopAuthenticator.dbm_path = str(HUB_DIR / "passwords.dbm")
c.Authenticator.admin_users = {ADMIN}
c.Authenticator.allow_all = True
c.WorkshopAuthenticator.homes_dir = str(USERS_DIR)  # a name no folder there can hold is refused at sign-in

# -- Each learner's server ---------------------------------------------------------
if AS_ROOT:
    c.JupyterHub.spawner_class = users.LearnerSpawner
else:
    # JupyterHub's spawner for one user (it says: no isolation); hub/launch.py has the instructor confirm.
    c.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
    c.SimpleLocalProcessSpawner.home_dir_template = str(USERS_DIR / "{username}")
c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.pre_spawn_hook = pre_spawn_hook
c.Spawner.post_stop_hook = post_stop_hook
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 90

# -- The idle culler, a hub service with only the scopes it needs ---------------------
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [
            sys.executable,
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={os.environ.get('HUB_CULL_TIMEOUT', '3600')}",
            f"--cull-every={os.environ.get('HUB_CULL_EVERY', '60')}",
        ],
    }
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }
]

# -- The instructor's board (hub/board.py): a service only the instructor may open -------
# It reads each learner's progress.json through the proxy, from their running server's
# contents API, with its own token; the role board-viewer lets the instructor past its OAuth.
BOARD_HOST = "127.0.0.1" if IP in ("0.0.0.0", "::", "localhost") else IP
c.JupyterHub.services.append(
    {
        "name": "board",
        "url": f"http://127.0.0.1:{PORT + 3}",
        "command": [sys.executable, str(ROOT / "hub" / "board.py")],
        "environment": {
            "BOARD_SERVERS_URL": f"http{'s' if os.environ.get('HUB_SSL_CERT') else ''}://{BOARD_HOST}:{PORT}",
            # With HUB_SSL_CERT the certificate names the room's host, not the address the board uses.
            "BOARD_VERIFY_TLS": "0" if os.environ.get("HUB_SSL_CERT") else "1",
            "BOARD_REFRESH_S": os.environ.get("HUB_BOARD_REFRESH_S", "2"),
            "BOARD_WORKSPACES": str(USERS_DIR),  # catch-up and fresh copies from the board
            "BOARD_MISTAKES": str(HUB_DIR / "board-mistakes.json"),  # the common mistakes, kept across a restart
        },
        "oauth_no_confirm": True,
        "display": True,
    }
)
c.JupyterHub.load_roles += [
    {"name": "board", "scopes": board.SERVICE_SCOPES, "services": ["board"]},
    {"name": "board-viewer", "scopes": board.VIEWER_SCOPES, "users": [ADMIN]},
]
