"""Where a local multi-process run's processes meet: a coordinator only its user can reach, and free TCP ports.

:func:`private_coordinator` puts the coordinator on a Unix-domain socket in a
folder only this user may enter (mode 0700): on a machine shared by several
users (a JupyterHub room), another user cannot connect to it, so cannot join
the run, read what goes through the coordinator or end the run.
:func:`free_port` asks the OS for a free TCP port; :func:`check_port_free`
says whether a chosen one is taken, binding as the coordinator's gRPC server
does. Only a port that is really taken (``EADDRINUSE``) is called in use; a
host that is not an address of this machine, or a port that needs rights, is
said as such. A machine that lets no process open a TCP socket at all (a
sandbox: ``OSError: [Errno 97] Address family not supported by protocol``),
or whose loopback interface is down, is said in one sentence too
(:func:`tcp_unavailable`, :class:`TcpUnavailable`): gloo's connections
between the processes need TCP on loopback. :mod:`dpcourse.multihost.launcher`
uses them before it starts any process.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import select
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dpcourse.multihost.distributed import (
    PLAIN_PATH,
    UNIX_PATH_MAX,
    UNIX_PREFIX,
    CoordinatorPortInUse,
    DistributedSetupError,
    check_coordinator_address,
)

__all__ = [
    "PrivateNetwork",
    "TcpUnavailable",
    "check_port_free",
    "free_port",
    "private_coordinator",
    "private_network",
    "run_folder",
    "run_parent",
    "tcp_unavailable",
]

SOCKET_NAME = "coordinator.sock"


class TcpUnavailable(DistributedSetupError):
    """This machine lets no process open a TCP socket: no local multi-process run can start here."""


def _socket(family: socket.AddressFamily, host: str) -> socket.socket:
    """A TCP socket of ``family``; a machine that refuses to make one raises :class:`TcpUnavailable`."""
    try:
        return socket.socket(family, socket.SOCK_STREAM)
    except OSError as err:
        raise TcpUnavailable(
            f"This machine lets no process open a TCP socket, not even on {host} ({type(err).__name__}: {err}): "
            "JAX's coordinator and the collectives between processes need one, so no multi-process run can "
            "start here; run it where processes can open one (a laptop, a cloud VM, a GKE pod)."
        ) from None


def private_coordinator(folder: str | os.PathLike) -> str:
    """``unix:<folder>/coordinator.sock``: a coordinator address only this user can connect to.

    ``folder`` must be this user's and closed to everyone else (mode 0700, as
    :func:`run_folder` makes it): connecting to a Unix-domain socket needs
    search permission on every folder of its path, so another user (not root)
    is refused with ``EACCES`` before a byte is sent. Process 0 creates the socket.

    Raises:
        DistributedSetupError: the folder is not a folder of this user's closed
            to others, or its path cannot be a socket's address (:func:`run_parent`).
    """
    path = Path(folder).absolute()
    try:
        info = path.stat()
    except OSError as err:
        raise DistributedSetupError(f"The coordinator's folder {path} cannot be used ({err.strerror}).") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise DistributedSetupError(
            f"The coordinator's folder {path} must be a folder of yours that no one else may enter (mode 0700; "
            f"it is {stat.filemode(info.st_mode)}, owner id {info.st_uid}): make it with ports.run_folder()."
        )
    address = f"{UNIX_PREFIX}{path / SOCKET_NAME}"
    check_coordinator_address(address)
    return address


def run_parent(prefix: str = "dpcourse-run-") -> str:
    """Where :func:`run_folder` makes a run's folder: Python's temporary folder, else ``/tmp``, the first
    where the coordinator's socket path has only :data:`PLAIN_PATH` characters (no ``%``, ``?``, ``#``, space,
    ``:`` or accented letter: gRPC reads ``unix:<path>`` as a URI) and at most :data:`UNIX_PATH_MAX` bytes.

    Raises:
        DistributedSetupError: neither can hold the run's folder (one sentence, with what to do).
    """
    tmp = tempfile.gettempdir()
    for parent in (tmp, "/tmp"):
        socket_path = f"{parent}/{prefix}{'x' * 8}/{SOCKET_NAME}"  # TemporaryDirectory adds 8 characters
        plain = PLAIN_PATH.fullmatch(socket_path) and len(socket_path) <= UNIX_PATH_MAX
        if plain and os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK):
            return parent
    raise DistributedSetupError(
        f"A local run's coordinator needs a short folder whose path holds only ASCII letters, digits and /._- "
        f"(gRPC reads its socket's address as a URI), and neither the temporary folder {tmp} nor /tmp is one "
        "this user can write: start Python or JupyterLab with TMPDIR set to such a folder (setting it inside a "
        "running kernel comes too late: Python's tempfile keeps the folder it found first)."
    )


def run_folder(prefix: str) -> tempfile.TemporaryDirectory:
    """A new folder of this user's (mode 0700) for one local run, in :func:`run_parent`: removed with the block."""
    return tempfile.TemporaryDirectory(prefix=prefix, dir=run_parent(prefix))


def unix_sockets_available() -> bool:
    """Whether this platform has Unix-domain sockets (Linux, macOS; not every Windows Python)."""
    return hasattr(socket, "AF_UNIX")


LOOPBACK_DOWN = (
    "This machine's loopback interface does not carry TCP ({detail}): the processes of a multi-process run "
    "connect to each other over it (gloo's collectives), so none can start here; bring it up "
    "(`ip link set lo up`, as root) or run where it works (a laptop, a cloud VM, a GKE pod)."
)


def tcp_unavailable(host: str = "127.0.0.1") -> str | None:
    """One sentence saying that processes cannot reach each other over TCP on ``host`` here, or None where they can.

    The hosts of some sandboxes refuse every internet socket, loopback
    included (gVisor with networking off: errno 97, ``EAFNOSUPPORT``); on
    others the loopback interface is down (``ip link set lo down``: a bind
    to 127.0.0.1 fails with ``EADDRNOTAVAIL``) or its traffic is dropped (a
    connect waits). The check opens a socket, listens on ``host`` and
    connects to itself within a second; a lesson runs it before its
    multi-process part and says the answer in one sentence instead of a
    traceback or a stall.
    """
    family, address = _listen_family(host)
    try:
        server = _socket(family, host)
    except TcpUnavailable as err:
        return str(err)
    with server, socket.socket(family, socket.SOCK_STREAM) as client:
        try:
            server.bind((address, 0))
        except OSError as err:
            if family == socket.AF_INET and ipaddress.ip_address(address).is_loopback:
                return LOOPBACK_DOWN.format(detail=f"{host} cannot be listened on: {err.strerror or err}")
            _bind(server, host, address, 0)  # raises its own sentence: not an address of this machine
            raise
        try:
            server.listen(1)
            client.settimeout(1.0)
            client.connect(server.getsockname()[:2])
        except OSError as err:
            detail = f"a connection to {host} failed: {err.strerror or err}"
            if isinstance(err, TimeoutError) or err.errno is None:
                detail = f"a connection to {host} got no answer within 1 s"
            return LOOPBACK_DOWN.format(detail=detail)
    return None


def _listen_family(host: str) -> tuple[socket.AddressFamily, str]:
    """The socket family and bare address to probe ``host`` with (IPv6 brackets removed).

    Raises:
        DistributedSetupError: ``host`` is neither an IP address nor a name this machine resolves.
    """
    bare = str(host).strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        try:
            infos = socket.getaddrinfo(bare, None, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as err:
            raise DistributedSetupError(
                f"Coordinator host {host!r} cannot be resolved on this machine ({err}). The local launcher runs "
                "every process here: use 127.0.0.1, or ::1 for IPv6 loopback."
            ) from None
        family, *_, sockaddr = infos[0]
        return family, str(sockaddr[0])
    return (socket.AF_INET6 if ip.version == 6 else socket.AF_INET), bare


def _bind(sock: socket.socket, host: str, address: str, port: int) -> None:
    """Bind ``sock`` to ``address:port``; only a port that is really taken is called in use."""
    try:
        sock.bind((address, port))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise CoordinatorPortInUse(
                f"Coordinator port {port} on {host} is already in use ({err.strerror}). Pass another port, "
                "or port=None to let the launcher pick a free one."
            ) from None
        if err.errno == errno.EACCES:
            raise DistributedSetupError(
                f"Not allowed to listen on port {port} of {host} ({err.strerror}): ports below 1024 need "
                "administrator rights. Pass a port from 1024 up, or port=None for a free one."
            ) from None
        raise DistributedSetupError(
            f"Cannot listen on {host}{f' port {port}' if port else ''} ({err.strerror or err}): this machine has no such local "
            "address (for ::1, IPv6 may be switched off). The local launcher runs every process here: use "
            "127.0.0.1, or ::1 where IPv6 loopback exists."
        ) from None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it); ``host`` may be IPv4 or IPv6.

    Raises:
        DistributedSetupError: ``host`` is not an address of this machine (or
            cannot be resolved), for example ``::1`` where IPv6 is off.
        TcpUnavailable: this machine lets no process open a TCP socket.
    """
    family, address = _listen_family(host)
    with _socket(family, host) as sock:
        _bind(sock, host, address, 0)
        return int(sock.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`CoordinatorPortInUse` when ``host:port`` is taken.

    Binds with ``SO_REUSEADDR``, as the coordinator's gRPC server does, so a
    port left in TIME_WAIT by an earlier run counts as free. IPv6 hosts
    (``::1``, with or without brackets) are probed with an IPv6 socket.

    Raises:
        CoordinatorPortInUse: the port is taken (``EADDRINUSE``), and only then.
        DistributedSetupError: the host is not an address of this machine, or
            the port needs rights this process lacks.
        TcpUnavailable: this machine lets no process open a TCP socket.
    """
    family, address = _listen_family(host)
    with _socket(family, host) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _bind(sock, host, address, port)


# ---------------------------------------------------------------------------
# A network of the run's own: gloo's ports out of other users' reach
# ---------------------------------------------------------------------------

# Run inside the new namespaces: bring their loopback up (SIOCGIFFLAGS/SIOCSIFFLAGS, linux/sockios.h; IFF_UP = 1),
# check that it carries TCP, say so, then live until the launcher closes stdin (or dies: the pipe closes too).
_HOLDER = r"""
import fcntl, os, socket, struct, sys
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        socket.create_connection(server.getsockname(), timeout=1).close()
except OSError as err:
    print("error", err, flush=True)
    sys.exit(1)
print("ready", os.getpid(), flush=True)
sys.stdin.read()
"""
HOLDER_START_S = 30.0  # a Python start, without site; seconds on a quiet machine, more under load


@dataclass
class PrivateNetwork:
    """Where a run's processes start: ``prefix + command`` runs a command inside the run's own network.

    Attributes:
        prefix: the command's prefix (``nsenter`` into the namespaces); empty where there are none.
        reason: why the run has no network of its own (None: it has one).
    """

    prefix: list[str] = field(default_factory=list)
    reason: str | None = None


def _holder_line(holder: subprocess.Popen, timeout_s: float) -> str:
    """The holder's first line, or "" when it said nothing within ``timeout_s``."""
    ready, _, _ = select.select([holder.stdout], [], [], timeout_s)
    return holder.stdout.readline().decode(errors="replace").strip() if ready else ""


def _can_enter(prefix: list[str], timeout_s: float) -> bool | str:
    """True when a process can start inside the namespaces through ``prefix``; else what ``nsenter`` said."""
    try:
        done = subprocess.run(prefix + [sys.executable, "-I", "-S", "-c", ""], capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    said = done.stderr.decode(errors="replace").strip().splitlines()
    return True if done.returncode == 0 else (said[-1] if said else f"exit status {done.returncode}")


@contextlib.contextmanager
def private_network(timeout_s: float = HOLDER_START_S) -> Iterator[PrivateNetwork]:
    """A network namespace of the run's own, with only a loopback interface, for as long as the block runs.

    Gloo's connections are TCP: on a loopback shared with other users anyone
    may connect to its listening ports (``/proc/net/tcp``) and claim a
    connection meant for the run, which ends its collective. In a namespace
    of its own (``unshare --user --map-root-user --net``, where Linux allows
    unprivileged user namespaces) no one else reaches it; processes join
    through :attr:`PrivateNetwork.prefix` (``nsenter --preserve-credentials``:
    the user's rights, shown inside as user 0), and reach the coordinator's
    socket as before. Where that is not possible (not Linux, no ``unshare``,
    namespaces off or confined, as by Ubuntu 24.04's AppArmor policy), the
    block gets an empty prefix and the reason: the run shares the loopback.
    """
    unshare, nsenter = shutil.which("unshare"), shutil.which("nsenter")
    if sys.platform != "linux" or not unshare or not nsenter:
        yield PrivateNetwork(reason="this system has no network namespaces (Linux's unshare and nsenter)")
        return
    holder = subprocess.Popen(
        [unshare, "--user", "--map-root-user", "--net", "--", sys.executable, "-I", "-S", "-c", _HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        line = _holder_line(holder, timeout_s)
        prefix = [
            nsenter,
            f"--target={line.split()[-1] if line else 0}",
            "--user",
            "--net",
            "--preserve-credentials",
            "--",
        ]
        entered = line.startswith("ready ") and _can_enter(prefix, timeout_s)
        if entered is True:
            yield PrivateNetwork(prefix=prefix)
        elif line.startswith("ready "):
            yield PrivateNetwork(reason=f"this system refuses to let a process join a network namespace ({entered})")
        else:
            if not line:
                try:
                    holder.wait(timeout=2)  # it ended (its stdout closed): its last word is on stderr
                    said = (holder.stderr.read() or b"").decode(errors="replace").strip().splitlines()
                    line = said[-1] if said else f"exit status {holder.returncode}"
                except subprocess.TimeoutExpired:
                    line = f"no answer within {timeout_s:.0f} s"
            yield PrivateNetwork(reason=f"this system refuses a network namespace to this user ({line})")
    finally:
        with contextlib.suppress(OSError):
            holder.stdin.close()
        try:
            holder.wait(timeout=2)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stdout.close()
        holder.stderr.close()


def main() -> int:
    """``python -m dpcourse.multihost.ports``: say whether this user's runs get a network of their own here."""
    with private_network() as network:
        if network.reason is None:
            print("private: a multi-process run started by this user gets a network of its own")
            return 0
        print(f"shared: a multi-process run started by this user shares this machine's loopback: {network.reason}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
