"""The headless course runner: ``python -m dpcourse run``.

Executes the notebooks in order with nbclient, each in a fresh kernel, on
the default backend and profile; writes the executed notebooks and
``results.json`` into the output folder; prints a summary; fails (exit
status 1) when any notebook fails, naming the notebook and the cell.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dpcourse.results import RESULTS_ENV, read_records, write_json_atomic

SCHEMA_VERSION = 1
NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"


@dataclass
class NotebookRun:
    """Outcome of one notebook: ``status`` is "passed" or "failed"."""

    notebook: str
    status: str
    wall_s: float
    error_cell: int | None = None  # 0-based index among all cells
    error: str | None = None
    output: str | None = None  # executed notebook, relative to the output folder


def find_notebooks(directory: Path = NOTEBOOK_DIR, only: list[str] | None = None) -> list[Path]:
    """The numbered ``NN_name.ipynb`` notebooks in order, optionally filtered.

    ``only`` holds names or prefixes (``"03"``, ``"03_mesh"``, ``"03_mesh.ipynb"``).

    Raises:
        FileNotFoundError: the folder has no numbered notebooks, or a name in
            ``only`` matches none (the message lists the valid names).
    """
    found = sorted(p for p in Path(directory).glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise FileNotFoundError(f"No numbered notebooks (NN_name.ipynb) in {directory}.")
    if not only:
        return found
    chosen = []
    for name in only:
        stem = Path(name).stem
        matches = [p for p in found if p.stem == stem or p.stem.startswith(stem + "_") or p.stem[:2] == stem]
        if not matches:
            valid = ", ".join(p.stem for p in found)
            raise FileNotFoundError(f"No notebook matches {name!r}. Valid names: {valid}.")
        chosen.extend(m for m in matches if m not in chosen)
    return sorted(chosen)


def _error_text(err: Exception) -> str:
    text = str(err).strip().splitlines()
    # nbclient's message ends with the exception line; keep it short.
    tail = [line for line in text if line.strip()][-3:]
    return " | ".join(tail)[:600]


def run_notebook(path: Path, out_dir: Path, results_file: Path, profile: str | None,
                 cell_timeout_s: int, on_cell=None) -> NotebookRun:
    """Execute one notebook in a fresh kernel with nbclient and save it executed.

    The kernel starts in the notebook's folder with ``DPCOURSE_PROFILE`` (when
    ``profile`` is given) and ``DPCOURSE_RESULTS`` set, so the notebook's
    ``parameters`` cell and the results recorder see them.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    current = {"index": None}

    def started(cell, cell_index, **_):
        current["index"] = cell_index
        if on_cell is not None:
            on_cell(path.stem, cell_index, len(nb.cells))

    saved = {k: os.environ.get(k) for k in ("DPCOURSE_PROFILE", RESULTS_ENV)}
    if profile:
        os.environ["DPCOURSE_PROFILE"] = profile
    os.environ[RESULTS_ENV] = str(results_file)
    client = NotebookClient(
        nb,
        timeout=cell_timeout_s,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        on_cell_start=started,
    )
    start = time.perf_counter()
    status, error, error_cell = "passed", None, None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as err:
        status, error, error_cell = "failed", _error_text(err), current["index"]
    except Exception as err:  # noqa: BLE001 - e.g. no such kernel: record it, run the next notebook
        status, error, error_cell = "failed", f"{type(err).__name__}: {err}"[:600], current["index"]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    wall = time.perf_counter() - start
    out_path = out_dir / path.name
    nbformat.write(nb, out_path)
    return NotebookRun(path.stem, status, round(wall, 2), error_cell, error, out_path.name)


def run_course(profile: str | None, notebooks: list[Path], out_dir: Path, cell_timeout_s: int = 1800) -> dict:
    """Run ``notebooks`` in order and write ``results.json`` in ``out_dir``.

    A failing notebook is recorded and the next one still runs (each starts
    from a fresh kernel). Returns the results payload.
    """
    from tqdm.auto import tqdm

    out_dir = out_dir.resolve()  # kernels run in the notebooks' folder
    out_dir.mkdir(parents=True, exist_ok=True)
    records_file = out_dir / "records.jsonl"
    if records_file.exists():
        records_file.unlink()
    runs: list[NotebookRun] = []
    payload: dict = {}
    bar = tqdm(notebooks, desc="notebooks", unit="nb", file=sys.stderr, mininterval=1.0)

    def on_cell(name, index, total):
        bar.set_postfix_str(f"{name} cell {index + 1}/{total}", refresh=False)

    for path in bar:
        runs.append(run_notebook(path, out_dir, records_file, profile, cell_timeout_s, on_cell))
        payload = {
            "schema": SCHEMA_VERSION,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "profile": profile or "auto",
            "notebooks": [asdict(r) for r in runs],
            "records": read_records(records_file),
        }
        write_json_atomic(out_dir / "results.json", payload)
    bar.close()
    return payload


def print_summary(payload: dict, out_dir: Path) -> None:
    """Print the notebooks' status and their recorded figures (rich tables)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    nb_table = Table(title=f"Course run ({out_dir})")
    for col in ("notebook", "status", "wall s", "failed cell", "error"):
        nb_table.add_column(col)
    for r in payload["notebooks"]:
        colour = "green" if r["status"] == "passed" else "red"
        nb_table.add_row(r["notebook"], f"[{colour}]{r['status']}[/{colour}]", f"{r['wall_s']:.1f}",
                         "" if r["error_cell"] is None else str(r["error_cell"]), r["error"] or "")
    console.print(nb_table)
    records = payload.get("records", [])
    if records:
        first = records[0]
        rec_table = Table(title=(f"Recorded figures: profile {first['profile']}, data {first['data_source']}, "
                                 f"JAX {first['jax_version']}"))
        for col in ("notebook", "metric", "value", "unit", "devices"):
            rec_table.add_column(col)
        for rec in records:
            value = rec["value"]
            text = f"{value:.4g}" if isinstance(value, float) else str(value)
            rec_table.add_row(rec["notebook"], rec["metric"], text, rec["unit"],
                              f"{rec['device_count']} x {rec['device_kind']}")
        console.print(rec_table)
    console.print(f"Executed notebooks and results.json: {out_dir}")
