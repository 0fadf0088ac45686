"""What compiling a step for GPUs, TPUs or CPU devices found: one result type, its records and table rows.

Every way this course compiles without running (a GPU target description on
a machine without a GPU, a TPU slice's topology on a machine without a TPU,
a mocked GPU topology on a machine with one GPU, or simulated CPU devices;
:mod:`dpcourse.cross_compile.compile`) returns a
:class:`CompileResult` per (backend, target, device count, profile), holding
one :class:`StepResult` per step. :func:`records` flattens them to the rows
of ``placement.json``; :func:`table_rows` to the rows a notebook shows.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from dpcourse.cross_compile import targets as gpu_targets

RESULT_PREFIX = "DPCOURSE_DEVICELESS_RESULT "


@dataclass(frozen=True)
class StepResult:
    """One compiled step.

    Attributes:
        step: its name (a key of the steps mapping).
        builder: the ``"module:function"`` that built it.
        collectives: one dict per collective instruction: ``kind``, ``name``,
            ``bytes`` (result bytes per device per execution; a tuple-typed
            async start counted once), ``in_loop``, ``runs_per_step``,
            ``bytes_per_step`` (None where a loop's trip count is unknown).
        count: collective instructions in the program.
        in_loop: of which inside a ``while`` body.
        runs_per_step: collective executions per step (None: unknown).
        bytes_per_step: bytes through collectives per step, per device.
        memory: ``compiled.memory_analysis()`` fields, bytes (per device).
        cost: ``compiled.cost_analysis()`` figures (:data:`COST_KEYS` present),
            for a whole step; a ``while`` body (``lax.scan``) is counted once.
        cost_source: how ``cost`` was obtained (see :func:`dpcourse.cross_compile.compile._cost`).
        compile_s: seconds to build, lower and compile (wall clock, in the worker; a GPU
            job's later steps reuse the kernels of its earlier ones, see the module's notes).
        error: why it could not be built or compiled (then the rest is empty).
        schedule: :meth:`dpcourse.compiled.schedule.Schedule.summary` of the program.
        scheduler_ran: XLA's latency-hiding scheduler ran (None: not a GPU compile).
    """

    step: str
    builder: str
    collectives: list[dict] = field(default_factory=list)
    count: int = 0
    in_loop: int = 0
    runs_per_step: int | None = 0
    bytes_per_step: int | None = 0
    memory: dict[str, int] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    compile_s: float = 0.0
    cost_source: str = ""
    error: str | None = None
    schedule: dict = field(default_factory=dict)
    scheduler_ran: bool | None = None


@dataclass(frozen=True)
class CompileResult:
    """Every step compiled for one :class:`Job`.

    Attributes:
        backend, target, n_devices, profile: the job.
        target_label: ``"H200"``, ``"L4 (approximate)"``, ``"TPU v5e 2x4"``, ``"CPU"``.
        approximate: the target description is an estimate (the L4).
        deviceless: compiled for devices this machine does not have.
        device_kind: the devices' kind as JAX reports it.
        jax_version, jaxlib_version: the versions that compiled it.
        disabled_passes: XLA passes switched off for the compile.
        steps: step name -> :class:`StepResult`.
        error: why nothing could be compiled (None when the job ran).
        stored: empty for a compile of this run; for a result read back from a
            file, where and when it was made (``"make placement, 2026-12-03"``).
    """

    backend: str
    target: str
    n_devices: int
    profile: str
    target_label: str = ""
    approximate: bool = False
    deviceless: bool = False
    device_kind: str = ""
    jax_version: str = ""
    jaxlib_version: str = ""
    disabled_passes: list[str] = field(default_factory=list)
    steps: dict[str, StepResult] = field(default_factory=dict)
    error: str | None = None
    stored: str = ""

    @property
    def platform(self) -> str:
        """The devices' platform: ``"gpu"`` (a target description or a mocked topology), ``"tpu"`` or ``"cpu"``."""
        return self.backend if self.backend in ("cpu", "tpu") else "gpu"

    @property
    def label(self) -> str:
        """Where it was compiled for, in words: ``"compiled for 8 x H200 without a GPU"``.

        A TPU slice: ``"compiled for 8 x TPU v5e (2x4 slice) without a TPU"``.

        A mocked topology: ``"compiled for 4 mocked GPUs (topology 1x4x1, NVIDIA H200) on a GPU"``;
        a stored result ends with ``", stored (make placement, 2026-12-03, JAX 0.10.2)"``.
        """
        if self.backend in ("gpu", "tpu"):
            device = self.backend.upper()
            how = f"without a {device}" if self.deviceless else f"on a {device}"
            text = f"compiled for {gpu_targets.target(self.target).devices_label(self.n_devices)} {how}"
        elif self.backend == "mocked":
            kind = f", {self.device_kind}" if self.device_kind else ""
            text = f"compiled for {self.n_devices} mocked GPUs (topology {self.target}{kind}) on a GPU"
        else:
            text = f"compiled for {self.n_devices} simulated CPU devices"
        if self.stored:
            text += f", stored ({self.stored}, JAX {self.jax_version or '?'})"
        return text

    def to_line(self) -> str:
        return RESULT_PREFIX + json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> CompileResult:
        """Rebuild from :func:`dataclasses.asdict` output.

        Raises:
            ValueError: not such a dict.
        """
        try:
            steps = {k: StepResult(**v) for k, v in payload.get("steps", {}).items()}
            return cls(steps=steps, **{k: v for k, v in payload.items() if k != "steps"})
        except TypeError as err:
            raise ValueError(f"Not a compile result: {err}.") from err


OVERLAP_FIELDS = ("overlapped_fraction", "windows_with_compute", "sync_collectives")


def records(results: list[CompileResult]) -> list[dict]:
    """One flat record per result and step (the rows of placement.json).

    Fields: backend, target, target_label, approximate, deviceless,
    n_devices, profile, step, collectives, all_reduces, in_loop,
    runs_per_step, bytes_per_step (per device), sent_bytes_per_step (bytes
    each device sends in ring collectives,
    :func:`dpcourse.compiled.census.sent_bytes`; None where a trip count is
    unknown), compile_s, flops,
    bytes_accessed (cost_analysis), temp_bytes (memory_analysis),
    overlapped_fraction, windows_with_compute, sync_collectives (the GPU
    schedule, :mod:`dpcourse.compiled.schedule`; None on the CPU), scheduler_ran,
    disabled_passes, jax_version, jaxlib_version, error.
    """
    from dpcourse.compiled import census

    out = []
    for res in results:
        base = {
            "backend": res.backend,
            "target": res.target,
            "target_label": res.target_label,
            "approximate": res.approximate,
            "deviceless": res.deviceless,
            "n_devices": res.n_devices,
            "profile": res.profile,
        }
        tail = {
            "disabled_passes": res.disabled_passes,
            "jax_version": res.jax_version,
            "jaxlib_version": res.jaxlib_version,
        }
        if res.error:
            out.append({**base, "step": None, **tail, "error": res.error})
            continue
        for name, s in res.steps.items():
            out.append(
                {
                    **base,
                    "step": name,
                    "collectives": s.count,
                    "all_reduces": sum(c["kind"] == "all-reduce" for c in s.collectives),
                    "in_loop": s.in_loop,
                    "runs_per_step": s.runs_per_step,
                    "bytes_per_step": s.bytes_per_step,
                    "sent_bytes_per_step": census.sent_bytes_per_step(
                        census.report_from_rows(s.collectives), res.n_devices
                    ),
                    "compile_s": s.compile_s,
                    "flops": s.cost.get("flops"),
                    "bytes_accessed": s.cost.get("bytes accessed"),
                    "temp_bytes": s.memory.get("temp_size_in_bytes"),
                    **{k: (s.schedule if res.backend == "gpu" else {}).get(k) for k in OVERLAP_FIELDS},
                    "scheduler_ran": s.scheduler_ran,
                    **tail,
                    "error": s.error,
                }
            )
    return out


def table_rows(recs: list[dict]) -> list[dict]:
    """Rows for :func:`dpcourse.show.table` or a text table: where each step's collectives land."""
    rows = []
    for r in recs:
        where = r["target_label"] if r["backend"] != "cpu" else "CPU (simulated)"
        row = {"backend": r["backend"], "compiled for": f"{r['n_devices']} x {where}", "profile": r["profile"]}
        if r.get("error"):
            rows.append({**row, "step": "(not compiled)", "collectives": r["error"]})
            continue
        rows.append(
            {
                **row,
                "step": r["step"],
                "collectives": r["collectives"],
                "inside loop": r["in_loop"],
                "runs per step": "unknown" if r["runs_per_step"] is None else r["runs_per_step"],
                "bytes per step": "unknown" if r["bytes_per_step"] is None else f"{r['bytes_per_step']:,}",
                "compile s": r["compile_s"],
            }
        )
    return rows
