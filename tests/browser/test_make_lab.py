"""``make lab``: starts (also as root), listens on 127.0.0.1 only, keeps token authentication."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from labserver import ROOT, descendants, free_port, wait_gone


def _listening_addresses(port: int) -> set[str]:
    """Local IPv4 addresses listening on ``port``, from /proc/net/tcp (Linux)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":  # 0A: LISTEN
            found.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists() or shutil.which("make") is None, reason="needs Linux and make")
def test_make_lab_starts_on_localhost_with_a_token(tmp_path):
    port = free_port()
    env = dict(os.environ)
    env.pop("JUPYTER_TOKEN", None)
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    for name, var in (
        ("config", "JUPYTER_CONFIG_DIR"),
        ("data", "JUPYTER_DATA_DIR"),
        ("runtime", "JUPYTER_RUNTIME_DIR"),
        ("settings", "JUPYTERLAB_SETTINGS_DIR"),
        ("workspaces", "JUPYTERLAB_WORKSPACES_DIR"),
    ):
        (tmp_path / name).mkdir()
        env[var] = str(tmp_path / name)
    venv = Path(sys.executable).parent.parent
    log = tmp_path / "lab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["make", "-s", "--no-print-directory", "lab", f"LAB_PORT={port}", f"VENV={venv}"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    tree: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            tree |= descendants(proc.pid)
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents", timeout=5)
                status = 200
            except urllib.error.HTTPError as err:
                status = err.code
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
                continue
            break
        text = log.read_text()
        assert status == 403, f"make lab: contents API without a token answered {status}; log:\n{text[-3000:]}"
        assert _listening_addresses(port) == {"127.0.0.1"}
        assert re.search(r"token=\w", text) or "token=..." in text, text[-2000:]
    finally:
        tree |= descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        left = wait_gone(tree, 20)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not wait_gone(tree, 10), "make lab left processes running"
