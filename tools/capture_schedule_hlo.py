"""Capture trimmed scheduled GPU programs into tests/data/ (the inputs of the schedule reader's tests).

Run with each environment's Python from the repository root, for example
``.venv/bin/python tools/capture_schedule_hlo.py`` and
``.venv-newest/bin/python tools/capture_schedule_hlo.py``. It compiles the
smoke profile's overlap forms (:data:`dpcourse.cross_compile.overlap_steps.STEPS`
but ``o1``, whose H200 program is the plain step's, byte for byte, with both
JAX versions) for 8 x H200 without a GPU, and the plain and small-threshold steps for
8 x H100 SXM and 8 x L4, and keeps what
:func:`dpcourse.compiled.schedule.read_schedule` reads: the module line, every
instruction of the entry and of loop bodies (without metadata, shardings and
backend_config but for ``is_sync`` and trip counts), the wrapped computations
of async collectives, and the parameter and ``dot`` lines of the fused
computations that hold a matmul. Files:
``tests/data/sched_<target>_<step>_smoke_8_jax<version>.txt``.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpcourse.backend.xlaflags import exit_on_bad_xla_flags  # noqa: E402
from dpcourse.compiled import collectives  # noqa: E402
from dpcourse.cross_compile import compile as gpu_compile  # noqa: E402
from dpcourse.cross_compile import overlap_steps  # noqa: E402

FEW = ("plain", "small_threshold")
DROP = re.compile(r", (metadata|frontend_attributes|sharding|origin)=\{[^{}]*(\{[^{}]*\}[^{}]*)*\}")
KEEP_JSON = re.compile(r'"(is_sync|known_trip_count|lhs_contracting_dimensions)":(\{[^}]*\}|\[[^\]]*\]|true|false)')
LAYOUT = re.compile(r"\]\{[\d,]*\}")
CONFIG = re.compile(r", backend_config=(\{.*\}|\"[^\"]*\")")


def _line(line: str) -> str:
    line = LAYOUT.sub("]", re.sub(r"/\*index=\d+\*/", "", DROP.sub("", line)))
    found = CONFIG.search(line)
    if found:
        kept = ",".join(m.group(0) for m in KEEP_JSON.finditer(found.group(1)))
        line = line[: found.start()] + (f", backend_config={{{kept}}}" if kept else "") + line[found.end() :]
    return line


def trim(text: str) -> str:
    """The module line and the computations the schedule reader needs (see the module's notes)."""
    comps, entry = collectives.split_computations(text)
    headers = {m.group(2): ln for ln in text.splitlines() if (m := collectives._HEADER.match(ln))}
    scheduled = set([entry])
    for lines in comps.values():
        for ln in lines:
            scheduled.update(re.findall(r"\bbody=%?([\w.\-]+)", ln))
            if " async-start(" in ln or " fusion-start(" in ln:
                scheduled.update(re.findall(r"\bcalls=%?([\w.\-]+)", ln))
    out = [text.splitlines()[0].split(", entry_computation_layout")[0]]
    for name, lines in comps.items():
        if name in scheduled:
            body = [_line(ln) for ln in lines]
        elif any(" dot(" in ln for ln in lines):
            body = [_line(ln) for ln in lines if " parameter(" in ln or " dot(" in ln]
        else:
            continue
        header = headers[name]
        out += [("ENTRY " if header.startswith("ENTRY") else "") + f"%{name} () -> () {{", *body, "}"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    # No options: --help describes the capture, and an unknown argument is refused, before any compile.
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    exit_on_bad_xla_flags()  # the compile workers inherit XLA_FLAGS
    import jax

    every = {k: v for k, v in overlap_steps.STEPS.items() if k != "o1"}
    few = {k: every[k] for k in FEW}
    with tempfile.TemporaryDirectory() as tmp:
        for target, steps in (("h200", every), ("h100_sxm", few), ("l4", few)):
            job = gpu_compile.Job("gpu", target, 8, "smoke")
            (res,) = gpu_compile.compile_jobs([job], steps, hlo_dir=tmp)
            if res.error or any(s.error for s in res.steps.values()):
                print(f"{res.label}: {res.error or [s.error for s in res.steps.values()]}", file=sys.stderr)
                return 1
            for name, step in res.steps.items():
                path = Path(tmp) / f"gpu_{target}_8_smoke_{name}.hlo"
                out = ROOT / "tests" / "data" / f"sched_{target}_{name}_smoke_8_jax{jax.__version__}.txt"
                out.write_text(trim(path.read_text()))
                print(out.name, step.schedule.get("overlapped_fraction"), step.scheduler_ran)
    return 0


if __name__ == "__main__":
    sys.exit(main())
