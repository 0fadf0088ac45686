"""Record a notebook's key figures for ``results.json``.

Every notebook records its key figures in a call or two (:func:`figures`, :func:`bench`). Under the headless runner
(``python -m coursetools run``), ``DPCOURSE_RESULTS`` names a JSON-lines file
and each record is appended to it; the runner merges them into
``results.json``. Run interactively, recording is a no-op unless you call
:func:`enable` (or set ``DPCOURSE_RESULTS`` yourself).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS_ENV = "DPCOURSE_RESULTS"

_context: dict[str, Any] = {}
_path: Path | None = None


@dataclass(frozen=True)
class Record:
    """One figure: what, how much, in which unit, measured where."""

    notebook: str
    metric: str
    value: float | int | str | None
    unit: str
    profile: str
    data_source: str
    backend: str
    device_kind: str
    device_count: int
    jax_version: str


def enable(path: str | os.PathLike) -> None:
    """Record into ``path`` (JSON lines) from now on, in this process."""
    global _path
    _path = Path(path)


def disable() -> None:
    """Stop recording (the default when run interactively)."""
    global _path
    _path = None


def active_path() -> Path | None:
    """Where records go: :func:`enable`'s path, else ``$DPCOURSE_RESULTS``, else None."""
    if _path is not None:
        return _path
    env = os.environ.get(RESULTS_ENV)
    return Path(env) if env else None


def set_context(
    notebook: str,
    profile: str,
    data_source: str,
    backend: str,
    device_kind: str,
    device_count: int,
    jax_version: str | None = None,
) -> None:
    """Fields that every later :func:`record` call in this process carries.

    ``device_kind`` and ``device_count`` describe the devices the notebook's
    measurements ran on (which may be simulated CPU devices on a 1-GPU node).
    """
    if jax_version is None:
        import jax

        jax_version = jax.__version__
    _context.update(
        notebook=notebook,
        profile=profile,
        data_source=data_source,
        backend=backend,
        device_kind=device_kind,
        device_count=int(device_count),
        jax_version=jax_version,
    )


def _clean(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / JAX scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    return value


def record(metric: str, value: Any, unit: str, **overrides: Any) -> Record | None:
    """Record one figure; returns the record, or None when recording is off.

    ``overrides`` replace context fields for this record (e.g. another
    ``device_count`` for the single-device baseline inside a multi-device
    notebook).

    Raises:
        RuntimeError: recording is on but :func:`set_context` was not called.
    """
    path = active_path()
    if path is None:
        return None
    fields = {**_context, **overrides}
    missing = [
        f
        for f in ("notebook", "profile", "data_source", "backend", "device_kind", "device_count", "jax_version")
        if f not in fields
    ]
    if missing:
        raise RuntimeError(f"Call dpcourse.record.set_context() before record(); missing {missing}.")
    rec = Record(metric=metric, value=_clean(value), unit=unit, **fields)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        start = fh.tell()
        try:
            fh.write(json.dumps(asdict(rec)) + "\n")
            fh.flush()
        except OSError:  # a full disk: no half line that would spoil the file for every reader
            with contextlib.suppress(OSError):
                fh.truncate(start)
            raise
    return rec


def figures(values: Mapping[str, tuple[Any, str]], **overrides: Any) -> list[Record]:
    """Record several figures at once: ``{metric: (value, unit)}``, in order; returns the records (empty when off).

    A value of None is left out (a figure this run could not measure), so a
    lesson can build the whole dict and record it in one call. ``overrides``
    apply to every figure, as in :func:`record`.

    Raises:
        RuntimeError: recording is on but :func:`set_context` was not called.
        ValueError: an entry is not a ``(value, unit)`` pair (the metric is named).
    """
    out = []
    for metric, pair in values.items():
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], str)):
            raise ValueError(f"record.figures: {metric!r} must map to (value, unit), got {pair!r}.")
        if pair[0] is None:
            continue
        rec = record(metric, pair[0], pair[1], **overrides)
        if rec is not None:
            out.append(rec)
    return out


def bench(result: Any, suffix: str = "", *, accuracy: bool = True, **overrides: Any) -> list[Record]:
    """Record a :class:`dpcourse.bench.BenchResult` in one call: throughput, ms_per_step, compile_time, final loss.

    The metrics are ``throughput{suffix}`` (examples/s), ``ms_per_step{suffix}``
    (ms), ``compile_time{suffix}`` (s), ``final_loss{suffix}`` and, with
    ``accuracy``, ``final_accuracy{suffix}`` (fraction): the names
    ``results.json`` and the baselines in ``baselines/`` use.
    """
    return figures(
        {
            f"throughput{suffix}": (result.examples_per_s, "examples/s"),
            f"ms_per_step{suffix}": (result.ms_per_step, "ms"),
            f"compile_time{suffix}": (result.compile_s, "s"),
            f"final_loss{suffix}": (result.final_loss, "loss"),
            f"final_accuracy{suffix}": (result.final_accuracy if accuracy else None, "fraction"),
        },
        **overrides,
    )


def save_figure(fig, name: str) -> Path | None:
    """Save a matplotlib figure as PNG beside the records, when recording is on.

    The file is ``<notebook>_<name>.png`` in the folder of the records file
    (the runner's output folder). Returns its path, or None when recording is
    off (a notebook run by hand).
    """
    path = active_path()
    if path is None:
        return None
    target = path.parent / f"{_context.get('notebook', 'figure')}_{name}.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:  # whole or absent: a full disk leaves no truncated PNG
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return target


@contextlib.contextmanager
def whole_folder(target: str | os.PathLike):
    """Write a folder of files whole or not at all: yields a new folder beside ``target`` to write into.

    When the block ends without an error, its files move into ``target``
    (created if needed; each by ``os.replace``, so a name already there is
    replaced by the new file); on an error (a full disk while a profiler
    writes its trace) the new folder is removed and the error goes on:
    ``target`` keeps only files that were complete. Notebook 09 writes its
    profiler trace through it.
    """
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        yield scratch
        for path in sorted(scratch.rglob("*")):
            if path.is_file():
                dest = target / path.relative_to(scratch)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def output_dir(name: str | None = None) -> Path:
    """The folder where a lesson writes files (traces, tables), created if needed.

    Under the runner (recording on) it is the run's output folder, beside the
    records; otherwise ``<cwd>/results``, which in the lab is the workspace's
    ``results/`` (a kernel's working folder is its notebook's folder). With
    ``name``, the sub-folder ``<notebook>_<name>`` of it (e.g.
    ``09_performance_trace`` for notebook 09's profiler trace).
    """
    path = active_path()
    base = path.parent if path is not None else Path.cwd() / "results"
    target = base / f"{_context.get('notebook', 'output')}_{name}" if name else base
    target.mkdir(parents=True, exist_ok=True)
    return target


def read_records(path: str | os.PathLike) -> list[dict]:
    """Read a JSON-lines file written by :func:`record` (missing file: empty list).

    Raises:
        ValueError: a line is not valid JSON (the message gives the line number).
    """
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON record ({err}).") from err
    return out


def write_json_atomic(path: str | os.PathLike, payload: Any) -> Path:
    """Write JSON to ``path`` through a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path
