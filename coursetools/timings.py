"""Measured times, written into the lessons and the README from a committed record: ``python -m coursetools timings``.

Every course run's ``results.json`` holds each notebook's wall time, the machine (CPU, cores, memory), its load
average at the start and end, and the course commit (:func:`coursetools.machine.machine_info`, filled in by the
runner). ``python -m coursetools timings --update RESULTS.json ...`` copies those figures (and the part of a lesson
that ran, where it recorded one: ``timed_part``) into ``baselines/timings.json`` (the committed record), refusing a
run measured on a machine too busy to time it (``--allow-busy`` records it all the same,
:func:`coursetools.machine.busy_sentence`), and writes from it each lesson's ``**Time.**`` line and the README's
block between ``<!-- timings:begin -->`` and ``<!-- timings:end -->``; ``--make-test-seconds S`` adds a measured
``make test`` time. ``--check`` (and tests/coursetools/test_timings.py) fails when a lesson or the README says
anything else than the record, so the text cannot drift from what was measured.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from coursetools import paths
from coursetools.machine import busy_sentence, load_average, machine_info
from coursetools.outfolder import write_atomic

ROOT = paths.ROOT
RECORD = paths.TIMINGS
README = paths.README
NOTEBOOK_DIR = paths.NOTEBOOKS
BEGIN, END = "<!-- timings:begin -->", "<!-- timings:end -->"
TIME_LINE = re.compile(r"^# \*\*Time[.*].*$", re.MULTILINE)


COMMIT_ENV = "DPCOURSE_COMMIT"  # the commit of a copy of the course without its .git (a lent machine's)


def course_commit() -> str | None:
    """The course's git commit (short), with ``+changes`` when the work tree differs.

    ``$DPCOURSE_COMMIT`` when set, first: a copy of the course sent to
    another machine (a lent TPU host) may carry no ``.git`` or one older
    than its files, and whoever sent it knows the commit. Outside git and
    without it, None.
    """
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


_LOADS = {"type": ["array", "null"], "items": {"type": "number", "minimum": 0}, "minItems": 3, "maxItems": 3}
# What of a runner's results.json (coursetools.runner) the record copies, and the values it may hold.
RESULTS_SCHEMA = {
    "type": "object",
    "required": ["profile", "machine", "notebooks"],
    "properties": {
        "profile": {"type": "string", "minLength": 1},
        "created": {"type": ["string", "null"]},
        "solutions": {"type": "boolean"},
        "cpu_devices": {"type": ["integer", "null"], "minimum": 1},
        "commit": {"type": ["string", "null"]},
        "machine": {
            "type": "object",
            "properties": {
                "cpu": {"type": ["string", "null"]},
                "cores": {"type": ["integer", "null"], "minimum": 1},
                "memory_gib": {"type": ["number", "null"], "minimum": 0},
                "gpus": {"type": ["array", "null"], "items": {"type": "string"}},
                "tpus": {"type": ["array", "null"], "items": {"type": "string"}},
                "load_average_start": _LOADS,
                "load_average_end": _LOADS,
                "gpu_compile_extra": {"type": ["boolean", "null"]},
                "tpu_compile_extra": {"type": ["boolean", "null"]},
            },
        },
        "notebooks": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["notebook", "wall_s", "status"],
                "properties": {
                    "notebook": {"type": "string", "minLength": 1},
                    "wall_s": {"type": "number", "exclusiveMinimum": 0},
                    "status": {"type": "string", "minLength": 1},
                },
            },
        },
        "records": {
            "type": "array",
            "items": {"type": "object", "properties": {"jax_version": {"type": ["string", "null"]}}},
        },
    },
}


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a measured number")


def read_results(path: Path) -> dict:
    """A runner's ``results.json`` at ``path``, checked against :data:`RESULTS_SCHEMA` (NaN and infinities refused).

    Raises:
        ValueError: unreadable JSON, no machine record, or a field of the wrong
            type or value; one sentence naming the file and the field.
        OSError: the file cannot be read.
    """
    import jsonschema

    if Path(path).is_dir():
        raise ValueError(
            f"{path} is a folder: give the results.json in it that a run wrote ({Path(path) / 'results.json'})."
        )
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except ValueError as err:
        raise ValueError(f"{path}: not a results.json the runner writes ({err}); give the file a run wrote.") from None
    if isinstance(payload, dict) and "profile" in payload and "machine" not in payload:
        raise ValueError(f"{path}: no machine record (a results.json from before the runner recorded it); run again.")
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(RESULTS_SCHEMA).iter_errors(payload))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        raise ValueError(
            f"{path}: {where}: {error.message}; it is not a results.json the runner writes "
            "(python -m coursetools run), so nothing was recorded."
        )
    return payload


LESSON_CPU_DEVICES = 8  # the lessons' own simulated CPU devices (dpcourse.devices.setup_devices' default)


def _entry(payload: dict, nb: dict) -> dict:
    """A lesson's time and status, and what ran where it was not the run's own profile on its accelerator.

    ``timed`` is the part the lesson recorded it ran (``timed_part``), else, on a GPU or TPU host whose
    lesson recorded its figures on CPU devices alone (a multi-device lesson on one chip), that it ran on
    simulated CPU devices, with ``profile`` the profile it fell back to: a Time line never credits the
    chip with a CPU run.
    """
    mine = [r for r in payload.get("records", []) if r.get("notebook") == nb["notebook"]]
    said = [str(r["value"]) for r in mine if r.get("metric") == "timed_part"]
    entry = {"wall_s": nb["wall_s"], "status": nb["status"]}
    where = [r for r in mine if r.get("backend")]
    on_accelerator = payload["machine"].get("gpus") or payload["machine"].get("tpus")
    if said:
        entry["timed"] = said[-1]
    elif on_accelerator and where and all(r["backend"] == "cpu" for r in where):
        count = max(int(r.get("device_count") or 0) for r in where)
        profiles = sorted({r.get("profile") for r in where if r.get("profile")})
        entry["timed"] = f"on {count} simulated CPU devices"
        if len(profiles) == 1 and profiles != [payload["profile"]]:  # the lesson fell back to another profile
            entry["profile"] = profiles[0]
    return entry


def _run_entry(path: Path, lessons: list[str], allow_busy: bool = False) -> dict:
    """What the record keeps of the run at ``path``: a run of the course's ``lessons`` as a learner runs them.

    Raises:
        ValueError: (one sentence, nothing recorded) a notebook that is not one of ``lessons``, a run
            with the exercises' solutions filled in, one at another CPU device count than the lessons' own,
            or (unless ``allow_busy``) one measured on a machine too busy to time it
            (:func:`coursetools.machine.busy_sentence`).
    """
    payload = read_results(path)
    busy = None if allow_busy else busy_sentence(payload["machine"], str(path))
    if busy:
        raise ValueError(busy + ".")
    others = [nb["notebook"] for nb in payload["notebooks"] if nb["notebook"] not in lessons]
    if others:
        raise ValueError(
            f"{path}: {others[0]!r} is not one of the course's lessons ({lessons[0]} to {lessons[-1]}), and the "
            "record times the course's lessons only, so nothing was recorded: give a run of the course's notebooks."
        )
    if payload.get("solutions"):
        raise ValueError(
            f"{path}: this run had the exercises' solutions filled in (--solutions), which is not the time a learner "
            f"waits, so nothing was recorded: record a run without --solutions (python -m coursetools run "
            f"--profile {payload['profile']})."
        )
    forced = payload.get("cpu_devices")
    if forced is not None and forced != LESSON_CPU_DEVICES and not payload["machine"].get("gpus"):
        raise ValueError(
            f"{path}: this run forced {forced} CPU devices (XLA_FLAGS), not the lessons' own {LESSON_CPU_DEVICES}, "
            "so nothing was recorded: record a run without --xla_force_host_platform_device_count in XLA_FLAGS."
        )
    return {
        "profile": payload["profile"],
        "created": payload.get("created"),
        "commit": payload.get("commit"),
        "machine": payload["machine"],
        "jax": sorted({r["jax_version"] for r in payload.get("records", []) if r.get("jax_version")}),
        "notebooks": {nb["notebook"]: _entry(payload, nb) for nb in payload["notebooks"]},
    }


def _accelerator(machine: dict) -> str | None:
    """The run's accelerator, ``"1 x TPU v5 lite"`` or ``"1 x NVIDIA H200"``; None for a CPU-only machine."""
    chips = machine.get("tpus") or machine.get("gpus") or []
    return f"{len(chips)} x {chips[0]}" if chips else None


def _run_key(run: dict) -> tuple:
    """What a new run replaces: the earlier runs of its profile on the same kind of accelerator (or none)."""
    return run["profile"], _accelerator(run.get("machine") or {})


def merge_runs(runs: list[dict], new: list[dict], lessons: list[str]) -> list[dict]:
    """The record's runs once ``new`` runs are added: a run of some lessons replaces only theirs.

    A new run of every lesson in ``lessons`` (the course's stems) replaces
    the earlier runs of its profile on the same accelerator (a TPU's
    ``full`` run does not replace a GPU's). A run of some lessons replaces those
    lessons in the earlier run of its profile, each entry keeping its own
    commit and load average at its start (the README says "measured
    alone"), so a profile keeps one line; with no earlier run of its
    profile it is kept as a run of its own. Smoke runs first, then by
    profile, each profile's runs in the order given.
    """
    runs = [dict(r, notebooks=dict(r["notebooks"])) for r in runs]
    for entry in new:
        whole = set(lessons) <= set(entry["notebooks"])
        same = [r for r in runs if _run_key(r) == _run_key(entry)]
        if whole or not same:
            runs = [r for r in runs if _run_key(r) != _run_key(entry)] + [entry]
            continue
        for run in same:
            run["notebooks"] = {k: v for k, v in run["notebooks"].items() if k not in entry["notebooks"]}
        alone = {"commit": entry.get("commit"), "load_average_start": entry["machine"].get("load_average_start")}
        same[0]["notebooks"].update({name: dict(nb, **alone) for name, nb in entry["notebooks"].items()})
        runs = [r for r in runs if r["notebooks"]]
    return sorted(runs, key=lambda r: (r["profile"] != "smoke", r["profile"]))


def _machine_text(machine: dict) -> str:
    where = f"{machine.get('cores')}-core {machine.get('cpu')}, {machine.get('memory_gib')} GiB"
    if _accelerator(machine):
        where += f", {_accelerator(machine)}"
    extra, tpu_extra = machine.get("gpu_compile_extra"), machine.get("tpu_compile_extra")
    if extra is not None and tpu_extra is not None:
        both = {(True, True): "with the GPU- and TPU-compile extras", (True, False): "with the GPU-compile extra only"}
        where += ", " + both.get(
            (extra, tpu_extra),
            "with the TPU-compile extra only" if tpu_extra else "without the compile extras (no GPU or TPU compiles)",
        )
    elif extra is not None:  # runs recorded before the TPU field say only this; earlier ones nothing
        where += ", with the GPU-compile extra" if extra else ", without the GPU-compile extra (no GPU compiles)"
    start, end = machine.get("load_average_start"), machine.get("load_average_end")
    if start and end:
        where += f"; load average {start[0]:g} at the start, {end[0]:g} at the end"
    elif end:
        where += f"; load average {end[0]:g} at the end (not recorded at the start)"
    return where


def _run_text(run: dict) -> str:
    jax = ", ".join(run["jax"]) or "?"
    alone = [  # lessons timed in a later run of their own: their commit and load, not the run's
        f"{name} at commit {nb['commit']}, load average {nb['load_average_start'][0]:g} at its start"
        for name, nb in run["notebooks"].items()
        if nb.get("commit") and nb.get("load_average_start")
    ]
    return f"commit {run['commit']}, JAX {jax}, {_machine_text(run['machine'])}" + (
        f"; measured alone: {'; '.join(alone)}" if alone else ""
    )


# A lesson's Time line gives a bucket, not the seconds, so that timing the course
# again changes baselines/timings.json and the README only, unless a lesson moves
# to another bucket. (upper bound in seconds, words)
TIME_BUCKETS = ((30, "under 30 s"), (60, "under 1 min"), (120, "1-2 min"), (300, "2-5 min"), (600, "5-10 min"))


def time_bucket(seconds: float) -> str:
    """The words for ``seconds`` of wall time in a lesson's Time line (``"under 30 s"`` ... ``"over 10 min"``)."""
    for bound, words in TIME_BUCKETS:
        if seconds < bound:
            return words
    return "over 10 min"


def _machine_words(machine: dict) -> str:
    if _accelerator(machine):
        return _accelerator(machine)
    cores = machine.get("cores")
    return f"a {cores}-core CPU" if cores else "a CPU"


def time_line(notebook: str, record: dict) -> str:
    """The ``# **Time** ...`` line of ``notebook`` (a stem such as ``05_shard_map``) from ``record``.

    One line a learner can use: the bucket of each profile's measured wall
    time (:func:`time_bucket`) and the kind of machine; the commit, CPU model
    and load stay in ``baselines/timings.json``. Wrapped at 100 characters.
    """
    by_machine: dict[str, list[str]] = {}  # each kind of machine with its profiles' buckets, in the record's order
    loads = []  # the load average at the start of each run of the lesson (its own where it was timed alone)
    for run in record["runs"]:
        nb = run["notebooks"].get(notebook)
        if nb is None:
            continue
        loads.append((nb.get("load_average_start") or run["machine"].get("load_average_start") or [None])[0])
        if nb["status"] == "passed":
            timed = f" ({nb['timed']})" if nb.get("timed") else ""  # the part of it that ran, where it skipped some
            part = f"{time_bucket(nb['wall_s'])} with `{nb.get('profile', run['profile'])}`{timed}"
        else:  # a lesson that stopped says nothing of how long a whole run takes
            part = f"{nb['status']} with `{run['profile']}` after {nb['wall_s']:.0f}\u00a0s"  # no break before s
        by_machine.setdefault(_machine_words(run["machine"]), []).append(part)
    if not by_machine:
        return "# **Time.** Not measured yet: `python -m coursetools timings --update` writes this line."
    where = "; ".join(f"{', '.join(parts)}, on {machine}" for machine, parts in by_machine.items())
    said = (  # the load itself stays in the record: a learner's machine is not the one it was measured on
        "measured; other work slows it: the run's details, its load included, are in"
        if loads and None not in loads
        else "measured; the run's details are in"
    )
    text = f"**Time**: {where} ({said} `baselines/timings.json`)."
    return "\n".join(textwrap.wrap(text, width=100, initial_indent="# ", subsequent_indent="# "))


def readme_block(record: dict) -> str:
    """The README's measured times (between the timings markers), from ``record``."""
    lines = [
        BEGIN,
        "Measured times (written by `python -m coursetools timings --update` from `baselines/timings.json`):",
        "",
    ]
    for run in record["runs"]:
        total = sum(nb["wall_s"] for nb in run["notebooks"].values())
        stopped = [f"{name} {nb['status']}" for name, nb in run["notebooks"].items() if nb["status"] != "passed"]
        command = "`make tpu-check`" if run["machine"].get("tpus") else "`make course`"  # no kernel on a TPU host
        lines.append(
            f"- {command} with the `{run['profile']}` profile: {total:.0f} s of notebook time "
            f"for {len(run['notebooks'])} notebooks"
            + (f", {len(stopped)} of them not to the end ({', '.join(stopped)})" if stopped else "")
            + _parts_text(run)
            + f" ({_run_text(run)})."
        )
    make_test = record.get("make_test")
    if make_test:
        lines.append(
            f"- `make test`: {make_test['seconds'] / 60:.0f} minutes ({make_test['seconds']:.0f} s; "
            f"commit {make_test['commit']}, {_machine_text(make_test['machine'])})."
        )
    else:
        lines.append("- `make test`: not measured yet (`make time-make-test` measures and records it).")
    lines.append(END)
    return "\n".join(lines)


def _parts_text(run: dict) -> str:
    """Which lessons of ``run`` ran another workload or a part of themselves (``"; 13 ran section 4 alone"``)."""
    parts: dict[str, list[str]] = {}
    for name, nb in run["notebooks"].items():
        profile = nb.get("profile", run["profile"])
        how = (f"the `{profile}` workload " if profile != run["profile"] else "") + nb.get("timed", "")
        if how:
            parts.setdefault(how.strip(), []).append(name.split("_", 1)[0])
    return "".join(f"; {', '.join(names)} ran {how}" for how, names in parts.items())


def _replace_time_paragraph(text: str, line: str) -> str:
    """``text`` (a lesson's .py) with its ``# **Time...`` paragraph replaced by ``line``."""
    lines = text.split("\n")
    for i, current in enumerate(lines):
        if TIME_LINE.match(current):
            j = i + 1
            while j < len(lines) and lines[j].startswith("# ") and not lines[j].startswith("# **"):
                j += 1  # the paragraph's continuation lines
            return "\n".join(lines[:i] + [line] + lines[j:])
    raise ValueError("no '# **Time' line in the lesson's introduction")


def lesson_files(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The lessons' percent-format sources, ``NN_name.py``."""
    return sorted(Path(directory).glob("[0-9][0-9]_*.py"))


def expected_texts(record: dict, directory: Path = NOTEBOOK_DIR, readme: Path = README) -> dict[Path, str]:
    """Each file the record writes, with the text it must hold."""
    out = {}
    for path in lesson_files(directory):
        out[path] = _replace_time_paragraph(path.read_text(encoding="utf-8"), time_line(path.stem, record))
    text = readme.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme}: no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    out[readme] = head + readme_block(record) + rest.split(END, 1)[1]
    return out


def load_record(path: Path = RECORD) -> dict:
    """The committed record at ``path``.

    Raises:
        ValueError: it is not JSON, or not a record of runs (each with its profile and notebooks); one sentence.
        OSError: it cannot be read.
    """
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except ValueError as err:
        raise ValueError(f"{path}: not JSON ({err}); restore it with git checkout {path}.") from None
    runs = record.get("runs") if isinstance(record, dict) else None
    if not isinstance(runs, list) or not all(
        isinstance(r, dict) and isinstance(r.get("profile"), str) and isinstance(r.get("notebooks"), dict) for r in runs
    ):
        raise ValueError(
            f"{path}: not a timings record (a list of runs, each with its profile and notebooks); "
            f"restore it with git checkout {path}."
        )
    return record


def update(
    results: list[Path],
    make_test_seconds: float | None = None,
    record_path: Path = RECORD,
    directory: Path = NOTEBOOK_DIR,
    readme: Path = README,
    sync: bool = True,
    *,
    make_test_load_start: list[float] | None = None,
    make_test_load_end: list[float] | None = None,
    make_test_commit: str | None = None,
    allow_busy: bool = False,
) -> list[Path]:
    """Write the record from ``results`` (and a ``make test`` time), then the lessons and the README; changed files.

    ``make_test_load_start``: the load average read before ``make test``
    started (``time-make-test`` passes it). ``make_test_load_end``: the one
    read as it ended, for a run measured elsewhere (a clean clone) and
    recorded later; without it the end is read now. Without a start, the
    start is recorded as unknown, not as now. ``make_test_commit``: the
    commit that run measured (default: this checkout's). ``allow_busy``: record
    runs (and a ``make test``) measured on a machine too busy to time them
    (:func:`coursetools.machine.busy_sentence`), which are refused otherwise.
    """
    record = load_record(record_path) if Path(record_path).exists() else {"runs": []}
    if results:  # every file is read and checked before anything is written
        lessons = [p.stem for p in lesson_files(directory)]
        record["runs"] = merge_runs(
            record.get("runs", []), [_run_entry(p, lessons, allow_busy) for p in results], lessons
        )
    if make_test_seconds is not None:
        machine = {**machine_info(), "load_average_start": make_test_load_start}
        busy = None if allow_busy else busy_sentence(machine, f"make test ({make_test_seconds:g} s)", judge_end=False)
        if busy:
            raise ValueError(busy + ".")
        record["make_test"] = {
            "seconds": round(make_test_seconds),
            "commit": make_test_commit or course_commit(),
            "measured": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "machine": {**machine, "load_average_end": make_test_load_end or load_average()},
        }
    texts = expected_texts(record, directory, readme)  # a README or lesson without its time block fails here
    changed = [path for path, text in texts.items() if path.read_text(encoding="utf-8") != text]
    write_atomic(record_path, json.dumps(record, indent=2) + "\n")
    for path in changed:
        write_atomic(path, texts[path])
    lessons = [str(p) for p in changed if p.suffix == ".py"]
    if lessons and sync:  # re-pair the .ipynb files with the edited .py files
        subprocess.run([sys.executable, "-m", "jupytext", "--sync", *lessons], check=True, capture_output=True)
    return changed


def check(record_path: Path = RECORD) -> list[str]:
    """Files whose time lines differ from the committed record (empty: all agree)."""
    record = load_record(record_path)
    return [str(p) for p, text in expected_texts(record).items() if p.read_text(encoding="utf-8") != text]


def _loads(text: str | None, flag: str) -> list[float] | None:
    """Three load averages from ``/proc/loadavg``'s first fields (``"0.64 2.89 3.14"``), or None for no text."""
    if not text:
        return None
    try:
        values = [float(v) for v in text.split()[:3]]
    except ValueError:
        values = []
    if len(values) != 3 or not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f'{flag} takes three load averages, as /proc/loadavg starts: "0.64 2.89 3.14"; got {text!r}')
    return values


def _short_commit(name: str) -> str:
    """``name`` (a commit, a tag, a branch) as this repository's short commit; ValueError when it has none."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "--verify", "--quiet", f"{name}^{{commit}}"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if found.returncode != 0:
        raise ValueError(f"--commit {name!r} is no commit of this repository; give the one the run measured (git log)")
    return found.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursetools timings", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--update", nargs="*", type=Path, metavar="RESULTS_JSON", help="record these runs, rewrite the text"
    )
    parser.add_argument("--make-test-seconds", type=float, help="record a measured `make test` wall time")
    parser.add_argument(
        "--load-start",
        help="with --make-test-seconds: the load average before make test started (/proc/loadavg's first 3 fields)",
    )
    parser.add_argument(
        "--load-end",
        help="with --make-test-seconds: the load average as make test ended, when recording it later (default: now)",
    )
    parser.add_argument(
        "--commit",
        help="with --make-test-seconds: the commit that run measured, when recording it later (default: HEAD)",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a lesson or the README differs from the record"
    )
    parser.add_argument(
        "--allow-busy",
        action="store_true",
        help="record runs measured at a load average above the core count (start) or twice it (end) all the same",
    )
    args = parser.parse_args(argv)
    given = [
        flag
        for flag, value in (("--load-start", args.load_start), ("--load-end", args.load_end), ("--commit", args.commit))
        if value
    ]
    if given and args.make_test_seconds is None:
        print(f"error: {', '.join(given)} describe a measured make test: give --make-test-seconds too", file=sys.stderr)
        return 2
    if args.make_test_seconds is not None and not (
        math.isfinite(args.make_test_seconds) and args.make_test_seconds > 0
    ):
        print(
            f"error: --make-test-seconds takes the measured wall time, a positive number of seconds; got {args.make_test_seconds}",
            file=sys.stderr,
        )
        return 2
    if args.update is not None or args.make_test_seconds is not None:
        try:
            start, end = (
                _loads(text, flag) for text, flag in ((args.load_start, "--load-start"), (args.load_end, "--load-end"))
            )
            commit = _short_commit(args.commit) if args.commit else None
            changed = update(
                args.update or [],
                args.make_test_seconds,
                make_test_load_start=start,
                make_test_load_end=end,
                make_test_commit=commit,
                allow_busy=args.allow_busy,
            )
        except (OSError, ValueError, KeyError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"timings: {RECORD} written; {len(changed)} file(s) rewritten")
        return 0
    try:
        stale = check()
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if stale:
        print(
            "timings: these differ from baselines/timings.json; run `python -m coursetools timings --update`: "
            + ", ".join(stale),
            file=sys.stderr,
        )
        return 1
    print("timings: every time line matches baselines/timings.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
