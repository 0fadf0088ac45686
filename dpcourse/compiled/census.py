"""The collectives a compiled step runs, per kind, and what the cost model predicts (lesson 10).

Lesson 10 counts, for each form of data parallelism (replicated, ZeRO-1, FSDP,
gradient accumulation), the all-reduces, reduce-scatters and all-gathers of
the compiled step: how many, how many inside loops, runs and bytes per step
(read with :mod:`dpcourse.compiled.collectives`), and holds them to the ring-collective
byte counts of :mod:`dpcourse.costs`.

Two byte counts, not to be confused: a collective's **result bytes** (what
the program text states: an all-reduce's and an all-gather's full array, a
reduce-scatter's ``1 / N`` slice) and the **bytes each device sends** in a
ring (:func:`sent_bytes`), the quantity the cost model predicts and a link's
bandwidth divides.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcourse import costs
from dpcourse.compiled import collectives

KINDS = ("all-reduce", "reduce-scatter", "all-gather")


@dataclass(frozen=True)
class KindCensus:
    """Collectives of one kind in a compiled step.

    Attributes:
        count: instructions in the program.
        in_loop: how many of them sit inside a loop body.
        runs_per_step: executions per step (None: a loop's trip count unknown).
        bytes_per_step: result bytes per device per step, summed over runs.
        sent_bytes_per_step: bytes each device sends per step in ring
            collectives (:func:`sent_bytes`); None when the device count was
            not given or a trip count is unknown.
    """

    count: int
    in_loop: int
    runs_per_step: int | None
    bytes_per_step: int | None
    sent_bytes_per_step: float | None = None


def sent_bytes(kind: str, result_bytes: float, n_devices: int) -> float:
    """Bytes each device sends in one ring collective whose result is ``result_bytes`` per device.

    From the ring formulas of :mod:`dpcourse.costs`, over a group of
    ``n_devices``: an all-reduce sends ``2 (N - 1) / N`` of its (full) result,
    an all-gather ``(N - 1) / N`` of its (full) result, and a reduce-scatter,
    whose result is the ``1 / N`` slice, ``(N - 1)`` times its result (the
    ``(N - 1) / N`` of the full array). Other kinds (collective-permute,
    all-to-all): their result bytes.

    Raises:
        ValueError: ``n_devices`` < 1 or negative bytes.
    """
    if n_devices < 1 or result_bytes < 0:
        raise ValueError(f"Need n_devices >= 1 and result_bytes >= 0, got {n_devices} and {result_bytes}.")
    if kind == "all-reduce":
        return 2 * (n_devices - 1) / n_devices * result_bytes
    if kind == "all-gather":
        return costs.all_gather_bytes(result_bytes, n_devices)
    if kind == "reduce-scatter":
        return costs.reduce_scatter_bytes(result_bytes * n_devices, n_devices)
    return float(result_bytes)


def census(report: collectives.CollectiveReport, n_devices: int | None = None) -> dict[str, KindCensus]:
    """Per kind (all-reduce, reduce-scatter, all-gather, and any other present): a :class:`KindCensus`.

    ``bytes_per_step`` are result sizes as in :mod:`dpcourse.compiled.collectives`: an
    all-reduce's and an all-gather's result is the full array, a
    reduce-scatter's the ``1 / N`` slice each device keeps. With
    ``n_devices`` (every collective over all of them, as on lesson 10's 1-D
    mesh), ``sent_bytes_per_step`` too.
    """
    kinds = list(KINDS) + sorted({c.kind for c in report.collectives} - set(KINDS))
    out = {}
    for kind in kinds:
        found = report.of_kind(kind)
        runs = [c.runs_per_step for c in found]
        per = [c.bytes_per_step for c in found]
        sent = None
        if n_devices is not None and None not in per:
            sent = sum(sent_bytes(kind, b, n_devices) for b in per)
        out[kind] = KindCensus(
            len(found),
            sum(c.in_loop for c in found),
            None if None in runs else sum(runs),
            None if None in per else sum(per),
            sent,
        )
    return out


def sent_bytes_per_step(report: collectives.CollectiveReport, n_devices: int) -> float | None:
    """Bytes each device sends per step over all collectives of ``report`` (None: a trip count unknown)."""
    per_kind = [c.sent_bytes_per_step for c in census(report, n_devices).values()]
    return None if None in per_kind else float(sum(per_kind))


def census_row(label: str, report: collectives.CollectiveReport, n_devices: int | None = None) -> dict:
    """One table row: per kind ``count (in loop) x runs per step``, result bytes, and (with ``n_devices``) sent bytes.

    ``"result bytes per step"``: the collectives' result sizes per device,
    summed over runs; ``"sent per device"``: what each device sends in ring
    collectives (:func:`sent_bytes`), the quantity
    :func:`predict_communication` predicts.
    """
    row = {"form": label}
    for kind, c in census(report).items():
        if kind in KINDS or c.count:
            runs = "?" if c.runs_per_step is None else c.runs_per_step
            row[kind] = f"{c.count} ({c.in_loop} in loop), {runs}/step" if c.count else "0"
    row["result bytes per step"] = report.bytes_per_step
    if n_devices is not None:
        sent = sent_bytes_per_step(report, n_devices)
        row["sent per device"] = None if sent is None else int(round(sent))
    return row


def form_rows(steps: dict, labels: dict[str, str], n_devices: int) -> list[dict]:
    """A :func:`census_row` per compiled step, in order: the table lesson 10 shows for each GPU and TPU target.

    Args:
        steps: step name -> a compiled step with a ``collectives`` list of
            row dicts (``dpcourse.cross_compile.result.StepResult``).
        labels: step name -> the form's label in the table.
        n_devices: the devices the steps were compiled for (sent bytes).

    Raises:
        KeyError: a step without a label.
    """
    return [census_row(labels[name], report_from_rows(s.collectives), n_devices) for name, s in steps.items()]


def memory_figures(compiled) -> dict[str, int]:
    """Argument, output and temporary bytes per device of a compiled step (``memory_analysis()``)."""
    m = compiled.memory_analysis()
    return {
        "argument_bytes": int(m.argument_size_in_bytes),
        "output_bytes": int(m.output_size_in_bytes),
        "temp_bytes": int(m.temp_size_in_bytes),
    }


def memory_saving(full_bytes: int, accumulated_bytes: int, k: int) -> str:
    """The temporary bytes per device of the full batch against ``k`` microbatches, as a sentence read from both.

    The activations shrink ``k`` times, the gradients do not, and the
    compiler's workspace moves with its choices for each shape: the saving
    lands near ``k`` where the activations dominate, below it where the
    rest weighs as much, and can pass it. The sentence says where this
    program's landed, or that there was none.
    """
    head = f"temporary bytes per device: full batch {full_bytes:,}, K = {k} microbatches {accumulated_bytes:,}"
    if accumulated_bytes <= 0 or full_bytes <= 0:
        return head + " (no temporary bytes to compare)"
    ratio = full_bytes / accumulated_bytes
    if ratio > 1.05 * k:
        return head + f" ({ratio:.2f}x less: more than K)"
    if ratio >= 0.95 * k:
        return head + f" ({ratio:.2f}x less: about K)"
    if ratio > 1:
        return head + f" ({ratio:.2f}x less: below K)"
    if ratio == 1:
        return head + " (the same: accumulation saved nothing here)"
    return head + f" ({1 / ratio:.2f}x more: accumulation saved nothing here)"


def report_from_rows(rows: list[dict]) -> collectives.CollectiveReport:
    """A :class:`dpcourse.compiled.collectives.CollectiveReport` from per-collective dicts.

    ``rows``: dicts with ``kind``, ``name``, ``bytes``, ``in_loop`` and
    ``runs_per_step``, as :mod:`dpcourse.cross_compile.compile` returns them for a
    compile in a subprocess.
    """
    return collectives.CollectiveReport(
        [
            collectives.Collective(
                r["kind"], r.get("name", ""), "", int(r["bytes"]), bool(r["in_loop"]), r["runs_per_step"]
            )
            for r in rows
        ]
    )


def predict_communication(
    grad_bytes: float, block_bytes: float, n_devices: int, k: int, block_repeats: int
) -> dict[str, dict]:
    """The cost model's collectives per step for each of lesson 10's forms, where each is placed ideally.

    Per form: runs per step of each kind (``all-reduce``, ``reduce-scatter``,
    ``all-gather``), ``payload`` (bytes of the arrays reduced or gathered per
    step, per kind) and ``wire_bytes`` (bytes each device sends per step in
    ring collectives, :mod:`dpcourse.costs`). Metrics (a few floats) are left
    out.

    - replicated DP: one all-reduce of the gradient;
    - ZeRO-1 and FSDP gathered once: one reduce-scatter of the gradient and
      one all-gather of the parameters: the same wire bytes as the all-reduce;
    - ZeRO-1 with the gradient all-reduced first (constrained to ``P()``):
      one all-reduce and one all-gather, 1.5 x replicated DP's wire bytes;
    - FSDP naive, if every use of the shared block gathers it: the block's
      weight gathered ``2 x block_repeats`` times (forward and backward
      loops), the rest once, one reduce-scatter;
    - accumulation with a scan, if the whole gradient were reduced in every
      microbatch: ``k`` all-reduces (XLA's GPU compiler reduces only the
      shared block's share ``k`` times, and sends less); with
      reduced/unreduced: one.

    Args:
        grad_bytes: bytes of the full gradient (= the parameters, float32).
        block_bytes: bytes of the shared block's weight ``w_block``.
        n_devices: devices on the ``data`` axis (>= 1).
        k: microbatches per step.
        block_repeats: uses of the shared block per forward pass.

    Raises:
        ValueError: ``n_devices``, ``k`` or ``block_repeats`` < 1.
    """
    if n_devices < 1 or k < 1 or block_repeats < 1:
        raise ValueError(f"Need n_devices, k and block_repeats >= 1, got {n_devices}, {k}, {block_repeats}.")
    g, uses = float(grad_bytes), 2 * block_repeats
    plans = {
        "replicated DP": {"all-reduce": (1, g)},
        "ZeRO-1": {"reduce-scatter": (1, g), "all-gather": (1, g)},
        "ZeRO-1, all-reduce first": {"all-reduce": (1, g), "all-gather": (1, g)},
        "FSDP, naive": {"reduce-scatter": (1, g), "all-gather": (uses + 1, uses * block_bytes + g - block_bytes)},
        "FSDP, gathered once": {"reduce-scatter": (1, g), "all-gather": (1, g)},
        "accumulation, scan": {"all-reduce": (k, k * g)},
        "accumulation, reduced": {"all-reduce": (1, g)},
    }
    out = {}
    for form, kinds in plans.items():
        row = {kind: kinds.get(kind, (0, 0.0))[0] for kind in KINDS}
        payload = {kind: kinds.get(kind, (0, 0.0))[1] for kind in KINDS}
        wire = (
            2 * (n_devices - 1) / n_devices * payload["all-reduce"]
            + costs.reduce_scatter_bytes(payload["reduce-scatter"], n_devices)
            + costs.all_gather_bytes(payload["all-gather"], n_devices)
        )
        out[form] = {**row, "payload": payload, "wire_bytes": wire}
    return out


def predicted_time_s(prediction: dict, n_devices: int, link_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Communication time per step of one form of :func:`predict_communication`, ring collectives.

    The bandwidth terms of :func:`dpcourse.costs.ring_allreduce_s`,
    :func:`~dpcourse.costs.ring_reduce_scatter_s` and
    :func:`~dpcourse.costs.ring_all_gather_s` on the payloads; with
    ``latency_s`` > 0, one latency term per collective call.
    """
    pay, runs = prediction["payload"], prediction
    total = 0.0
    for kind, fn in (
        ("all-reduce", costs.ring_allreduce_s),
        ("reduce-scatter", costs.ring_reduce_scatter_s),
        ("all-gather", costs.ring_all_gather_s),
    ):
        if runs[kind]:
            total += fn(pay[kind], n_devices, link_bytes_per_s) + runs[kind] * fn(
                0.0, n_devices, link_bytes_per_s, latency_s
            )
    return total
