"""Command line: ``python -m dpcourse run`` and ``python -m dpcourse compare``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpcourse.config import profile_names


def _run(args: argparse.Namespace) -> int:
    from dpcourse.config import PROFILE_ENV, resolve_profile
    from dpcourse.runner import find_notebooks, print_summary, run_course

    import os

    profile = args.profile or os.environ.get(PROFILE_ENV)
    if profile and profile != "auto":
        resolve_profile(profile, backend="cpu")  # validate before starting kernels
    try:
        notebooks = find_notebooks(Path(args.notebook_dir), args.notebooks)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if profile and profile != "auto":
        folder = profile
    else:
        # Resolve "auto" as the notebooks will, from JAX's default backend,
        # asked in a short subprocess so this process never holds a GPU.
        from dpcourse.config import default_profile
        from dpcourse.devices import probe_backend

        folder = default_profile(probe_backend())
        profile = folder
    out = Path(args.out) if args.out else Path("results") / folder
    payload = run_course(profile, notebooks, out, cell_timeout_s=args.cell_timeout)
    print_summary(payload, out)
    failed = [r for r in payload["notebooks"] if r["status"] != "passed"]
    for r in failed:
        print(f"FAILED: {r['notebook']} at cell {r['error_cell']}: {r['error']}", file=sys.stderr)
    return 1 if failed else 0


def _compare(args: argparse.Namespace) -> int:
    from dpcourse.compare import main as compare_main

    return compare_main(args.old, args.new, threshold=args.threshold)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpcourse", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute the notebooks headlessly and write results.json")
    run.add_argument("--profile", choices=profile_names() + ["auto"], default=None,
                     help="workload profile (default: $DPCOURSE_PROFILE, else full on GPU, cpu on CPU)")
    run.add_argument("--notebooks", nargs="+", metavar="NAME",
                     help="only these notebooks, by name or number (e.g. 01 03_mesh)")
    run.add_argument("--out", help="output folder (default: results/<profile>/)")
    run.add_argument("--notebook-dir", default=str(Path(__file__).resolve().parent.parent / "notebooks"),
                     help=argparse.SUPPRESS)
    run.add_argument("--cell-timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    run.set_defaults(func=_run)
    cmp_ = sub.add_parser("compare", help="compare two results.json files and flag regressions")
    cmp_.add_argument("old", type=Path)
    cmp_.add_argument("new", type=Path)
    cmp_.add_argument("--threshold", type=float, default=0.10,
                      help="largest tolerated throughput drop, as a fraction (default 0.10)")
    cmp_.set_defaults(func=_compare)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
