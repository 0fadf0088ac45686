"""What the multi-process tests share: another user of the machine (a room's learner B) trying to reach a run."""

from __future__ import annotations

import errno
import json
import os
import socket
import warnings

import pytest

OTHER_USER = 65534  # "nobody": another learner of the room, with no rights to this run's files


def as_other_user(socket_path: str, ports: list[int] = ()) -> dict:
    """Another user (not root) tries to connect to a run's coordinator socket and to each of ``ports`` on loopback.

    A forked child drops to :data:`OTHER_USER` and reports each attempt's outcome through a pipe:
    ``{"coordinator": "PermissionError" | "connected" | ..., "gloo": {port: outcome}}``. Root only.
    """
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # the child makes system calls only (no lock of a launch's thread)
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe and never returns
        outcome = {"coordinator": None, "gloo": {}}
        try:
            os.setgroups([])
            os.setgid(OTHER_USER)
            os.setuid(OTHER_USER)
            with socket.socket(socket.AF_UNIX) as sock:
                try:
                    sock.connect(socket_path)
                    outcome["coordinator"] = "connected"
                except OSError as err:
                    outcome["coordinator"] = type(err).__name__
            for port in ports:
                with socket.socket() as sock:
                    sock.settimeout(2)
                    try:
                        sock.connect(("127.0.0.1", port))
                        outcome["gloo"][port] = "connected"
                    except OSError as err:
                        outcome["gloo"][port] = type(err).__name__
        finally:
            os.write(write_end, json.dumps(outcome).encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        outcome = json.loads(pipe.read() or "{}")
    os.waitpid(child, 0)
    return outcome


@pytest.fixture(scope="session")
def other_user():
    """:func:`as_other_user`, for a test (or a module's fixture) that plays learner B."""
    return as_other_user


@pytest.fixture
def no_internet_sockets(monkeypatch):
    """Call it to make this process as on a sandboxed host (gVisor, networking off): every internet socket
    refused with errno 97."""
    real = socket.socket

    def refusing(family=socket.AF_INET, *args, **kwargs):
        if family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *args, **kwargs)

    return lambda: monkeypatch.setattr(socket, "socket", refusing)
