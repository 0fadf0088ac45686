"""Where a step's time goes, from a profiler trace: matmuls at the measured rate, beyond it, other kernels, idle.

Taught in notebook 09. ``jax.profiler.trace`` writes a Chrome trace
(``plugins/profile/<session>/<host>.trace.json.gz``, JSON read with the
standard library). On a TPU it holds the chip's own timeline: one event per
kernel the program ran (named as the optimised HLO names its instruction,
``fusion.12``, ``copy.3``), with the chip's start and duration. On a CPU the
thunks XLA's CPU runtime executes appear under the same names on the host's
threads. :func:`kernel_kinds` sorts the program's instructions from its text
(``compiled.as_text()``): a kernel holding a ``dot`` or ``convolution`` is a
matmul (so is a Pallas kernel with a matmul, :func:`dpcourse.perf.fusions.matmul_call`), the others are reductions, copies (moves of data: ``copy``,
``dynamic-update-slice``, ``transpose``, ...), the optimizer's update (a kernel that reads
the optimizer's state, an ``opt_state`` argument of the step) or
element-wise work. :func:`kernels`
reads the trace's events of those names, and :func:`split` divides the
traced steps into: the matmul kernels' time at the measured matmul rate
(the step's matmul FLOPs over that rate), the time they took beyond it, the
other kernels by kind, and the idle time between kernels. The parts add up
to the traced step; :attr:`Breakdown.agrees` compares it with the step the
benchmark measured.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dpcourse.perf.fusions import MATMUL_OPS, called, matmul_call, walk

KINDS = ("matmul", "element-wise", "reduction", "optimizer", "copy")
COPY_OPS = frozenset(
    ("copy", "copy-start", "copy-done", "dynamic-update-slice", "dynamic-slice", "transpose", "slice")
    + ("concatenate", "pad", "broadcast", "bitcast", "reshape", "gather", "scatter", "iota", "parameter")
    + ("get-tuple-element", "tuple", "constant", "bitcast-convert")
)
VIEW_OPS = frozenset(("bitcast", "copy", "reshape", "get-tuple-element"))
CONTROL_OPS = frozenset(("while", "conditional", "call", "async-start", "async-done"))
AGREEMENT = 0.05  # the parts must add up to the benchmark's step within 5 %
FUSED_SHARE = 0.02  # under 2 % of the step outside the matmul kernels: the other work ran inside them
_LINE = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?\s([a-z][\w\-]*)\((.*)$")


def _operands(args: str) -> list[str]:
    """The instruction names an instruction's argument text refers to (``%name``)."""
    return re.findall(r"%([\w.\-]+)", args.split("), ", 1)[0])


def kernel_kinds(text: str) -> dict[str, str]:
    """``{instruction name: kind}`` for every instruction of the program that can run as a kernel.

    Kinds: ``KINDS``, plus ``"control"`` for a ``while``, ``conditional`` or
    ``call`` (whose trace event, where there is one, spans the kernels it
    runs: not counted as a kernel of its own). The instructions of fused
    computations and a reduction's combiner are not kernels.
    """
    comps, fused, combiners, ops_inside = walk(text)

    # The optimizer's state enters as the step's opt_state arguments; its kernels read them (or a view of them).
    state = set()
    for lines in comps.values():
        for line in lines:
            m = _LINE.match(line)
            if m and (
                (m.group(2) == "parameter" and m.group(1).startswith("opt_state"))
                or (m.group(2) in VIEW_OPS and set(_operands(m.group(3))) & state)
            ):
                state.add(m.group(1))
    kinds: dict[str, str] = {}
    for comp, lines in comps.items():
        if comp in fused or comp in combiners:
            continue
        for line in lines:
            m = _LINE.match(line)
            if not m:
                continue
            name, op = m.group(1), m.group(2)
            inside = set().union(*(ops_inside(c) for c in called(line, "calls"))) if op == "fusion" else {op}
            if op in CONTROL_OPS:
                kinds[name] = "control"
            elif inside & set(MATMUL_OPS) or (op == "custom-call" and matmul_call(line)):
                kinds[name] = "matmul"
            elif set(_operands(m.group(3))) & state:
                kinds[name] = "optimizer"
            elif "reduce" in inside or "reduce-window" in inside:
                kinds[name] = "reduction"
            elif inside <= COPY_OPS:
                kinds[name] = "copy"
            else:
                kinds[name] = "element-wise"
    return kinds


def trace_file(folder: str | Path) -> Path | None:
    """The newest ``*.trace.json.gz`` under ``folder`` (what ``jax.profiler.trace`` wrote), or None."""
    found = sorted(Path(folder).rglob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


@dataclass(frozen=True)
class Kernel:
    """One kernel's run in the trace: its instruction name, kind, start and duration (microseconds)."""

    name: str
    kind: str
    start_us: float
    dur_us: float


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def kernels(path: str | Path, kinds: dict[str, str]) -> tuple[list[Kernel], str]:
    """The trace's kernels of one program, in start order, and where they ran (the trace's process name).

    Takes the complete events (``"ph": "X"``) named as an instruction of
    ``kinds``, from the process (a TPU chip, or the host for a CPU) where
    those events add up to the most time; on a TPU that is the chip's
    timeline, not the host's. Control events (a ``while``'s span) are left
    out. Returns ``([], "")`` when the trace holds none of the program's
    names (a backend whose trace does not show its kernels).
    """
    events = _events(Path(path))
    procs = {e.get("pid"): e.get("args", {}).get("name", "") for e in events if e.get("name") == "process_name"}
    by_pid: dict = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        kind = kinds.get(e.get("name", ""))
        if kind is None or kind == "control":
            continue
        by_pid[e.get("pid")].append(Kernel(e["name"], kind, float(e["ts"]), float(e["dur"])))
    if not by_pid:
        return [], ""
    pid = max(by_pid, key=lambda p: sum(k.dur_us for k in by_pid[p]))
    return sorted(by_pid[pid], key=lambda k: k.start_us), str(procs.get(pid, pid))


def _union_us(ks: list[Kernel]) -> float:
    total, end = 0.0, float("-inf")
    for k in ks:  # sorted by start
        lo, hi = max(k.start_us, end), k.start_us + k.dur_us
        if hi > lo:
            total += hi - lo
        end = max(end, hi)
    return total


@dataclass(frozen=True)
class Breakdown:
    """One step's time, split (milliseconds per step, averaged over the traced steps).

    ``matmul_at_rate_ms + matmul_beyond_ms + sum(other_ms.values()) +
    idle_ms - overlap_ms == traced_ms``: the matmul kernels' time is their
    FLOPs at the measured rate plus what they took beyond it; ``other_ms``
    the other kernels by kind; ``idle_ms`` the time no kernel ran between the
    first kernel of the traced steps and the last; ``overlap_ms`` kernel time
    that ran at once with another (threads of a CPU; 0 on a TPU's one
    timeline). ``measured_ms``: the benchmark's step.
    """

    rung: str
    where: str
    steps: int
    measured_ms: float
    traced_ms: float
    matmul_at_rate_ms: float
    matmul_beyond_ms: float
    other_ms: dict[str, float]
    idle_ms: float
    overlap_ms: float
    kernels_per_step: dict[str, float]
    rate_flops_per_s: float
    top: list[dict] = field(default_factory=list)
    compile_s: float | None = None  # the program's compile, where it was stored with it
    date: str | None = None  # when the trace was taken, where it was stored with it

    @property
    def parts_ms(self) -> float:
        """The parts added up (equal to ``traced_ms`` up to rounding)."""
        other = sum(self.other_ms.values())
        return self.matmul_at_rate_ms + self.matmul_beyond_ms + other + self.idle_ms - self.overlap_ms

    @property
    def gap(self) -> float:
        """``|parts - measured| / measured``: how far the trace's step is from the benchmark's."""
        return abs(self.parts_ms - self.measured_ms) / self.measured_ms

    @property
    def agrees(self) -> bool:
        """The parts add up to the measured step within ``AGREEMENT`` (5 %)."""
        return self.gap <= AGREEMENT

    def rows(self) -> list[dict]:
        """A table: each part, its milliseconds and share of the traced step."""
        parts = [("matmul kernels at the measured rate", self.matmul_at_rate_ms)]
        parts.append(("matmul kernels beyond that rate", self.matmul_beyond_ms))
        parts += [(f"{kind} kernels", ms) for kind, ms in self.other_ms.items() if ms or kind != "optimizer"]
        parts.append(("idle between kernels", self.idle_ms))
        if self.overlap_ms:
            parts.append(("kernels running at once (counted twice above)", -self.overlap_ms))
        return [{"part": p, "ms/step": ms, "share": ms / self.traced_ms} for p, ms in parts]

    def sentences(self) -> list[str]:
        """One sentence per part, with its share, and one on the agreement with the benchmark."""
        t = self.traced_ms
        beyond = self.matmul_beyond_ms
        out = [
            f"{self.rung}: the matmuls' FLOPs at the measured {self.rate_flops_per_s / 1e12:,.3g} TFLOP/s take "
            f"{self.matmul_at_rate_ms:.2f} ms ({self.matmul_at_rate_ms / t:.0%} of the traced step).",
            f"The matmul kernels took {beyond:.2f} ms beyond that ({beyond / t:.0%}): the work fused into them "
            "and shapes that run below the measured rate."
            if beyond >= 0
            else f"The matmul kernels took {-beyond:.2f} ms less than that ({-beyond / t:.0%}): they ran faster "
            "than the rate measured on one large square matmul.",
        ]
        names = {
            "element-wise": "Element-wise kernels of their own",
            "reduction": "Reductions",
            "optimizer": "The optimizer's update in kernels of its own (an update fused into a matmul's kernel counts there)",
            "copy": "Copies and moves of data",
        }
        for kind, ms in self.other_ms.items():
            n = self.kernels_per_step.get(kind, 0)
            out.append(f"{names.get(kind, kind)}: {ms:.2f} ms ({ms / t:.0%}), {n:,.0f} kernels per step.")
        out.append(f"Idle between kernels: {self.idle_ms:.2f} ms ({self.idle_ms / t:.0%}).")
        if self.overlap_ms:
            out.append(f"Kernels ran at once on several threads for {self.overlap_ms:.2f} ms, counted twice above.")
        out.append(
            f"The parts add up to {self.parts_ms:.2f} ms per step, the benchmark measured {self.measured_ms:.2f} ms: "
            f"{self.gap:.1%} apart ({'within' if self.agrees else 'more than'} {AGREEMENT:.0%})."
        )
        return out

    def per_iteration_us(self, repeats: int) -> dict[str, float]:
        """Each kind's kernel time per repeat of the block, microseconds (a scan's iteration)."""
        matmul = self.matmul_at_rate_ms + self.matmul_beyond_ms
        return {"matmul": matmul * 1e3 / repeats} | {k: ms * 1e3 / repeats for k, ms in self.other_ms.items()}

    def to_json(self) -> dict:
        """A plain dict (for the stored breakdown and results)."""
        return asdict(self)


def split(
    ks: list[Kernel],
    steps: int,
    measured_ms: float,
    matmul_flops_per_step: float,
    rate_flops_per_s: float,
    rung: str = "",
    where: str = "",
    top: int = 8,
) -> Breakdown:
    """Split ``steps`` traced steps' kernels ``ks`` (start order) into the parts of :class:`Breakdown`.

    Raises:
        ValueError: no kernels, no steps, or a rate that is not positive.
    """
    if not ks or steps < 1 or rate_flops_per_s <= 0:
        raise ValueError(
            f"Need kernels from the trace, steps >= 1 and a positive rate; got {len(ks)} kernels, "
            f"{steps} steps, rate {rate_flops_per_s}."
        )
    window = max(k.start_us + k.dur_us for k in ks) - ks[0].start_us
    busy = _union_us(ks)
    by_kind: Counter = Counter()
    counts: Counter = Counter()
    by_name: dict = defaultdict(lambda: [0.0, 0, ""])
    for k in ks:
        by_kind[k.kind] += k.dur_us
        counts[k.kind] += 1
        entry = by_name[k.name]
        entry[0] += k.dur_us
        entry[1] += 1
        entry[2] = k.kind
    ms = 1e-3 / steps
    at_rate = matmul_flops_per_step / rate_flops_per_s * 1e3
    biggest = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return Breakdown(
        rung=rung,
        where=where,
        steps=steps,
        measured_ms=measured_ms,
        traced_ms=window * ms,
        matmul_at_rate_ms=at_rate,
        matmul_beyond_ms=by_kind["matmul"] * ms - at_rate,
        other_ms={kind: by_kind[kind] * ms for kind in KINDS[1:]},
        idle_ms=(window - busy) * ms,
        overlap_ms=max(0.0, sum(by_kind.values()) - busy) * ms if sum(by_kind.values()) - busy > 1e-3 else 0.0,
        kernels_per_step={kind: counts[kind] / steps for kind in KINDS},
        rate_flops_per_s=rate_flops_per_s,
        top=[{"kernel": n, "kind": v[2], "ms/step": v[0] * ms, "runs/step": v[1] / steps} for n, v in biggest],
    )


def from_stored(data: dict) -> Breakdown:
    """A :class:`Breakdown` from its :meth:`Breakdown.to_json` dict (the stored chip breakdown)."""
    return Breakdown(**data)


def trace_steps(step, cfg, device, init_params: dict, batches: list, steps: int, folder: str | Path) -> Path | None:
    """Trace ``steps`` back-to-back steps of a compiled ``step`` from a fresh state; the trace file, or None.

    The parameters and the optimizer's state are placed (and its ``init``
    program run) before the trace starts, so the trace holds the step's
    kernels alone.
    """
    import jax

    from dpcourse import train

    optimizer = train.make_optimizer(cfg)
    params = jax.device_put(init_params, device)
    state = jax.block_until_ready(optimizer.init(params))
    with jax.profiler.trace(str(folder)):
        for i in range(steps):
            params, state, _ = step(params, state, *batches[i % len(batches)])
        jax.block_until_ready((params, state))
    return trace_file(folder)


STORED = "stored_breakdown.json"


def stored() -> dict | None:
    """The chip's breakdown stored in the package (``dpcourse/perf/stored_breakdown.json``), or None."""
    from importlib.resources import files

    source = files("dpcourse.perf") / STORED
    return json.loads(source.read_text()) if source.is_file() else None


def scan_sentences(scan: Breakdown, unrolled: Breakdown, wider: Breakdown | None, repeats: int) -> list[str]:
    """What an iteration of ``scan`` costs beyond its matmuls, and what ``scan(unroll=k)`` adds, from the traces.

    ``scan``: the plain scan's breakdown; ``unrolled``: the fully unrolled
    program's (in any dtype or batch: the kinds of kernels are compared,
    not the times); ``wider``: ``scan(unroll=k)``'s, or None.
    """
    it = scan.per_iteration_us(repeats)
    outside = sum(unrolled.other_ms.values())
    loop = ("element-wise", "reduction", "copy")  # the optimizer's update runs once a step, not per iteration
    beside = sum(it[k] for k in loop)
    parts = ", ".join(f"{k} {it[k]:,.0f}" for k in loop if it[k] >= 1)
    first = scan.top[0] if scan.top else None
    out = [
        f"{scan.rung}: over its {repeats} iterations, each spends on average {it['matmul']:,.0f} us in matmul kernels and "
        f"{beside:,.0f} us in kernels beside them ({parts} us): "
        f"{sum(scan.other_ms[k] for k in loop) / scan.traced_ms:.0%} of the step."
        + (
            f" Its longest kernel is {first['kernel']} ({first['kind']}, {first['runs/step']:,.0f} runs, "
            f"{first['ms/step']:.2f} ms per step)."
            if first
            else ""
        ),
        f"{unrolled.rung}, the same model unrolled: {outside:.2f} ms per step outside the matmul kernels "
        f"({outside / unrolled.traced_ms:.1%})"
        + (
            ": the loop's kernels of its own are gone, their work runs inside the matmuls' kernels."
            if outside / unrolled.traced_ms < FUSED_SHARE
            else ": this compiler keeps that work in kernels of its own, unrolled or not."
        ),
    ]
    if wider is not None:
        grew = max(wider.other_ms, key=lambda k: wider.other_ms[k] - scan.other_ms.get(k, 0.0))
        top = [t for t in wider.top if t["kind"] == grew][:3]
        out.append(
            f"{wider.rung}: {wider.measured_ms:.1f} ms per step against {scan.measured_ms:.1f}. Its {grew} kernels "
            f"take {wider.other_ms[grew]:.2f} ms per step ({wider.kernels_per_step[grew]:,.0f} runs) against "
            f"{scan.other_ms[grew]:.2f} ms in the plain scan"
            + (
                ", the largest "
                + ", ".join(f"{t['kernel']} ({t['runs/step']:,.0f} runs, {t['ms/step']:.2f} ms)" for t in top)
                if top
                else ""
            )
            + f"; its matmul kernels ran {wider.matmul_beyond_ms:.2f} ms beyond the rate "
            f"(the plain scan's {scan.matmul_beyond_ms:.2f})."
        )
    return out


def kernel_sentence(autodiff: Breakdown, kernel: Breakdown) -> str:
    """What a hand-written backward pass changed, from two splits of the same step: JAX's own and the kernel's.

    ``autodiff``: the step whose backward pass JAX derived; ``kernel``: the
    same step with the block's backward pass written by hand (notebook 09's
    Pallas rung). Compares the time beyond the matmul rate, the kernels
    outside the matmuls and the measured steps.
    """
    outside = (sum(autodiff.other_ms.values()), sum(kernel.other_ms.values()))
    saved = autodiff.measured_ms - kernel.measured_ms
    return (
        f"{kernel.rung}: its matmul kernels took {kernel.matmul_beyond_ms:.2f} ms per step beyond the rate, "
        f"against {autodiff.matmul_beyond_ms:.2f} ms in {autodiff.rung}, whose backward pass JAX derived; "
        f"kernels outside the matmuls {outside[1]:.2f} ms against {outside[0]:.2f}; the step "
        f"{kernel.measured_ms:.2f} ms against {autodiff.measured_ms:.2f} "
        + (
            f"({saved / autodiff.measured_ms:.1%} less)."
            if saved > 0
            else f"({-saved / autodiff.measured_ms:.1%} more)."
        )
    )


def profile(runs: list, cfg, device, init_params: dict, batches_of, measured: dict, steps: int, label: str):
    """Lesson 09, section 5: split the fastest rung, ``scan_f32`` and (for a Pallas fastest) its twin from traces.

    ``batches_of(global_batch)``: the placed batches of that size. Each trace
    goes to a temporary folder that is removed once it is read. Returns
    ``(part, {rung: Breakdown})``; ``part`` is a :class:`dpcourse.perf.report.Part`.
    """
    import shutil
    import tempfile

    from dpcourse import costs
    from dpcourse.perf import ceilings
    from dpcourse.perf.report import Part

    part, out = Part(), {}
    ok = {r.rung.name: r for r in runs if r.status == "ok"}
    best = max(ok.values(), key=lambda r: r.result.examples_per_s) if ok else None
    twin = f"unrolled_bf16_batch{cfg.ladder_large_batch}"
    names = [best.rung.name, "scan_f32"] if best else []
    if best and best.rung.block_backward != "autodiff":
        names.append(twin)
    for name in dict.fromkeys(n for n in names if n in ok):
        r, rc = ok[name], ok[name].rung.config(cfg)
        folder = tempfile.mkdtemp(prefix=f"09_{name}_")
        try:
            path = trace_steps(r.compiled, rc, device, init_params, batches_of(r.rung.global_batch), steps, folder)
            ks, where = kernels(path, kernel_kinds(r.compiled.as_text())) if path else ([], "")
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # 1-3 MB a trace: read, then gone
        rate = measured[ceilings.ceiling_for(r.rung.compute_dtype)].rate
        if not ks or not rate:
            part.lines.append(f"{name}: this host's trace shows none of the program's kernels, so it cannot be split.")
            continue
        flops = costs.train_flops_per_step(rc, r.rung.global_batch)
        bd = out[name] = split(ks, steps, r.result.ms_per_step, flops, rate, name, where)
        part.tables.append((bd.rows(), f"{name} on {label}: one step, from its trace ({where})"))
        part.lines += bd.sentences()
        part.figures |= {
            f"breakdown_{name}_traced_ms": (bd.traced_ms, "ms"),
            f"breakdown_{name}_matmul_at_rate_ms": (bd.matmul_at_rate_ms, "ms"),
            f"breakdown_{name}_matmul_beyond_ms": (bd.matmul_beyond_ms, "ms"),
            f"breakdown_{name}_idle_ms": (bd.idle_ms, "ms"),
            f"breakdown_{name}_gap_to_measured": (bd.gap, "fraction"),
        } | {f"breakdown_{name}_{k.replace('-', '_')}_ms": (v, "ms") for k, v in bd.other_ms.items()}
        if device.platform == "tpu":  # one timeline: the parts must add up to the benchmark's step
            part.figures[f"breakdown_{name}_gap_to_measured_tolerance"] = (AGREEMENT, "fraction")
    if out and device.platform == "cpu":
        gaps = ", ".join(f"{n} {bd.gap:.0%}" for n, bd in out.items())
        part.lines.append(
            f"Apart from the benchmark's step here: {gaps}. On a CPU the kernels run on several threads and the "
            "profiler's own cost weighs on short steps, so the traced step can differ; the split is this host's."
        )
    unrolled = next((n for n in (twin, best.rung.name if best else "") if n in out and n != "scan_f32"), None)
    if "scan_f32" in out and unrolled:
        part.lines += ["", *scan_sentences(out["scan_f32"], out[unrolled], None, cfg.block_repeats)]
    if best and best.rung.name in out and twin in out and best.rung.name != twin:
        part.lines += [
            "",
            kernel_sentence(out[twin], out[best.rung.name])
            if device.platform == "tpu"
            else f"{best.rung.name}'s kernel ran in Pallas's interpret mode here (JAX operations standing in for "
            "it): its time against its twin's says nothing about the kernel.",
        ]
    return part, out


def stored_part():
    """Lesson 09, section 5: the chip's stored split (the Pallas rung, its twin, the scan) and the levers tried."""
    from dpcourse.perf.report import Part

    chip, part = stored(), Part()
    if chip is None:
        part.lines.append("No stored chip breakdown in this install of dpcourse.")
        return part
    kind = chip["device_kind"]
    part.lines.append(
        f"stored: {kind}, {chip['date']}, JAX {chip['jax']}, libtpu {chip['libtpu']}, profile {chip['profile']} "
        "(measured there, not on this machine)"
    )
    bd = {name: from_stored(data) for name, data in chip["breakdowns"].items()}
    pallas, twin, scan, wider = (
        bd[n] for n in ("pallas_bf16_batch8192", "unrolled_bf16_batch8192", "scan_f32", "scan_unroll8_f32")
    )
    for b in (pallas, twin, scan):
        part.tables.append((b.rows(), f"stored, {kind}: {b.rung}, one step ({b.date})"))
        part.tables.append((b.top, f"stored, {kind}: {b.rung}, its longest kernels"))
    part.lines += [kernel_sentence(twin, pallas), *scan_sentences(scan, twin, wider, chip["repeats"])]
    part.lines.append(
        f"Compile: scan {scan.compile_s:.1f} s, scan(unroll=8) {wider.compile_s:.1f} s, unrolled "
        f"{twin.compile_s:.0f} s (programs compiled side by side)."
    )
    part.tables.append((chip["levers"], f"stored, {kind}: levers toward 85 % MFU (compile s: beside the others)"))
    best = max(chip["levers"], key=lambda row: row["MFU (197 TFLOP/s)"])
    reached = "at least 85 %." if best["MFU (197 TFLOP/s)"] >= 0.85 else "no lever reached 85 %."
    part.lines.append(f"Best: {best['variant']} at {best['MFU (197 TFLOP/s)']:.1%} of 197 TFLOP/s; {reached}")
    return part
