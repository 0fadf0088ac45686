"""Tests of dpcourse.multihost.ports: only a taken port is called in use; IPv6 hosts are probed with IPv6 sockets."""

from __future__ import annotations

import socket
import time

import pytest

from dpcourse.multihost import distributed, ports
from dpcourse.multihost.distributed import DistributedSetupError


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_a_free_port_is_never_called_in_use():
    """Only EADDRINUSE means "in use": an address this machine lacks is another error, said plainly."""
    port = ports.free_port("127.0.0.1")
    ports.check_port_free("127.0.0.1", port)  # free: no error
    for host in ("192.0.2.1", "no-such-host.invalid"):  # TEST-NET-1: never a local address
        with pytest.raises(distributed.DistributedSetupError) as info:
            ports.check_port_free(host, port)
        assert not isinstance(info.value, distributed.CoordinatorPortInUse)
        assert "127.0.0.1" in str(info.value) and "in use" not in str(info.value)


def test_a_taken_ipv4_port_is_in_use_and_says_what_to_do():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        with pytest.raises(distributed.CoordinatorPortInUse, match=f"port {taken} on 127.0.0.1 .*port=None"):
            ports.check_port_free("127.0.0.1", taken)


def test_a_port_in_time_wait_counts_as_free():
    """A coordinator (gRPC binds with SO_REUSEADDR, so its connections do too) that just ended leaves
    its port in TIME_WAIT: the next run may take it, and the check, binding the same way, agrees."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the side that closes first keeps TIME_WAIT
    client.close()
    server.close()
    ports.check_port_free("127.0.0.1", port)


def test_a_port_below_1024_without_rights_says_so(monkeypatch):
    import errno

    real_socket = socket.socket

    class NoRights(real_socket):
        def bind(self, address):
            raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(ports.socket, "socket", NoRights)
    with pytest.raises(distributed.DistributedSetupError, match="below 1024 need administrator rights") as info:
        ports.check_port_free("127.0.0.1", 80)
    assert not isinstance(info.value, distributed.CoordinatorPortInUse)


def test_ipv6_switched_off_is_said_as_such(no_ipv6):
    for probe in (lambda: ports.free_port("::1"), lambda: ports.check_port_free("::1", 8476)):
        with pytest.raises(distributed.DistributedSetupError, match="IPv6 may be switched off") as info:
            probe()
        assert not isinstance(info.value, distributed.CoordinatorPortInUse)


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_ipv6_ports_are_probed_with_ipv6_sockets():
    port = ports.free_port("::1")
    ports.check_port_free("::1", port)
    ports.check_port_free("[::1]", port)
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        sock.bind(("::1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        with pytest.raises(distributed.CoordinatorPortInUse, match=f"port {taken} on ::1 is already in use"):
            ports.check_port_free("::1", taken)


def test_a_host_without_tcp_is_said_in_one_sentence(no_internet_sockets):
    """On a TPU host without TCP, lesson 08 stopped with a traceback of `OSError: [Errno 97] ...`."""
    assert ports.tcp_unavailable() is None  # this machine has loopback TCP
    no_internet_sockets()
    said = ports.tcp_unavailable()
    assert said is not None and "\n" not in said
    assert said.startswith("This machine lets no process open a TCP socket, not even on 127.0.0.1 (OSError: [Errno 97]")
    assert said.endswith("run it where processes can open one (a laptop, a cloud VM, a GKE pod).")
    assert "::1" in ports.tcp_unavailable("::1")
    for probe in (lambda: ports.free_port("127.0.0.1"), lambda: ports.check_port_free("127.0.0.1", 12345)):
        with pytest.raises(ports.TcpUnavailable) as info:
            probe()
        assert str(info.value) == said and isinstance(info.value, distributed.DistributedSetupError)


@pytest.mark.parametrize("name", ["pct%41", "what?", "hash#1", "a space", "co:lon", "caf\u00e9", "l" * 80])
def test_a_run_folder_carries_a_socket_address_both_sides_of_grpc_read_alike(name, tmp_path, monkeypatch):
    """A $TMPDIR that a URI (or a shell) reads specially, or one too long for a socket, is passed over for /tmp."""
    import tempfile

    odd = tmp_path / name
    odd.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(odd))
    with ports.run_folder("dpcourse-test-") as folder:
        address = ports.private_coordinator(folder)
        assert address == f"unix:{folder}/coordinator.sock" and folder.startswith("/tmp/dpcourse-test-")
    odd.chmod(0o755)
    with pytest.raises(DistributedSetupError, match=r"no one else may enter \(mode 0700; it is drwxr-xr-x"):
        ports.private_coordinator(odd)
    odd.chmod(0o700)
    with pytest.raises(DistributedSetupError, match=r"only ASCII letters, digits and /\._- \(gRPC reads it as a URI\)"):
        ports.private_coordinator(odd)
    monkeypatch.setattr(ports.os, "access", lambda *_: False)
    with pytest.raises(DistributedSetupError, match="start Python or JupyterLab with TMPDIR set .* comes too late"):
        ports.run_folder("dpcourse-test-")


def test_a_loopback_that_is_down_is_said_in_one_sentence(monkeypatch):
    import errno

    real = socket.socket

    class Down(real):
        def bind(self, address):
            if self.family == socket.AF_INET:
                raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
            return super().bind(address)

    monkeypatch.setattr(socket, "socket", Down)
    said = ports.tcp_unavailable()
    assert said.startswith("This machine's loopback interface does not carry TCP (127.0.0.1 cannot be listened on")
    assert "ip link set lo up" in said and said.count(". ") == 0


def test_a_loopback_that_drops_connections_is_said_within_a_second(monkeypatch):
    real = socket.socket

    class Dropping(real):
        def connect(self, address):
            raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "socket", Dropping)
    start = time.monotonic()
    said = ports.tcp_unavailable()
    assert time.monotonic() - start < 2 and "got no answer within 1 s" in said


def test_without_namespaces_the_run_shares_the_network_and_says_why(monkeypatch):
    monkeypatch.setattr(ports.shutil, "which", lambda name: None)
    with ports.private_network() as network:
        assert network.prefix == [] and "no network namespaces" in network.reason


def test_a_refused_namespace_is_said_and_the_run_goes_on_shared(monkeypatch, tmp_path):
    refusing = tmp_path / "unshare"
    refusing.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    refusing.chmod(0o755)
    monkeypatch.setattr(ports.sys, "platform", "linux")
    monkeypatch.setattr(ports.shutil, "which", lambda name: str(refusing) if name == "unshare" else "/bin/true")
    with ports.private_network() as network:
        assert network.prefix == [] and network.reason.endswith("(unshare: unshare failed: Operation not permitted)")


def test_the_command_line_says_whether_runs_get_a_network_of_their_own(monkeypatch, capsys):
    monkeypatch.setattr(ports.shutil, "which", lambda name: None)
    assert ports.main() == 1
    assert capsys.readouterr().out.startswith("shared: a multi-process run started by this user shares")


def test_a_namespace_no_process_may_join_is_said_and_the_run_goes_on_shared(monkeypatch, tmp_path):
    """A sandbox may let unshare make the namespaces yet refuse nsenter: checked once, before any worker starts."""
    holder, joiner = tmp_path / "unshare", tmp_path / "nsenter"
    holder.write_text("#!/bin/sh\necho ready 1\ncat >/dev/null\n")
    joiner.write_text(
        "#!/bin/sh\necho \"nsenter: reassociate to namespace 'ns/user' failed: Invalid argument\" >&2\nexit 1\n"
    )
    for script in (holder, joiner):
        script.chmod(0o755)
    monkeypatch.setattr(ports.sys, "platform", "linux")
    monkeypatch.setattr(ports.shutil, "which", lambda name: str(tmp_path / name))
    with ports.private_network() as network:
        assert network.prefix == [] and network.reason == (
            "this system refuses to let a process join a network namespace "
            "(nsenter: reassociate to namespace 'ns/user' failed: Invalid argument)"
        )
