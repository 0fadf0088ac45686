"""The test server: a taken port is replaced, and stopping it leaves no process behind."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest
from labserver import NOTEBOOKS, LabServer, LabServerError, lesson_names, processes_mentioning


def test_lessons_are_found_by_pattern():
    names = lesson_names()
    assert names == sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert "01_setup" in names and "07_sweep" in names


def test_taken_port_is_replaced_and_stop_ends_server_and_kernels():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        server = LabServer(port=busy)
        try:
            server.start()
            assert server.port != busy
            assert server.get("/api/status")[0] == 200
            assert server.get("/api/contents", token=False)[0] == 403
            request = urllib.request.Request(
                server.url + "/api/kernels",
                data=json.dumps({"name": "python3"}).encode(),
                headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                kernel = json.loads(response.read())
            assert kernel["id"]
            # The server and the kernel (its connection file is in the server's folder).
            assert len(processes_mentioning(str(server.workdir))) >= 2
            server.stop()
            assert processes_mentioning(str(server.workdir)) == set()
        finally:
            server.cleanup()
    assert not server.workdir.exists()


def test_a_server_that_cannot_start_says_why(monkeypatch):
    server = LabServer(start_timeout_s=20)
    monkeypatch.setattr(server, "command", lambda port: ["python3", "-c", "import sys; sys.exit('no lab here')"])
    try:
        with pytest.raises(LabServerError, match="no lab here"):
            server.start(attempts=2)
    finally:
        server.cleanup()
