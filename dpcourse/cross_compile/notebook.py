"""What lessons 04, 05, 09 and 10 call to show the GPU compiler's collectives, on any machine.

Three ways to the same :class:`dpcourse.cross_compile.result.CompileResult`, tried
in order: the GPU-compile extra (a target description, no GPU needed,
:mod:`dpcourse.cross_compile.compile`); else, on a machine with an NVIDIA GPU, mocked
topologies (:mod:`dpcourse.cross_compile.mocked`); else the result ``make
placement`` stored in the package (:data:`STORED_FILE`), labelled as stored,
with the JAX version and the date it was made. A stored result is read back,
never recorded as this run's figure.
"""

from __future__ import annotations

import importlib.resources
import json

from dpcourse.cross_compile import compile as deviceless
from dpcourse.cross_compile import mocked as gpu_placement
from dpcourse.cross_compile import targets as gpu_targets
from dpcourse.cross_compile.result import CompileResult, records, table_rows

PASS_NAME = "while-loop-all-reduce-code-motion"
CPU_ONLY_CAVEAT = (
    "This is the CPU compiler's placement. XLA's GPU compiler, measured with JAX 0.10.2 and 0.12.0.1 "
    "for H100 SXM, H200 and L4 targets, moves this all-reduce out of the loop (pass "
    "while-loop-all-reduce-code-motion, then gpu-all-reduce-combiner merges it into one): the GPU compile "
    "below shows it."
)
STORED_FILE = (
    "cross_compile",
    "stored",
    "lessons.json",
)  # package data, written by `make placement` (coursetools.compile_report)
STORED_PROFILE = "smoke"  # shown when the run's own profile was not stored
EXTRA_SAYS = "the GPU-compile extra (make gpu-compile, about 510 MB) compiles it on this machine"


def stored_payload() -> dict:
    """The stored file: ``made_by``, ``date``, ``jax_version``, ``jaxlib_version``, ``results`` (dicts).

    Raises:
        ValueError: the file is missing or not such a payload (a broken install; reinstall the package).
    """
    path = importlib.resources.files("dpcourse").joinpath(*STORED_FILE)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        payload["results"]  # noqa: B018 - the one field every reader needs
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"The stored GPU compile {'/'.join(STORED_FILE)} cannot be read ({err}): reinstall dpcourse."
        ) from err
    return payload


def stored_results() -> list[CompileResult]:
    """Every stored result, its ``stored`` field saying where and when it was made."""
    payload = stored_payload()
    made = f"{payload.get('made_by', 'make placement')}, {payload.get('date', 'undated')}"
    return [CompileResult(**{**CompileResult.from_dict(r).__dict__, "stored": made}) for r in payload["results"]]


def find_stored(
    jobs: list[deviceless.Job], steps: dict[str, str], disable_passes: tuple[str, ...] = ()
) -> list[CompileResult]:
    """The stored result for each job that has one: same backend, target, device count, passes and steps.

    The job's profile and device count when they were stored, else
    :data:`STORED_PROFILE` and 8 GPUs (the result's ``profile`` and
    ``n_devices`` say which). Jobs without one are left out.
    """
    found = []
    stored = stored_results()
    for job in jobs:
        wanted = [
            (p, n) for p in dict.fromkeys((job.profile, STORED_PROFILE)) for n in dict.fromkeys((job.n_devices, 8))
        ]
        for profile, n in wanted:
            match = [
                r
                for r in stored
                if (r.backend, r.target, r.n_devices, r.profile) == (job.backend, job.target, n, profile)
                and tuple(r.disabled_passes) == tuple(disable_passes)
                and set(steps) <= set(r.steps)
                and not r.error
            ]
            if match:
                res = match[0]
                found.append(CompileResult(**{**res.__dict__, "steps": {k: res.steps[k] for k in steps}}))
                break
    return found


def _stored_line(results: list[CompileResult], missing: str) -> str:
    if not results:
        return f"Not shown: no stored result of this compile, and {EXTRA_SAYS} ({missing.split('.')[0]})."
    res = results[0]
    return f"Stored result (made by {res.stored}, JAX {res.jax_version}, {res.profile} profile): {EXTRA_SAYS}."


def show_results(results: list[CompileResult], passes: tuple[str, ...] = ()) -> None:
    """One table per result: where each step's collectives land, captioned with where it was compiled for."""
    from IPython.display import display

    from dpcourse import show

    off = f", XLA passes off: {', '.join(passes)}" if passes else ""
    for res in results:
        caption = f"{res.label} ({res.profile} profile, JAX {res.jax_version or '?'}{off})"
        display(show.table(table_rows(records([res])), caption=caption))


def show_gpu_placement(
    profile: str,
    backend: str,
    steps: dict[str, str] | None = None,
    counts: tuple[int, ...] = (8,),
    disable_passes: tuple[str, ...] = (),
    target: str = "h200",
) -> list[CompileResult]:
    """Notebooks 04, 05 and 09: the GPU compiler's placement of ``steps`` on ``counts`` x ``target``.

    With the extra: compiled without a GPU, and, when ``backend`` is not
    ``"cpu"`` (a notebook on CPU devices has just shown the CPU's answer),
    for 8 simulated CPU devices too. Without it, on a machine with an NVIDIA
    GPU: the mocked topologies of ``counts`` GPUs. Elsewhere: the stored
    result, with one line saying so and what the extra adds.

    Args:
        steps: step name -> builder ``"module:function"`` (default
            :data:`dpcourse.cross_compile.compile.COURSE_STEPS`).
        disable_passes: XLA passes to switch off in the compile (experiments).

    Returns:
        The results shown (a stored one has ``stored`` set; a result that
        failed has ``error`` set); possibly empty.
    """
    steps = dict(deviceless.COURSE_STEPS if steps is None else steps)
    passes = tuple(disable_passes)
    missing = gpu_targets.extra_missing()
    if missing is None:
        jobs = [deviceless.Job("gpu", target, n, profile) for n in counts]
        jobs += [deviceless.Job("cpu", "cpu", 8, profile)] if backend != "cpu" else []
        results = deviceless.compile_jobs(jobs, steps, disable_passes=passes)
    elif gpu_placement.gpu_unavailable_reason() is None:
        topologies = tuple(f"1x{n}x1" for n in counts)
        results = gpu_placement.compile_mocked(profile, topologies, steps, passes)
        gpu_placement.record(results)
    else:
        results = find_stored([deviceless.Job("gpu", target, n, profile) for n in counts], steps, passes)
        print(_stored_line(results, missing))
    show_results(results, passes)
    return results


class GpuCompile:
    """Lesson 10's background GPU compile (:func:`start_gpu_compile`); :meth:`results` collects it."""

    def __init__(self, jobs, steps, pending, missing):
        self.jobs, self.steps, self.pending, self.missing = jobs, steps, pending, missing

    def results(self) -> list[CompileResult]:
        """The compiled results (waiting for the worker), or the stored ones with a line saying so."""
        if self.pending is not None:
            return self.pending.results()
        if not self.jobs:
            return []
        found = find_stored(self.jobs, self.steps)
        print(_stored_line(found, self.missing))
        return found


def start_gpu_compile(steps: dict[str, str], targets: tuple[str, ...], n_devices: int, profile: str) -> GpuCompile:
    """Start compiling ``steps`` for ``n_devices`` x each target without a GPU, in the background.

    Without the extra nothing starts, and :meth:`GpuCompile.results` gives
    the stored results for those targets instead.

    Raises:
        ValueError: an unknown target or a bad builder name.
    """
    jobs = [deviceless.Job("gpu", t, n_devices, profile) for t in targets]
    missing = gpu_targets.extra_missing() if jobs else None
    pending = deviceless.start_jobs(jobs, steps) if jobs and missing is None else None
    return GpuCompile(jobs, dict(steps), pending, missing or "")


# Notebook 09's section 8: each program's optimised text, as `make placement-store` compiled it
# (coursetools.overlap_report.store), so that a machine without the extra reads the same schedules.
OVERLAP_FILE = ("cross_compile", "stored", "overlap.json.gz")


def stored_overlap(profile: str) -> tuple[list[CompileResult], dict[tuple[str, str], str]]:
    """The stored overlap compiles of ``profile``: the results, and each ``(target, form)``'s HLO text.

    The results have ``stored`` set (``"make placement, 2026-12-05"``); their
    JAX version is the one that compiled them. Empty when nothing of that
    profile was stored.

    Raises:
        ValueError: the file is missing or not such a payload (a broken install; reinstall the package).
    """
    import gzip

    path = importlib.resources.files("dpcourse").joinpath(*OVERLAP_FILE)
    try:
        payload = json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
        made = f"{payload['made_by']}, {payload['date']}"
        results = [CompileResult(**{**CompileResult.from_dict(r).__dict__, "stored": made}) for r in payload["results"]]
        texts = {tuple(key.split("/", 1)): text for key, text in payload["hlo"].items()}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"The stored GPU compile {'/'.join(OVERLAP_FILE)} cannot be read ({err}): reinstall dpcourse."
        ) from err
    from dpcourse.cross_compile.overlap_steps import STEPS

    order = list(STEPS)  # the lesson's order of the forms, whatever order the file kept
    results = [
        CompileResult(**{**r.__dict__, "steps": dict(sorted(r.steps.items(), key=lambda kv: order.index(kv[0])))})
        for r in results
        if r.profile == profile
    ]
    return results, {key: text for key, text in texts.items() if any(r.target == key[0] for r in results)}


def stored_overlap_line(results: list[CompileResult], missing: str) -> str:
    """The line above a stored schedule: stored, when, which JAX and profile, and what the extra adds."""
    return _stored_line(results, missing)
