"""Command line: ``python -m coursetools run``, ``compare``, ``sync``, ``check-collectives``, ``workspace`` and ``timings``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from coursetools import paths
from dpcourse.config import profile_names


def _run(args: argparse.Namespace) -> int:
    import os

    from coursetools.runner import (
        KernelSetupError,
        OutputFolderError,
        RunInterrupted,
        check_kernel_interpreter,
        find_notebooks,
        print_summary,
        run_course,
    )
    from dpcourse.backend.xlaflags import XlaFlagsError, check_xla_flags
    from dpcourse.config import PROFILE_ENV, resolve_profile
    from dpcourse.data import DATA_ENV

    try:  # before any JAX starts here or in a kernel: XLA would end the process on a bad token
        check_xla_flags()
    except XlaFlagsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.cell_timeout <= 0:  # nbclient would read a negative limit as none at all
        print(f"error: --cell-timeout must be a positive number of seconds, got {args.cell_timeout}.", file=sys.stderr)
        return 2
    profile = (args.profile or os.environ.get(PROFILE_ENV) or "").strip().lower() or None
    data_source = (os.environ.get(DATA_ENV) or "auto").strip().lower()
    if data_source not in ("auto", "real", "synthetic"):
        print(f"error: {DATA_ENV}={data_source!r}: use auto, real or synthetic.", file=sys.stderr)
        return 2
    if profile and profile != "auto":
        try:
            resolve_profile(profile, backend="cpu")  # validate before starting kernels
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    try:
        notebooks = find_notebooks(Path(args.notebook_dir), args.notebooks)
        check_kernel_interpreter()
    except (FileNotFoundError, KernelSetupError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not profile or profile == "auto":
        # Resolve "auto" as the notebooks will, from JAX's default backend,
        # asked in a short subprocess so this process never holds a GPU.
        from dpcourse.config import default_profile
        from dpcourse.devices import DeviceSetupError, probe_backend

        try:
            profile = default_profile(probe_backend())
        except DeviceSetupError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.solutions:  # check that every exercise has its solution before starting kernels
        from coursetools.solutions import SolutionError, fill_solutions

        try:
            import nbformat

            for path in notebooks:
                fill_solutions(nbformat.read(path, as_version=4), path.stem)
        except SolutionError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    out = Path(args.out) if args.out else Path("results") / (f"{profile}-solutions" if args.solutions else profile)
    try:
        payload = run_course(
            profile, notebooks, out, cell_timeout_s=args.cell_timeout, solutions=args.solutions, kernel=args.kernel
        )
    except (OutputFolderError, KernelSetupError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RunInterrupted as stop:
        print(f"\nInterrupted in {stop.run.notebook}; results so far in {out / 'results.json'}.", file=sys.stderr)
        return 130
    print_summary(payload, out, figures=args.figures)
    failed = [r for r in payload["notebooks"] if r["status"] != "passed"]
    for r in failed:
        where = f" at code cell {r['error_code_cell']}" if r.get("error_code_cell") else ""
        print(f"FAILED: {r['notebook']}{where}: {r['error']} (executed notebook: {out / r['output']})", file=sys.stderr)
    return 1 if failed else 0


def _compare(args: argparse.Namespace) -> int:
    from coursetools.compare import main as compare_main

    return compare_main(args.old, args.new, threshold=args.threshold)


def _sync(args: argparse.Namespace) -> int:
    from coursetools.pairs import PairConflict, sync

    try:
        statuses = sync(Path(args.notebook_dir))
    except (PairConflict, FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for status in statuses:
        print(f"{status.py.stem}: {status.action}")
    return 0


def _check_collectives(args: argparse.Namespace) -> int:
    from dpcourse.backend.health import CollectiveCheckError, check_collectives
    from dpcourse.backend.xlaflags import exit_on_bad_xla_flags

    exit_on_bad_xla_flags()  # the probe starts JAX in a subprocess that inherits XLA_FLAGS
    try:
        print(f"check-collectives: {check_collectives(timeout_s=args.timeout)}")
    except CollectiveCheckError as err:
        print(f"check-collectives: FAILED: {err}", file=sys.stderr)
        return 1
    except ValueError as err:  # a bad --timeout: nothing was checked
        print(f"error: --{err}", file=sys.stderr)
        return 2
    return 0


def _workspace(args: argparse.Namespace) -> int:
    from coursetools import workspace as ws
    from coursetools.owner import as_owner, other_owner

    if args.room:
        return _room(args)
    root = Path(args.dir).expanduser() if args.dir else ws.default_dir()
    space = ws.Workspace(root)
    owner = other_owner(root)
    if owner is not None:  # root on a learner's folder (make hub as root): as the learner
        try:  # what the course holds is read as root first: the learner may not enter the course's clone
            space.read_course(args.lessons, solved=args.action == "catchup" and bool(args.lessons))
        except ws.WorkspaceError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return as_owner(owner, lambda: _in_workspace(space, args))
    return _in_workspace(space, args)


def _in_workspace(space, args: argparse.Namespace) -> int:
    """The workspace command's action on ``space``, as whoever this process is now."""
    from coursetools import workspace as ws

    try:
        if args.action == "status":
            actions = space.status(args.lessons)
        elif args.action in ("reset", "catchup"):
            if args.action == "catchup" and (args.all or not args.lessons):
                raise ws.WorkspaceError("Say which lessons to catch up (e.g. `catchup 04`); --all is for reset.")
            actions = space.reset(args.lessons, all_lessons=args.all, solved=args.action == "catchup")
        elif args.all:
            print(
                "error: --all is for reset; init and update take every lesson unless some are named.", file=sys.stderr
            )
            return 2
        else:
            actions = space.update(args.lessons)
    except ws.WorkspaceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for note in space.notes:
        print(note)
    if args.action in ("init", "update") and not args.verbose:
        from coursetools.workspace_summary import summary

        print("\n".join(summary(space.root, actions)))
    else:
        print(f"workspace {space.root}:")
        for action in actions:
            print(f"  {action.message}")
    return 0


def _room(args: argparse.Namespace) -> int:
    """The same workspace command for every learner's workspace under ``--room`` (make hub's .hub/users)."""
    users = Path(args.room).expanduser()
    folders = sorted(p for p in users.glob("*/workspace") if p.is_dir())
    if args.dir or not folders:
        why = "give --room or --dir, not both" if args.dir else f"no learner's workspace under {users} (*/workspace)"
        print(f"error: {why}.", file=sys.stderr)
        return 2
    if args.action == "catchup" and not args.lessons:
        print("error: Say which lessons to catch up (e.g. `catchup 04`).", file=sys.stderr)
        return 2
    status = 0
    for folder in folders:
        args.room, args.dir = None, str(folder)
        print(f"{folder.parent.name}:")
        status = max(status, _workspace(args))
    return status


def port_in_use(ip: str, port: int) -> str | None:
    """Why JupyterLab could not listen on ``ip:port`` (one sentence), or None when it can; binds as tornado does."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                return f"JupyterLab cannot listen on {ip} port {port} ({err.strerror}): set LAB_IP and LAB_PORT to an address of this machine (make lab LAB_PORT=8889)."
            return (
                f"Port {port} on {ip} is already in use, most often by another `make lab` "
                "(`.venv/bin/jupyter server list` shows its address and token): open that one, stop it "
                f"(Ctrl-C in its terminal), or start this one on another port: make lab LAB_PORT={port + 1}."
            )
    return None


def _lab_port(args: argparse.Namespace) -> int:
    if not 1 <= args.port <= 65535:
        print(
            f"error: --port takes a TCP port from 1 to 65535 (JupyterLab's default is 8888), got {args.port}.",
            file=sys.stderr,
        )
        return 2
    if args.profile is not None:
        from dpcourse import config

        names = [*config.profile_names(), "auto"]
        if args.profile.strip().lower() not in names:
            print(
                f"error: PROFILE={args.profile} is not one of the course's profiles ({', '.join(names)}); "
                "give one of those (make lab PROFILE=smoke), or none for auto.",
                file=sys.stderr,
            )
            return 2
    problem = port_in_use(args.ip, args.port)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["timings"]:  # its own options (coursetools/timings.py)
        from coursetools.timings import main as timings_main

        return timings_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m coursetools", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute the notebooks headlessly and write results.json")
    run.add_argument(
        "--profile",
        choices=profile_names() + ["auto"],
        default=None,
        help="workload profile (default: $DPCOURSE_PROFILE, else full on GPU, cpu on CPU)",
    )
    run.add_argument(
        "--notebooks",
        nargs="+",
        metavar="NAME",
        help="only these notebooks: lessons by name or number (e.g. 01 03_mesh), or paths to .ipynb files",
    )
    run.add_argument("--out", help="output folder (default: results/<profile>/)")
    run.add_argument("--notebook-dir", default=str(paths.NOTEBOOKS), help=argparse.SUPPRESS)
    run.add_argument("--cell-timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    run.add_argument(
        "--solutions",
        action="store_true",
        help="fill the exercises' solutions (solutions/) in; every checker must then pass (default out: results/<profile>-solutions/)",
    )
    run.add_argument(
        "--kernel",
        choices=["ipykernel", "shell"],
        default="ipykernel",
        help="how each notebook runs: a Jupyter kernel (default), or IPython's shell in a process of its own, "
        "for hosts where no socket can be opened (make tpu-check)",
    )
    run.add_argument(
        "--figures",
        action="store_true",
        help="also print the recorded figures (always in results.json and figures.txt of the output folder)",
    )
    run.set_defaults(func=_run)
    cmp_ = sub.add_parser("compare", help="compare two results.json files and flag regressions")
    cmp_.add_argument("old", type=Path)
    cmp_.add_argument("new", type=Path)
    cmp_.add_argument(
        "--threshold", type=float, default=0.10, help="largest tolerated throughput drop, as a fraction (default 0.10)"
    )
    cmp_.set_defaults(func=_compare)
    sync_ = sub.add_parser(
        "sync", help="re-pair the notebooks' .py and .ipynb; refuses when both files of a pair changed"
    )
    sync_.add_argument("--notebook-dir", default=str(paths.NOTEBOOKS), help=argparse.SUPPRESS)
    sync_.set_defaults(func=_sync)
    health_ = sub.add_parser(
        "check-collectives",
        help="one shard_map + pmean over every device; the all-reduce itself is stopped after --timeout seconds",
    )
    health_.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds the all-reduce may take after JAX started and compiled it (default 60)",
    )
    health_.set_defaults(func=_check_collectives)
    work = sub.add_parser(
        "workspace",
        help="the learner's own copy of the lessons (workspace/): init, update, reset, catchup, status",
        description="init/update: copy new lessons in, replace unchanged ones the course changed, and put the "
        "course's new version of a lesson you edited into updates/DATE/; never overwrite your work. "
        "reset: move your copy to old/TIMESTAMP/ and lay a fresh one. catchup: the same with the solutions "
        "filled in. status: one line per lesson.",
    )
    work.add_argument("action", choices=["init", "update", "reset", "catchup", "status"])
    work.add_argument(
        "--room",
        metavar="USERS",
        help="every learner's workspace, USERS/*/workspace (make hub: .hub/users), one after another",
    )
    work.add_argument("lessons", nargs="*", metavar="LESSON", help="lessons by number or name (e.g. 05 09_performance)")
    work.add_argument(
        "--dir", help="the workspace folder (default: $DPCOURSE_WORKSPACE, else workspace/ in the repository)"
    )
    work.add_argument("--all", action="store_true", help="reset: every lesson")
    work.add_argument("-v", "--verbose", action="store_true", help="init/update: one line per lesson")
    work.set_defaults(func=_workspace)
    lab = sub.add_parser("lab-port", help="refuse a JupyterLab address that is taken (make lab runs it first)")
    lab.add_argument("--ip", default="127.0.0.1")
    lab.add_argument("--port", type=int, default=8888)
    lab.add_argument("--profile", default=None, help="make lab's PROFILE: refused unless a profile of the course")
    lab.set_defaults(func=_lab_port)
    # Lessons may also follow an option (`workspace reset --dir D 05`), which
    # argparse leaves over once the positionals have been matched.
    args, extra = parser.parse_known_args(argv)
    if extra and (args.command != "workspace" or any(e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.lessons = [*args.lessons, *extra]
    try:
        return args.func(args)
    except ModuleNotFoundError as err:
        print(
            f"error: {err}. This Python lacks the course's requirements: run `make install`, then "
            f"`.venv/bin/python -m coursetools ...` (or activate .venv).",
            file=sys.stderr,
        )
        return 2
    except RuntimeError as err:  # e.g. JAX could not start in the backend probe
        import os

        hint = ""
        if os.environ.get("JAX_PLATFORMS"):
            hint = f" JAX_PLATFORMS={os.environ['JAX_PLATFORMS']} is set: unset it, or install that backend."
        print(f"error: {err}{hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
