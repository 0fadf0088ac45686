"""Where communication can hide: each collective of a scheduled GPU program and the work inside its window.

Taught in notebook 09 (section 7). XLA's GPU compiler turns every collective
into a start/done pair (``all-reduce-start``/``all-reduce-done``, an
``async-start``/``async-done`` around a wrapped reduce-scatter or all-to-all
in some versions) and orders the instructions of each computation: the
program text of a scheduled module (``HloModule ..., is_scheduled=true``,
what ``compiled.as_text()`` returns for a GPU) lists them in that order. The
instructions placed strictly between a start and its done are what the
compiler intends to run while the transfer is in flight: its *window*. The
start's ``backend_config`` says whether the collective is issued
synchronously (``"is_sync":true``: the compiler does not mean to overlap it).

:func:`read_schedule` gives, per collective, its kind, the bytes each device
sends in a ring (:func:`dpcourse.compiled.census.sent_bytes`), ``is_sync`` and the work in its
window (fusions, GEMMs, loops: FLOPs of their matmuls and the bytes at their
boundaries, counted as XLA's cost analysis counts a fusion: operands plus
result); and for the whole step the fraction of the bytes sent whose window
holds compute. Compute here means matmul FLOPs, as the cost model's window
time (:func:`dpcourse.costs.overlapped_step_s`) counts it: element-wise work
in a window (a broadcast of a constant, an optimizer update) is listed with
its bytes but does not make the window one of compute, and scalar work (a
fusion on rank-0 values, such as the step counter) is bookkeeping. This is the compiler's *intended*
overlap, read without running anything; the time that really overlaps is in
a profiler trace of a real run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpcourse.compiled import census
from dpcourse.compiled.collectives import (
    _CALLED,
    _INSTR,
    _SHAPE,
    _TRIP,
    _result_bytes,
    parse_hlo,
    shape_bytes,
    split_computations,
)
from dpcourse.compiled.hlo import _is_gemm_call

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
WRAPPING_STARTS = ("async-start", "fusion-start")
COMPUTE_OPCODES = ("fusion", "custom-call", "dot", "convolution", "while", "conditional", "call")
_IS_SYNC = re.compile(r'"is_sync":(true|false)')
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=")
_GROUPS_LIST = re.compile(r"replica_groups=\{\{([\d,]*)\}")
_LHS_DIMS = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_LHS_DIMS_JSON = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
_FUSION_KIND = re.compile(r"kind=(k\w+)")
_OPERAND = re.compile(r"%([\w.\-]+)")


@dataclass(frozen=True)
class Work:
    """One instruction scheduled inside a window.

    Attributes:
        name: its name in the HLO text.
        what: ``"GEMM"``, ``"fusion (kLoop)"``, ``"while (2 iterations)"``, ...
        flops: FLOPs of the matmuls it runs (2 per multiply-accumulate; a
            loop's body times its trip count), 0 when it runs none.
        bytes: bytes it reads and writes at its boundary (operands plus
            result; a loop: its body's work times the trip count), per device.
        scalar: every operand and result is a scalar (bookkeeping, not compute).
    """

    name: str
    what: str
    flops: float
    bytes: int
    scalar: bool


@dataclass(frozen=True)
class Window:
    """One collective, from its start to its done.

    Attributes:
        kind: ``all-reduce``, ``all-gather``, ``reduce-scatter``, ...
        name: the start instruction's name.
        computation: the computation holding it (the entry, or a loop body).
        payload_bytes: bytes of its result, per device (a reduce-scatter's is
            the ``1 / N`` slice each device keeps).
        group_size: devices taking part (``N``).
        sent_bytes: bytes each device sends per run in a ring
            (:func:`dpcourse.compiled.census.sent_bytes`): all-reduce
            ``2 (N - 1) / N x payload``, all-gather ``(N - 1) / N x payload``,
            reduce-scatter ``(N - 1) x payload``, other kinds the payload.
        is_sync: the start's ``"is_sync"`` (None when it states none).
        runs_per_step: executions per step (None: a loop's trip count unknown).
        work: the instructions scheduled strictly between start and done.
    """

    kind: str
    name: str
    computation: str
    payload_bytes: int
    group_size: int
    sent_bytes: float
    is_sync: bool | None
    runs_per_step: int | None
    work: tuple[Work, ...]

    @property
    def compute(self) -> tuple[Work, ...]:
        """The work in the window that is not scalar bookkeeping (element-wise work included)."""
        return tuple(w for w in self.work if not w.scalar)

    @property
    def has_compute(self) -> bool:
        """The window runs matmul FLOPs; element-wise work alone (a broadcast, an update) does not count."""
        return self.window_flops > 0

    @property
    def window_flops(self) -> float:
        return sum(w.flops for w in self.compute)

    @property
    def window_bytes(self) -> int:
        return sum(w.bytes for w in self.compute)


@dataclass(frozen=True)
class Schedule:
    """The collectives of one scheduled program and their windows.

    Attributes:
        windows: one :class:`Window` per collective, in program order.
        scheduled: the module says ``is_scheduled=true``, as every program
            JAX 0.10 and 0.12 compile does, for a GPU or a CPU (False: text
            without that module line). A CPU program's collectives are
            synchronous, with no start and done, so it has no windows to read.
    """

    windows: tuple[Window, ...]
    scheduled: bool

    @property
    def sent_bytes_per_step(self) -> float | None:
        """Bytes each device sends per step over all collectives (None: a run count unknown)."""
        runs = [w.runs_per_step for w in self.windows]
        return None if None in runs else sum(w.sent_bytes * w.runs_per_step for w in self.windows)

    @property
    def overlapped_bytes_per_step(self) -> float | None:
        """Of those, the bytes of collectives whose window runs matmul FLOPs (:attr:`Window.has_compute`)."""
        runs = [w.runs_per_step for w in self.windows]
        if None in runs:
            return None
        return sum(w.sent_bytes * w.runs_per_step for w in self.windows if w.has_compute)

    @property
    def overlapped_fraction(self) -> float | None:
        """``overlapped_bytes_per_step / sent_bytes_per_step``; None without collectives or run counts."""
        total, inside = self.sent_bytes_per_step, self.overlapped_bytes_per_step
        return None if not total or inside is None else inside / total

    def rows(self) -> list[dict]:
        """One dict per collective, for :func:`dpcourse.show.table`."""
        out = []
        for w in self.windows:
            shown = ", ".join(f"{x.name} ({x.what})" for x in w.compute[:4])
            more = len(w.compute) - 4
            out.append(
                {
                    "collective": f"{w.kind} {w.name}",
                    "bytes sent per device": round(w.sent_bytes),
                    "runs per step": "unknown" if w.runs_per_step is None else w.runs_per_step,
                    "is_sync": "?" if w.is_sync is None else str(w.is_sync).lower(),
                    "work in window": (shown + (f", +{more} more" if more > 0 else "")) or "none",
                    "window FLOPs": round(w.window_flops),
                    "window bytes": w.window_bytes,
                    "scalar work": len(w.work) - len(w.compute),
                }
            )
        return out

    def summary(self) -> dict:
        """The step's figures as one flat dict (what ``placement.json`` records)."""
        frac = self.overlapped_fraction
        return {
            "scheduled": self.scheduled,
            "collectives": len(self.windows),
            "sync_collectives": sum(w.is_sync is True for w in self.windows),
            "windows_with_compute": sum(w.has_compute for w in self.windows),
            "sent_bytes_per_step": self.sent_bytes_per_step,
            "overlapped_bytes_per_step": self.overlapped_bytes_per_step,
            "overlapped_fraction": None if frac is None else round(frac, 4),
            "in_window": sorted({w.kind for w in self.windows if w.has_compute}),
        }


def _operands(line: str, start: int) -> list[str]:
    """Names of the operands in the parentheses that open at ``line[start - 1]``."""
    depth, end = 1, start
    while end < len(line) and depth:
        depth += {"(": 1, ")": -1}.get(line[end], 0)
        end += 1
    return _OPERAND.findall(line[start : end - 1])


def _dims(type_text: str) -> list[int]:
    found = _SHAPE.search(type_text)
    return [int(d) for d in found.group(2).split(",") if d] if found else []


def _elements(type_text: str) -> int:
    count = 1
    for d in _dims(type_text):
        count *= d
    return count


def _is_scalar(type_text: str) -> bool:
    shapes = _SHAPE.findall(type_text)
    return bool(shapes) and all(not dims for _, dims in shapes)


def group_size(line: str, default: int) -> int:
    """Devices in each replica group of a collective's line, or ``default`` where it states none.

    Reads the three forms XLA prints: ``replica_groups=mesh['axis_0'=8,'axis_1'=1] {'axis_0'}``,
    ``replica_groups=[1,8]<=[8]`` and ``replica_groups={{0,1,2,3},...}``.
    """
    mesh = _GROUPS_MESH.search(line)
    if mesh:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", mesh.group(1)))
        size = 1
        for axis in re.findall(r"'([^']+)'", mesh.group(2)):
            size *= int(sizes.get(axis, 1))
        return size
    iota = _GROUPS_IOTA.search(line)
    if iota:
        return int(iota.group(2))
    listed = _GROUPS_LIST.search(line)
    if listed and listed.group(1):
        return len(listed.group(1).split(","))
    return default


class _Reader:
    """The module's computations, instruction types and work figures."""

    def __init__(self, text: str):
        self.comps, self.entry = split_computations(text)
        self.types: dict[str, str] = {}
        self.parsed: dict[str, list[tuple[str, str, str, list[str]]]] = {}
        for comp, lines in self.comps.items():
            rows = []
            for line in lines:
                m = _INSTR.match(line)
                if m:
                    self.types[m.group(2)] = m.group(3)
                    rows.append((m.group(2), m.group(4), line, _operands(line, m.end())))
            self.parsed[comp] = rows

    def dot_flops(self, line: str, type_text: str, operands: list[str]) -> float:
        dims = _LHS_DIMS.search(line) or _LHS_DIMS_JSON.search(line)
        if not dims or not operands:
            return 0.0
        lhs = _dims(self.types.get(operands[0], ""))
        contract = 1
        for d in re.findall(r"\d+", dims.group(1)):
            contract *= lhs[int(d)] if int(d) < len(lhs) else 1
        return 2.0 * _elements(type_text) * contract

    def flops_in(self, comp: str, depth: int = 0) -> float:
        """FLOPs of the matmuls of a computation (fusions' bodies included)."""
        if depth > 8:
            return 0.0
        total = 0.0
        for _name, op, line, operands in self.parsed.get(comp, []):
            total += self.work_flops(op, line, operands, depth + 1)
        return total

    def work_flops(self, op: str, line: str, operands: list[str], depth: int = 0) -> float:
        type_text = _INSTR.match(line).group(3)
        if op == "dot" or (op == "custom-call" and _is_gemm_call(line)):
            return self.dot_flops(line, type_text, operands)
        if op in ("fusion", "call", "while", "conditional"):
            trip = _TRIP.search(line) if op == "while" else None
            factor = int(trip.group(1)) if trip else 1
            body = re.search(r"\bbody=%?([\w.\-]+)", line) if op == "while" else None
            callees = [body.group(1)] if body else _CALLED.findall(line)
            return factor * sum(self.flops_in(c, depth) for c in callees)
        return 0.0

    def work(self, name: str, op: str, line: str, operands: list[str]) -> Work:
        type_text = _INSTR.match(line).group(3)
        flops = self.work_flops(op, line, operands)
        boundary = shape_bytes(type_text) + sum(shape_bytes(self.types.get(o, "")) for o in operands)
        scalar = _is_scalar(type_text) and all(_is_scalar(self.types.get(o, "f32[]")) for o in operands)
        if op == "while":
            trip = _TRIP.search(line)
            body = re.search(r"\bbody=%?([\w.\-]+)", line)
            inner = [
                self.work(n, o, ln, ops)
                for n, o, ln, ops in self.parsed.get(body.group(1) if body else "", [])
                if o in COMPUTE_OPCODES
            ]
            runs = int(trip.group(1)) if trip else 1
            what = f"while ({trip.group(1)} iterations)" if trip else "while (trip count unknown)"
            return Work(name, what, flops, runs * sum(w.bytes for w in inner), scalar)
        if op == "custom-call" and _is_gemm_call(line):
            what = "GEMM"
        elif op == "fusion":
            kind = _FUSION_KIND.search(line)
            what = ("GEMM fusion" if flops else "fusion") + (f" ({kind.group(1)})" if kind else "")
        else:
            what = op
        return Work(name, what, flops, boundary, scalar)


def _kind_of(reader: _Reader, op: str, line: str) -> tuple[str, str] | None:
    """``(kind, the line that states it)`` for a collective start, or None for another instruction.

    A start is ``<kind>-start``, or an ``async-start``/``fusion-start`` whose
    called computation holds the collective (jaxlib 0.12 wraps some
    all-reduces in a ``fusion-start`` of a ``fused_all-reduce`` computation).
    """
    if op.endswith("-start") and op[:-6] in KINDS:
        return op[:-6], line
    if op in WRAPPING_STARTS:
        for callee in _CALLED.findall(line):
            for _n, inner_op, inner_line, _o in reader.parsed.get(callee, []):
                if inner_op in KINDS:
                    return inner_op, inner_line
    return None


SCHEDULER_PASS = "latency-hiding-scheduler"


def scheduler_dump_options(folder: str) -> dict[str, str]:
    """XLA options that make a compile write its latency-hiding scheduler's passes (if it runs them) to ``folder``."""
    return {"xla_dump_to": folder, "xla_dump_hlo_pass_re": SCHEDULER_PASS}


def scheduler_ran(folder: str) -> bool:
    """Whether a compile with :func:`scheduler_dump_options` ran XLA's latency-hiding scheduler.

    XLA writes a module's text before and after each pass it runs whose name
    matches ``xla_dump_hlo_pass_re`` (file names holding the pass name); the
    GPU compiler leaves the pass out of its pipeline where it does not use
    the scheduler, so no such file appears.
    """
    import os

    return any(SCHEDULER_PASS in name for _root, _dirs, files in os.walk(folder) for name in files)


def read_schedule(text: str, n_devices: int = 1) -> Schedule:
    """Read the collectives of optimised HLO text (``compiled.as_text()``) with the work in their windows.

    Synchronous collectives (a CPU program's plain ``all-reduce``) have no
    window: they are listed with none.

    Args:
        text: the compiled program's text.
        n_devices: group size for a collective whose line states none.

    Raises:
        ValueError: the text holds no HLO computation.
    """
    reader = _Reader(text)
    runs = {c.name: c.runs_per_step for c in parse_hlo(text).collectives}
    wrapped = {
        c
        for rows in reader.parsed.values()
        for _n, op, ln, _o in rows
        if op in WRAPPING_STARTS
        for c in _CALLED.findall(ln)
    }
    windows = []
    for comp, rows in reader.parsed.items():
        if comp in wrapped:
            continue
        for i, (name, op, line, _ops) in enumerate(rows):
            base = op[:-6] if op.endswith("-start") else op
            found = _kind_of(reader, op, line) if op.endswith("-start") else None
            if found is None and base in KINDS and not op.endswith("-done"):
                found = (base, line)  # a synchronous collective: no window
                inside: list[Work] = []
            elif found is None:
                continue
            else:
                end = next(
                    (j for j in range(i + 1, len(rows)) if name in rows[j][3] and rows[j][1].endswith("done")), i
                )
                inside = [reader.work(*rows[j]) for j in range(i + 1, end) if rows[j][1] in COMPUTE_OPCODES]
            kind, stated = found
            n = group_size(stated, n_devices)
            if op in WRAPPING_STARTS:
                payload = shape_bytes(_INSTR.match(stated).group(3))
                inner = next((r[0] for r in reader.parsed[_CALLED.findall(line)[0]] if r[1] == kind), name)
                count = runs.get(inner, runs.get(name, 1))
            else:
                payload = _result_bytes(op, _INSTR.match(line).group(3))
                count = runs.get(name, 1)
            sync = _IS_SYNC.search(line) or _IS_SYNC.search(stated)
            windows.append(
                Window(
                    kind,
                    name,
                    comp,
                    payload,
                    n,
                    census.sent_bytes(kind, payload, n),
                    None if sync is None else sync.group(1) == "true",
                    count,
                    tuple(inside),
                )
            )
    return Schedule(tuple(windows), bool(re.search(r"^HloModule\b[^\n]*is_scheduled=true", text, re.M)))


# Lesson 09, section 7, one call per cell: (tables, lines, figures), as dpcourse.perf.report.Part takes them.


def read_compiled(results: list, hlo_texts: dict) -> tuple[dict, list[str]]:
    """``{(target, form): Schedule}`` of every compiled form (``hlo_texts``: its text or file), a line per failure."""
    from pathlib import Path

    scheds, lines = {}, []
    for res in results:
        if res.error:
            lines.append(f"{res.label}: {res.error}")
            continue
        for name, step in res.steps.items():
            if step.error:
                lines.append(f"{res.label}, {name}: {step.error}")
                continue
            text = hlo_texts[res.target, name]
            text = text.read_text() if isinstance(text, Path) else text
            scheds[res.target, name] = read_schedule(text, res.n_devices)
    return scheds, lines


def overview(results: list, scheds: dict, profile: str) -> tuple[list, list, dict]:
    """Every form on every GPU: its collectives, windows with compute, bytes sent, and whether LHS ran."""
    from dpcourse.cross_compile.overlap_steps import LABELS

    rows = []
    for res in results:
        for name, step in res.steps.items() if not res.error else ():
            sched = scheds.get((res.target, name))
            if sched is None:
                continue
            rows.append(
                {
                    "GPU": res.target_label,
                    "form": LABELS[name],
                    "collectives": len(sched.windows),
                    "with compute inside": sum(w.has_compute for w in sched.windows),
                    "is_sync": sum(w.is_sync is True for w in sched.windows),
                    "bytes sent / device": round(sched.sent_bytes_per_step),
                    "fraction in windows": round(sched.overlapped_fraction or 0.0, 3),
                    "LHS ran": step.scheduler_ran,
                    "temp bytes": step.memory.get("temp_size_in_bytes"),
                }
            )
    if not rows:
        return [], [], {}
    version = "" if results[0].stored else f", JAX {results[0].jax_version}"  # stored: in the line above
    lhs = {r["GPU"]: r["LHS ran"] for r in rows if r["form"] == LABELS["plain"]}
    line = "latency-hiding scheduler ran (default options): " + ", ".join(
        f"{k} {'yes' if v else 'no'}" for k, v in lhs.items()
    )
    figures = {f"overlap_fraction_{t}_{n}": (s.overlapped_fraction or 0.0, "fraction") for (t, n), s in scheds.items()}
    caption = f"Schedules compiled for 8 GPUs without a GPU, {profile} profile{version}"
    return [(rows, caption)], [line], figures


def plain_reading(plain: Schedule | None) -> tuple[list, list, dict]:
    """The plain step's windows on the H200, and what its one combined all-reduce says about the threshold."""
    if plain is None:
        return [], [], {}
    only = max(plain.windows, key=lambda w: w.payload_bytes)
    scalar = [w.name for w in only.work if w.scalar]
    return (
        [(plain.rows(), "Plain jit step, 8 x H200: each collective's window")],
        [
            f"{len(plain.windows)} collective(s); the largest: {only.kind} with a payload of {only.payload_bytes:,} "
            f"bytes ({only.sent_bytes:,.0f} sent per device in a ring, the table's figure); matmul FLOPs in its "
            f"window: {only.window_flops:,.0f}; other work: {len(only.compute)}; scalar work: {scalar or 'none'}",
            f"the combiner merged {only.payload_bytes:,} bytes of gradients into it, so its default threshold is at "
            "least that (XLA's source sets 30 MiB + 7 bytes: xla/service/collective_utils.h)",
        ],
        {},
    )


def threshold_reading(scheds: dict) -> tuple[list, list, dict]:
    """The small combine threshold on the H200 (its busiest window), and on the other GPUs in one line each."""
    from dpcourse.cross_compile import targets

    small, plain = scheds.get(("h200", "small_threshold")), scheds.get(("h200", "plain"))
    if small is None or plain is None:
        return [], [], {}
    busiest = max(small.windows, key=lambda w: (w.window_flops, w.window_bytes))
    lines = [
        f"{len(small.windows)} collectives instead of {len(plain.windows)}, {small.sent_bytes_per_step:,.0f} bytes "
        f"sent per device either way; the busiest window: {busiest.name} (a payload of {busiest.payload_bytes:,} "
        f"bytes per device, which the table counts as {busiest.sent_bytes:,.0f} bytes sent in a ring), holding "
        + ", ".join(f"{w.name} ({w.what})" for w in busiest.compute)
    ]
    for target in ("h100_sxm", "l4"):
        other = scheds.get((target, "small_threshold"))
        if other is not None:
            lines.append(
                f"{targets.target(target).label}: {len(other.windows)} collectives, "
                f"{sum(w.has_compute for w in other.windows)} with compute inside, "
                f"{sum(w.is_sync is True for w in other.windows)} marked is_sync"
            )
    return [(small.rows(), "Combine threshold 4,096 bytes, 8 x H200")], lines, {}


def o1_reading(results: list, scheds: dict) -> tuple[list, list, dict]:
    """Default against ``O1`` per GPU (the overview's rows of the two): what the table's columns show changed."""
    from dpcourse.cross_compile.overlap_steps import LABELS

    tables = overview(results, scheds, "")[0]
    rows = [r for r in (tables[0][0] if tables else []) if r["form"] in (LABELS["plain"], LABELS["o1"])]
    lines = []
    for gpu in dict.fromkeys(r["GPU"] for r in rows):
        pair = [r for r in rows if r["GPU"] == gpu]
        changed = [k for k in pair[0] if k not in ("GPU", "form") and len(pair) == 2 and pair[0][k] != pair[1][k]]
        lines.append(f"{gpu}: O1 changes {', '.join(changed) if changed else 'nothing in this table'}")
    return ([(rows, f"Default against O1, JAX {results[0].jax_version}")] if rows else []), lines, {}


def forms_reading(scheds: dict) -> tuple[list, list, dict]:
    """FSDP gathered once and the reduced accumulation on the H200: each window's compute and bytes."""
    from dpcourse.cross_compile.overlap_steps import LABELS

    tables, lines = [], []
    for name in (n for n in ("fsdp_gathered", "accum_reduced") if ("h200", n) in scheds):
        sched = scheds["h200", name]
        tables.append((sched.rows(), f"{LABELS[name]}, 8 x H200"))
        lines.append(
            f"{LABELS[name]}: {sched.sent_bytes_per_step:,.0f} bytes sent per device, "
            f"{sched.overlapped_fraction or 0:.0%} of them inside windows of compute"
        )
        lines += [
            f"  {w.kind} ({w.sent_bytes:,.0f} bytes sent): {w.window_flops:,.0f} matmul FLOPs and "
            f"{w.window_bytes:,} bytes of work in its window ({len(w.compute)} instruction{'s' * (len(w.compute) != 1)})"
            for w in sched.windows
        ]
    return tables, lines, {}


def bound_reading(results: list, scheds: dict) -> tuple[list, list, dict]:
    """The cost model's bound per form on the H200: XLA's FLOPs at the TF32 peak, the ring at the NVLink rate."""
    from dpcourse import costs
    from dpcourse.cross_compile.overlap_steps import LABELS

    h200, rows = costs.find_peak("NVIDIA H200"), []
    cost_of = {(r.target, k): s.cost for r in results for k, s in r.steps.items()}
    for (target, name), sched in scheds.items():
        if target != "h200" or not cost_of[target, name].get("flops"):
            continue
        compute_s = cost_of[target, name]["flops"] / h200.peak("tf32")
        comm_s = sched.sent_bytes_per_step / h200.link_bytes_per_s
        window_s = min(compute_s, sum(w.window_flops for w in sched.windows) / h200.peak("tf32"))
        frac = sched.overlapped_fraction or 0.0
        rows.append(
            {
                "form": LABELS[name],
                "fraction in windows": round(frac, 3),
                "earns": costs.bound_for(frac),
                "sum, us": round((compute_s + comm_s) * 1e6, 3),
                "overlapped, us": round(costs.overlapped_step_s(compute_s, comm_s, frac, window_s) * 1e6, 3),
                "best case, us": round(1e6 * costs.overlapped_step_s(compute_s, comm_s, frac), 3),
            }
        )
    if not rows:
        return [], [], {}
    earned = {r["form"]: r["earns"] for r in rows}.get(LABELS["plain"], "?")
    return [(rows, "Cost model, 8 x H200 datasheet (smoke size)")], [f"this course's plain step earns the {earned}"], {}
