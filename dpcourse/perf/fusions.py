"""Which kernels of a compiled step hold a matmul, and whether the element-wise work rides in them.

Taught in notebook 09: the roofline's separate-kernel estimate assumes the
bias, the GELU and the residual mix run as kernels of their own, each
reading and writing device memory. Whether they do is in the optimised HLO
(``compiled.as_text()``): a TPU's compiler puts the GELU into the matmul's
own fusion (an output fusion around a ``convolution``; one v5e, JAX 0.10.2:
323 of the fully unrolled step's 389 matmul kernels), while the GPU
compiler's scan step for 8 x H200 (smoke profile, stored in
``tests/data/sched_h200_plain_smoke_8_jax0.10.2.txt``) has 8 GEMM fusions
and 44 other kernels, and the CPU's keeps the GELU apart too. :func:`census` counts, over the program text (a loop's body once, not
once per trip), the kernels: every fusion, and every matmul or GEMM call
outside a fusion, of the computations that run as code (the entry, loop
bodies and conditions, called computations; not the fused computations
themselves, nor a reduction's combiner).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass

MATMUL_OPS = ("dot", "convolution")
# A GELU's tanh (JAX's default approximation) or erf (the exact one): the element-wise work of the block.
GELU_OPS = ("tanh", "erf")
ELEMENTWISE_OPS = frozenset(
    ("add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "exponential", "log", "tanh")
    + ("erf", "rsqrt", "sqrt", "power", "select", "compare", "convert", "abs", "sign", "clamp")
)
_MOSAIC_BODY = re.compile(r'custom_call_target="tpu_custom_call".*?"body":"([A-Za-z0-9+/=]+)"')


def matmul_call(line: str) -> bool:
    """Whether a ``custom-call`` instruction computes a matmul: a GEMM library call, or a Pallas kernel with one.

    A Pallas kernel on a TPU is a ``tpu_custom_call`` whose backend config
    carries the kernel as Mosaic's MLIR bytecode (base64); the bytecode
    names its operations, ``tpu.matmul`` among them when the kernel has one.
    """
    if re.search(r"gemm|matmul", line, re.IGNORECASE):
        return True
    body = _MOSAIC_BODY.search(line)
    if body is None:
        return False
    try:
        return b"tpu.matmul" in base64.b64decode(body.group(1))
    except ValueError:  # not base64 after all: no kernel to read
        return False


_COMPUTATION = re.compile(r"^(?:ENTRY )?(%?[\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = .*?\s([a-z][\w\-]*)\((.*)$")


@dataclass(frozen=True)
class FusionCensus:
    """The kernels of one program text.

    Attributes:
        kernels: fusions, plus matmuls, GEMM calls and element-wise
            instructions left outside any fusion.
        matmul_kernels: kernels that compute a matmul (a fusion holding a
            ``dot`` or ``convolution``, a bare one, or a GEMM custom call).
        matmul_with_gelu: matmul kernels that also compute a GELU
            (``tanh`` or ``erf``): element-wise work fused into the matmul.
        elementwise_kernels: kernels without a matmul (loop fusions, bare
            element-wise instructions).
    """

    kernels: int
    matmul_kernels: int
    matmul_with_gelu: int
    elementwise_kernels: int

    @property
    def gelu_in_matmuls(self) -> bool:
        """True when most matmul kernels also compute the GELU (a TPU's fusion)."""
        return self.matmul_kernels > 0 and 2 * self.matmul_with_gelu >= self.matmul_kernels

    def sentence(self, name: str) -> str:
        """One sentence for a learner: the counts and what they mean for the element-wise bytes."""
        head = (
            f"{name}: {self.kernels} kernels in the program, {self.matmul_kernels} with a matmul "
            f"({self.matmul_with_gelu} of them also compute the GELU), {self.elementwise_kernels} of "
            "element-wise work alone"
        )
        if self.gelu_in_matmuls:
            return (
                head + ": the element-wise work rides in the matmuls' kernels, its values stay on "
                "chip, and the step moves far fewer bytes than the separate-kernel estimate counts."
            )
        return (
            head + ": the element-wise work runs in kernels of its own, each reading and writing "
            "device memory, as the separate-kernel estimate assumes."
        )


def _computations(text: str) -> dict[str, list[str]]:
    """Each computation's name and its instruction lines (``%`` dropped from names)."""
    comps: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        head = _COMPUTATION.match(line)
        if head and "=" not in line.split("{", 1)[0].split("(", 1)[0]:
            current = head.group(1).lstrip("%")
            comps[current] = []
        elif current is not None and line.strip() == "}":
            current = None
        elif current is not None:
            comps[current].append(line)
    return comps


def called(line: str, key: str) -> list[str]:
    """The computations ``line`` names after ``key=`` (``calls``, ``to_apply``), without their ``%``."""
    found = re.findall(rf"{key}=\{{?(%?[\w.\-]+(?:,\s*%?[\w.\-]+)*)\}}?", line)
    return [n.strip().lstrip("%") for group in found for n in group.split(",")]


def walk(text: str) -> tuple[dict[str, list[str]], set[str], set[str], Callable[[str], set[str]]]:
    """An optimised HLO module's text read for its kernels: ``(computations, fused, combiners, ops_inside)``.

    ``computations`` maps each computation's name to its instruction lines; ``fused`` names the
    computations a ``fusion`` calls and ``combiners`` a reduction's ``to_apply`` (neither is a kernel of
    its own); ``ops_inside(name)`` is the set of opcodes in computation ``name`` and those it calls.
    """
    comps = _computations(text)
    fused, combiners = set(), set()
    for lines in comps.values():
        for line in lines:
            fused.update(called(line, "calls") if " fusion(" in line else [])
            combiners.update(called(line, "to_apply"))

    def ops_inside(name: str, seen: frozenset = frozenset()) -> set[str]:
        found: set[str] = set()
        for line in comps.get(name, []):
            m = _INSTRUCTION.match(line)
            if m:
                found.add(m.group(1))
            for sub in called(line, "calls"):
                if sub not in seen:
                    found |= ops_inside(sub, seen | {name})
        return found

    return comps, fused, combiners, ops_inside


def census(text: str) -> FusionCensus:
    """Count the kernels of an optimised HLO module's text (``compiled.as_text()``); see the module docstring."""
    comps, fused, combiners, ops_inside = walk(text)
    kernels = matmuls = with_gelu = elementwise = 0
    for name, lines in comps.items():
        if name in fused or name in combiners:
            continue
        for line in lines:
            m = _INSTRUCTION.match(line)
            if not m:
                continue
            op = m.group(1)
            if op == "fusion":
                inside = set().union(*(ops_inside(c) for c in called(line, "calls")))
                kernels += 1
                if inside & set(MATMUL_OPS):
                    matmuls += 1
                    with_gelu += bool(inside & set(GELU_OPS))
                else:
                    elementwise += 1
            elif op in MATMUL_OPS or (op == "custom-call" and matmul_call(line)):
                kernels += 1
                matmuls += 1
            elif op in ELEMENTWISE_OPS:
                kernels += 1
                elementwise += 1
    return FusionCensus(kernels, matmuls, with_gelu, elementwise)
