"""Start the workshop's JupyterHub (`make hub`): passwords, a lock, free ports, SIGINT, then JupyterHub.

    python hub/launch.py            (make hub; HUB_* settings: hub/jupyterhub_config.py)

What it adds around ``jupyterhub -f hub/jupyterhub_config.py``:

- the workshop password and the instructor's password, from ``HUB_PASSWORD`` /
  ``HUB_ADMIN_PASSWORD`` or made once, kept in ``HUB_DIR`` (mode 0600) and read
  there by the hub: a password given in the environment is taken out of it (the
  launcher starts itself again without it), so no process of the hub's has it there;
- as root, each learner a system user of their own (hub/users.py): the hub's
  folder open to them only to reach their homes, its files the hub's alone, and
  the course's Python and folder reachable by them; without root, learners share
  the hub's user, which the instructor confirms with ``HUB_SHARED_USER_OK=1``;
- the address learners open (``HUB_PUBLIC_URL``, else the hub's own) written to
  ``HUB_DIR/address``, where the room card (hub/card.py) reads it;
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
import stat
import sys
from pathlib import Path
from urllib.parse import urlsplit

from pythons import advice, closed_folders  # hub/pythons.py: which Python the learners' users can run

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "hub" / "jupyterhub_config.py"
PROXY = ROOT / "tools" / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
SECRETS = ("HUB_PASSWORD", "HUB_ADMIN_PASSWORD")  # kept in files, never passed on in the environment
SHARED_USER_WARNING = (
    "Not running as root, so every learner's server runs as this one user: learners can read and change each "
    "other's files and read the hub's secrets (its database, cookie secret and passwords) from their kernels."
)


class LaunchError(RuntimeError):
    """The hub cannot start; the message says what to do."""


def _write_private(path: Path, text: str) -> None:
    """``text`` written to ``path`` readable by this user alone (0600), whole or not at all."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _secret(env: dict[str, str], name: str, path: Path, length: int) -> tuple[str, bool]:
    """``env[name]`` (then kept at ``path``), else the one kept there, else a new one kept there. Returns (value, made)."""
    value = env.get(name)
    if value:
        if not path.is_file() or path.read_text().strip() != value:
            _write_private(path, value + "\n")
        return value, False
    if path.is_file():
        return path.read_text().strip(), False
    value = secrets.token_urlsafe(length)[:length]
    _write_private(path, value + "\n")
    return value, True


def _separate_users(hub_dir: Path) -> None:
    """As root: the hub's files its own, its folder enterable (for the homes in users/), the course reachable.

    Raises:
        LaunchError: a folder the learners' users must pass through is closed to them.
    """
    import sysconfig

    python = [Path(sys.executable).resolve(), Path(sys.base_prefix), Path(sysconfig.get_config_var("LIBDIR") or "/")]
    closed = closed_folders(python)
    if closed:
        raise LaunchError(advice(closed))
    closed = closed_folders([ROOT, Path(sys.prefix), hub_dir.parent])
    if closed:
        names = " ".join(str(p) for p in closed)
        raise LaunchError(
            f"each learner's server runs as a user of their own, who cannot enter {names} (the course or HUB_DIR "
            f"lie below): put the course and HUB_DIR where every user may enter (e.g. /opt/course), or run "
            f"`chmod o+x {names}` (others may then open what lies there by name, not list it)."
        )
    for entry in hub_dir.iterdir():  # files an older run left with other modes
        if entry.is_file() and not entry.is_symlink():
            os.chmod(entry, stat.S_IMODE(entry.stat().st_mode) & 0o700)
    os.chmod(hub_dir, 0o711)  # learners enter it to reach users/NAME, and may list nothing
    (hub_dir / "users").mkdir(exist_ok=True)
    os.chmod(hub_dir / "users", 0o711)


def certificate_name(cert: str) -> str | None:
    """The first DNS name the certificate at ``cert`` is for (its subjectAltName, else its common name), or None."""
    try:
        from cryptography import x509

        loaded = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    except (OSError, ValueError, ImportError):
        return None
    try:
        names = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = names.get_values_for_type(x509.DNSName)
        if dns:
            return dns[0].lstrip("*.")
    except x509.ExtensionNotFound:
        pass
    common = loaded.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
    return str(common[0].value) if common else None


def public_url(env: dict[str, str], ip: str, port: int, tls: bool) -> str:
    """The address learners open: ``HUB_PUBLIC_URL``, else the hub's (the certificate's name or this host's for 0.0.0.0).

    Raises:
        LaunchError: ``HUB_PUBLIC_URL`` is not an http(s) address with a host.
    """
    given = env.get("HUB_PUBLIC_URL")
    if given:
        parts = urlsplit(given)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LaunchError(
                f"HUB_PUBLIC_URL={given!r} is not an address a browser opens: give the one learners type, "
                "e.g. https://hub.example.org/ (the TLS proxy in front of the hub, or the hub's own DNS name)."
            )
        return given.rstrip("/") + "/"
    host = ip
    if ip in ("0.0.0.0", "::", ""):
        host = (certificate_name(env["HUB_SSL_CERT"]) if tls else None) or socket.getfqdn()
    if ":" in host:
        host = f"[{host}]"
    return f"http{'s' if tls else ''}://{host}:{port}/"


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def prepare(environ: dict[str, str] | None = None, euid: int | None = None) -> tuple[dict[str, str], list[str], object]:
    """Check and complete the settings. Returns (environment without passwords, lines to print, the held lock file).

    Raises:
        LaunchError: a setting or the machine does not allow the hub to start.
    """
    env = dict(os.environ if environ is None else environ)
    as_root = (os.geteuid() if euid is None else euid) == 0
    if not as_root and env.get("HUB_SHARED_USER_OK") != "1":
        raise LaunchError(
            f"{SHARED_USER_WARNING} Run `make hub` as root to give each learner a system user of their own, "
            "or set HUB_SHARED_USER_OK=1 to seat them so anyway (docs/instructor.md, 'What keeps learners apart')."
        )
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
    for name, minimum in (("HUB_PASSWORD", 8), ("HUB_ADMIN_PASSWORD", 32)):
        if env.get(name) and len(env[name]) < minimum:
            raise LaunchError(f"{name} must have at least {minimum} characters.")
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
    if as_root:
        _separate_users(hub_dir)
    url = public_url(env, ip, port, tls)
    password, made = _secret(env, "HUB_PASSWORD", hub_dir / "password", 12)
    _, admin_made = _secret(env, "HUB_ADMIN_PASSWORD", hub_dir / "admin-password", 40)
    for name in SECRETS:
        env.pop(name, None)
    _write_private(hub_dir / "address", url + "\n")
    admin = env.get("HUB_ADMIN", "instructor")
    lines = [
        f"hub: learners open {url} and sign in with a name and a password of their own, typing the workshop "
        "password in the second field the first time (it claims the name)",
        f"hub: workshop password{' (new)' if made else ''}: {password}  (kept in {hub_dir / 'password'})",
        f"hub: instructor: user {admin}, password in {hub_dir / 'admin-password'}"
        f"{' (new)' if admin_made else ''}; admin page {url}hub/admin",
        f"hub: learners' workspaces under {hub_dir / 'users'}; stop with Ctrl-C",
        (
            "hub: each learner's server runs as a system user of their own (jupyter-NAME)"
            if as_root
            else f"hub: {SHARED_USER_WARNING}"
        ),
    ]
    if loopback and not tls and not env.get("HUB_PUBLIC_URL"):
        lines.append(
            "hub: listening on this machine only; for a room, put TLS in front and give its address as "
            "HUB_PUBLIC_URL (docs/instructor.md, 'TLS in front')"
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
    if any(name in os.environ for name in SECRETS):
        # A password given in the environment is kept in HUB_DIR now: start again without it, so that
        # no process of the hub's (this one, the proxy, the services) holds it in /proc/PID/environ.
        lock.close()
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)
    os.environ.clear()
    os.environ.update(env)
    # Everything the hub writes (its database, cookie secret, pid files) readable by its user alone.
    os.umask(0o077)
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
