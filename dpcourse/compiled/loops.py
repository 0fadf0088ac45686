"""How many times a compiled ``while`` loop runs: XLA's stated trip count, else read from the loop's own code.

XLA's CPU and GPU compilers write a loop's trip count into the ``while``
instruction (``backend_config={"known_trip_count":{"n":"4"}}``). The TPU
compiler does not (measured: libtpu 0.0.42 with JAX 0.10.2, every
``lax.scan`` of the course's steps), but its loops keep the counter that
``lax.scan`` lowers to: element ``k`` of the loop's tuple starts at a
constant, the body adds a constant to it, and the condition compares it
with a constant::

    %tuple.99 = (s32[], ...) tuple(%copy.6, ...)            # %copy.6 = copy(constant(0))
    %while.41 = (...) while(%tuple.99), condition=%cond, body=%body
    %cond: ROOT compare(get-tuple-element(param, index=0), constant(2)), direction=LT
    %body: ROOT tuple(add(get-tuple-element(param, index=0), constant(1)), ...)

:func:`trip_count` returns the stated count when there is one, else the
count of such a counter (2 above), else None: a loop whose count the text
does not fix is reported as unknown, never guessed.
"""

from __future__ import annotations

import math
import re

_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\(")
_KNOWN = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CONDITION = re.compile(r"\bcondition=%?([\w.\-]+)")
_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_INDEX = re.compile(r"\bindex=(\d+)")
_DIRECTION = re.compile(r"\bdirection=([A-Z]+)")
_CONSTANT = re.compile(r"\bconstant\((-?\d+)\)")
# Instructions that pass a scalar counter on unchanged.
_PASS_THROUGH = ("copy", "bitcast", "convert", "reshape")


def _operands(line: str, opcode: str) -> list[str]:
    """The names of an instruction's operands (``%a, %b`` after the opcode), in order."""
    start = line.find(f" {opcode}(") + len(opcode) + 2
    depth, end = 1, start
    while end < len(line) and depth:
        depth += {"(": 1, ")": -1}.get(line[end], 0)
        end += 1
    text = re.sub(r"/\*.*?\*/", "", line[start : end - 1])
    return [t.strip().split(" ")[-1].lstrip("%") for t in text.split(",") if t.strip()]


class _Computation:
    """One computation's instructions by name: ``name -> (opcode, line)``, and its root's name."""

    def __init__(self, lines: list[str]):
        self.by_name: dict[str, tuple[str, str]] = {}
        self.root: str | None = None
        for line in lines:
            m = _INSTR.match(line)
            if m:
                self.by_name[m.group(2)] = (m.group(4), line)
                if m.group(1):
                    self.root = m.group(2)

    def resolve(self, name: str) -> tuple[str, str] | None:
        """The instruction ``name`` stands for, past copies, bitcasts and converts."""
        for _ in range(16):
            found = self.by_name.get(name)
            if found is None or found[0] not in _PASS_THROUGH:
                return found
            name = _operands(found[1], found[0])[0]
        return None

    def constant(self, name: str) -> int | None:
        found = self.resolve(name)
        if found is None or found[0] != "constant":
            return None
        value = _CONSTANT.search(found[1])
        return int(value.group(1)) if value else None

    def element(self, name: str) -> int | None:
        """``k`` when ``name`` is element ``k`` of the computation's parameter (``get-tuple-element``)."""
        found = self.resolve(name)
        if found is None or found[0] != "get-tuple-element":
            return None
        source = self.resolve(_operands(found[1], found[0])[0])
        index = _INDEX.search(found[1])
        return int(index.group(1)) if source and source[0] == "parameter" and index else None


def _counter_trips(line: str, caller: list[str], comps: dict[str, list[str]]) -> int | None:
    cond_name, body_name = _CONDITION.search(line), _BODY.search(line)
    if not cond_name or not body_name:
        return None
    cond, body = _Computation(comps.get(cond_name.group(1), [])), _Computation(comps.get(body_name.group(1), []))
    root = cond.by_name.get(cond.root or "")
    if root is None or root[0] != "compare":
        return None
    direction = _DIRECTION.search(root[1])
    left, right = _operands(root[1], "compare")[:2]
    k, limit = cond.element(left), cond.constant(right)
    if direction is None or k is None or limit is None:
        return None
    # Where the counter starts: element k of the loop's initial tuple.
    init_tuple = _Computation(caller).resolve(_operands(line, "while")[0])
    if init_tuple is None or init_tuple[0] != "tuple":
        return None
    start = _Computation(caller).constant(_operands(init_tuple[1], "tuple")[k])
    # What the body does to it: element k of its root tuple is counter + step.
    body_root = body.by_name.get(body.root or "")
    if start is None or body_root is None or body_root[0] != "tuple":
        return None
    update = body.resolve(_operands(body_root[1], "tuple")[k])
    if update is None or update[0] != "add":
        return None
    a, b = _operands(update[1], "add")[:2]
    step = body.constant(b) if body.element(a) == k else body.constant(a) if body.element(b) == k else None
    if not step or step <= 0:
        return None
    span = {"LT": limit - start, "LE": limit - start + 1, "NE": limit - start}.get(direction.group(1))
    if span is None or (direction.group(1) == "NE" and span % step):
        return None
    return max(0, math.ceil(span / step))


def trip_count(line: str, caller: list[str], comps: dict[str, list[str]]) -> int | None:
    """How many times the ``while`` instruction ``line`` runs its body, or None when its text does not say.

    Args:
        line: the ``while`` instruction's line of HLO text.
        caller: the lines of the computation that holds it (where its initial tuple is built).
        comps: every computation's lines (``split_computations``), for its condition and body.
    """
    known = _KNOWN.search(line)
    if known:
        return int(known.group(1))
    return _counter_trips(line, caller, comps)
