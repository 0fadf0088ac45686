"""Lesson 12's conclusions, written from the run's own numbers: each sentence changes when they do.

Taught in notebook 12 (``notebooks/12_batch_size.py``), which prints these
sentences beside the tables they read. The model behind the steps is
McCandlish et al. 2018's ``S = S_min (1 + B_crit / B)`` (arXiv:1812.06162,
section 2.3): there a doubling of the batch from ``B`` cuts the steps by
``B_crit / (2 (B + B_crit))``, a quarter at ``B_crit`` and a tenth at
``4 B_crit``; the steps never stop falling, they fall by less and less.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def doubling_cut(global_batch: float, b_crit: float) -> float:
    """The fraction of the steps a doubling of the batch from ``global_batch`` saves in the model ``S_min (1 + B_crit / B)``.

    ``(S(B) - S(2B)) / S(B) = B_crit / (2 (B + B_crit))``: 1/4 at ``B = B_crit``, 1/10 at ``B = 4 B_crit``.

    Raises:
        ValueError: a batch or ``b_crit`` that is not > 0.
    """
    if not (global_batch > 0 and b_crit > 0):
        raise ValueError(f"Need a batch and a critical batch > 0, got {global_batch} and {b_crit}.")
    return b_crit / (2.0 * (global_batch + b_crit))


def seed_spread(counts: Sequence[int | None]) -> float:
    """(max - min) / mean of the step counts that reached the target; NaN with fewer than 2 of them."""
    reached = [c for c in counts if c is not None]
    if len(reached) < 2:
        return float("nan")
    return (max(reached) - min(reached)) / (sum(reached) / len(reached))


def spread_sentence(counts: Sequence[int | None], global_batch: int) -> str:
    """What the seeds' spread says: differences below it cannot be told from luck, and it is a low estimate."""
    reached = [c for c in counts if c is not None]
    spread = seed_spread(counts)
    if math.isnan(spread):
        return (
            f"Only {len(reached)} of {len(counts)} seeds reached the target at global batch {global_batch:,}: "
            "no spread to read, so no difference between batches can be told from luck here."
        )
    return (
        f"Spread (max - min) / mean over {len(reached)} seeds at global batch {global_batch:,}: {spread:.0%}. "
        "Differences between batches smaller than this cannot be told from luck; "
        f"{len(reached)} seeds at one batch give a low estimate of the spread (more seeds find a wider one)."
    )


def steps_sentence(best: Mapping[int, int], b_crit: float, spread: float) -> str:
    """The trend of the fewest steps at the two largest batches that reached the target, read against the fit and the seeds' spread.

    Args:
        best: global batch -> fewest steps to the target over the learning-rate rules.
        b_crit: the fitted critical batch (examples).
        spread: the seeds' spread (a fraction; NaN: unknown).

    Raises:
        ValueError: fewer than 2 batches.
    """
    if len(best) < 2:
        raise ValueError(f"Need the steps at 2 or more batches, got {dict(best)}.")
    small, large = sorted(best)[-2:]
    before, after = best[small], best[large]
    cut = (before - after) / before
    where = f"From global batch {small:,} to {large:,} ({small / b_crit:.1f} and {large / b_crit:.1f} x B_crit)"
    predicted = doubling_cut(small, b_crit) if large == 2 * small else None
    model = f"; the fit's model predicts -{predicted:.0%} for this doubling" if predicted is not None else ""
    moved = "fell" if after < before else "rose" if after > before else "stayed"
    head = f"{where} the fewest steps {moved} from {before} to {after} ({-cut:+.0%}{model})."
    past = small >= b_crit
    if math.isnan(spread):
        return head + " With no seeds' spread, this run cannot say whether the change is more than luck."
    if cut > spread:
        where = " past B_crit" if past else ""
        return head + f" That is more than the seeds' spread ({spread:.0%}): the steps still fell{where}."
    if cut < -spread:
        return head + f" That is a rise beyond the seeds' spread ({spread:.0%}): the larger batch took more steps."
    why = (
        "as the model's small cut past B_crit leads one to expect"
        if past
        else "though the model expects a clear cut below B_crit: more seeds would tell"
    )
    return head + f" That is within the seeds' spread ({spread:.0%}): this run cannot tell the change from luck, {why}."


def scaling_sentence(best: Mapping[int, int]) -> str:
    """How close the two smallest batches came to perfect scaling (steps falling as ``1 / B``).

    Args:
        best: global batch -> fewest steps to the target over the learning-rate rules.

    Raises:
        ValueError: fewer than 2 batches.
    """
    if len(best) < 2:
        raise ValueError(f"Need the steps at 2 or more batches, got {dict(best)}.")
    small, next_up = sorted(best)[:2]
    perfect = best[small] * small / next_up
    share = perfect / best[next_up]  # 1: perfect scaling; below 1: more steps than perfect scaling
    head = (
        f"From global batch {small:,} to {next_up:,} the fewest steps went from {best[small]} to "
        f"{best[next_up]}; perfect scaling would give {perfect:.0f}"
    )
    if share >= 0.9:
        return head + f": {share:.0%} of perfect scaling, on the perfect-scaling line within 10%."
    return head + f": {share:.0%} of perfect scaling, already bent away from it at the smallest batches."


def rules_sentence(steps: Mapping[tuple[str, int], int | None], rules: Sequence[str], batches: Sequence[int]) -> str:
    """Which learning-rate rule took the fewest steps at each batch, and which runs never reached the target.

    Args:
        steps: ``(rule, global batch) -> steps`` (None: not reached).
        rules: the rules in the order to name them.
        batches: the global batches, smallest first.
    """
    fewest: dict[str, list[int]] = {}
    missed: dict[str, list[int]] = {}
    nobody = []
    for batch in batches:
        reached = {r: steps[r, batch] for r in rules if steps.get((r, batch)) is not None}
        for rule in rules:
            if steps.get((rule, batch)) is None:
                missed.setdefault(rule, []).append(batch)
        if not reached:
            nobody.append(batch)
            continue
        least = min(reached.values())
        winners = [r for r in rules if reached.get(r) == least]
        who = "every rule" if len(winners) == len(rules) else " and ".join(f'"{r}"' for r in winners)
        fewest.setdefault(who, []).append(batch)

    def listed(values):
        return ", ".join(f"{b:,}" for b in values)

    parts = [f"{who} at {listed(at)}" for who, at in fewest.items()]
    sentence = "Fewest steps: " + "; ".join(parts) + "." if parts else "No rule reached the target at any batch."
    if missed:
        sentence += " Not reached: " + "; ".join(f'"{r}" at {listed(at)}' for r, at in missed.items()) + "."
    else:
        sentence += " Every run reached the target."
    return sentence


def same_split_sentence(backend: str, curve_diff: float, steps_1: int | None, steps_n: int | None, n: int) -> str:
    """What the 1-device vs N-device run shows about step counts on other hardware, from its measured difference."""
    same = "the same step count" if steps_1 == steps_n else f"step counts {steps_1} and {steps_n}"
    here = f"Here ({backend}): 1 and {n} devices gave {same}, held-out losses within {curve_diff:.2g}."
    if backend == "cpu":
        return here + (
            " On the CPU, simulated devices run the same float32 arithmetic as real ones would, summed in "
            "another order: their step counts carry over. A GPU's default float32 matmul runs as TF32, "
            "a TPU's as one bfloat16 pass: there the losses differ by more, and a count can move by a step "
            "where a loss crosses the target within that rounding."
        )
    return here + (
        " This backend's default float32 matmul may round more than float32 (TF32 on a GPU, one bfloat16 "
        "pass on a TPU): read a count that moves by a step where a loss crosses the target as equal."
    )
