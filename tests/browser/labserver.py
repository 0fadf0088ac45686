"""A JupyterLab server for the browser tests: started, checked and always stopped.

:class:`LabServer` starts JupyterLab from the running Python environment (the
course's ``.venv``) on a free 127.0.0.1 port with a random token and the
course's settings (``jupyter/`` in the repository, as ``make lab`` applies
them), serving a learner's workspace made by ``coursetools.workspace.init`` (what
``make lab`` serves: one ``NN_name.ipynb`` per lesson), so that nothing a test
does (autosave) writes into the repository. ``test_workspace_lab.py`` starts
``make lab`` itself, from a fresh clone. Everything else the server
reads or writes (user config, settings, workspaces, runtime files, kernel
specs, IPython profile) lives in the same temporary folder, so a
developer's own ``~/.jupyter`` cannot change what the tests see.

:meth:`LabServer.stop` ends the server and every process it started (kernels,
and what the kernels started), and raises if any is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
COURSE_CONFIG = ROOT / "jupyter"
LESSON_GLOB = "[0-9][0-9]_*.ipynb"


class LabServerError(RuntimeError):
    """The server did not start, or left processes behind when stopped."""


def lesson_names(notebooks: Path = NOTEBOOKS) -> list[str]:
    """Every lesson notebook's name without suffix (``"04_sharding"``), sorted.

    Lessons are found by the pattern ``NN_name.ipynb``, so lessons added later
    are covered without changing the tests.
    """
    return sorted(path.stem for path in notebooks.glob(LESSON_GLOB))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` on ``host`` can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _die_with_parent() -> None:  # pragma: no cover (runs in the child before exec)
    """Linux: have the kernel kill the server if the test process dies.

    SIGKILL, not SIGTERM: a server told to stop while a kernel is busy was seen
    to hang in its shutdown. Its kernels notice that their parent is gone
    (ipykernel watches ``JPY_PARENT_PID``) and exit by themselves.
    """
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc (Linux) or ``ps`` elsewhere."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The command name (2nd field) may hold spaces: parse after its ')'.
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
        return children
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        pid, ppid = (int(x) for x in line.split())
        children.setdefault(ppid, []).append(pid)
    return children


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    children = _children_map()
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def processes_mentioning(text: str) -> set[int]:
    """Pids whose command line contains ``text`` (Linux /proc; empty elsewhere)."""
    found = set()
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, finished but not yet reaped, counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
        return state[state.rindex(")") + 2] != "Z"
    except (OSError, ValueError):
        return True


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    """Wait up to ``timeout_s`` for ``pids`` to end; returns those still running."""
    deadline = time.monotonic() + timeout_s
    left = {pid for pid in pids if alive(pid)}
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {pid for pid in left if alive(pid)}
    return left


class LabServer:
    """JupyterLab with the course's settings, for one test session.

    Args:
        lessons: the course's notebooks folder the workspace is made from
            (the repository's ``notebooks/`` by default).
        port: preferred port; when it is taken (or None), a free one is used.
        profile: ``DPCOURSE_PROFILE`` for the kernels (``smoke``: seconds per
            lesson).
        start_timeout_s: how long the server may take to answer.

    Attributes:
        url: ``http://127.0.0.1:PORT`` once started.
        token: the random token; requests without it get the login page or 403.
        root: the served folder (a workspace made from ``lessons``).
        start_dir: the folder the server is started in (``root``).
        workdir: the temporary folder holding everything the server writes.
    """

    def __init__(
        self,
        lessons: Path = NOTEBOOKS,
        port: int | None = None,
        profile: str = "smoke",
        start_timeout_s: float = 90.0,
    ) -> None:
        self.lessons = Path(lessons)
        self.preferred_port = port
        self.profile = profile
        self.start_timeout_s = start_timeout_s
        self.token = secrets.token_hex(24)
        self.workdir = Path(tempfile.mkdtemp(prefix="dpcourse-lab-"))
        self.root = self.workdir / "root"
        self.start_dir = self.root
        self.log_path = self.workdir / "server.log"
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise LabServerError("The server has not been started.")
        return f"http://127.0.0.1:{self.port}"

    def _prepare(self) -> None:
        from coursetools.workspace import init

        init(self.root, source=self.lessons)  # as `make lab` does: no jupytext.toml, no .py twins
        for name in ("config", "data", "runtime", "settings", "workspaces", "ipython"):
            (self.workdir / name).mkdir()

    def environment(self) -> dict[str, str]:
        """The server's environment: the caller's, with the lab's folders isolated."""
        env = dict(os.environ)
        # The course's own setting is what is under test, not the caller's.
        env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
        env.update(
            JUPYTER_CONFIG_DIR=str(self.workdir / "config"),
            JUPYTER_CONFIG_PATH=str(COURSE_CONFIG),
            JUPYTER_DATA_DIR=str(self.workdir / "data"),
            JUPYTER_RUNTIME_DIR=str(self.workdir / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(self.workdir / "settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(self.workdir / "workspaces"),
            IPYTHONDIR=str(self.workdir / "ipython"),
            JUPYTER_TOKEN=self.token,
            DPCOURSE_PROFILE=self.profile,
            PYTHONUNBUFFERED="1",
        )
        return env

    def command(self, port: int) -> list[str]:
        """The command line (the token travels in the environment, not here)."""
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={self.root}",
            # Lets the tests read the notebook model (outputs, execution counts).
            "--LabApp.expose_app_in_browser=True",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")
        return cmd

    def start(self, attempts: int = 5) -> LabServer:
        """Start the server and wait until its API answers.

        A port taken before the server could bind it (by another program) is
        replaced by another free port, up to ``attempts`` times.

        Raises:
            LabServerError: the server did not answer; the message holds the
                end of its log.
        """
        self._prepare()
        port = self.preferred_port
        if port is not None and not port_is_free(port):
            port = None
        for _ in range(attempts):
            port = port or free_port()
            self._log = open(self.log_path, "a")  # noqa: SIM115 (closed in stop())
            self._log.write(f"--- starting on port {port}\n")
            self._log.flush()
            self.proc = subprocess.Popen(
                self.command(port),
                cwd=self.start_dir,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
            self.port = port
            if self._wait_ready():
                return self
            in_use = "already in use" in self.log_tail() or "Address already in use" in self.log_tail()
            self.stop()
            if not in_use:
                break
            port = None
        raise LabServerError(f"JupyterLab did not start (log {self.log_path}):\n{self.log_tail()}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if self.get("/api/status")[0] == 200:
                    return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.3)
        return False

    def get(self, path: str, token: bool = True) -> tuple[int, str]:
        """GET ``path`` on the server; returns (HTTP status, body)."""
        request = urllib.request.Request(self.url + path)
        if token:
            request.add_header("Authorization", f"token {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")

    def delete(self, path: str) -> int:
        """DELETE ``path`` with the token; returns the HTTP status."""
        request = urllib.request.Request(self.url + path, method="DELETE")
        request.add_header("Authorization", f"token {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as err:
            return err.code

    def shutdown_kernels(self) -> None:
        """End every session (and its kernel), as closing the lesson with its kernel would."""
        import json

        status, body = self.get("/api/sessions")
        if status != 200:
            return
        for session in json.loads(body):
            self.delete(f"/api/sessions/{session['id']}")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server and everything it started; raise if a process is left.

        SIGTERM lets JupyterLab shut its kernels down; whatever still runs after
        ``grace_s`` (the server, a kernel, a kernel's own subprocess) is killed.

        Raises:
            LabServerError: a process of this server is still alive after the
                kill (its pid and command line are in the message).
        """
        if self.proc is None:
            return
        tree = descendants(self.proc.pid) | {self.proc.pid}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        # Kernels run in sessions of their own: end them by pid, then anything
        # else that names this server's folders on its command line.
        left = wait_gone(tree | processes_mentioning(str(self.workdir)), 5.0)
        _signal_all(left, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        left = wait_gone(left | processes_mentioning(str(self.workdir)), 5.0)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if left:
            described = "; ".join(f"{pid}: {_cmdline(pid)}" for pid in sorted(left))
            raise LabServerError(f"Processes of the lab server were left running: {described}")

    def cleanup(self) -> None:
        """Stop the server if needed, then remove its temporary folder."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LabServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
