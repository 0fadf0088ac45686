"""Compare two course runs and flag regressions: ``python -m coursetools compare OLD NEW``.

Reads two ``results.json`` files written by the runner
(:mod:`coursetools.runner`, schema 1)::

    {"schema": 1, "created": ..., "profile": ...,
     "notebooks": [{"notebook", "status", "wall_s", "error_cell", "error", "output"}],
     "records":   [{"notebook", "metric", "value", "unit", "profile", "data_source",
                    "backend", "device_kind", "device_count", "jax_version"}]}

prints every metric side by side (old, new, change in %), and returns an
exit status:

- **1 (regression)** when
  - a notebook that passed in OLD fails in NEW or is missing from NEW, or a
    notebook that is new in NEW fails (a notebook that failed in both runs
    is only warned about);
  - a throughput measured in OLD is missing (e.g. a sweep size that now
    fails) or not a number in NEW, on the same hardware and profile;
  - an equivalence difference in NEW exceeds its tolerance. Convention: a
    record that has a sibling ``<metric>_tolerance`` record, or whose metric
    holds ``max_abs_`` (parameter, gradient or loss differences, e.g.
    ``max_abs_param_diff_vs_1_device``, lesson 13's
    ``survivors_max_abs_param_diff``), is checked against the record ``<metric>_tolerance``
    of the same notebook: OLD's, on the same hardware and profile (a NEW run
    that loosens its own bound is held to OLD's, and told so), else NEW's
    (OLD's when NEW has none). A non-numeric difference (``"nan"``) fails,
    with a tolerance or without; a number without any tolerance is a warning;
  - a throughput (unit ``examples/s``) falls by more than ``threshold``
    (a fraction: 0.10 is a 10 % drop), for a metric measured on the same
    hardware (backend, device kind, device count) and profile in both runs,
    on an accelerator. On the CPU backend such a drop is a warning: CPU
    devices, simulated ones above all, share a few busy cores and two runs
    of one commit differ by tens of percent. Throughputs measured on
    different hardware or profiles get no verdict ("not comparable").
  - a status record (metric ending ``_status``, e.g. notebook 09's
    ``rung_unrolled_f32_status``) was ``"ok"`` in OLD and is anything else
    in NEW, on the same hardware and profile (a rung or ceiling that ran
    before and fails now; on other hardware it is a warning).
- **0** otherwise, with warnings where a figure with a sibling
  ``<metric>_target`` record (a goal, e.g. notebook 09's fraction of the
  measured matmul ceiling) is below its target on an accelerator (on the
  CPU backend that is information: the targets are set for GPUs), and
  with warnings where a collective count or byte total
  (metrics starting with ``collective``) changed between runs on the same
  hardware: the compiled program moved its all-reduces. Differences of hardware, profile or data source between
  the runs are warnings (a throughput drop across different hardware or
  profiles is reported but not counted: the numbers are not comparable);
  a different JAX version is information (comparing JAX versions is what
  the command is for).
- **2** when a file is missing, unreadable or not a results file (the
  message names it), or ``threshold`` is negative.

Records are matched by notebook, metric name and, where a notebook records
the same metric more than once, by the order of the records. A record
renamed since a results file was written is read under its new name
(:data:`RENAMED`), so the committed baselines stay comparable.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
THROUGHPUT_UNIT = "examples/s"
EQUIVALENCE_MARK = "max_abs_"  # max_abs_param_diff_*, max_abs_grad_diff_*, survivors_max_abs_param_diff
TOLERANCE_SUFFIX = "_tolerance"
STATUS_SUFFIX = "_status"
TARGET_SUFFIX = "_target"
COLLECTIVES_PREFIX = "collective"  # collectives_per_step_*, collective_bytes_per_step_*, collectives_in_loop_*
HARDWARE_FIELDS = ("backend", "device_kind", "device_count")
_TEXT = {"type": ["string", "null"]}
# What compare reads of a results.json (coursetools.runner, dpcourse.record.Record), and the types it needs.
RESULTS_SCHEMA = {
    "type": "object",
    "required": ["notebooks", "records"],
    "properties": {
        "profile": _TEXT,
        "notebooks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["notebook", "status"],
                "properties": {
                    "notebook": {"type": "string", "minLength": 1},
                    "status": {"type": "string", "minLength": 1},
                    "error_cell": {"type": ["integer", "null"]},
                    "error": _TEXT,
                },
            },
        },
        "records": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["notebook", "metric", "value", "unit"],
                "properties": {
                    **dict.fromkeys(("notebook", "metric"), {"type": "string", "minLength": 1}),
                    "unit": {"type": "string"},
                    **dict.fromkeys(("profile", "data_source", "backend", "device_kind", "jax_version"), _TEXT),
                    "device_count": {"type": ["integer", "null"]},
                },
            },
        },
    },
}
# (notebook, old metric name) -> its name now. Lesson 09 recorded the tolerance of the median
# bfloat16-vs-float32 loss difference under the max's name (before JAX 0.10.2's TPU baseline).
# Differences a lesson reports without a tolerance, and why: no warning that they are not checked.
REPORTED_ONLY = {
    ("09_performance", "max_abs_loss_diff_bf16_vs_f32"): "one step's, where the loss jumps; the median is checked",
}
RENAMED = {
    ("09_performance", "max_abs_loss_diff_bf16_vs_f32_tolerance"): "median_abs_loss_diff_bf16_vs_f32_tolerance",
}


class ResultsFileError(ValueError):
    """A results file is missing, unreadable or not in the runner's format."""


def load_results(path: str | Path) -> dict:
    """Read and check a ``results.json`` file.

    Returns:
        The payload (a dict with ``notebooks`` and ``records`` lists).

    Raises:
        ResultsFileError: the file is missing, unreadable, not JSON, of
            another schema, or lacks the runner's fields or holds one of the
            wrong type (:data:`RESULTS_SCHEMA`); one sentence naming the file,
            the field and what is wrong.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: no such file (give the results.json of a course run).") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ResultsFileError(f"{path}: cannot read it ({err}).") from err
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as err:
        raise ResultsFileError(f"{path}: not valid JSON ({err}).") from err
    if not isinstance(payload, dict):
        raise ResultsFileError(f"{path}: expected a JSON object with 'notebooks' and 'records'.")
    schema = payload.get("schema")
    if schema != SCHEMA_VERSION:
        raise ResultsFileError(f"{path}: results schema {schema!r}, this version reads schema {SCHEMA_VERSION}.")
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(RESULTS_SCHEMA).iter_errors(payload))
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
        said = error.message if len(error.message) <= 120 else f"breaks the rule {error.validator}"
        raise ResultsFileError(f"{path}: {where or 'the top level'}: {said}; it is not a results.json a run wrote.")
    payload["records"] = [renamed(rec) for rec in payload["records"]]
    return payload


def renamed(rec: dict) -> dict:
    """``rec`` under its metric's current name (:data:`RENAMED`); the record itself when it was not renamed."""
    now = RENAMED.get((rec.get("notebook"), rec.get("metric")))
    return rec if now is None else {**rec, "metric": now}


@dataclass
class Row:
    """One metric of the side-by-side table.

    ``old``/``new`` are the recorded values (None also when the run has no
    such record: see ``in_old``/``in_new``).
    """

    notebook: str
    metric: str
    unit: str
    old: Any
    new: Any
    change: float | None  # (new - old) / |old|; None where not numeric or old is 0
    check: str = ""  # "", "ok", "REGRESSION", "warning"
    in_old: bool = True
    in_new: bool = True


@dataclass
class Comparison:
    """Outcome of :func:`compare`: the table, and why it passes or fails."""

    rows: list[Row] = field(default_factory=list)
    notebooks: list[tuple[str, str | None, str | None]] = field(default_factory=list)  # name, old, new status
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.failures else 0


def _number(value: Any) -> float | None:
    """The value as a finite float, or None (strings, None, NaN, booleans)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _keyed(records: list[dict]) -> dict[tuple[str, str, int], dict]:
    seen: dict[tuple[str, str], int] = {}
    out = {}
    for rec in records:
        base = (rec["notebook"], rec["metric"])
        k = seen.get(base, 0)
        seen[base] = k + 1
        out[base + (k,)] = rec
    return out


def _values(payload: dict, field_name: str) -> list[str]:
    """The distinct values of a record field; for the profile, the run's own
    ``profile`` when there are no records (records carry the profile a
    notebook actually used, which may differ from the one asked for)."""
    values = {str(r.get(field_name)) for r in payload["records"] if field_name in r}
    if not values and field_name == "profile" and payload.get("profile"):
        values.add(str(payload["profile"]))
    return sorted(values)


def _hardware(records: list[dict]) -> list[str]:
    return sorted({f"{r.get('device_count')} x {r.get('device_kind')} ({r.get('backend')})" for r in records})


def _run_differences(old: dict, new: dict, result: Comparison) -> None:
    hw_old, hw_new = _hardware(old["records"]), _hardware(new["records"])
    if hw_old != hw_new:
        result.warnings.append(
            f"Different hardware: OLD ran on {', '.join(hw_old) or 'n/a'}; "
            f"NEW on {', '.join(hw_new) or 'n/a'}. Throughput is not comparable."
        )
    for name, label in (("profile", "profiles"), ("data_source", "data sources")):
        a, b = _values(old, name), _values(new, name)
        if a != b:
            result.warnings.append(f"Different {label}: OLD {', '.join(a) or 'n/a'}; NEW {', '.join(b) or 'n/a'}.")
    a, b = _values(old, "jax_version"), _values(new, "jax_version")
    if a != b:
        result.infos.append(f"JAX version: OLD {', '.join(a) or 'n/a'}; NEW {', '.join(b) or 'n/a'}.")


def _check_notebooks(old: dict, new: dict, result: Comparison) -> None:
    old_status = {nb["notebook"]: nb for nb in old["notebooks"]}
    new_status = {nb["notebook"]: nb for nb in new["notebooks"]}
    for name in sorted(old_status.keys() | new_status.keys()):
        before, after = old_status.get(name), new_status.get(name)
        result.notebooks.append((name, before and before["status"], after and after["status"]))
        passed_before = before is not None and before["status"] == "passed"
        if after is None:
            if passed_before:
                result.failures.append(f"{name}: passed in OLD, missing from NEW.")
            continue
        if after["status"] == "passed":
            continue
        where = f" at cell {after.get('error_cell')}" if after.get("error_cell") is not None else ""
        why = f": {after['error']}" if after.get("error") else ""
        if passed_before:
            result.failures.append(f"{name}: passed in OLD, {after['status']} in NEW{where}{why}")
        elif before is None:
            result.failures.append(f"{name}: new in NEW and {after['status']}{where}{why}")
        else:
            result.warnings.append(f"{name}: {after['status']} in both runs{where}{why}")


def _comparable(a: dict, b: dict) -> bool:
    return all(a.get(f) == b.get(f) for f in HARDWARE_FIELDS + ("profile",))


def _check_equivalence(row: Row, rec: dict, new_keyed: dict, old_keyed: dict, result: Comparison) -> None:
    tol_key = (rec["notebook"], rec["metric"] + TOLERANCE_SUFFIX, 0)
    new_tol, old_tol = new_keyed.get(tol_key), old_keyed.get(tol_key)
    same = old_tol is not None and (new_tol is None or _comparable(old_tol, new_tol))
    tol_rec = old_tol if same else new_tol
    tolerance = _number(tol_rec["value"]) if tol_rec else None
    label = f"{rec['notebook']}: {rec['metric']}"
    if same and new_tol is not None and new_tol["value"] != old_tol["value"]:
        result.warnings.append(
            f"{label}: NEW records its tolerance as {new_tol['value']}, OLD as {old_tol['value']} on the same "
            "hardware and profile: held to OLD's."
        )
    value = _number(rec["value"])
    if value is None:  # NaN, infinity, a string: no difference can be read, whatever the tolerance
        row.check = "REGRESSION"
        result.failures.append(f"{label} = {rec['value']!r} is not a number: the run did not reproduce its reference.")
    elif tolerance is None and (rec["notebook"], rec["metric"]) in REPORTED_ONLY:
        row.check = "reported"
    elif tolerance is None:
        row.check = "warning"
        result.warnings.append(f"{label}: no numeric '{rec['metric']}{TOLERANCE_SUFFIX}' record; not checked.")
    elif value > tolerance:
        row.check = "REGRESSION"
        result.failures.append(f"{label} = {rec['value']} exceeds its tolerance {tolerance:g}.")
    else:
        row.check = "ok"


def _check_throughput(row: Row, old_rec: dict, new_rec: dict, threshold: float, result: Comparison) -> None:
    label = f"{new_rec['notebook']}: {new_rec['metric']}"
    if row.change is None:
        if (
            _number(new_rec["value"]) is None
            and _number(old_rec["value"]) is not None
            and _comparable(old_rec, new_rec)
        ):
            row.check = "REGRESSION"
            result.failures.append(f"{label} = {new_rec['value']!r}, was {_fmt(row.old)} {THROUGHPUT_UNIT}.")
        return
    if not _comparable(old_rec, new_rec):
        row.check = "not comparable"  # other hardware or profile: no verdict either way
        return
    if row.change >= -threshold:
        row.check = "ok"
        return
    drop = f"fell {-row.change:.1%} ({_fmt(row.old)} -> {_fmt(row.new)} {THROUGHPUT_UNIT}), threshold {threshold:.0%}"
    if new_rec.get("backend") == "cpu":
        # CPU devices (simulated ones above all) share a few busy cores: two
        # runs of the same commit differ by tens of percent. Report, do not gate.
        row.check = "warning"
        result.warnings.append(f"{label} {drop}; CPU timings are too noisy to count as a regression.")
        return
    row.check = "REGRESSION"
    result.failures.append(f"{label} {drop}.")


def _check_status(row: Row, old_rec: dict, new_rec: dict, result: Comparison) -> None:
    label = f"{new_rec['notebook']}: {new_rec['metric']}"
    if old_rec["value"] != "ok" or new_rec["value"] == "ok":
        if new_rec["value"] == "ok":
            row.check = "ok"
        return
    message = f"{label} was ok in OLD, {new_rec['value']!r} in NEW."
    if _comparable(old_rec, new_rec):
        row.check = "REGRESSION"
        result.failures.append(message)
    else:
        row.check = "warning"
        result.warnings.append(message + " (other hardware or profile)")


def _check_target(row: Row, rec: dict, target_rec: dict, result: Comparison) -> None:
    value, target = _number(rec["value"]), _number(target_rec["value"])
    if value is None or target is None:
        return
    if value >= target:
        row.check = "ok"
        return
    message = f"{rec['notebook']}: {rec['metric']} = {_fmt(value)} is below its target {_fmt(target)}"
    if rec.get("backend") == "cpu":
        result.infos.append(message + " (the target is set for GPUs; this ran on the CPU).")
    else:
        row.check = "warning"
        result.warnings.append(message + ".")


def compare(old: dict, new: dict, threshold: float = 0.10) -> Comparison:
    """Compare two results payloads (see the module docstring for the rules).

    Args:
        old, new: payloads as returned by :func:`load_results`.
        threshold: largest tolerated throughput drop, a fraction >= 0.

    Raises:
        ValueError: ``threshold`` < 0.
    """
    if not threshold >= 0:
        raise ValueError(f"threshold must be a fraction >= 0 (0.10 = 10 %), got {threshold}.")
    result = Comparison()
    _run_differences(old, new, result)
    _check_notebooks(old, new, result)
    old_keyed, new_keyed = _keyed(old["records"]), _keyed(new["records"])
    new_status = {nb["notebook"]: nb["status"] for nb in new["notebooks"]}
    new_only: dict[str, list[str]] = {}  # notebook -> metrics without an OLD value
    for key in list(old_keyed) + [k for k in new_keyed if k not in old_keyed]:
        old_rec, new_rec = old_keyed.get(key), new_keyed.get(key)
        rec = new_rec or old_rec
        old_v = old_rec["value"] if old_rec else None
        new_v = new_rec["value"] if new_rec else None
        a, b = _number(old_v), _number(new_v)
        change = (b - a) / abs(a) if a not in (None, 0.0) and b is not None else None
        metric = rec["metric"] if key[2] == 0 else f"{rec['metric']} #{key[2] + 1}"
        row = Row(
            rec["notebook"],
            metric,
            rec["unit"],
            old_v,
            new_v,
            change,
            in_old=old_rec is not None,
            in_new=new_rec is not None,
        )
        result.rows.append(row)
        if new_rec is None:
            if new_status.get(key[0]) == "passed":
                same_setup = any(_comparable(old_rec, r) for r in new["records"] if r["notebook"] == key[0])
                if old_rec["unit"] == THROUGHPUT_UNIT and same_setup:
                    # e.g. a sweep size that ran before and fails now
                    row.check = "REGRESSION"
                    result.failures.append(f"{key[0]}: {metric} was measured in OLD and is missing in NEW.")
                else:
                    row.check = "warning"
                    result.warnings.append(f"{key[0]}: {metric} recorded in OLD, not in NEW.")
            continue
        if old_rec is None:
            new_only.setdefault(key[0], []).append(metric)
        has_tolerance = (key[0], rec["metric"] + TOLERANCE_SUFFIX, 0) in new_keyed
        if not rec["metric"].endswith(TOLERANCE_SUFFIX) and (EQUIVALENCE_MARK in rec["metric"] or has_tolerance):
            _check_equivalence(row, new_rec, new_keyed, old_keyed, result)
        elif rec["unit"] == THROUGHPUT_UNIT and old_rec is not None:
            _check_throughput(row, old_rec, new_rec, threshold, result)
        elif rec["metric"].endswith(STATUS_SUFFIX) and old_rec is not None:
            _check_status(row, old_rec, new_rec, result)
        elif (key[0], rec["metric"] + TARGET_SUFFIX, 0) in new_keyed:
            _check_target(row, new_rec, new_keyed[(key[0], rec["metric"] + TARGET_SUFFIX, 0)], result)
        elif (
            rec["metric"].startswith(COLLECTIVES_PREFIX)
            and old_rec is not None
            and old_v != new_v
            and _comparable(old_rec, new_rec)
        ):
            row.check = "warning"
            result.warnings.append(
                f"{key[0]}: {metric} changed from {_fmt(old_v)} to {_fmt(new_v)}: "
                "the compiled program's collectives moved (JAX or XLA changed?)."
            )
    for notebook, metrics in new_only.items():  # one line per notebook, not one per metric
        if len(metrics) == 1:
            result.infos.append(f"{notebook}: {metrics[0]} is new in NEW (no OLD value to compare).")
        else:
            shown = ", ".join(metrics[:4]) + (
                f", ... ({len(metrics) - 4} more, see the table)" if len(metrics) > 4 else ""
            )
            result.infos.append(
                f"{notebook}: {len(metrics)} metrics are new in NEW (no OLD value to compare): {shown}."
            )
    return result


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if 1e-3 <= abs(value) < 1e6 or value == 0 else f"{value:.3e}"
    return str(value)


def print_comparison(result: Comparison, old_path: Path, new_path: Path, threshold: float, console=None) -> None:
    """Print the notebooks, the metrics side by side, and the verdict (rich; plain text without it)."""
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:  # rich is optional for the course's own reporting
        _print_plain(result, old_path, new_path, threshold)
        return

    if console is None:
        console = Console()
        if not console.is_terminal:  # CI logs and files: do not fold metric names
            console = Console(width=max(console.width, 160))
    styles = {"ok": "green", "REGRESSION": "bold red", "warning": "yellow", "not comparable": "dim"}

    nb_table = Table(title="Notebooks")
    for col in ("notebook", "OLD", "NEW"):
        nb_table.add_column(col)
    for name, before, after in result.notebooks:
        nb_table.add_row(escape(name), before or "—", after or "—")
    console.print(nb_table)

    table = Table(title=f"Metrics: OLD {escape(str(old_path))} vs NEW {escape(str(new_path))}")
    for col, justify in (
        ("notebook", "left"),
        ("metric", "left"),
        ("unit", "left"),
        ("OLD", "right"),
        ("NEW", "right"),
        ("change", "right"),
        ("check", "left"),
    ):
        table.add_column(col, justify=justify)
    for r in result.rows:
        change = "" if r.change is None else f"{r.change:+.1%}"
        check = f"[{styles[r.check]}]{r.check}[/]" if r.check in styles else r.check
        old = escape(_fmt(r.old)) if r.in_old else "—"
        new = escape(_fmt(r.new)) if r.in_new else "—"
        table.add_row(escape(r.notebook), escape(r.metric), escape(r.unit), old, new, change, check)
    console.print(table)

    for line in result.infos:
        console.print(f"note: {escape(line)}")
    for line in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(line)}")
    if result.failures:
        console.print(f"[bold red]REGRESSIONS ({len(result.failures)}):[/]")
        for line in result.failures:
            console.print(f"  - {escape(line)}")
    else:
        console.print(f"[green]No regressions[/] (throughput threshold {threshold:.0%}).")


def _print_plain(result: Comparison, old_path: Path, new_path: Path, threshold: float) -> None:
    from dpcourse.show import table

    print(table([{"notebook": n, "OLD": b or "-", "NEW": a or "-"} for n, b, a in result.notebooks], "Notebooks"))
    rows = [
        {
            "notebook": r.notebook,
            "metric": r.metric,
            "unit": r.unit,
            "OLD": _fmt(r.old) if r.in_old else "-",
            "NEW": _fmt(r.new) if r.in_new else "-",
            "change": "" if r.change is None else f"{r.change:+.1%}",
            "check": r.check,
        }
        for r in result.rows
    ]
    print(table(rows, f"Metrics: OLD {old_path} vs NEW {new_path}"))
    for line in result.infos:
        print(f"note: {line}")
    for line in result.warnings:
        print(f"warning: {line}")
    if result.failures:
        print(f"REGRESSIONS ({len(result.failures)}):")
        for line in result.failures:
            print(f"  - {line}")
    else:
        print(f"No regressions (throughput threshold {threshold:.0%}).")


def main(old: Path, new: Path, threshold: float = 0.10) -> int:
    """Compare two ``results.json`` files, print the report, return the exit status.

    Returns:
        0: no regression; 1: a regression (see the module docstring);
        2: a file is missing or invalid, or the threshold is negative (the
        message, on stderr, names the problem).
    """
    if not threshold >= 0:
        print(f"error: --threshold must be a fraction >= 0 (0.10 = 10 %), got {threshold}.", file=sys.stderr)
        return 2
    try:
        old_payload, new_payload = load_results(old), load_results(new)
    except ResultsFileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = compare(old_payload, new_payload, threshold)
    print_comparison(result, Path(old), Path(new), threshold)
    return result.exit_code
