"""The headless course runner: ``python -m coursetools run``.

Executes the notebooks in order with nbclient, each in a fresh kernel, on
the default backend and profile; writes the executed notebooks and
``results.json`` into the output folder; prints a summary; fails (exit
status 1) when any notebook fails, naming the notebook and the cell.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coursetools import paths
from coursetools.choose import find_notebooks  # noqa: F401 - the runner's selection, used by the command line
from coursetools.outfolder import (  # noqa: F401 - the errors are re-exported for the command line
    DiskFullError,
    FolderInUse,
    OutputFolderError,
    acquire_lock,
    check_output_folder,
    disk_full_message,
    is_disk_full,
    keep_previous_results,
    release_lock,
    write_atomic,
    write_json_atomic,
)
from dpcourse.data import DATA_DIR_ENV
from dpcourse.exercises.base import STRICT_ENV
from dpcourse.record import RESULTS_ENV, read_records

SCHEMA_VERSION = 1
FIGURES_FILE = "figures.txt"  # the recorded figures as a table, beside results.json
RESERVE_FILE = ".results-reserve"  # freed on a full disk so that results.json can still be written
RESERVE_BYTES = 4 * 2**20  # results.json and figures.txt of a full run are well under 1 MB each
NOTEBOOK_DIR = paths.NOTEBOOKS


@dataclass
class NotebookRun:
    """Outcome of one notebook: ``status`` is "passed" or "failed"."""

    notebook: str
    status: str
    wall_s: float
    error_cell: int | None = None  # 0-based index among all cells (markdown too)
    error_code_cell: int | None = None  # 1-based number among code cells, as a learner counts
    error: str | None = None
    output: str | None = None  # executed notebook, relative to the output folder
    # Peaks over the run (coursetools/memwatch.py): the kernel and its children's RSS; GPU memory via nvidia-smi.
    peak_rss_bytes: int | None = None
    peak_gpu_bytes: int | None = None
    # JAX's own high-water mark of the accelerator (peak_bytes_in_use, largest device); shell kernel only.
    peak_device_bytes: int | None = None


KERNELS = ("ipykernel", "shell")  # how a notebook runs: a Jupyter kernel, or IPython's shell in a process


class KernelSetupError(RuntimeError):
    """The notebooks' kernels cannot start with this interpreter."""


def kernel_argv(python: str | None = None) -> list[str]:
    """The command that starts a notebook kernel: ``python -m ipykernel_launcher`` of the runner's interpreter.

    The runner never looks up an installed ``python3`` kernelspec, which may
    start another Python (one without JAX, or another virtual environment):
    the kernels run with the interpreter, and so the packages, of the runner.
    """
    return [python or sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]


def check_kernel_interpreter(python: str | None = None) -> str:
    """Check that ``python`` (default: this interpreter) can start an IPython kernel; return it.

    Raises:
        KernelSetupError: ipykernel is not importable there; the message names
            the interpreter and what to install.
    """
    import importlib.util

    python = python or sys.executable
    if python == sys.executable:
        missing = importlib.util.find_spec("ipykernel") is None
    else:  # pragma: no cover - the runner always checks its own interpreter
        import subprocess

        missing = subprocess.run([python, "-c", "import ipykernel"], capture_output=True).returncode != 0
    if missing:
        raise KernelSetupError(
            f"The notebooks' kernels run with this interpreter, {python}, which lacks ipykernel. "
            f"Install the course's requirements into it: {python} -m pip install -r requirements.txt "
            "(or at least ipykernel)."
        )
    return python


def _kernel_manager_class():
    """A jupyter_client kernel manager that starts :func:`kernel_argv`, whatever kernelspecs are installed."""
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager

    class RunnerKernelManager(AsyncKernelManager):
        @property
        def kernel_spec(self):
            if self._kernel_spec is None:
                self._kernel_spec = KernelSpec(
                    argv=kernel_argv(),
                    display_name=f"Python {sys.version.split()[0]} ({sys.executable})",
                    language="python",
                    resource_dir="",
                )
            return self._kernel_spec

    return RunnerKernelManager


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def dead_kernel_text(exit_code: int | None, stderr_text: str = "") -> str:
    """Why a kernel died, from its exit status and its own stderr; "out of memory" only for a kill.

    XLA ends the process with status 1 and a fatal line on a bad
    ``XLA_FLAGS`` token (:func:`dpcourse.backend.xlaflags.describe_abort`); the
    Linux out-of-memory killer sends SIGKILL and leaves no message.
    """
    import signal

    from dpcourse.backend.xlaflags import describe_abort

    flags = describe_abort(stderr_text)
    if flags:
        return f"DeadKernelError: the kernel stopped at start: {flags}"
    lines = [line.strip() for line in _ANSI.sub("", stderr_text).splitlines() if line.strip()]
    last = f" Its last message: {lines[-1][:300]}" if lines else ""
    if exit_code is not None and exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        if -exit_code == signal.SIGKILL:
            return (
                "DeadKernelError: the kernel was killed (SIGKILL), most often by the out-of-memory killer: "
                "`dmesg` or `journalctl -k` says so; use a smaller profile (--profile smoke) or free memory." + last
            )
        return f"DeadKernelError: the kernel died of {name}." + last
    if exit_code is not None:
        return f"DeadKernelError: the kernel exited with status {exit_code}." + last
    return "DeadKernelError: the kernel died." + last


def _error_text(
    err: BaseException, cell_timeout_s: int | None = None, exit_code: int | None = None, stderr_text: str = ""
) -> str:
    """One line: the exception's type and the first line of its message, without colour codes."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    if isinstance(err, CellTimeoutError):
        return f"CellTimeoutError: the cell ran longer than {cell_timeout_s} s (--cell-timeout)"
    if isinstance(err, DeadKernelError):
        return dead_kernel_text(exit_code, stderr_text)
    if type(err).__name__ == "NoSuchKernel" or "No such kernel" in str(err):
        return (
            f"{type(err).__name__}: {err}. Install ipykernel into the runner's Python: "
            f"{sys.executable} -m pip install ipykernel (or -r requirements.txt)."
        )
    if "Kernel didn't respond" in str(err):  # jupyter_client: the kernel never answered over its sockets
        from dpcourse.multihost.ports import tcp_unavailable

        why = tcp_unavailable()
        return (
            f"{type(err).__name__}: {err}: the kernel talks to the runner over TCP on 127.0.0.1"
            + (f", and here {why[0].lower()}{why[1:]}" if why else " (a busy machine can also delay it)")
            + " Run with --kernel shell: the notebook then runs in one Python process, without a kernel's sockets."
        )
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    if ename:
        lines = [line.strip() for line in _ANSI.sub("", str(evalue or "")).splitlines() if line.strip()]
        return f"{ename}: {lines[0] if lines else ''}"[:600]
    lines = [line.strip() for line in _ANSI.sub("", str(err)).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:600]


def run_notebook(
    path: Path,
    out_dir: Path,
    results_file: Path,
    profile: str | None,
    cell_timeout_s: int,
    on_cell=None,
    solutions: bool = False,
    kernel: str = "ipykernel",
) -> NotebookRun:
    """Execute one notebook in a fresh kernel with nbclient and save it executed.

    With ``kernel="shell"`` the notebook runs in a fresh Python process of
    its own with IPython's shell instead (:mod:`coursetools.shellrun`): no
    kernel and no sockets, for hosts where processes cannot open TCP
    sockets; ``cell_timeout_s`` then bounds the whole notebook.

    The kernel runs with this interpreter (:func:`kernel_argv`), never with
    another Python that an installed ``python3`` kernelspec names.

    The kernel starts in the notebook's folder with ``DPCOURSE_PROFILE`` (when
    ``profile`` is given) and ``DPCOURSE_RESULTS`` set, so the notebook's
    ``parameters`` cell and the results recorder see them. With ``solutions``
    the exercise cells get their solutions (``solutions/``) and every checker
    must report success (``DPCOURSE_EXERCISES_STRICT=1``).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    if solutions:
        from coursetools.solutions import fill_solutions

        fill_solutions(nb, path.stem)
    current = {"index": None, "process": None}
    from coursetools.memwatch import PeakMemory

    memory = PeakMemory()

    def started(cell, cell_index, **_):
        current["index"] = cell_index
        if current["process"] is None:  # the kernel's Popen, to read its exit status if it dies
            current["process"] = getattr(getattr(client.km, "provisioner", None), "process", None)
            if current["process"] is not None:
                memory.watch(current["process"].pid)
        if on_cell is not None:
            on_cell(path.stem, cell_index, len(nb.cells))

    client = NotebookClient(
        nb,
        timeout=cell_timeout_s,
        kernel_name="python3",
        # The runner's own interpreter, not whatever a "python3" kernelspec starts.
        kernel_manager_class=_kernel_manager_class(),
        # Quieter kernel start (ipykernel warns about its TCP transport on loopback).
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
        resources={"metadata": {"path": str(path.parent)}},
        on_cell_start=started,
    )
    import tempfile

    if kernel not in KERNELS:
        raise ValueError(f"Unknown kernel {kernel!r}. Valid: {', '.join(KERNELS)}.")
    start = time.perf_counter()
    status, error, error_cell = "passed", None, None
    interrupted, device_peak = False, None
    # The kernel's own stderr (XLA's fatal lines land there, not in the notebook).
    kernel_stderr = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115 - closed in the finally below
    # The kernel inherits these; set only now, right before the try whose finally puts them back, so
    # nothing that fails earlier (the client's set-up) leaves them set in the caller's process.
    saved = {k: os.environ.get(k) for k in ("DPCOURSE_PROFILE", RESULTS_ENV, DATA_DIR_ENV, STRICT_ENV)}
    if solutions:
        os.environ[STRICT_ENV] = "1"
    if profile:
        os.environ["DPCOURSE_PROFILE"] = profile
    os.environ[RESULTS_ENV] = str(results_file)
    if os.environ.get(DATA_DIR_ENV):  # the kernel runs in notebooks/: keep relative paths the user's
        os.environ[DATA_DIR_ENV] = os.path.abspath(os.path.expanduser(os.environ[DATA_DIR_ENV]))
    try:
        if kernel == "shell":
            from coursetools.shellrun import run_for_runner

            nb, status, error, error_cell, device_peak = run_for_runner(
                nb, path, out_dir, memory, cell_timeout_s, on_cell
            )
            interrupted = status == "interrupted"
        else:
            client.execute(stderr=kernel_stderr)
    except KeyboardInterrupt:
        status, error, error_cell, interrupted = "interrupted", "KeyboardInterrupt: run stopped", current["index"], True
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as err:
        exit_code, text = None, ""
        if isinstance(err, DeadKernelError):
            process = current["process"]
            exit_code = process.poll() if process is not None else None
            kernel_stderr.seek(0)
            text = kernel_stderr.read()[-20000:].decode("utf-8", "replace")
        status, error, error_cell = "failed", _error_text(err, cell_timeout_s, exit_code, text), current["index"]
        if getattr(err, "ename", None) == "KeyboardInterrupt":
            status, interrupted = "interrupted", True
    except Exception as err:  # noqa: BLE001 - e.g. no such kernel: record it, run the next notebook
        status, error, error_cell = "failed", _error_text(err), current["index"]
    finally:
        # On SIGINT/SIGTERM nbclient's own handler shuts the kernel down (and
        # marks it with this attribute); what surfaces here is then some
        # unrelated error. Treat it as the interruption it was.
        if hasattr(client, "_async_cleanup_kernel_future"):
            status, interrupted = "interrupted", True
            error = "KeyboardInterrupt: run stopped (SIGINT or SIGTERM)"
        # nbclient registers its kernel's clean-up at exit before the kernel starts, and takes it back only
        # after a run whose kernel started: one that never answered (cleaned up already) failed at exit
        # with an AssertionError under the runner's last line. The kernel is done with here, either way.
        atexit.unregister(client._cleanup_kernel)
        if client.km is not None and client.km.has_kernel:
            client._cleanup_kernel()
        kernel_stderr.close()
        peaks = memory.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    wall = time.perf_counter() - start
    out_path = out_dir / path.name
    write_atomic(out_path, nbformat.writes(nb))  # never a half-written notebook (a full disk)
    code_cell = None
    if error_cell is not None:
        code_cell = sum(1 for c in nb.cells[: error_cell + 1] if c.cell_type == "code")
    run = NotebookRun(
        path.stem,
        status,
        round(wall, 2),
        error_cell=error_cell,
        error=error,
        output=out_path.name,
        error_code_cell=code_cell,
        **peaks,
        peak_device_bytes=device_peak,
    )
    if interrupted:
        raise RunInterrupted(run)
    return run


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a notebook: the run stops after saving what it has."""

    def __init__(self, run: NotebookRun):
        super().__init__(run.notebook)
        self.run = run


def _progress(notebooks: list[Path]):
    """A tqdm bar over ``notebooks`` on stderr, or one line per notebook where tqdm is not installed."""
    try:
        from tqdm.auto import tqdm
    except ImportError:

        class _Lines:
            def __init__(self, items):
                self.items = items

            def __iter__(self):
                for i, item in enumerate(self.items, start=1):
                    print(f"notebook {i}/{len(self.items)}: {item.stem}", file=sys.stderr, flush=True)
                    yield item

            def set_postfix_str(self, *_, **__):
                pass

            def close(self):
                pass

        return _Lines(notebooks)
    return tqdm(notebooks, desc="notebooks", unit="nb", file=sys.stderr, mininterval=1.0)


def run_course(
    profile: str | None,
    notebooks: list[Path],
    out_dir: Path,
    cell_timeout_s: int = 1800,
    solutions: bool = False,
    kernel: str = "ipykernel",
) -> dict:
    """Run ``notebooks`` in order and write ``results.json`` in ``out_dir``.

    A failing notebook is recorded and the next one still runs (each starts
    from a fresh kernel). Ctrl-C stops the run: the notebook is recorded as
    "interrupted", ``results.json`` is written, and :class:`RunInterrupted`
    propagates. The run holds ``out_dir``'s lock while it runs
    (:func:`coursetools.outfolder.acquire_lock`); every file it writes there
    is written atomically. ``results.json`` also holds the machine, its load
    and the course commit (:func:`coursetools.timings.machine_info`), and
    ``figures.txt`` the recorded figures as a table. Returns the results payload.

    Raises:
        OutputFolderError: ``out_dir`` cannot hold the results (a file, not
            writable, or the notebooks' own folder).
        FolderInUse: another run holds ``out_dir``; nothing was run.
        DiskFullError: the disk filled up; the files written so far are whole.
        KernelSetupError: this interpreter cannot start kernels (no
            ipykernel); nothing was run.
    """
    from coursetools.timings import course_commit, load_average, machine_info

    check_kernel_interpreter()
    out_dir = check_output_folder(out_dir, notebooks)
    lock = acquire_lock(out_dir, command=" ".join(["python -m coursetools", *sys.argv[1:]]))
    runs: list[NotebookRun] = []
    saved: list[int] = []  # how many notebooks each results.json this run wrote holds
    try:
        kept = keep_previous_results(out_dir, notebooks)
        if kept is not None:
            print(
                f"note: {out_dir / 'results.json'} held notebooks this run does not repeat; it is kept as {kept}.",
                file=sys.stderr,
            )
        records_file = out_dir / "records.jsonl"
        if records_file.exists():
            records_file.unlink()
        payload: dict = {}
        machine = machine_info()
        commit = course_commit()
        # Room kept for the last results.json: on a full disk it is freed, so the run's record
        # (which notebook stopped, and why) is still written.
        reserve = out_dir / RESERVE_FILE
        write_atomic(reserve, b"\0" * RESERVE_BYTES)  # DiskFullError, naming the folder, when even this fails
        bar = _progress(notebooks)  # after the reserve: a bar left open would share the error's line

        def on_cell(name, index, total):
            bar.set_postfix_str(f"{name} cell {index + 1}/{total}", refresh=False)

        def save() -> dict:
            try:
                return write_payload()
            except (OSError, DiskFullError) as err:
                if not is_disk_full(err) and not isinstance(err, DiskFullError) or not reserve.exists():
                    raise
                reserve.unlink()
                return write_payload()

        def write_payload() -> dict:
            payload = {
                "schema": SCHEMA_VERSION,
                "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "profile": profile or "auto",
                "commit": commit,
                "machine": {**machine, "load_average_end": load_average()},
                "solutions": solutions,  # what the timings record checks: a learner's lessons, at their own devices
                "cpu_devices": forced_cpu_devices(),
                "notebooks": [asdict(r) for r in runs],
                "records": read_records(records_file),
            }
            write_json_atomic(out_dir / "results.json", payload)
            saved.append(len(runs))
            write_atomic(out_dir / FIGURES_FILE, figures_text(payload) + "\n")
            return payload

        try:
            for path in bar:
                try:
                    runs.append(
                        run_notebook(
                            path, out_dir, records_file, profile, cell_timeout_s, on_cell, solutions, kernel=kernel
                        )
                    )
                    said_full = runs[-1].error and (
                        "No space left on device" in runs[-1].error or "Errno 28" in runs[-1].error
                    )
                    if said_full and not _has_room(out_dir):
                        # The kernel's own writes there (records). A full disk elsewhere (the temporary folder
                        # a lesson writes to) is that notebook's failure, in its own words.
                        raise DiskFullError(disk_full_message(out_dir))
                except RunInterrupted as stop:
                    runs.append(stop.run)
                    raise
                except (OSError, DiskFullError) as err:
                    if is_disk_full(err) or isinstance(err, DiskFullError):
                        if not runs or runs[-1].notebook != path.stem:  # its executed copy could not be saved
                            why = "No space left on device while saving the executed notebook"
                            runs.append(NotebookRun(path.stem, "failed", 0.0, error=f"DiskFullError: {why}"))
                        raise DiskFullError(disk_full_message(out_dir)) from err
                    raise
                finally:
                    try:
                        payload = save()
                    except OSError as err:
                        if is_disk_full(err):
                            raise DiskFullError(disk_full_message(out_dir)) from None
                        raise
        finally:
            bar.close()
            with contextlib.suppress(FileNotFoundError):
                reserve.unlink()
    except DiskFullError as err:  # said once what this run's results.json holds, as it is now
        raise DiskFullError(disk_full_message(out_dir, recorded_words(saved, runs))) from err.__cause__
    finally:
        release_lock(lock)
    return payload


def forced_cpu_devices() -> int | None:
    """The CPU device count ``XLA_FLAGS`` forces on the lessons' kernels, or None (the lessons' own)."""
    found = re.findall(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(found[-1]) if found else None


def _has_room(folder: Path, n_bytes: int = 64 * 1024) -> bool:
    """Whether ``folder`` takes a file of ``n_bytes`` now (written through :func:`write_atomic`, then removed)."""
    probe = folder / ".room-probe"
    try:
        write_atomic(probe, b"\0" * n_bytes)
    except (OSError, DiskFullError):
        return False
    finally:
        probe.unlink(missing_ok=True)
    return True


def recorded_words(saved: list[int], runs: list[NotebookRun]) -> str:
    """What a run stopped by a full disk recorded: ``saved`` counts the notebooks of each results.json it wrote."""
    if not saved or not saved[-1]:
        return ""  # disk_full_message's own words: nothing of this run could be recorded
    if saved[-1] == len(runs) and runs[-1].status != "passed":
        return "results.json there says which notebook stopped and why"
    finished = ", ".join(run.notebook for run in runs[: saved[-1]])
    return f"results.json there holds the {saved[-1]} notebook(s) run before the disk filled ({finished}); the rest are not in it"


def _plain_table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
    return lines


def figures_text(payload: dict) -> str:
    """The recorded figures of a results payload as a plain-text table (``figures.txt``, ``--figures``)."""
    records = payload.get("records", [])
    if not records:
        return "No figures were recorded."

    def distinct(field):
        values = sorted({str(r.get(field)) for r in records if r.get(field) not in (None, "none", "n/a")})
        return ", ".join(values) or "none"

    rows = []
    for rec in records:
        value = rec["value"]
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        rows.append(
            [rec["notebook"], rec["metric"], text, rec["unit"], f"{rec['device_count']} x {rec['device_kind']}"]
        )
    title = (
        f"Recorded figures: profile {distinct('profile')}, data {distinct('data_source')}, "
        f"JAX {distinct('jax_version')}"
    )
    return "\n".join([title, *_plain_table(rows, ["notebook", "metric", "value", "unit", "devices"])])


def summary_text(payload: dict, out_dir: Path) -> str:
    """The pass/fail table of a run, plain text: no optional package needed."""
    runs = payload["notebooks"]
    passed = sum(r["status"] == "passed" for r in runs)
    rows = [
        [
            r["notebook"],
            r["status"] if r["status"] == "passed" else r["status"].upper(),
            f"{r['wall_s']:.1f}",
            "" if r.get("error_code_cell") is None else f"code cell {r['error_code_cell']}",
            r.get("error") or "",
        ]
        for r in runs
    ]
    total = sum(r["wall_s"] for r in runs)
    head = f"Course run ({out_dir}): {passed} of {len(runs)} notebooks passed, {total:.0f} s of notebook time"
    return "\n".join([head, *_plain_table(rows, ["notebook", "status", "wall s", "failed cell", "error"])])


def print_summary(payload: dict, out_dir: Path, figures: bool = False) -> None:
    """Print the notebooks' status (last, where a learner sees it); the figures table only with ``figures``.

    Plain text, so the summary never needs an optional package. Without
    ``figures``, one line says where the figures are (``results.json`` and
    ``figures.txt``) and how to print them.
    """
    n_records = len(payload.get("records", []))
    if figures:
        print(figures_text(payload))
        print()
    print(summary_text(payload, out_dir))
    if n_records and not figures:
        print(
            f"{n_records} recorded figures: {Path(out_dir) / FIGURES_FILE} (and results.json); --figures prints them."
        )
    print(f"Executed notebooks and results.json: {out_dir}")
