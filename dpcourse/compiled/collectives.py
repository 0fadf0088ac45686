"""Read a compiled XLA program and list its cross-device collectives.

Taught in notebooks 04 and 05: where did the gradient all-reduce go? The
report comes from ``jax.jit(step).lower(*args).compile().as_text()``, the
optimised HLO that will actually run, so it shows what the compiler did
rather than what the Python code suggests.

For each collective it gives the kind (all-reduce, all-gather,
reduce-scatter, collective-permute, all-to-all), the bytes of its result,
and whether it sits in the body of a ``while`` loop (a ``lax.scan``), in
which case it runs once per loop iteration. Bytes per step multiply by the
loop's trip count where XLA states it (``known_trip_count``) or, in a TPU
program, where the loop's counter fixes it (:mod:`dpcourse.compiled.loops`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dpcourse.compiled import loops

# HLO opcodes of collectives; the async "-start" forms are counted, their
# "-done" halves are not (same transfer).
COLLECTIVE_OPCODES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "collective-permute",
    "all-to-all",
)
_BYTES_PER_ELEMENT = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\(")
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128)\[([\d,]*)\]")
_CALLED = re.compile(r"(?:body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_WHILE_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def shape_bytes(type_text: str) -> int:
    """Bytes of an HLO result type such as ``(f32[32,32]{1,0}, f32[32]{0})``."""
    total = 0
    for dtype, dims in _SHAPE.findall(type_text):
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        total += count * _BYTES_PER_ELEMENT.get(dtype, 4)
    return total


_TYPE_TOKEN = re.compile(r"\(|\)|\b(pred|[suf]\d+|bf16|c64|c128)\[([\d,]*)\]")


def type_tree(type_text: str) -> list:
    """An HLO result type as nested lists of array byte counts.

    ``((f32[26508]{0}), f32[26508]{0})`` gives ``[[[106032], 106032]]``: the
    outer list holds the top-level elements, each tuple is a list.
    """
    stack: list[list] = [[]]
    for m in _TYPE_TOKEN.finditer(type_text):
        token = m.group(0)
        if token == "(":
            stack.append([])
        elif token == ")":
            if len(stack) > 1:
                done = stack.pop()
                stack[-1].append(done)
        else:
            stack[-1].append(shape_bytes(token))
    while len(stack) > 1:  # unbalanced text: close what is open
        done = stack.pop()
        stack[-1].append(done)
    return stack[0]


def _tree_bytes(node) -> int:
    return sum(_tree_bytes(n) for n in node) if isinstance(node, list) else node


def _result_bytes(opcode: str, type_text: str) -> int:
    # Synchronous collectives: the whole result (a tuple when XLA combined
    # several arrays into one instruction). Async "-start" forms return
    # (operands, output[, context...]): count the output once. jaxlib 0.12's
    # GPU all-reduce-start is typed ((f32[n]), f32[n]); older ones, and
    # all-reduce-start generally, may also return the plain result.
    if not opcode.endswith("-start"):
        return shape_bytes(type_text)
    tree = type_tree(type_text)
    elements = tree[0] if len(tree) == 1 and isinstance(tree[0], list) else tree
    if len(elements) < 2:
        return _tree_bytes(elements)
    if opcode == "all-reduce-start" and not isinstance(elements[0], list):
        return _tree_bytes(elements)  # a combined all-reduce's results, no operand tuple
    return _tree_bytes(elements[1])


@dataclass(frozen=True)
class Collective:
    """One collective instruction of the compiled program.

    Attributes:
        kind: opcode without ``-start`` (e.g. ``all-reduce``).
        name: instruction name in the HLO text.
        computation: HLO computation that holds it.
        bytes: bytes of its result (per device, per execution).
        in_loop: whether it runs inside a ``while`` body.
        runs_per_step: executions per step (the product of the enclosing
            loops' known trip counts; 1 outside loops; None where a loop's
            trip count is unknown).
    """

    kind: str
    name: str
    computation: str
    bytes: int
    in_loop: bool
    runs_per_step: int | None

    @property
    def bytes_per_step(self) -> int | None:
        return None if self.runs_per_step is None else self.bytes * self.runs_per_step


@dataclass(frozen=True)
class CollectiveReport:
    """All collectives of one compiled program."""

    collectives: list[Collective] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Collective]:
        return [c for c in self.collectives if c.kind == kind]

    @property
    def count(self) -> int:
        """Collective instructions in the program text."""
        return len(self.collectives)

    @property
    def in_loop_count(self) -> int:
        return sum(c.in_loop for c in self.collectives)

    @property
    def runs_per_step(self) -> int | None:
        """Collective executions per step (None if a trip count is unknown)."""
        runs = [c.runs_per_step for c in self.collectives]
        return None if None in runs else sum(runs)

    @property
    def bytes_per_step(self) -> int | None:
        """Bytes moved through collectives per step, per device (result sizes)."""
        per = [c.bytes_per_step for c in self.collectives]
        return None if None in per else sum(per)

    def rows(self) -> list[dict]:
        """One dict per collective, for :func:`dpcourse.show.table`."""
        return [
            {
                "kind": c.kind,
                "instruction": c.name,
                "bytes": c.bytes,
                "inside loop": "yes" if c.in_loop else "no",
                "runs per step": "unknown" if c.runs_per_step is None else c.runs_per_step,
                "bytes per step": "unknown" if c.bytes_per_step is None else c.bytes_per_step,
            }
            for c in self.collectives
        ]


def split_computations(text: str) -> tuple[dict[str, list[str]], str | None]:
    """Split HLO text into its computations: ``({name: body lines}, entry name or None)``.

    Shared by :func:`parse_hlo` and :mod:`dpcourse.compiled.hlo`.

    Raises:
        ValueError: the text holds no HLO computation (not a compiled program).
    """
    computations: dict[str, list[str]] = {}
    entry = None
    current = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(2)
            computations[current] = []
            if header.group(1):
                entry = current
            continue
        if current is not None:
            if line.strip() == "}":
                current = None
            else:
                computations[current].append(line)
    if not computations:
        raise ValueError("No HLO computation found: pass compiled.as_text() of a jitted function.")
    return computations, entry


def parse_hlo(text: str) -> CollectiveReport:
    """Find the collectives in optimised HLO text (``compiled.as_text()``).

    Raises:
        ValueError: the text holds no HLO computation (not a compiled program).
    """
    computations, entry = split_computations(text)

    # Edges caller -> callee, with the trip count for while bodies.
    edges: dict[str, list[tuple[str, int | None, bool]]] = {name: [] for name in computations}
    for name, lines in computations.items():
        for line in lines:
            body = _WHILE_BODY.search(line) if " while(" in line else None
            trip = loops.trip_count(line, lines, computations) if body else None
            for callee in _CALLED.findall(line):
                if body and callee == body.group(1):
                    edges[name].append((callee, trip, True))
                else:
                    edges[name].append((callee, 1, False))
            for group in _BRANCHES.findall(line):
                for callee in group.split(","):
                    edges[name].append((callee.strip().lstrip("%"), 1, False))

    # Walk from the entry: how many times per step each computation runs,
    # and whether it is inside a loop body.
    runs: dict[str, int | None] = {}
    looped: dict[str, bool] = {}
    roots = [entry] if entry else list(computations)
    stack = [(r, 1, False) for r in roots]
    while stack:
        name, count, in_loop = stack.pop()
        if name not in computations or name in runs:
            continue
        runs[name], looped[name] = count, in_loop
        for callee, factor, is_body in edges[name]:
            sub = None if count is None or factor is None else count * factor
            stack.append((callee, sub, in_loop or is_body))

    found = []
    for name, lines in computations.items():
        for line in lines:
            m = _INSTR.match(line)
            if not m:
                continue
            opcode = m.group(4)
            base = opcode[:-6] if opcode.endswith("-start") else opcode
            if base not in COLLECTIVE_OPCODES or opcode.endswith("-done"):
                continue
            found.append(
                Collective(
                    kind=base,
                    name=m.group(2),
                    computation=name,
                    bytes=_result_bytes(opcode, m.group(3)),
                    in_loop=looped.get(name, False),
                    runs_per_step=runs.get(name, 1),
                )
            )
    return CollectiveReport(found)


def collective_report(jitted, *args) -> CollectiveReport:
    """Compile ``jitted`` for ``args`` and report its collectives.

    Args:
        jitted: a ``jax.jit`` (or ``jax.pmap``) function.
        args: example arguments with the shapes and shardings of a real step.
    """
    return parse_hlo(jitted.lower(*args).compile().as_text())
