"""Start the workshop's JupyterHub (`make hub`): passwords, a lock, free ports, SIGINT, then JupyterHub.

    python hub/launch.py            (make hub; HUB_* settings: hub/jupyterhub_config.py)

What it adds around ``jupyterhub -f hub/jupyterhub_config.py``:

- the workshop password and the instructor's password, from ``HUB_PASSWORD`` /
  ``HUB_ADMIN_PASSWORD`` or made once and kept in ``HUB_DIR`` (mode 0600);
- one hub per ``HUB_DIR`` (a lock file): a second hub started before the first
  exits would start a second proxy and leave it behind;
- the three ports checked free before anything starts, each named if not;
- a non-loopback address only with TLS (``HUB_SSL_CERT``/``HUB_SSL_KEY``) or an
  explicit ``HUB_PLAIN_HTTP=1`` (TLS terminated in front, docs/instructor.md);
- SIGINT handled again: a process started in the background of a shell script
  inherits SIGINT ignored, and the hub then only stops when killed (29 s and a
  stray proxy, measured), so Ctrl-C and ``kill -INT`` stop it cleanly.

Exit status: JupyterHub's, or 2 when it could not start (the message says why).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import secrets
import signal
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "hub" / "jupyterhub_config.py"
PROXY = ROOT / "tools" / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"


class LaunchError(RuntimeError):
    """The hub cannot start; the message says what to do."""


def _secret(env: str, path: Path, length: int, minimum: int) -> tuple[str, bool]:
    """``$env``, else the one kept at ``path``, else a new one written there (0600). Returns (value, made)."""
    value = os.environ.get(env)
    if value:
        if len(value) < minimum:
            raise LaunchError(f"{env} must have at least {minimum} characters (JupyterHub's shared-password rule).")
        return value, False
    if path.is_file():
        return path.read_text().strip(), False
    value = secrets.token_urlsafe(length)[:length]
    path.touch(mode=0o600)
    path.write_text(value + "\n")
    return value, True


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def prepare(environ: dict[str, str] | None = None) -> tuple[dict[str, str], list[str], object]:
    """Check and complete the settings. Returns (environment, lines to print, the held lock file).

    Raises:
        LaunchError: a setting or the machine does not allow the hub to start.
    """
    env = dict(os.environ if environ is None else environ)
    hub_dir = Path(env.get("HUB_DIR", ROOT / ".hub")).resolve()
    hub_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    env["HUB_DIR"] = str(hub_dir)
    if not PROXY.exists():
        raise LaunchError(f"{PROXY} is missing: run `make hub` (it runs npm ci in tools/hub), or npm ci there.")
    lock = (hub_dir / "hub.lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = (hub_dir / "jupyterhub.pid").read_text().strip() if (hub_dir / "jupyterhub.pid").exists() else "?"
        raise LaunchError(
            f"a hub is already running from {hub_dir} (pid {pid}): stop it first (Ctrl-C in its terminal, "
            f"or kill -INT {pid}); two hubs on one folder leave a stray proxy behind."
        ) from None
    ip = env.get("HUB_IP", "127.0.0.1")
    port = int(env.get("HUB_PORT", "8000"))
    tls = bool(env.get("HUB_SSL_CERT"))
    if tls != bool(env.get("HUB_SSL_KEY")):
        raise LaunchError("set HUB_SSL_CERT and HUB_SSL_KEY together (the certificate chain and its key, PEM).")
    try:
        loopback = ipaddress.ip_address(ip).is_loopback
    except ValueError:
        loopback = ip == "localhost"
    if not loopback and not tls and env.get("HUB_PLAIN_HTTP") != "1":
        raise LaunchError(
            f"HUB_IP={ip} would serve the workshop password over plain HTTP. Give a certificate "
            "(HUB_SSL_CERT=fullchain.pem HUB_SSL_KEY=privkey.pem), or keep HUB_IP=127.0.0.1 behind a "
            "TLS proxy on this machine (docs/instructor.md, 'TLS in front'), or, only when such a proxy "
            "runs elsewhere, set HUB_PLAIN_HTTP=1."
        )
    for number, role in ((port, "learners' address"), (port + 1, "proxy API"), (port + 2, "hub"), (port + 3, "board")):
        if not _port_free(number):
            raise LaunchError(
                f"port {number} ({role}) is in use: stop what listens there (ss -ltnp 'sport = :{number}') "
                "or choose another HUB_PORT (the hub uses HUB_PORT, +1, +2 and +3)."
            )
    given = bool(env.get("HUB_PASSWORD"))
    password, made = _secret("HUB_PASSWORD", hub_dir / "password", 12, 8)
    admin_password, admin_made = _secret("HUB_ADMIN_PASSWORD", hub_dir / "admin-password", 40, 32)
    env["HUB_PASSWORD"], env["HUB_ADMIN_PASSWORD"] = password, admin_password
    admin = env.get("HUB_ADMIN", "instructor")
    url = f"http{'s' if tls else ''}://{ip}:{port}"
    lines = [
        f"hub: learners open {url}/ and sign in with any user name and the workshop password",
        (
            "hub: workshop password: the one in HUB_PASSWORD"
            if given
            else f"hub: workshop password{' (new)' if made else ''}: {password}  (kept in {hub_dir / 'password'})"
        ),
        f"hub: instructor: user {admin}, password in {hub_dir / 'admin-password'}"
        f"{' (new)' if admin_made else ''}; admin page {url}/hub/admin",
        f"hub: learners' workspaces under {hub_dir / 'users'}; stop with Ctrl-C",
    ]
    if loopback and not tls:
        lines.append(
            "hub: listening on this machine only; for a room, put TLS in front (docs/instructor.md, 'TLS in front')"
        )
    return env, lines, lock


def main(argv: list[str] | None = None) -> int:
    """Start JupyterHub with the course's config; return its exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        env, lines, lock = prepare()
    except LaunchError as err:
        print(f"hub: {err}", file=sys.stderr)
        return 2
    os.environ.update(env)
    for line in lines:
        print(line, flush=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(env["HUB_DIR"])
    from jupyterhub.app import JupyterHub

    try:
        JupyterHub.launch_instance(["-f", str(CONFIG), *argv])
    except KeyboardInterrupt:
        pass
    finally:
        lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
