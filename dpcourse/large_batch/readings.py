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


def step_cut(small: float, large: float, b_crit: float) -> float:
    """The fraction of the steps that growing the batch from ``small`` to ``large`` saves in the model ``S_min (1 + B_crit / B)``.

    ``(S(b) - S(B)) / S(b) = B_crit (1 - b / B) / (b + B_crit)``; for a doubling
    (``B = 2 b``) this is :func:`doubling_cut`.

    Raises:
        ValueError: a batch or ``b_crit`` that is not > 0, or ``large`` below ``small``.
    """
    if not (small > 0 and large > 0 and b_crit > 0):
        raise ValueError(f"Need batches and a critical batch > 0, got {small}, {large} and {b_crit}.")
    if large < small:
        raise ValueError(f"The larger batch {large} is below the smaller {small}: give them smallest first.")
    return b_crit * (1.0 - small / large) / (small + b_crit)


def growth(small: int, large: int) -> str:
    """How many times larger ``large`` is than ``small``, in words: "a doubling", "a fourfold batch", "a 2.5-fold batch"."""
    ratio = large / small
    if ratio == 2:
        return "a doubling"
    named = {3: "threefold", 4: "fourfold", 8: "eightfold", 16: "sixteenfold"}
    return f"a {named.get(ratio, f'{ratio:g}-fold')} batch"


def told_apart(a: float, b: float, spread: float) -> bool:
    """Whether two step counts differ by more than the seeds' spread: ``|a - b| / mean(a, b) > spread``.

    The spread is the seeds' ``(max - min) / mean`` at one batch
    (:func:`seed_spread`); NaN (no spread measured) tells nothing apart.
    """
    if math.isnan(spread):
        return False
    return abs(a - b) / ((a + b) / 2.0) > spread


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
    where = (
        f"From global batch {small:,} to {large:,} ({growth(small, large)}; "
        f"{small / b_crit:.1f} and {large / b_crit:.1f} x B_crit)"
    )
    predicted = step_cut(small, large, b_crit)
    model = f"; the fit's model predicts -{predicted:.0%} for this step"
    moved = "fell" if after < before else "rose" if after > before else "stayed"
    head = f"{where} the fewest steps {moved} from {before} to {after} ({-cut:+.0%}{model})."
    if math.isnan(spread):
        return head + " With no seeds' spread, this run cannot say whether the change is more than luck."
    if told_apart(before, after, spread) and after < before:
        where = " past B_crit" if small >= b_crit else ""
        return head + f" That is more than the seeds' spread ({spread:.0%}): the steps still fell{where}."
    if told_apart(before, after, spread):
        return head + f" That is a rise beyond the seeds' spread ({spread:.0%}): the larger batch took more steps."
    if told_apart(before, before * (1 - predicted), spread):
        why = f", though the model's cut for this step (-{predicted:.0%}) is beyond it: more seeds would tell"
    else:
        why = f"; the model's own cut for this step (-{predicted:.0%}) is within it too, too small for these seeds to test"
    return head + f" That is within the seeds' spread ({spread:.0%}): this run cannot tell the change from luck{why}."


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
        f"From global batch {small:,} to {next_up:,} ({growth(small, next_up)}) the fewest steps went from "
        f"{best[small]} to {best[next_up]}; perfect scaling would give {perfect:.0f}"
    )
    if share >= 0.9:
        return head + f": {share:.0%} of perfect scaling, on the perfect-scaling line within 10%."
    return head + f": {share:.0%} of perfect scaling, already bent away from it at the smallest batches."


def rules_sentence(
    steps: Mapping[tuple[str, int], int | None],
    rules: Sequence[str],
    batches: Sequence[int],
    spread: float,
) -> str:
    """Which learning-rate rule took the fewest steps at each batch, where the seeds' spread tells them apart.

    A rule wins at a batch only when every other rule's count there is
    :func:`told_apart` from its own; otherwise the sentence names the counts
    and no winner. Runs that never reached the target are listed.

    Args:
        steps: ``(rule, global batch) -> steps`` (None: not reached).
        rules: the rules in the order to name them.
        batches: the global batches, smallest first.
        spread: the seeds' spread (a fraction, :func:`seed_spread`; NaN: unknown, nothing told apart).
    """
    won: dict[str, list[int]] = {}
    undecided: list[str] = []
    missed: dict[str, list[int]] = {}
    for batch in batches:
        reached = {r: steps[r, batch] for r in rules if steps.get((r, batch)) is not None}
        for rule in rules:
            if steps.get((rule, batch)) is None:
                missed.setdefault(rule, []).append(batch)
        if not reached:
            continue
        if len(set(reached.values())) == 1:
            undecided.append(
                f"{batch:,} ({'every rule' if len(reached) == len(rules) else 'every rule that reached it'}: "
                f"{next(iter(reached.values()))})"
            )
            continue
        least = min(reached.values())
        winner = next(r for r in rules if reached.get(r) == least)
        others = [c for r, c in reached.items() if r != winner]
        if all(told_apart(least, c, spread) for c in others):
            won.setdefault(f'"{winner}"', []).append(batch)
        else:
            counts = ", ".join(f'"{r}" {c}' for r, c in reached.items())
            undecided.append(f"{batch:,} ({counts})")

    def listed(values):
        return ", ".join(f"{b:,}" for b in values)

    against = "no spread measured" if math.isnan(spread) else f"the seeds' spread ({spread:.0%})"
    if not won and not undecided:
        sentence = "No rule reached the target at any batch."
    else:
        sentence = f"Fewest steps by rule, read against {against}: "
        if won:
            wins = "; ".join(f"{who} at {listed(at)}" for who, at in won.items())
            sentence += f"{wins} (fewer than every other rule by more than the spread)."
        else:
            sentence += "no rule took fewer than the others by more than the spread at any batch."
        if undecided:
            sentence += " No winner at " + "; ".join(undecided) + ": the counts are equal or within the spread."
    if missed:
        sentence += " Not reached: " + "; ".join(f'"{r}" at {listed(at)}' for r, at in missed.items()) + "."
    elif won or undecided:
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


def measured_sentence(measured: Sequence[Mapping], simulated: bool) -> str:
    """What this run's own step times say, read from the measured table (section 7).

    Args:
        measured: rows with ``global batch``, ``ms/step`` and ``time to target s``
            (None: not reached), smallest batch first.
        simulated: whether the devices are simulated CPU devices.

    Raises:
        ValueError: fewer than 2 rows, or a row whose batch or step time is not > 0.
    """
    if len(measured) < 2:
        raise ValueError(f"Need 2 or more measured rows, got {len(measured)}.")
    if any(not (r["ms/step"] and r["ms/step"] > 0 and r["global batch"] > 0) for r in measured):
        raise ValueError(f"Every measured row needs a global batch and a ms/step > 0, got {list(measured)}.")
    first, last = measured[0], measured[-1]
    batch_x = last["global batch"] / first["global batch"]
    time_x = last["ms/step"] / first["ms/step"]
    head = (
        f"Measured here: from global batch {first['global batch']:,} to {last['global batch']:,} "
        f"(x{batch_x:g}) the step went from {first['ms/step']:.3g} to {last['ms/step']:.3g} ms (x{time_x:.2g})"
    )
    if time_x >= 0.75 * batch_x:
        how = ": it grew about in proportion to the batch, so the examples are most of the step's cost at these sizes."
    elif time_x <= 1.25:
        how = (
            ": its time hardly followed the batch, so a step's fixed costs (dispatch, the held-out loss, the "
            "collectives) outweigh its examples at these sizes."
        )
    else:
        how = ": it grew by less than the batch, so part of the step's cost is fixed at these sizes."
    reached = [r for r in measured if r["time to target s"] is not None]
    soonest = (
        " No run reached the target."
        if not reached
        else " The target came soonest at global batch {:,} ({:.3g} s).".format(
            *min(((r["global batch"], r["time to target s"]) for r in reached), key=lambda t: t[1])
        )
    )
    where = (
        " Simulated devices share this machine's cores: these times are how this host runs them, "
        "not how real devices would; only the step counts carry over."
        if simulated
        else " These are this machine's devices: the times hold for them, at these sizes."
    )
    return head + how + soonest + where
