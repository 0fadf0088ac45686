"""Execute a notebook in one process with IPython's shell: no kernel, no sockets (hosts without TCP).

A Jupyter kernel talks to its client over ZeroMQ sockets; on a host where
processes may open no TCP socket, not even on the loopback (a lent TPU
host), an ipykernel does not start. This module runs the notebook's code
cells in order in IPython's own ``InteractiveShell``, as a kernel's shell
does (magics, ``display()``, the value of a cell's last line), and keeps
each cell's outputs in the notebook: streams, rich displays, results and
the error with its traceback. The first cell that raises stops the run, as
nbclient does.

``python -m coursetools.shellrun NOTEBOOK --out EXECUTED --result RESULT.json``
executes one notebook in a fresh process (one per notebook, as a fresh
kernel is) and writes the executed notebook and a small result file: the
failing cell and its error, and the accelerator's peak memory
(:func:`device_peak_bytes`). The runner starts it with ``--kernel shell``
(:mod:`coursetools.runner`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

RESULT_SCHEMA = 1


class _CellSink:
    """The outputs of the cell being executed (nbformat output dicts), in the order they came."""

    def __init__(self) -> None:
        self.outputs: list[dict] = []
        self.execution_count: int | None = None

    def stream(self, name: str, text: str) -> None:
        if not text:
            return
        last = self.outputs[-1] if self.outputs else None
        if last is not None and last.get("output_type") == "stream" and last["name"] == name:
            last["text"] += text
        else:
            self.outputs.append({"output_type": "stream", "name": name, "text": text})

    def display(self, data: dict, metadata: dict | None, display_id: str | None = None, update: bool = False) -> None:
        out = {"output_type": "display_data", "data": dict(data), "metadata": dict(metadata or {})}
        if update and display_id:
            for i, old in enumerate(self.outputs):
                if old.get("_display_id") == display_id:
                    self.outputs[i] = {**out, "_display_id": display_id}
                    return
            return
        if display_id:
            out["_display_id"] = display_id
        self.outputs.append(out)

    def result(self, data: dict, metadata: dict | None) -> None:
        self.outputs.append(
            {
                "output_type": "execute_result",
                "data": dict(data),
                "metadata": dict(metadata or {}),
                "execution_count": self.execution_count,
            }
        )

    def error(self, ename: str, evalue: str, traceback: list[str]) -> None:
        self.outputs.append({"output_type": "error", "ename": ename, "evalue": evalue, "traceback": list(traceback)})

    def clear(self) -> None:
        self.outputs.clear()

    def take(self) -> list[dict]:
        """The cell's outputs as nbformat nodes; the sink is empty afterwards."""
        import nbformat

        outs = [nbformat.from_dict({k: v for k, v in o.items() if k != "_display_id"}) for o in self.outputs]
        self.outputs = []
        return outs


class _Stream:
    """``sys.stdout``/``sys.stderr`` for the cells: text goes to the cell's outputs (and, with ``echo``, on)."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, sink: _CellSink, name: str, echo) -> None:
        self._sink, self.name, self._echo = sink, name, echo

    def write(self, text: str) -> int:
        self._sink.stream(self.name, text)
        if self._echo is not None:
            self._echo.write(text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._echo is not None:
            self._echo.flush()

    def isatty(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return False

    def close(self) -> None:
        pass  # a logging handler may close the stream it was given; the cells' streams stay open

    def fileno(self) -> int:
        # Subprocesses and faulthandler write to the real descriptor, as under ipykernel.
        return (sys.__stdout__ if self.name == "stdout" else sys.__stderr__).fileno()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False


_SINK = _CellSink()  # the cell being executed; make_shell points it at the caller's


def _shell_class():
    """IPython's ``InteractiveShell`` whose displays, results and tracebacks land in :data:`_SINK`."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **_):
            _SINK.display(data, metadata, (transient or {}).get("display_id"), update)

        def clear_output(self, wait=False):
            _SINK.clear()

    class Hook(DisplayHook):
        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            _SINK.result(format_dict, md_dict)

        def finish_displayhook(self):
            self._is_active = False

    class Shell(InteractiveShell):
        def _showtraceback(self, etype, evalue, stb):
            _SINK.error(etype.__name__, str(evalue), stb)

    return Shell, Publisher, Hook


_CLASSES: tuple | None = None


def make_shell(sink: _CellSink):
    """The process's shell (one per process, as in a kernel), its outputs going to ``sink`` from now on."""
    global _SINK, _CLASSES
    _SINK = sink
    if _CLASSES is None:
        _CLASSES = _shell_class()
    shell, publisher, hook = _CLASSES
    return shell.instance(display_pub_class=publisher, displayhook_class=hook, colors="nocolor")


def device_peak_bytes() -> int | None:
    """The accelerator's memory high-water mark in this process: JAX's ``peak_bytes_in_use``, largest device.

    None when JAX was never imported, or its default backend is the CPU (or
    reports no memory statistics).
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        devs = [d for d in jax.local_devices() if d.platform != "cpu"]
        peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in devs]
    except Exception:  # noqa: BLE001 - a backend that cannot say
        return None
    peaks = [int(p) for p in peaks if p is not None]
    return max(peaks) if peaks else None


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def execute(nb, cwd: Path, echo: bool = False) -> dict:
    """Execute ``nb``'s code cells in order in this process, in ``cwd``; outputs go into ``nb``.

    Returns:
        ``{"error_cell": index or None, "error": "Name: first line" or None,
        "interrupted": bool}``: the first cell that raised (0-based among all
        cells) stops the run.
    """
    before = os.getcwd()
    os.chdir(cwd)
    sys.path.insert(0, str(cwd))
    sink = _CellSink()
    shell = make_shell(sink)
    saved = sys.stdout, sys.stderr
    sys.stdout = _Stream(sink, "stdout", sys.__stdout__ if echo else None)
    sys.stderr = _Stream(sink, "stderr", sys.__stderr__ if echo else None)
    outcome: dict = {"error_cell": None, "error": None, "interrupted": False}
    try:
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            sink.execution_count = shell.execution_count
            started = _now_iso()
            try:
                result = shell.run_cell(cell.source, store_history=True)
            except KeyboardInterrupt:  # between IPython's own handlers
                sink.error("KeyboardInterrupt", "", ["KeyboardInterrupt"])
                result = None
            cell.outputs = sink.take()
            cell.execution_count = sink.execution_count
            # nbclient's record_timing keys, so a cell's time reads the same from either runner
            cell.metadata["execution"] = {"iopub.execute_input": started, "shell.execute_reply": _now_iso()}
            err = None if result is None else (result.error_before_exec or result.error_in_exec)
            if result is None or err is not None:
                name = "KeyboardInterrupt" if result is None else type(err).__name__
                first = "" if result is None else (str(err).strip().splitlines() or [""])[0]
                outcome.update(
                    error_cell=index, error=f"{name}: {first}"[:600], interrupted=name == "KeyboardInterrupt"
                )
                break
    finally:
        sys.stdout, sys.stderr = saved
        os.chdir(before)  # the notebook's process ends here; a caller in-process gets its folder back
        sys.path.remove(str(cwd))
    return outcome


def run_in_process(nb, cwd: Path, out_path: Path, on_start=None, timeout_s: float | None = None) -> dict:
    """Execute ``nb`` with :func:`main` in a fresh Python process; the executed notebook lands in ``out_path``.

    The process inherits this one's environment (the runner sets the
    profile and the results file there). ``on_start(pid)`` is called once it
    runs (the runner's memory watch). Ctrl-C here reaches the process too
    (the same process group); it records the interruption and stops.

    Returns:
        The result of :func:`main`: ``error_cell``, ``error``, ``interrupted``,
        ``wall_s``, ``peak_device_bytes``; a process that died before writing
        it gives ``error`` with its exit status and the last line it printed.
    """
    import signal
    import subprocess
    import tempfile

    import nbformat

    with tempfile.TemporaryDirectory(prefix="shellrun-") as tmp:
        source, result_file = Path(tmp) / "notebook.ipynb", Path(tmp) / "result.json"
        nbformat.write(nb, source)
        argv = [sys.executable, "-m", "coursetools.shellrun", str(source), "--out", str(out_path)]
        argv += ["--result", str(result_file), "--cwd", str(cwd)]
        log = Path(tmp) / "stderr.txt"
        with open(log, "wb") as err:
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
            if on_start is not None:
                on_start(proc.pid)
            interrupted = False
            try:
                proc.wait(timeout=timeout_s)
            except KeyboardInterrupt:
                interrupted = True
                proc.send_signal(signal.SIGINT)  # a signal sent to the runner alone (gpucheck's budget)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return {
                    "error_cell": None,
                    "error": f"TimeoutError: the notebook ran longer than {timeout_s:.0f} s",
                    "interrupted": False,
                    "peak_device_bytes": None,
                }
        if result_file.exists():
            outcome = json.loads(result_file.read_text(encoding="utf-8"))
            outcome["interrupted"] = outcome.get("interrupted") or interrupted
            return outcome
        lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
        last = f" Its last message: {lines[-1].strip()[:300]}" if lines else ""
        return {
            "error_cell": None,
            "error": f"ProcessError: the notebook's process ended with status {proc.returncode}.{last}",
            "interrupted": interrupted,
            "peak_device_bytes": None,
        }


def run_for_runner(nb, path: Path, out_dir: Path, memory, timeout_s: float, on_cell=None) -> tuple:
    """The runner's ``--kernel shell``: ``nb`` (from ``path``) run by :func:`run_in_process` into ``out_dir``.

    ``memory``: the runner's :class:`coursetools.memwatch.PeakMemory`, set
    on the notebook's process. Returns ``(executed notebook, status, error,
    error cell, the accelerator's peak bytes)``, status "passed", "failed"
    or "interrupted".
    """
    import nbformat

    if on_cell is not None:
        on_cell(path.stem, 0, len(nb.cells))
    out = out_dir / path.name
    outcome = run_in_process(nb, path.parent.resolve(), out, memory.watch, timeout_s)
    executed = nbformat.read(out, as_version=4) if out.exists() else nb
    error = outcome["error"]
    if outcome.get("interrupted"):
        status, error = "interrupted", error or "KeyboardInterrupt: run stopped"
    else:
        status = "failed" if error else "passed"
    return executed, status, error, outcome["error_cell"], outcome.get("peak_device_bytes")


def main(argv: list[str] | None = None) -> int:
    """Execute one notebook (see the module docstring); exit 0 when every cell ran, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m coursetools.shellrun", description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path, help="the notebook to execute (.ipynb)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the executed notebook")
    parser.add_argument("--result", type=Path, required=True, help="where to write the result (JSON)")
    parser.add_argument("--cwd", type=Path, help="folder to run in (default: the notebook's own)")
    parser.add_argument("--echo", action="store_true", help="also print the cells' output as it comes")
    args = parser.parse_args(argv)
    import nbformat

    out, result_file = args.out.resolve(), args.result.resolve()  # the cells run in another folder
    nb = nbformat.read(args.notebook, as_version=4)
    os.environ.setdefault("MPLBACKEND", "Agg")  # no display here; the lessons save their figures
    start = time.perf_counter()
    outcome = execute(nb, (args.cwd or args.notebook.parent).resolve(), echo=args.echo)
    outcome.update(
        schema=RESULT_SCHEMA, wall_s=round(time.perf_counter() - start, 2), peak_device_bytes=device_peak_bytes()
    )
    nbformat.write(nb, out)
    result_file.write_text(json.dumps(outcome, indent=1) + "\n", encoding="utf-8")
    return 0 if outcome["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
