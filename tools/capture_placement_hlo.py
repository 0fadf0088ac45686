"""Capture trimmed optimised HLO of the course's steps into tests/data/ (the collectives' test inputs).

Run with each environment's Python from the repository root, for example
``.venv/bin/python tools/capture_placement_hlo.py`` and
``.venv-newest/bin/python tools/capture_placement_hlo.py``. It compiles the
smoke profile's steps for 2 x H200 without a GPU (the gpu-compile extra)
and for 2 simulated CPU devices, and keeps, per computation, its header,
its ``while`` lines (with their trip counts) and its collective lines
without metadata: what :func:`dpcourse.compiled.collectives.parse_hlo` reads.
Files: ``tests/data/hlo_<backend>_<step>_smoke_2_jax<version>.txt``.

With ``--tpu`` (the tpu-compile extra) it compiles the smoke profile's
``jit`` step and lesson 10's ``zero1`` and ``accum_scan`` for a TPU v5e 2x4
slice without a TPU and keeps each program whole, without metadata and
backend configs, gzipped: the TPU compiler states no trip count, so the
census reads a loop's counter in its condition, body and initial tuple
(:mod:`dpcourse.compiled.loops`), and its matmuls are convolutions inside
fusions. Files: ``tests/data/hlo_tpu_<step>_smoke_v5e_2x4_jax<version>.txt.gz``.
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
from dpcourse.cross_compile import compile as deviceless  # noqa: E402

KEEP = re.compile(
    r"\s(while|all-reduce(-start|-done)?|all-gather(-start|-done)?|reduce-scatter|collective-permute"
    r"(-start|-done)?|all-to-all|async-start|async-done)\("
)
DROP = re.compile(r", (metadata|backend_config|frontend_attributes)=\{.*$")


def trim(text: str) -> str:
    """Per computation: header, while and collective lines (metadata dropped except on while lines), ``}``.

    Computations left empty are dropped, except the entry.
    """
    out: list[str] = []
    block: list[str] = []
    for line in text.splitlines():
        header = collectives._HEADER.match(line)
        if header:
            block = [line]
        elif line.strip() == "}" and block:
            if len(block) > 1 or block[0].startswith("ENTRY"):
                out += block + [line]
            block = []
        elif block and KEEP.search(line):
            block.append(line if " while(" in line else DROP.sub("", line))
    return "\n".join(out) + "\n"


def trim_tpu(text: str) -> str:
    """The whole program, every line without its metadata and backend config (none of them is read)."""
    return "\n".join(DROP.sub("", line) for line in text.splitlines()) + "\n"


TPU_STEPS = {
    "jit": deviceless.COURSE_STEPS["jit"],
    "zero1": "dpcourse.cross_compile.steps:zero1",
    "accum_scan": "dpcourse.cross_compile.steps:accum_scan",
}


def capture_tpu() -> int:
    """``--tpu``: the programs of :data:`TPU_STEPS` for a v5e 2x4 slice, gzipped whole (see the module's notes)."""
    import gzip

    import jax

    job = deviceless.Job("tpu", "v5e_2x4", 8, "smoke")
    with tempfile.TemporaryDirectory() as tmp:
        (res,) = deviceless.compile_jobs([job], TPU_STEPS, hlo_dir=tmp)
        if res.error:
            print(f"{res.label}: {res.error}", file=sys.stderr)
            return 1
        for step in TPU_STEPS:
            text = (Path(tmp) / f"tpu_v5e_2x4_8_smoke_{step}.hlo").read_text()
            name = f"hlo_tpu_{step}_smoke_v5e_2x4_jax{jax.__version__}.txt.gz"
            (ROOT / "tests" / "data" / name).write_bytes(gzip.compress(trim_tpu(text).encode(), mtime=0))
            print(name)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    # One option: --help describes the capture, and an unknown argument is refused, before any compile.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tpu", action="store_true", help="the TPU programs (needs the tpu-compile extra)")
    args = parser.parse_args(argv)
    exit_on_bad_xla_flags()  # the compile workers inherit XLA_FLAGS
    if args.tpu:
        return capture_tpu()
    import jax

    jobs = [deviceless.Job("gpu", "h200", 2, "smoke"), deviceless.Job("cpu", "cpu", 2, "smoke")]
    with tempfile.TemporaryDirectory() as tmp:
        results = deviceless.compile_jobs(jobs, hlo_dir=tmp)
        for res in results:
            if res.error:
                print(f"{res.label}: {res.error}", file=sys.stderr)
                return 1
        for path in sorted(Path(tmp).glob("*.hlo")):
            backend, _target, n, profile, step = path.stem.split("_", 4)
            name = f"hlo_{backend}_{step}_{profile}_{n}_jax{jax.__version__}.txt"
            (ROOT / "tests" / "data" / name).write_text(trim(path.read_text()))
            print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
