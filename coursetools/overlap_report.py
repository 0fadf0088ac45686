"""Where communication hides, per form and GPU target: the overlap table of ``make placement`` and its check.

``python -m coursetools.compile_report --overlap`` (``make placement``)
compiles the two steps of :data:`dpcourse.cross_compile.overlap_steps.STEPS`
that nothing else compiles (the small combine threshold, ``O1``) on 8 devices
of every GPU target, and reads the others from the compiles it makes anyway
(the plain ``jit`` step at 8 GPUs, lesson 10's FSDP gathered once and
reduced accumulation). Each record of ``placement.json`` carries the
overlap its program's schedule shows (:mod:`dpcourse.compiled.schedule`);
:func:`check` fails when a fraction moves from :data:`EXPECTED`, the
figures notebook 09 teaches, as a moved collective does.
"""

from __future__ import annotations

import re
from pathlib import Path

from dpcourse.cross_compile import compile as deviceless
from dpcourse.cross_compile import overlap_steps

DEVICES = 8
# The overlap forms and the record step that holds each: the plain step is make placement's "jit".
FORMS: dict[str, str] = {
    "plain": "jit",
    "small_threshold": "small_threshold",
    "o1": "o1",
    "fsdp_gathered": "fsdp_gathered",
    "accum_reduced": "accum_reduced",
}
EXTRA_STEPS: dict[str, str] = {k: overlap_steps.STEPS[k] for k in ("small_threshold", "o1")}
# Fraction of the bytes sent whose window runs matmul FLOPs (dpcourse.compiled.schedule.Window.has_compute),
# smoke profile, 8 GPUs, compiled without a GPU: measured with JAX 0.10.2 and 0.12.0.1 (make placement;
# tools/capture_schedule_hlo.py). A key (form, target, JAX minor version) absent here is reported, not checked.
_TARGETS = ("h100_sxm", "h200", "l4")
EXPECTED: dict[tuple[str, str, str], float] = {
    **{(f, t, v): 0.0 for f in ("plain", "o1", "accum_reduced") for t in _TARGETS for v in ("0.10", "0.12")},
    # JAX 0.10: the biases' and the input layer's all-reduces have a GEMM in their window (100,648 of
    # 106,032 bytes); JAX 0.12: the biases', the output layer's and the block's (5,680 of 106,032 bytes).
    **{("small_threshold", t, "0.10"): 0.9492 for t in ("h100_sxm", "h200")},
    **{("small_threshold", t, "0.12"): 0.0536 for t in ("h100_sxm", "h200")},
    **{("small_threshold", "l4", v): 0.0 for v in ("0.10", "0.12")},
    # Only the reduce-scatter's window has a GEMM: 91,392 of 185,556 bytes sent.
    **{("fsdp_gathered", t, v): 0.4925 for t in ("h100_sxm", "h200") for v in ("0.10", "0.12")},
    **{("fsdp_gathered", "l4", v): 0.0 for v in ("0.10", "0.12")},
}
TOLERANCE = 0.001  # the fraction is a ratio of byte counts, printed to 4 places: any real move is larger


def jobs(profiles: list[str], targets: list[str]) -> list:
    """The jobs of ``--overlap``: :data:`DEVICES` GPUs of each target, smoke profile only when asked."""
    return [deviceless.Job("gpu", t, DEVICES, "smoke") for t in targets if "smoke" in profiles]


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def overlap_records(recs: list[dict]) -> list[dict]:
    """The records of the overlap forms (GPU, :data:`DEVICES` devices), each with its ``form``."""
    by_step = {step: form for form, step in FORMS.items()}
    return [
        {**r, "form": by_step[r["step"]]}
        for r in recs
        if r.get("backend") == "gpu" and r.get("n_devices") == DEVICES and r.get("step") in by_step
    ]


def table_rows(recs: list[dict]) -> list[dict]:
    """One row per (profile, form), one column per target: ``fraction (windows/collectives, LHS yes/no)``."""
    rows: dict[tuple[str, str], dict] = {}
    for r in overlap_records(recs):
        row = rows.setdefault((r["profile"], r["form"]), {"profile": r["profile"], "form": r["form"]})
        if r.get("error"):
            row[r["target_label"]] = "not compiled"
            continue
        frac = r.get("overlapped_fraction")
        lhs = {True: "yes", False: "no"}.get(r.get("scheduler_ran"), "?")
        shown = "?" if frac is None else f"{frac:.2f}"
        row[r["target_label"]] = f"{shown} ({r.get('windows_with_compute')}/{r.get('collectives')}, LHS {lhs})"
    order = list(FORMS)
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0], order.index(k[1])))]


def check(recs: list[dict], expected: dict | None = None) -> list[str]:
    """What differs from :data:`EXPECTED` (empty: as taught), one sentence per record that moved."""
    expected = EXPECTED if expected is None else expected
    problems = []
    for r in overlap_records(recs):
        if r["profile"] != "smoke" or r.get("error"):
            continue
        key = (r["form"], r["target"], _minor(r.get("jax_version", "")))
        if key not in expected:
            continue
        got, want = r.get("overlapped_fraction"), expected[key]
        if got is None or abs(got - want) > TOLERANCE:
            problems.append(
                f"gpu {r['target']} x{r['n_devices']} smoke {r['form']}: the fraction of bytes sent inside "
                f"windows with matmul FLOPs moved from {want} to {got} (JAX {r.get('jax_version')}); read notebook 09's "
                "overlap section again and update coursetools.overlap_report.EXPECTED"
            )
    return problems


# What notebook 09 compiles in its section 8, and stores for a machine without the extra: every form
# for 8 x H200, the plain step and its two changes for 8 x H100 SXM and 8 x L4.
LESSON_FORMS: dict[str, tuple[str, ...]] = {
    "h200": tuple(overlap_steps.STEPS),
    "h100_sxm": ("plain", "small_threshold", "o1"),
    "l4": ("plain", "small_threshold", "o1"),
}
_METADATA = re.compile(r",? metadata=\{[^{}]*\}")


def strip_metadata(text: str) -> str:
    """HLO text without its ``metadata={...}`` (source lines and op names): a third of the size, the same program."""
    return _METADATA.sub("", text)


def lesson_payload(profile: str = "smoke") -> dict:
    """Compile notebook 09's overlap forms as the lesson does; the stored file's payload (results and HLO text)."""
    import tempfile
    from dataclasses import asdict
    from datetime import UTC, datetime

    with tempfile.TemporaryDirectory(prefix="overlap-store-") as hlo_dir:
        pending = [
            deviceless.start_jobs(
                [deviceless.Job("gpu", target, DEVICES, profile)],
                {k: overlap_steps.STEPS[k] for k in forms},
                hlo_dir=hlo_dir,
            )
            for target, forms in LESSON_FORMS.items()
        ]
        results = [r for p in pending for r in p.results()]
        failed = [f"{r.target}: {r.error}" for r in results if r.error]
        failed += [f"{r.target} {k}: {s.error}" for r in results for k, s in r.steps.items() if s.error]
        if failed:
            raise RuntimeError("overlap compile failed, nothing stored: " + "; ".join(failed))
        hlo = {
            f"{r.target}/{name}": strip_metadata(
                (Path(hlo_dir) / f"gpu_{r.target}_{DEVICES}_{profile}_{name}.hlo").read_text(encoding="utf-8")
            )
            for r in results
            for name in r.steps
        }
    return {
        "made_by": "make placement",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "jax_version": results[0].jax_version,
        "results": [asdict(r) for r in results],
        "hlo": hlo,
    }


def store(path: Path, profile: str = "smoke") -> Path:
    """Write :func:`lesson_payload` gzip-compressed to ``path`` (whole or not at all); ``path``."""
    import gzip
    import json
    import os

    data = gzip.compress(json.dumps(lesson_payload(profile)).encode("utf-8"), 9, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path
