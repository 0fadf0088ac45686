"""One TPU host, one command: ``make tpu-check`` runs the course's check on a machine with TPU chips.

The sibling of ``make gpu-check`` (:mod:`coursetools.gpucheck`) for a TPU
host, also one where nothing can be downloaded and no process may open a
TCP socket, not even on the loopback (a lent or sandboxed TPU VM): there a
Jupyter kernel cannot start (ZeroMQ's sockets), so every lesson runs in a
fresh Python process of its own with IPython's shell
(``python -m coursetools run --kernel shell``, :mod:`coursetools.shellrun`),
the way a notebook's cells run in a kernel, one process at a time, as one
process at a time can hold the chips.

The check is one step: every lesson with the ``full`` profile. What one
device can do runs on the chip (01, 02, 09); the multi-device parts run on
simulated CPU devices, as each lesson's banner says. It records each
lesson's wall time and the chip's peak memory (JAX's ``peak_bytes_in_use``,
``peak_device_bytes`` in ``results.json``), and writes
``<chip>-full-jax<version>.json`` in the output folder: the runner's
``results.json`` (the format of ``baselines/``, which ``python -m
coursetools compare`` and ``python -m coursetools timings --update`` read)
with a ``tpu_check`` section: the chips, the JAX, jaxlib and libtpu
versions, the step's command, exit status and wall time. The check stops
at its time budget (``--budget-s``, the runner then records the lesson as
interrupted). Without a TPU, or with a chip held by another process, it
refuses in one sentence before running anything; ``--dry-run`` prints the
plan on any machine.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from coursetools.gpucheck import Step, check_summary, installed, run_steps

PROFILE = "full"
BUDGET_S = 9 * 60  # a lent TPU machine gives one command 10 minutes, the install included
DEFAULT_OUT = Path("results") / "tpu-check"
PROBE = (
    "import json, jax\n"
    "d = jax.devices()\n"
    "s = d[0].memory_stats() or {}\n"
    "print(json.dumps({'platform': d[0].platform, 'device_kind': d[0].device_kind, 'count': len(d),"
    " 'memory_bytes': s.get('bytes_limit')}))\n"
)


def plan(out: Path, python: str = sys.executable, notebooks: list[str] | None = None) -> list[Step]:
    """The check's commands, in order, writing under ``out``; ``notebooks``: only these lessons (default all)."""
    argv = [
        python,
        "-m",
        "coursetools",
        "run",
        "--profile",
        PROFILE,
        "--kernel",
        "shell",
        "--out",
        str(out / "lessons"),
    ]
    return [
        Step(
            "lessons",
            argv + (["--notebooks", *notebooks] if notebooks else []),
            f"every lesson with the {PROFILE} profile, each in a process of its own with IPython's shell (no "
            "kernel, no sockets): 01, 02 and 09 on the chip, the multi-device lessons on simulated CPU devices "
            "as each banner says; wall time and the chip's peak memory per lesson",
        )
    ]


def probe_tpu(timeout_s: float = 180.0) -> dict:
    """What JAX sees here, asked in a subprocess that lets the chips go when it ends.

    Returns:
        ``{"platform", "device_kind", "count", "memory_bytes"}`` of the
        default backend's devices, or ``{"error": "..."}``: the last line
        JAX printed when it could not start.
    """
    try:
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"JAX did not start within {timeout_s:.0f} s"}
    if out.returncode == 0 and out.stdout.strip():
        return json.loads(out.stdout.strip().splitlines()[-1])
    lines = [line.strip() for line in out.stderr.splitlines() if line.strip()]
    return {"error": lines[-1][:400] if lines else f"exit status {out.returncode}"}


def refusal(probe: dict) -> str | None:
    """Why this machine cannot run the check (one sentence), or None when it can."""
    error = probe.get("error")
    if error and ("already in use" in error or "lockfile" in error):
        return (
            "another process holds the TPU here (one process at a time can open it; JAX said: "
            f"{error}): stop it (a notebook's kernel, another check), then run make tpu-check again."
        )
    if error:
        return f"JAX could not start here ({error}): run make tpu-check on a TPU host with the course installed."
    if probe.get("platform") != "tpu":
        return (
            f"tpu-check needs a TPU, and JAX's default backend here is {probe.get('platform')!r} "
            f"({probe.get('device_kind')}): run it on a TPU host (make gpu-check on a GPU, make course on a CPU)."
        )
    return None


def results_name(device_kind: str, jax_version: str) -> str:
    """The results file's name in the manner of ``baselines/``: ``tpu-v5-lite-full-jax0.10.2.json``."""
    return f"{re.sub(r'[^a-z0-9.]+', '-', device_kind.lower()).strip('-')}-{PROFILE}-jax{jax_version}.json"


def results_payload(lessons: dict | None, probe: dict, steps: list[dict], wall_s: float, budget_s: float) -> dict:
    """The results file: the runner's ``results.json`` (``lessons``) with the check's ``tpu_check`` section."""
    payload = dict(lessons or {"schema": 1, "profile": PROFILE, "notebooks": [], "records": []})
    chips = [probe["device_kind"]] * int(probe.get("count") or 1)
    if "machine" in payload:
        payload["machine"] = {**payload["machine"], "tpus": chips}
    payload["tpu_check"] = {
        "tpus": chips,
        "tpu_memory_bytes": probe.get("memory_bytes"),
        "jax_version": installed("jax"),
        "jaxlib_version": installed("jaxlib"),
        "libtpu_version": installed("libtpu") or installed("libtpu-nightly"),
        "budget_s": budget_s,
        "wall_s": round(wall_s, 1),
        "steps": steps,
        "passed": bool(payload["notebooks"])
        and all(nb["status"] == "passed" for nb in payload["notebooks"])
        and all(s["exit_status"] == 0 and not s["timed_out"] for s in steps)
        and wall_s <= budget_s,
    }
    return payload


def summary(payload: dict) -> str:
    """:func:`coursetools.gpucheck.check_summary` of the TPU check: peak chip memory per lesson."""
    return check_summary(payload, "tpu_check", "peak_device_bytes", "peak chip MiB")


_NUMBER = {"type": "number", "minimum": 0}
_TEXT = {"type": ["string", "null"]}
# What --join reads of each part's results file (results_payload's fields), and the values it may hold.
PART_SCHEMA = {
    "type": "object",
    "required": ["notebooks", "tpu_check"],
    "properties": {
        "profile": {"type": "string"},
        "created": _TEXT,
        "commit": _TEXT,
        "notebooks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["notebook", "status", "wall_s"],
                "properties": {
                    "notebook": {"type": "string", "minLength": 1},
                    "status": {"type": "string", "minLength": 1},
                    "wall_s": _NUMBER,
                    "error": _TEXT,
                    "peak_device_bytes": {"type": ["number", "null"], "minimum": 0},
                },
            },
        },
        "records": {"type": "array", "items": {"type": "object"}},
        "tpu_check": {
            "type": "object",
            "required": ["tpus", "jax_version", "jaxlib_version", "libtpu_version", "budget_s", "wall_s", "steps"],
            "properties": {
                "tpus": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                **dict.fromkeys(("jax_version", "jaxlib_version", "libtpu_version"), _TEXT),
                "budget_s": {"type": "number", "exclusiveMinimum": 0},
                "wall_s": _NUMBER,
                "only": {"type": ["array", "null"], "items": {"type": "string"}},
                "steps": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "exit_status", "wall_s", "timed_out"],
                        "properties": {
                            "name": {"type": "string"},
                            "exit_status": {"type": ["integer", "null"]},
                            "wall_s": _NUMBER,
                            "timed_out": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}


def part_problem(part, name: str) -> str | None:
    """Why ``part`` (the results file ``name``) is not a tpu-check results file --join can read, or None."""
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(PART_SCHEMA).iter_errors(part))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "the top level"
    said = error.message if len(error.message) <= 120 else f"breaks the rule {error.validator}"
    return f"{name}: {where}: {said}, so it is not a results file tpu-check wrote: give the files its parts wrote."


def _course_lessons() -> list[str]:
    from coursetools.timings import lesson_files

    return [path.stem for path in lesson_files()]


def join_parts(parts: list[dict], lessons: list[str] | None = None, names: list[str] | None = None) -> dict:
    """One check's results from its parts: the same chip, software and commit, each lesson in one part.

    A lent TPU machine can limit one command to less time than the whole
    course takes: the check then runs as parts (``--notebooks``), one after
    another on the same machine, and this joins their results files into
    the one the course's check would have written. It passes when every
    lesson of ``lessons`` (default: the course's) ran and passed and each
    part kept to its budget; the lessons no part ran are its ``missing``.
    ``names``: the parts' file names, for the messages.

    Raises:
        ValueError: (one sentence, nothing written) fewer than two parts, a
            part that is not a TPU check's results (:data:`PART_SCHEMA`: the file, the
            field and the rule), parts that differ in profile, chip, JAX, jaxlib,
            libtpu or commit, or a lesson in two parts.
    """
    if len(parts) < 2:
        raise ValueError("--join needs the results files of two parts or more of one check.")
    for i, p in enumerate(parts):
        problem = part_problem(p, names[i] if names else f"part {i + 1}")
        if problem:
            raise ValueError(problem)
    same = {
        "profile": lambda p: p.get("profile"),
        "chip": lambda p: tuple(p["tpu_check"]["tpus"]),
        "JAX": lambda p: p["tpu_check"]["jax_version"],
        "jaxlib": lambda p: p["tpu_check"]["jaxlib_version"],
        "libtpu": lambda p: p["tpu_check"]["libtpu_version"],
        "commit": lambda p: p.get("commit"),
    }
    for what, read in same.items():
        seen = {read(p) for p in parts}
        if len(seen) > 1:
            raise ValueError(
                f"the parts ran with different {what} ({', '.join(map(str, seen))}): join parts of one check."
            )
    names = [nb["notebook"] for p in parts for nb in p["notebooks"]]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{twice[0]} is in two parts: give each lesson's part once.")
    order = {name: i for i, name in enumerate(lessons or _course_lessons())}
    first = min(parts, key=lambda p: p.get("created") or "")
    joined = dict(first)
    joined["notebooks"] = sorted(
        [nb for p in parts for nb in p["notebooks"]], key=lambda nb: order.get(nb["notebook"], len(order))
    )
    by_lesson = {nb["notebook"]: i for i, nb in enumerate(joined["notebooks"])}
    joined["records"] = sorted(
        [r for p in parts for r in p.get("records", [])], key=lambda r: by_lesson.get(r.get("notebook"), len(by_lesson))
    )
    checks = [p["tpu_check"] for p in sorted(parts, key=lambda p: p.get("created") or "")]
    missing = [name for name in order if name not in by_lesson]
    passed = (
        set(order) <= {nb["notebook"] for nb in joined["notebooks"] if nb["status"] == "passed"}
        and all(s["exit_status"] == 0 and not s["timed_out"] for c in checks for s in c["steps"])
        and all(c["wall_s"] <= c["budget_s"] for c in checks)
    )
    joined["tpu_check"] = {
        **{k: v for k, v in checks[0].items() if k not in ("only", "passed")},
        "budget_s": round(sum(c["budget_s"] for c in checks), 1),
        "wall_s": round(sum(c["wall_s"] for c in checks), 1),
        "steps": [s for c in checks for s in c["steps"]],
        "parts": [{"notebooks": c.get("only"), "wall_s": c["wall_s"], "budget_s": c["budget_s"]} for c in checks],
        "missing": missing,
        "passed": passed,
    }
    return joined


def main(argv: list[str] | None = None) -> int:
    """``make tpu-check``: refuse without a usable TPU, run :func:`plan`, write the results file; exit 1 when it failed."""
    parser = argparse.ArgumentParser(prog="python -m coursetools.tpucheck", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help=f"time budget in s (default {BUDGET_S})")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; start nothing (not even JAX)")
    parser.add_argument(
        "--notebooks", nargs="+", metavar="NAME", help="only these lessons (e.g. 01 09); the check passes only with all"
    )
    parser.add_argument(
        "--join",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="join the results files of a check run in parts; run nothing",
    )
    args = parser.parse_args(argv)
    if args.join:
        return _join_main(args.join, args.out)
    if args.budget_s <= 0:
        print(f"error: --budget-s must be a positive number of seconds, got {args.budget_s:g}.", file=sys.stderr)
        return 2
    steps = plan(args.out, notebooks=args.notebooks) if args.notebooks else plan(args.out)
    if args.dry_run:
        for i, step in enumerate(steps, 1):
            print(f"{i}. {step.name}: {step.what}\n   {' '.join(step.argv)}")
        print(f"results: {args.out}/<chip>-{PROFILE}-jax<version>.json (budget {args.budget_s:.0f} s)")
        return 0
    from coursetools.outfolder import write_json_atomic
    from dpcourse.backend.xlaflags import exit_on_bad_xla_flags

    exit_on_bad_xla_flags()
    # A process started in the background by a non-interactive shell ignores Ctrl-C, and its children
    # inherit that: the budget's Ctrl-C to the runner would do nothing. Handled here, it is reset in them.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.monotonic()
    probe = probe_tpu()
    problem = refusal(probe)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"tpu-check: {probe['count']} x {probe['device_kind']}; every lesson, one process at a time")
    args.out.mkdir(parents=True, exist_ok=True)
    done, lessons, _ = run_steps(steps, args.out, args.budget_s - (time.monotonic() - start))
    payload = results_payload(lessons, probe, done, time.monotonic() - start, args.budget_s)
    if args.notebooks:  # a part of the course is not the course's check
        payload["tpu_check"].update(passed=False, only=args.notebooks)
    name = results_name(probe["device_kind"], payload["tpu_check"]["jax_version"] or "unknown")
    path = write_json_atomic(args.out / name, payload)
    print(summary(payload))
    print(f"tpu-check: results in {path} (the format of baselines/; python -m coursetools compare reads it)")
    return 0 if payload["tpu_check"]["passed"] else 1


def _no_constant(name: str):
    raise ValueError(f"{name} is not a measured number")


def _join_main(files: list[Path], out: Path) -> int:
    from coursetools.outfolder import write_json_atomic

    parts = []
    try:
        for f in files:
            try:
                parts.append(json.loads(Path(f).read_text(encoding="utf-8"), parse_constant=_no_constant))
            except (OSError, ValueError) as err:  # ValueError: not UTF-8, not JSON, NaN or Infinity
                why = err.strerror if isinstance(err, OSError) and err.strerror else str(err).split(":")[0]
                raise ValueError(
                    f"{f}: cannot be read as JSON ({why}): give the results files tpu-check's parts wrote."
                ) from None
        payload = join_parts(parts, names=[str(f) for f in files])
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    name = results_name(payload["tpu_check"]["tpus"][0], payload["tpu_check"]["jax_version"] or "unknown")
    try:
        out.mkdir(parents=True, exist_ok=True)
        path = write_json_atomic(out / name, payload)
    except OSError as err:
        print(
            f"error: cannot write the joined results into {out} ({err.strerror}): give another --out.", file=sys.stderr
        )
        return 2
    print(summary(payload))
    missing = payload["tpu_check"]["missing"]
    if missing:
        numbers = " ".join(name[:2] for name in missing)
        print(
            f"tpu-check: no part ran {', '.join(missing)}: run them as one more part "
            f"(python -m coursetools.tpucheck --notebooks {numbers}) and join again."
        )
    print(f"tpu-check: {len(parts)} parts joined in {path}")
    return 0 if payload["tpu_check"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
