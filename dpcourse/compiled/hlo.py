"""Summarise a compiled XLA program: loops, fusions, matmul calls, per step.

Taught in notebook 09. ``compiled.as_text()`` is the optimised HLO that
runs; counting its instructions shows what ``lax.scan`` vs a Python loop
became (a ``while`` loop with a trip count, or straight-line code), how
much element-wise work XLA fused into kernels, and how many matmuls run:
``dot`` instructions, on GPUs the cuBLAS calls XLA emits for them
(``custom-call`` with a ``gemm``/``matmul`` target), and on TPUs the
``convolution`` instructions without spatial dimensions that the TPU
compiler writes for them (``dim_labels=bf_io->bf``, inside fusions or not;
measured with libtpu 0.0.42: the course's steps hold no ``dot`` there).
Counts "per step" multiply the instructions of a loop body by the loop's
trip count (:mod:`dpcourse.compiled.loops`: XLA's stated count, or a TPU
loop's counter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# One set of HLO text patterns for the package: the instruction, callee and branch patterns
# are collectives.py's; a loop's trip count is loops.py's.
from dpcourse.compiled.collectives import _BRANCHES, _CALLED, _INSTR, split_computations
from dpcourse.compiled.loops import trip_count

_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_DIM_LABELS = re.compile(r"\bdim_labels=([\w>-]+)")


def _is_gemm_call(line: str) -> bool:
    target = _TARGET.search(line)
    return bool(target) and any(k in target.group(1).lower() for k in ("gemm", "matmul"))


def is_matmul_convolution(line: str) -> bool:
    """A ``convolution`` with no spatial dimensions: how the TPU compiler writes a matrix product.

    Its ``dim_labels`` name only batch/feature dimensions (``bf_io->bf``);
    a true convolution's name spatial ones with digits (``b01f_01io->b01f``).
    """
    labels = _DIM_LABELS.search(line)
    return bool(labels) and not any(ch.isdigit() for ch in labels.group(1))


def is_matmul(op: str, line: str) -> bool:
    """A matrix product: a ``dot``, a GPU's GEMM custom-call, or a TPU's spatial-free ``convolution``."""
    return (
        op == "dot"
        or (op == "custom-call" and _is_gemm_call(line))
        or (op == "convolution" and is_matmul_convolution(line))
    )


@dataclass(frozen=True)
class ProgramSummary:
    """Counts of one compiled program.

    Attributes:
        while_loops: ``while`` instructions in the text.
        trip_counts: their known trip counts (None where XLA does not state one).
        fusions: ``fusion`` instructions (kernels of fused element-wise work,
            some with a matmul inside) executed per step.
        matmuls: matrix products executed per step (:func:`is_matmul`).
        instructions: all instructions executed per step (outside fused bodies).
        unknown_trip: a loop's trip count is unknown: per-step counts above
            count its body once.
    """

    while_loops: int
    trip_counts: tuple[int | None, ...]
    fusions: int
    matmuls: int
    instructions: int
    unknown_trip: bool = False

    def row(self) -> dict:
        """A table row for :func:`dpcourse.show.table`."""
        return {
            "while loops": self.while_loops,
            "trip counts": ", ".join("?" if t is None else str(t) for t in self.trip_counts) or "none",
            "fusions per step": self.fusions,
            "matmuls (dot / GEMM / TPU convolution) per step": self.matmuls,
            "instructions per step": self.instructions,
        }


def summarize(text: str) -> ProgramSummary:
    """Summarise optimised HLO text (``jax.jit(f).lower(...).compile().as_text()``).

    Computations called from a ``fusion`` count as part of that one kernel,
    except that a matmul inside a fusion still counts as a matmul.

    Raises:
        ValueError: the text holds no HLO computation.
    """
    comps, entry = split_computations(text)

    totals = {"fusion": 0, "matmul": 0, "instr": 0}
    loops: list[int | None] = []
    unknown = False
    seen: set[tuple[str, bool]] = set()

    def walk(name: str, runs: int, fused: bool) -> None:
        nonlocal unknown
        for line in comps.get(name, []):
            m = _INSTR.match(line)
            if not m:
                continue
            op = m.group(4)
            if not fused:
                totals["instr"] += runs
            if op == "fusion" and not fused:
                totals["fusion"] += runs
            if is_matmul(op, line):
                totals["matmul"] += runs
            trip = None
            if op == "while":
                trip = trip_count(line, comps.get(name, []), comps)
                if (name, fused) not in seen:
                    loops.append(trip)
                unknown = unknown or trip is None
            callees = _CALLED.findall(line)
            for group in _BRANCHES.findall(line):
                callees += [c.strip().lstrip("%") for c in group.split(",")]
            for callee in callees:
                body = op == "while" and re.search(rf"\bbody=%?{re.escape(callee)}\b", line)
                sub_runs = runs * (trip or 1) if body else runs
                # Reductions' to_apply bodies are tiny scalar functions: not kernels.
                inner_fused = (
                    fused
                    or op in ("fusion", "reduce", "reduce-window", "scatter", "sort", "map")
                    or (op.startswith("all-") or op.startswith("reduce-scatter"))
                )
                walk(callee, sub_runs, inner_fused)
        seen.add((name, fused))

    walk(entry or next(iter(comps)), 1, False)
    return ProgramSummary(len(loops), tuple(loops), totals["fusion"], totals["matmul"], totals["instr"], unknown)


_MLIR_TENSOR = re.compile(r"tensor<([\dx]*?)x?(bf16|f16|f32|f64|i1|i8|i16|i32|i64|ui8|ui32)>")
_MLIR_BYTES = {
    "bf16": 2,
    "f16": 2,
    "f32": 4,
    "f64": 8,
    "i1": 1,
    "i8": 1,
    "ui8": 1,
    "i16": 2,
    "i32": 4,
    "ui32": 4,
    "i64": 8,
}


def written_all_reduce_bytes(lowered_text: str) -> list[tuple[str, int]]:
    """All-reduces as the program asks for them, before the compiler: ``(dtype, bytes)`` each.

    Reads ``jax.jit(f).lower(...).as_text()`` (StableHLO): the
    ``stablehlo.all_reduce`` ops that ``lax.psum``/``pmean`` wrote, with the
    dtype and bytes of their results. Comparing with the compiled program's
    collectives (:func:`dpcourse.compiled.collectives.collective_report`) shows what
    the backend's compiler changed; for example XLA's CPU compiler promotes a
    bfloat16 all-reduce to float32. The all-reduces that plain ``jit``
    inserts for sharded arrays do not exist yet at this stage.
    """
    out = []
    lines = lowered_text.splitlines()
    for i, line in enumerate(lines):
        if "stablehlo.all_reduce" not in line:
            continue
        for tail in lines[i:]:
            if re.match(r"^\s*\}\)\s*:", tail):
                result = tail.split("->", 1)[-1]
                for dims, dtype in _MLIR_TENSOR.findall(result):
                    count = 1
                    for d in filter(None, dims.split("x")):
                        count *= int(d)
                    out.append((dtype, count * _MLIR_BYTES[dtype]))
                break
    return out
