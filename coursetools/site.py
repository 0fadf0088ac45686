"""Gather the executed lessons into a Sphinx source tree for the course's website (``make site``).

``python -m coursetools.site --src build/site-src`` picks, for every lesson in
``notebooks/`` (``NN_name.ipynb``), an executed copy whose cells are the
lesson's current cells: from the runs named by ``--run`` (a ``python -m
coursetools run`` folder with ``results.json``, or a folder of notebooks that
nbmake executed with ``--overwrite`` and a ``records.jsonl``), else it runs
the missing lessons itself with ``--profile`` into ``--run-out``. A lesson
that failed (an error, a cell past its time limit) stops the build with a
:class:`SiteBuildError` naming the lesson and the cell. The tree it writes
holds ``site/``'s pages, the guides from ``docs/``, the executed lessons with
a note on where their outputs come from (profile, commit, JAX, machine) and
the figures of each real GPU run in ``baselines/``, and the lessons'
unexecuted notebooks to download. Sphinx (``requirements-site.txt``) then
renders it with ``site/conf.py``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from coursetools import paths, streams

ROOT = paths.ROOT
# The paths whose contents decide what a lesson prints.
SOURCE_PATHS = ("notebooks", "dpcourse", "requirements.txt", "pyproject.toml", ":(exclude)coursetools/site.py")
ALLOWED_ERROR_TAG = "raises-exception"


class SiteBuildError(RuntimeError):
    """A lesson cannot go on the site: it failed, or its outputs are missing."""


@dataclass
class Run:
    """One set of executed lessons: where, which profile, when, and what they recorded."""

    folder: Path
    profile: str
    created: float  # POSIX seconds: when the run finished writing
    kind: str  # "runner" (python -m coursetools run) or "nbmake"
    status: dict[str, dict] = field(default_factory=dict)  # lesson -> runner's notebook entry
    records: list[dict] = field(default_factory=list)
    machine: str | None = None


def _read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def load_run(folder: Path, profile: str | None = None) -> Run | None:
    """The run in ``folder``: a runner's ``results.json``, else nbmake's executed notebooks; None when empty.

    ``profile`` names the profile of an nbmake folder (it records none of its
    own); a runner's folder says its own.
    """
    folder = Path(folder)
    results = folder / "results.json"
    if results.exists():
        payload = json.loads(results.read_text(encoding="utf-8"))
        created = _dt.datetime.fromisoformat(payload["created"]).timestamp()
        run = Run(folder, payload.get("profile", "auto"), created, "runner")
        run.status = {nb["notebook"]: nb for nb in payload.get("notebooks", [])}
        run.records = list(payload.get("records", []))
    else:
        executed = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
        if not executed:
            return None
        created = max(p.stat().st_mtime for p in executed)
        run = Run(folder, profile or "unknown", created, "nbmake")
        run.records = _read_records(folder / "records.jsonl")
    stamp = folder / "machine.txt"
    run.machine = stamp.read_text(encoding="utf-8").strip() if stamp.exists() else None
    profiles = {r.get("profile") for r in run.records if r.get("profile")}
    if run.profile in ("auto", "unknown") and len(profiles) == 1:
        run.profile = profiles.pop()
    return run


def cells_of(nb) -> list[tuple[str, str]]:
    """What a lesson says and runs: each cell's type and source."""
    return [(c["cell_type"], c["source"]) for c in nb["cells"]]


def last_change(root: Path = ROOT) -> float:
    """When the sources that decide a lesson's outputs last changed (POSIX seconds).

    The newest of the last commit touching :data:`SOURCE_PATHS` and the
    modification time of any of their files with uncommitted changes.
    """
    times = []
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%ct", "--", *SOURCE_PATHS],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if out:
            times.append(float(out))
        for name in dirty_files(root):
            path = root / name
            if path.exists():
                times.append(path.stat().st_mtime)
    except (OSError, subprocess.CalledProcessError):
        return float("inf")  # not a git checkout: no run can be shown to be current
    return max(times) if times else 0.0


def dirty_files(root: Path = ROOT) -> list[str]:
    """Files under :data:`SOURCE_PATHS` that differ from the commit (untracked ones too)."""
    out = subprocess.run(
        ["git", "status", "--porcelain", "--", *SOURCE_PATHS],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line[3:].split(" -> ")[-1] for line in out.splitlines() if line.strip()]


def commit_label(root: Path = ROOT) -> str:
    """The checkout's commit, short, with a note when the lesson sources have uncommitted changes."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = dirty_files(root)
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit (not a git checkout)"
    return f"{sha} with uncommitted changes" if dirty else sha


def machine_label() -> str:
    """This machine in words: CPU model, core count, OS (for runs made here)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"


def failure_message(lesson: str, entry: dict) -> str:
    """One line for a lesson that failed under the runner: lesson, cell, error, and whether it timed out."""
    cell = entry.get("error_code_cell")
    where = f" at code cell {cell}" if cell is not None else ""
    error = entry.get("error") or "no error recorded"
    kind = "timed out" if error.startswith("CellTimeoutError") else "failed"
    return f"lesson {lesson} {kind}{where} (cell {entry.get('error_cell')} counting markdown): {error}"


def error_cells(nb) -> list[tuple[int, str]]:
    """Code cells (1-based, as a learner counts) with an error output not tagged ``raises-exception``."""
    found, number = [], 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        number += 1
        if ALLOWED_ERROR_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append((number, f"{out.get('ename')}: {str(out.get('evalue', '')).splitlines()[:1]}"))
    return found


def check_lesson(lesson: Path, run: Run, changed: float):
    """The executed copy of ``lesson`` in ``run`` when it is current, else None (with the reason).

    Raises:
        SiteBuildError: the run executed the current lesson and it failed.
    """
    import nbformat

    executed = run.folder / lesson.name
    if not executed.exists():
        return None, f"no executed {lesson.name} in {run.folder}"
    nb = nbformat.read(executed, as_version=4)
    if cells_of(nb) != cells_of(nbformat.read(lesson, as_version=4)):
        return None, f"{executed} was executed from another version of the lesson"
    entry = run.status.get(lesson.stem)
    if entry is not None and entry.get("status") != "passed":
        raise SiteBuildError(failure_message(lesson.stem, entry))
    if run.kind == "runner" and entry is None:
        return None, f"{run.folder / 'results.json'} does not list {lesson.stem}"
    errors = error_cells(nb)
    if errors:
        cell, text = errors[0]
        raise SiteBuildError(f"lesson {lesson.stem} failed at code cell {cell}: {text} ({executed})")
    if run.created < changed:
        return None, f"{run.folder} is older than the last change to {', '.join(SOURCE_PATHS[:-1])}"
    return nb, None


def run_lessons(lessons: list[Path], profile: str, out: Path, cell_timeout_s: int) -> Run:
    """Execute ``lessons`` with the headless runner into ``out``; the run, with this machine recorded.

    Raises:
        SiteBuildError: a lesson failed or a cell ran past ``cell_timeout_s``.
    """
    from coursetools.runner import run_course

    print(f"site: running {', '.join(p.stem for p in lessons)} with the {profile} profile into {out}", file=sys.stderr)
    payload = run_course(profile, lessons, out, cell_timeout_s=cell_timeout_s)
    (out / "machine.txt").write_text(machine_label() + "\n", encoding="utf-8")
    failed = [failure_message(nb["notebook"], nb) for nb in payload["notebooks"] if nb["status"] != "passed"]
    if failed:
        raise SiteBuildError("; ".join(failed))
    return load_run(out)


def choose(lessons: list[Path], runs: list[Run], changed: float) -> tuple[dict, list[str]]:
    """For each lesson the first run holding a current executed copy: ({stem: (run, nb)}, reasons for the rest)."""
    chosen, missing = {}, []
    for lesson in lessons:
        reasons = []
        for run in runs:
            nb, why = check_lesson(lesson, run, changed)
            if nb is not None:
                chosen[lesson.stem] = (run, nb)
                break
            reasons.append(why)
        else:
            missing.append(f"{lesson.stem}: " + ("; ".join(reasons) or "no executed copy in any run"))
    return chosen, missing


def lesson_title(nb) -> str:
    """The lesson's first heading, without the ``#``."""
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in cell["source"].splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return "untitled"


def lesson_goal(nb) -> str:
    """The first sentence after ``**Goal.**`` in the lesson's opening, or an empty string."""
    for cell in nb["cells"][:3]:
        if cell["cell_type"] != "markdown":
            continue
        text = " ".join(cell["source"].split())
        m = re.search(r"\*\*Goal\.\*\*\s*(.+?[.!?])(\s|$)", text)
        if m:
            return m.group(1)
    return ""


def baseline_runs(folder: Path) -> list[dict]:
    """The real GPU runs in ``folder`` (``baselines/*.json``): name, commit (from its README row), records."""
    readme = folder / "README.md"
    rows = readme.read_text(encoding="utf-8").splitlines() if readme.exists() else []
    runs = []
    for path in sorted(folder.glob("*.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        records = payload.get("records", [])
        if not any(r.get("backend") == "gpu" for r in records):
            continue
        row = next((r for r in rows if f"`{path.name}`" in r), "")
        m = re.search(r"commit\s+`?([0-9a-f]{7,40})", row)
        gpus = sorted({r["device_kind"] for r in records if r.get("backend") == "gpu"})
        runs.append(
            {
                "name": path.name,
                "commit": m.group(1) if m else None,
                "device": ", ".join(gpus),
                "profile": payload.get("profile", "?"),
                "created": payload.get("created", "?"),
                "jax": ", ".join(sorted({str(r.get("jax_version")) for r in records})),
                "records": records,
            }
        )
    return runs


def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def gpu_section(stem: str, run: Run, gpu_runs: list[dict]) -> str | None:
    """Markdown: each GPU run's figures for lesson ``stem`` beside this run's same metrics; None if none."""
    parts = []
    ours = {r["metric"]: r for r in run.records if r.get("notebook") == stem}
    for g in gpu_runs:
        recs = [r for r in g["records"] if r.get("notebook") == stem]
        if not recs:
            continue
        commit = f"commit `{g['commit']}`" if g["commit"] else "commit not recorded"
        lines = [
            f"**{g['device']}** (`baselines/{g['name']}`: profile `{g['profile']}`, JAX {g['jax']}, "
            f"{commit}, run {g['created']}). Each figure says which devices measured it."
            + (
                ""
                if any(r.get("backend") == "gpu" for r in recs)
                else " On that machine this lesson ran on simulated CPU devices, as the course does on one GPU:"
                " none of these figures was measured on the GPU."
            ),
            "",
            f"| metric | unit | GPU run | devices (GPU run) | this page (`{run.profile}`) | devices (this page) |",
            "|---|---|---|---|---|---|",
        ]
        for r in recs:
            mine = ours.get(r["metric"])
            lines.append(
                "| "
                + " | ".join(
                    _cell(x)
                    for x in (
                        r["metric"],
                        r.get("unit", ""),
                        _value(r.get("value")),
                        f"{r.get('device_count')} x {r.get('device_kind')}",
                        _value(mine["value"]) if mine else "not recorded",
                        f"{mine['device_count']} x {mine['device_kind']}" if mine else "",
                    )
                )
                + " |"
            )
        parts.append("\n".join(lines))
    if not parts:
        return None
    return "## Figures from a real GPU run\n\n" + "\n\n".join(parts)


def provenance(stem: str, run: Run, commit: str, gpu: bool) -> str:
    """Markdown: where this page's outputs come from, and the download link."""
    recs = [r for r in run.records if r.get("notebook") == stem] or run.records
    jax = ", ".join(sorted({str(r["jax_version"]) for r in recs if r.get("jax_version")})) or "not recorded"
    devices = sorted(
        {f"{r['device_count']} x {r['device_kind']} ({r['backend']})" for r in recs if r.get("device_kind")}
    )
    when = _dt.datetime.fromtimestamp(run.created, _dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    how = "python -m coursetools run" if run.kind == "runner" else "the notebook tests"
    machine = run.machine or machine_label()
    text = (
        f"The outputs below come from running this lesson with the **`{run.profile}` profile** "
        f"({how}, {when}) at commit **`{commit}`**, with **JAX {jax}** on {machine}"
        + (f"; devices: {', '.join(devices)}" if devices else "")
        + ". "
        + f"Download the lesson to run it yourself: {{download}}`{stem}.ipynb <../download/{stem}.ipynb>`."
    )
    if gpu:
        text += " A real GPU run's figures for this lesson: [at the end of the page](#figures-from-a-real-gpu-run)."
    return ":::{admonition} Where these outputs come from\n:class: note\n\n" + text + "\n:::"


def lesson_table(entries: list[tuple[str, str, str]]) -> str:
    """Markdown table of the lessons: link, title, goal."""
    lines = ["| lesson | what it is about |", "|---|---|"]
    for stem, title, goal in entries:
        lines.append(f"| [{_cell(title)}](lessons/{stem}.ipynb) | {_cell(goal)} |")
    return "\n".join(lines) + "\n"


_SPAN_COLOURS = re.compile(
    r"color: #([0-9a-fA-F]{6}); text-decoration-color: #([0-9a-fA-F]{6}); background-color: #([0-9a-fA-F]{6})"
)


def _luminance(hex6: str) -> float:
    """Relative luminance of an sRGB colour (WCAG 2.x: https://www.w3.org/TR/WCAG21/#dfn-relative-luminance)."""
    channels = [int(hex6[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two ``RRGGBB`` colours, 1 to 21."""
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def readable_colours(html: str) -> str:
    """Rich's coloured blocks (``jax.debug.visualize_array_sharding``) with text that can be read on its background.

    Where the text colour has less than WCAG's 4.5:1 contrast with its
    background, it becomes black or white, whichever contrasts more; the
    background (the device's colour) stays.
    """

    def fix(m: re.Match) -> str:
        fg, _, bg = m.groups()
        if contrast(fg, bg) >= 4.5:
            return m.group(0)
        best = max(("000000", "ffffff"), key=lambda c: contrast(c, bg))
        return f"color: #{best}; text-decoration-color: #{best}; background-color: #{bg}"

    return _SPAN_COLOURS.sub(fix, html)


def image_alt(cell) -> None:
    """Give the cell's image output its ``alt`` text: the output's own ``text/plain`` (the figure's data).

    :func:`dpcourse.show.show_figure` writes that text from the chart; a bare
    repr (``<Figure size ...>``, ``<IPython.core.display.Image object>``)
    is not a description and is not used. myst-nb reads ``alt`` from the
    cell's ``mystnb.image`` metadata.
    """
    for out in cell.get("outputs", []):
        text = out.get("data", {}).get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else text
        if "image/png" in out.get("data", {}) and text.strip() and not text.lstrip().startswith("<"):
            cell.setdefault("metadata", {}).setdefault("mystnb", {}).setdefault("image", {})["alt"] = text.strip()
            return


def stage(
    src: Path,
    lessons: list[Path],
    chosen: dict,
    gpu_runs: list[dict],
    commit: str,
    pages: Path = ROOT / "site",
    docs: Path = ROOT / "docs",
    vendor: Path | None = None,
) -> None:
    """Write the Sphinx source tree ``src``: pages, guides, lessons with their notes, downloads, vendor files."""
    import nbformat

    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(pages, src, ignore=shutil.ignore_patterns("__pycache__"))
    if docs.is_dir():
        shutil.copytree(docs, src / "guides")
    (src / "lessons").mkdir()
    (src / "download").mkdir()
    entries = []
    for lesson in lessons:
        run, nb = chosen[lesson.stem]
        nb = nbformat.from_dict(json.loads(json.dumps(nb)))
        section = gpu_section(lesson.stem, run, gpu_runs)
        note = nbformat.v4.new_markdown_cell(provenance(lesson.stem, run, commit, section is not None))
        nb.cells.insert(1, note)
        if section:
            nb.cells.append(nbformat.v4.new_markdown_cell(section))
        folders = {str(run.folder.resolve()): "<the run's folder>", **streams.machine_folders(ROOT)}
        for cell in nb.cells:  # nbformat wants ids; the runner's copies have them, nbmake's may not
            cell.setdefault("id", f"c{abs(hash(cell.source)) % 10**10}")
            image_alt(cell)
            cell["outputs"] = streams.merged_streams(cell.get("outputs", []))
            for out in cell.get("outputs", []):
                streams.publishable(out, folders)
                html = out.get("data", {}).get("text/html")
                if html:
                    out["data"]["text/html"] = readable_colours("".join(html) if isinstance(html, list) else html)
        nbformat.write(nb, src / "lessons" / lesson.name)
        shutil.copy2(lesson, src / "download" / lesson.name)
        entries.append((lesson.stem, lesson_title(nb), lesson_goal(nb)))
    (src / "_lessons.md").write_text(lesson_table(entries), encoding="utf-8")
    profiles = sorted({chosen[p.stem][0].profile for p in lessons})
    (src / "_provenance.md").write_text(
        f"The lessons' outputs on this site come from the `{'`, `'.join(profiles)}` profile at commit `{commit}`; "
        "each lesson's page says which JAX and machine produced them.\n",
        encoding="utf-8",
    )
    if vendor is not None:
        copy_vendor(vendor, src / "_static" / "offline")


# What the pages load from tools/site/node_modules (npm ci from package-lock.json).
VENDOR_FILES = {
    "requirejs/require.js": "require.js",
    "@jupyter-widgets/html-manager/dist": "html-manager",
    "mathjax": "mathjax",
    "@mathjax/mathjax-newcm-font": "@mathjax/mathjax-newcm-font",
}
# Not needed by a browser: source maps, Node entry points, the other font sizes' sources.
# MathJax: only the tex-mml-svg component (SVG output needs no web fonts) and what it loads.
_VENDOR_SKIP = (
    "*.map",
    "*.md",
    "node-main*",
    "*.cjs",
    "*.mjs",
    "*.d.ts",
    "ts",
    "cjs",
    "mjs",
    "*chtml*",
    "*.eot",
    "tex-svg*",
    "mml-svg*",
    "tex-mml-svg-*",
)


def copy_vendor(node_modules: Path, dest: Path) -> None:
    """Copy the browser files of :data:`VENDOR_FILES` from ``node_modules`` into ``dest``.

    Raises:
        SiteBuildError: a file is missing (``npm ci`` in ``tools/site`` was not run).
    """
    for name, target in VENDOR_FILES.items():
        source = node_modules / name
        if not source.exists():
            raise SiteBuildError(f"{source} is missing: run `npm ci` in tools/site (make site does).")
        out = dest / target
        out.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, out, ignore=shutil.ignore_patterns(*_VENDOR_SKIP))
        else:
            shutil.copy2(source, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursetools.site", description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=Path("build/site-src"), help="Sphinx source tree to write")
    parser.add_argument("--run", type=Path, action="append", default=[], help="folder of executed lessons to reuse")
    parser.add_argument("--run-profile", default=None, help="profile of an nbmake --run folder (it records none)")
    parser.add_argument("--profile", default="cpu", help="profile for lessons no --run holds (default cpu)")
    parser.add_argument("--run-out", type=Path, default=Path("build/site-run"), help="where those run")
    parser.add_argument("--no-run", action="store_true", help="fail instead of running missing lessons")
    parser.add_argument("--cell-timeout", type=int, default=1800, help="seconds per cell when running (default 1800)")
    parser.add_argument("--notebooks", type=Path, default=ROOT / "notebooks")
    parser.add_argument("--vendor", type=Path, default=ROOT / "tools" / "site" / "node_modules")
    args = parser.parse_args(argv)
    from coursetools.runner import find_notebooks
    from dpcourse.backend.xlaflags import exit_on_bad_xla_flags
    from dpcourse.config import profile_names

    if args.profile not in profile_names():  # before any lesson runs with it
        parser.error(f"--profile {args.profile!r} is not a profile: use one of {', '.join(profile_names())}")
    if args.cell_timeout <= 0:
        parser.error(f"--cell-timeout must be a positive number of seconds, got {args.cell_timeout}")

    try:
        lessons = find_notebooks(args.notebooks)
        changed = last_change()
        runs = [r for r in (load_run(f, args.run_profile) for f in args.run if f.is_dir()) if r is not None]
        own = args.run_out / args.profile
        previous = load_run(own) if own.is_dir() else None
        if previous is not None and previous.profile == args.profile:
            runs.append(previous)
        chosen, missing = choose(lessons, runs, changed)
        if not runs:
            looked = ", ".join(str(f) for f in [*args.run, own]) or str(own)
            print(f"site: no executed lessons to reuse (none in {looked})", file=sys.stderr)
        elif missing:
            print("site: no current executed copy of\n  " + "\n  ".join(missing), file=sys.stderr)
        if missing and not args.no_run:
            print(
                f"site: running {len(missing)} lesson(s) with the {args.profile} profile into {own} first "
                "(make course writes results/cpu, which the next make site reuses)",
                file=sys.stderr,
            )
        if missing:
            if args.no_run:
                raise SiteBuildError(f"{len(missing)} lesson(s) have no current executed copy (--no-run)")
            todo = [p for p in lessons if p.stem not in chosen]
            exit_on_bad_xla_flags()  # before the kernels start: XLA would end each one on a bad token
            fresh = run_lessons(todo, args.profile, own, args.cell_timeout)
            more, still = choose(todo, [fresh], 0.0)
            if still:
                raise SiteBuildError("after running them: " + "; ".join(still))
            chosen.update(more)
        for stem, (run, _) in chosen.items():
            print(f"site: {stem} from {run.folder} ({run.profile} profile)", file=sys.stderr)
        stage(args.src, lessons, chosen, baseline_runs(ROOT / "baselines"), commit_label(), vendor=args.vendor)
    except SiteBuildError as err:
        print(f"make site: FAILED: {err}", file=sys.stderr)
        return 1
    print(f"site: source tree in {args.src}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
