"""Capture trimmed optimised HLO of the course's steps into tests/data/ (the collectives' test inputs).

Run with each environment's Python from the repository root, for example
``.venv/bin/python tools/capture_placement_hlo.py`` and
``.venv-newest/bin/python tools/capture_placement_hlo.py``. It compiles the
smoke profile's steps for 2 x H200 without a GPU (the gpu-compile extra)
and for 2 simulated CPU devices, and keeps, per computation, its header,
its ``while`` lines (with their trip counts) and its collective lines
without metadata: what :func:`dpcourse.compiled.collectives.parse_hlo` reads.
Files: ``tests/data/hlo_<backend>_<step>_smoke_2_jax<version>.txt``.
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


def main(argv: list[str] | None = None) -> int:
    import argparse

    # No options: --help describes the capture, and an unknown argument is refused, before any compile.
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    exit_on_bad_xla_flags()  # the compile workers inherit XLA_FLAGS
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
