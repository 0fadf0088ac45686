"""The compiles ``make placement`` stored in the package, read back labelled as stored, with their JAX and date.

A lesson that cannot compile for a GPU or a TPU here (no extra, no device)
shows what ``make placement`` compiled instead: ``stored/lessons.json``
(GPU targets), ``stored/lessons_tpu.json`` (TPU slices) and
``stored/overlap.json.gz`` (lesson 09's schedules, with their programs'
text). Each file says who made it, when, and with which JAX; every result
read back has ``stored`` set (``"make placement, 2026-12-03"``), so a table
says so, and it is never recorded as this run's figure.
"""

from __future__ import annotations

import importlib.resources
import json

from dpcourse.cross_compile.compile import Job
from dpcourse.cross_compile.result import CompileResult

# Package data, written by `make placement-store` (coursetools.compile_report).
STORED_FILE = ("cross_compile", "stored", "lessons.json")
TPU_STORED_FILE = ("cross_compile", "stored", "lessons_tpu.json")
STORED_FILES = {"gpu": STORED_FILE, "tpu": TPU_STORED_FILE}
STORED_PROFILE = "smoke"  # shown when the run's own profile was not stored
OVERLAP_FILE = ("cross_compile", "stored", "overlap.json.gz")


def stored_payload(platform: str = "gpu") -> dict:
    """One stored file: ``made_by``, ``date``, ``jax_version``, ``jaxlib_version``, ``results`` (dicts).

    Args:
        platform: ``"gpu"`` (:data:`STORED_FILE`) or ``"tpu"`` (:data:`TPU_STORED_FILE`).

    Raises:
        ValueError: the file is missing or not such a payload (a broken install; reinstall the package).
    """
    parts = STORED_FILES[platform]
    path = importlib.resources.files("dpcourse").joinpath(*parts)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        payload["results"]  # noqa: B018 - the one field every reader needs
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"The stored compile {'/'.join(parts)} cannot be read ({err}): reinstall dpcourse.") from err
    return payload


def stored_results(platform: str | None = None) -> list[CompileResult]:
    """Every stored result (of ``platform``'s file, default both), its ``stored`` field saying where and when."""
    out = []
    for name in [platform] if platform else list(STORED_FILES):
        payload = stored_payload(name)
        made = f"{payload.get('made_by', 'make placement')}, {payload.get('date', 'undated')}"
        out += [CompileResult(**{**CompileResult.from_dict(r).__dict__, "stored": made}) for r in payload["results"]]
    return out


def find_stored(jobs: list[Job], steps: dict[str, str], disable_passes: tuple[str, ...] = ()) -> list[CompileResult]:
    """The stored result for each job that has one: same backend, target, device count, passes and steps.

    The job's profile and device count when they were stored, else
    :data:`STORED_PROFILE` and 8 devices (the result's ``profile`` and
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
