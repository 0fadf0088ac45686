"""Free and taken TCP ports on this machine, IPv4 or IPv6: where a local multi-process run's coordinator can listen.

:func:`free_port` asks the OS for a free port; :func:`check_port_free` says
whether a chosen one is taken, binding as the coordinator's gRPC server does.
Only a port that is really taken (``EADDRINUSE``) is called in use; a host
that is not an address of this machine, or a port that needs rights, is said
as such. A machine that lets no process open a TCP socket at all (a
sandbox: ``OSError: [Errno 97] Address family not supported by protocol``)
is said in one sentence too (:func:`tcp_unavailable`, :class:`TcpUnavailable`).
:mod:`dpcourse.multihost.launcher` uses them before it starts any process.
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from dpcourse.multihost.distributed import CoordinatorPortInUse, DistributedSetupError

__all__ = ["TcpUnavailable", "check_port_free", "free_port", "tcp_unavailable"]


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


def tcp_unavailable(host: str = "127.0.0.1") -> str | None:
    """One sentence saying that no process may open a TCP socket on ``host`` here, or None where one can.

    The hosts of some sandboxes refuse every internet socket, loopback
    included (gVisor with networking off: errno 97, ``EAFNOSUPPORT``); a
    lesson checks this before its multi-process part and says it in one
    sentence instead of a traceback.
    """
    family, _ = _listen_family(host)
    try:
        _socket(family, host).close()
    except TcpUnavailable as err:
        return str(err)
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
