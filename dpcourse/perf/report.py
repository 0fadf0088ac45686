"""Lesson 09's tables, sentences and records, one call per cell: what the lesson shows around its JAX calls.

Each function returns a :class:`Part` (tables, printed lines, the figures to
record); ``part.show()`` displays it and records its figures. Every sentence
here that concludes from a number reads that number from the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpcourse import costs, record, show
from dpcourse.perf import ceilings, ladder, roofline

MB = 1e6


@dataclass
class Part:
    """What one cell of lesson 09 shows: tables ``(rows, caption)``, lines, and ``{metric: (value, unit)}``."""

    tables: list[tuple[list[dict], str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    figures: dict = field(default_factory=dict)

    def show(self, **record_context) -> Part:
        """Display the tables (columns that are empty in every row left out), print the lines, record the figures."""
        for rows, caption in self.tables:
            if rows:
                shown = [k for k in rows[0] if any(r.get(k) is not None for r in rows)]
                show._display(show.table(rows, caption, shown))
        for line in self.lines:
            print(line)
        record.figures(self.figures, **record_context)
        return self


def _status(status: str, reason: str) -> tuple[str, str]:
    return (status if status == "ok" else f"failed: {reason}", "status")


def ceiling_table(measured: dict, peak, platform: str, label: str) -> Part:
    """Section 1: each ceiling beside the datasheet peak of what it runs as, and the bfloat16/float32 ratio."""
    runs_as, part = ceilings.precision_words(platform), Part()
    rows = []
    for name, c in measured.items():
        is_bw = name == "memory bandwidth"
        sheet, words = (None, "") if is_bw else ceilings.datasheet_rate(name, peak, platform)
        rate = None if c.rate is None else f"{c.rate / 1e9:,.1f} GB/s" if is_bw else f"{c.rate / 1e12:,.2f} TFLOP/s"
        rows.append(
            {
                "measured": name + ("" if is_bw or c.size is None else f" matmul {c.size}^3"),
                "on this device": runs_as.get(name, "one read and one write per value"),
                "status": c.status,
                "rate": rate,
                "datasheet": None if sheet is None else f"{sheet / 1e12:,.0f} TFLOP/s ({words})",
                "of datasheet": None if sheet is None or c.rate is None else f"{c.rate / sheet:.1%}",
                "reason": c.reason or None,
            }
        )
        key = name.replace(" ", "_")
        part.figures[f"ceiling_{key}_status"] = _status(c.status, c.reason)
        part.figures[f"ceiling_{key}"] = (c.rate, "bytes/s" if is_bw else "FLOP/s")
    part.tables.append((rows, f"Ceilings of {label}"))
    bf16, f32 = measured["bfloat16"].rate, measured["float32 default"].rate
    if bf16 and f32:
        part.lines.append(f"bfloat16 matmul rate / float32-default rate on this device: {bf16 / f32:.2f}x")
    return part


def roofline_tables(cfg, batch: int, measured: dict) -> Part:
    """Section 2: the work of one step and the times it bounds, float32 and bfloat16."""
    bw, part = measured["memory bandwidth"].rate, Part()
    work, bounds = [], []
    for label, c in (("float32", cfg), ("bfloat16", cfg.with_overrides(compute_dtype="bfloat16"))):
        rate = measured[ceilings.ceiling_for(c.compute_dtype)].rate
        bound = roofline.step_bound(c, batch, rate, bw) if rate and bw else None
        work.append(
            {
                "compute": label,
                "FLOPs/step": costs.train_flops_per_step(c, batch),
                "least bytes/step": roofline.saved_activation_bytes_per_step(c, batch),
                "separate-kernel bytes/step": roofline.elementwise_bytes_per_step(c, batch),
                "block matmul FLOP/byte": roofline.block_matmul_intensity(c, batch),
                "ridge FLOP/byte (measured)": rate / bw if rate and bw else None,
            }
        )
        if bound is not None:
            bounds.append(
                {
                    "compute": label,
                    "matmul ms": bound.compute_s * 1e3,
                    "least-bytes ms": bound.memory_s * 1e3,
                    "bound ms (max)": bound.overlap_s * 1e3,
                    "no-overlap ms (matmul + separate kernels)": bound.serial_s * 1e3,
                }
            )
    part.tables += [(work, f"Work of one step at global batch {batch} (one device)")]
    part.tables += [(bounds, f"Roofline at global batch {batch} (one device)")]
    left_out = roofline.residual_bytes_per_step(cfg, batch) / roofline.elementwise_bytes_per_step(cfg, batch)
    part.lines += [
        f"{roofline.passes_per_repeat()} passes over a [batch, {cfg.width}] activation per repeat; input and "
        f"output layers are {roofline.input_output_fraction(cfg):.1%} of the matmul FLOPs.",
        "Left out of the separate-kernel count: the scan's saved residuals, written and read once, would add "
        f"{left_out:.0%} to its bytes.",
    ]
    return part


def ladder_table(runs: list, cfg, measured: dict, device_kind: str, label: str) -> Part:
    """Section 3: the ladder's table, each rung's settings or failure, and its figures."""
    part, rows = Part(), []
    for r in runs:
        res, n = r.result, r.rung.name
        row = {
            "rung": n,
            "batch": r.rung.global_batch,
            "status": r.status,
            "ms/step": res.ms_per_step if res else None,
            "examples/s": res.examples_per_s if res else None,
            "MFU (datasheet)": r.mfu_datasheet(cfg, device_kind),
            "of measured ceiling": r.fraction_of_ceiling(cfg, measured),
            "compile s": res.compile_s if res else None,
            "program MB": None if r.program_bytes is None else r.program_bytes / MB,
            "peak MB": None if r.peak_bytes is None else r.peak_bytes / MB,
            "reason": (r.reason[:60] + ("..." if len(r.reason) > 60 else "")) or None,
        }
        rows.append(row)
        part.lines.append(f"{n}: {r.rung.label}" + (f"; failed: {r.reason}" if r.status != "ok" else ""))
        part.figures[f"rung_{n}_status"] = _status(r.status, r.reason)
        if res is not None:
            part.figures |= {
                f"rung_{n}_throughput": (res.examples_per_s, "examples/s"),
                f"rung_{n}_ms_per_step": (res.ms_per_step, "ms"),
                f"rung_{n}_compile_time": (res.compile_s, "s"),
                f"rung_{n}_mfu_datasheet": (row["MFU (datasheet)"], "fraction"),
                f"rung_{n}_fraction_of_measured_ceiling": (row["of measured ceiling"], "fraction"),
                f"rung_{n}_program_bytes": (r.program_bytes, "bytes"),
                f"rung_{n}_device_peak_bytes": (r.peak_bytes, "bytes"),
                f"rung_{n}_final_loss": (res.final_loss, "loss"),
            }
    part.tables.append((rows, label))
    part.lines.append("program MB: arguments + outputs + temporaries of the compiled step (memory_analysis).")
    if any(row["peak MB"] is not None for row in rows):
        part.lines.append(
            "peak MB: the backend's high-water mark since the process started: it bounds every rung so far."
        )
    over = [row["rung"] for row in rows if (row["of measured ceiling"] or 0) > 1.0]
    if over:
        part.lines.append(
            f"{', '.join(over)} ran faster than the measured 'ceiling': on this machine it is not a ceiling "
            "(see section 1), so read the fractions as rough."
        )
    part.lines += unroll_sentence(part.figures)
    ok = [r for r in runs if r.status == "ok"]
    batch = cfg.ladder_global_batch
    for dtype, key in (("float32", "f32"), ("bfloat16", "bf16")):
        fractions = [r.fraction_of_ceiling(cfg, measured) for r in ok if r.rung.compute_dtype == dtype]
        fractions = [f for r, f in zip(ok, fractions) if f is not None and r.rung.global_batch == batch]
        if fractions:
            part.figures[f"best_{key}_fraction_of_measured_ceiling"] = (max(fractions), "fraction")
            part.figures[f"best_{key}_fraction_of_measured_ceiling_target"] = (0.5, "fraction")
    if ok:
        best = max(ok, key=lambda r: r.result.examples_per_s)
        part.figures["throughput"] = (best.result.examples_per_s, "examples/s")
        part.figures["best_rung"] = (best.rung.name, "name")
    return part


def unroll_sentence(figures: dict) -> list[str]:
    """What this run's compile column says about unrolling: the scan's compile time against the unrolled step's.

    ``figures``: the ladder's records (``rung_<name>_compile_time``), read as
    ``{metric: value}`` or ``{metric: (value, unit)}``.
    """

    def value(name):
        v = figures.get(f"rung_{name}_compile_time")
        return v[0] if isinstance(v, tuple) else v

    scan, unrolled = value("scan_f32"), value("unrolled_f32")
    if scan is None or unrolled is None:
        return []
    verdict = "longer" if unrolled > scan else "shorter" if unrolled < scan else "as long"
    return [
        f"Compile: unrolled_f32 {unrolled:.1f} s against scan_f32 {scan:.1f} s: unrolling made this run's compile "
        f"{verdict} (the programs compiled side by side, so each time also holds the others' load)."
    ]


def sweep_table(runs: list, cfg, dataset, device, init_params: dict, label: str) -> Part:
    """The fastest rung at the ladder's batch over three batches; the rows the ladder measured are marked."""
    batch, part = cfg.ladder_global_batch, Part()
    at_batch = [r for r in runs if r.status == "ok" and r.rung.global_batch == batch]
    if not at_batch:
        part.lines.append("No rung ran at the ladder's batch, so there is no fast step to sweep.")
        return part
    fastest = max(at_batch, key=lambda r: r.result.examples_per_s)
    fast_cfg = fastest.rung.config(cfg)
    sizes = (batch // 2, batch, cfg.ladder_large_batch)
    reused = {
        r.rung.global_batch: r.result
        for r in runs
        if r.status == "ok" and r.rung.config(cfg) == fast_cfg and r.rung.global_batch in sizes
    }
    points = ladder.sweep_single_device(fast_cfg, dataset, device, init_params, sizes, True, reused)  # a bar
    rows = [
        {
            "global batch": p.global_batch,
            "status": p.status,
            "ms/step": p.result.ms_per_step if p.result else None,
            "examples/s": p.result.examples_per_s if p.result else None,
            "measured": "in the ladder, above" if p.global_batch in reused else "now",
            "reason": p.reason or None,
        }
        for p in points
    ]
    part.tables.append((rows, f"{fastest.rung.label} over the batch, on {label}"))
    part.lines.append(sweep_sentence({row["global batch"]: row["examples/s"] for row in rows}))
    part.figures = {
        f"fast_step_examples_per_s_batch{p.global_batch}": (p.result.examples_per_s, "examples/s")
        if p.result
        else (f"{p.status}: {p.reason}", "status")
        for p in points
    }
    return part


def sweep_sentence(throughput: dict[int, float | None]) -> str:
    """What this run's sweep shows, batch by batch: where the throughput rose and where it did not."""
    ok = sorted((b, t) for b, t in throughput.items() if t)
    if len(ok) < 2:
        return "Too few batches ran to compare."
    steps = [f"{t1 / t0 - 1:+.0%} from {b0:,} to {b1:,}" for (b0, t0), (b1, t1) in zip(ok, ok[1:])]
    fell = any(t1 < t0 for (_, t0), (_, t1) in zip(ok, ok[1:]))
    return (
        "Throughput "
        + ", ".join(steps)
        + "."
        + (
            " It fell somewhere here: on a shared machine other jobs move it, and past a size the device's "
            "caches or memory stop keeping up."
            if fell
            else ""
        )
    )


def budget_table(runs: list, cfg, measured: dict, platform: str) -> Part:
    """What is left to win: the best measured step against the 50 % target and the roofline; the bound is checked.

    Raises:
        AssertionError: on an accelerator, a step ran below its roofline bound
            (a ceiling was measured too low, or the bound counts work the step
            does not do).
    """
    batch, bw, part, rows = cfg.ladder_global_batch, measured["memory bandwidth"].rate, Part(), []
    for label, c in (("float32", cfg), ("bfloat16", cfg.with_overrides(compute_dtype="bfloat16"))):
        rate = measured[ceilings.ceiling_for(c.compute_dtype)].rate
        if not (rate and bw):
            continue
        bound = roofline.step_bound(c, batch, rate, bw)
        best_ms = min(
            (
                r.result.ms_per_step
                for r in runs
                if r.status == "ok" and r.rung.compute_dtype == c.compute_dtype and r.rung.global_batch == batch
            ),
            default=None,
        )
        rows.append(
            {
                "compute": label,
                "50 % of ceiling: ms/step": costs.train_flops_per_step(c, batch) / (0.5 * rate) * 1e3,
                "best measured ms/step": best_ms,
                "bound ms (max)": bound.overlap_s * 1e3,
                "no-overlap ms (sum)": bound.serial_s * 1e3,
                "element-wise share of the estimate": f"{bound.unfused_s / bound.serial_s:.0%}",
            }
        )
        if best_ms is None:
            continue
        bound_ms, holds = bound.overlap_s * 1e3, best_ms >= bound.overlap_s * 1e3
        part.lines.append(f"{label}: best measured {best_ms:.2f} ms >= roofline bound {bound_ms:.2f} ms: {holds}")
        if not holds and platform == "cpu":
            part.lines.append(
                "  On a shared CPU the 'ceiling' is only the best rate this run saw (section 1), so the bound it "
                "gives is not one."
            )
        elif not holds:
            raise AssertionError(
                f"The {label} step ran in {best_ms:.2f} ms, below its roofline bound {bound_ms:.2f} ms: a ceiling "
                "of section 1 was measured too low (another process on the device?). Run the lesson again on an "
                "idle device."
            )
    part.tables.insert(0, (rows, f"Step-time budget at global batch {batch}"))
    return part


def roofline_figure(runs: list, cfg, measured: dict, label: str):
    """The rungs on the roofline of the measured float32-default ceiling and bandwidth; None without them."""
    rate, bw = measured["float32 default"].rate, measured["memory bandwidth"].rate
    points = [
        (
            r.rung.name,
            roofline.step_intensity(r.rung.config(cfg), r.rung.global_batch),
            costs.achieved_flops_per_s(r.rung.config(cfg), r.rung.global_batch, r.result.ms_per_step),
        )
        for r in runs
        if r.status == "ok"
    ]
    if not (rate and bw and points):
        return None
    note = "x: training FLOPs over the modelled element-wise bytes of the step; y: achieved FLOP/s."
    title = f"Roofline (measured float32-default ceiling and bandwidth), {label}"
    return roofline.roofline_chart(rate, bw, points, title, note=note)


def mean_over_slices(fn, params, x, y, size: int):
    """``fn(params, x[i:i+size], y[i:i+size])`` averaged over the slices (a loss or a gradient tree)."""
    import jax

    parts = [fn(params, x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]
    return jax.tree.map(lambda *g: np.mean(np.stack([np.asarray(a) for a in g]), axis=0), *parts)


def float32_checks(runs: list, cfg, device, init_params: dict, batches: list) -> Part:
    """Section 4: every float32 rung against ``scan_f32``: parameters after the ladder's steps, first-step gradients."""
    from dpcourse import train

    part, by_name = Part(), {r.rung.name: r for r in runs}
    ref = by_name.get("scan_f32")
    if ref is None or ref.status != "ok":
        part.lines.append(
            f"scan_f32, the reference of these checks, failed ({ref.reason if ref else 'not run'}): "
            "no rung could be checked."
        )
        return part
    n_steps = cfg.warmup_steps + cfg.repeats * cfg.steps
    param_tol, grad_tol = train.equivalence_tolerances(device.platform, cfg.learning_rate, n_steps)
    _, _, s_ref = ladder.run_steps(ref.compiled, cfg, device, init_params, batches, 1)
    rows = []
    for r in runs:
        if r.status != "ok" or r.rung.compute_dtype != "float32" or r is ref:
            continue
        p = train.max_abs_diff(ref.final_params, r.final_params)
        _, _, s_other = ladder.run_steps(r.compiled, cfg, device, init_params, batches, 1)
        g_diff, g_scale = train.first_step_gradient_diff(s_ref, s_other)
        g = g_diff / g_scale
        ok = p <= param_tol and g <= grad_tol
        rows.append(
            {
                "rung vs scan_f32": r.rung.name,
                "max |param diff|": p,
                "tolerance": param_tol,
                "gradient diff (rel.)": g,
                "gradient tolerance": grad_tol,
                "equal?": "yes" if ok else "NO",
            }
        )
        n = r.rung.name
        part.figures |= {
            f"max_abs_param_diff_{n}_vs_scan": (p, "abs"),
            f"max_abs_param_diff_{n}_vs_scan_tolerance": (param_tol, "abs"),
            f"max_abs_grad_rel_diff_{n}_vs_scan": (g, "relative"),
            f"max_abs_grad_rel_diff_{n}_vs_scan_tolerance": (grad_tol, "relative"),
        }
    part.tables.append((rows, f"Float32 rungs after {n_steps} steps"))
    return part


def bfloat16_checks(runs: list, cfg, device, init_params: dict, batches: list) -> Part:
    """Section 4: the bfloat16 logits against float32's, and the first steps' losses of the bfloat16 rungs.

    Raises:
        AssertionError: the logits or the typical step's loss differ by more than their tolerances.
    """
    part = Part()
    err, tol = ladder.logit_rel_error(init_params, batches[0][0], cfg), ladder.bf16_logit_tolerance(cfg)
    part.lines.append(f"bfloat16 logits vs float32, relative (rms): {err:.2%} (tolerance {tol:.1%})")
    assert err <= tol, (
        f"bfloat16 logits differ from float32 by {err:.2%}, more than {tol:.1%}: the bfloat16 rung computes "
        "something else; compare its cell with the float32 one"
    )
    by_name = {r.rung.name: r for r in runs if r.status == "ok"}
    if "scan_f32" not in by_name:
        return part
    n = min(cfg.steps, 10)
    f32, _, _ = ladder.run_steps(by_name["scan_f32"].compiled, cfg, device, init_params, batches, n)
    loss_tol = min(ladder.bf16_loss_tolerance(v) for v in f32)
    rows = [
        {
            "rung": "scan_f32",
            "first loss": f32[0],
            "last loss": f32[-1],
            "median |loss diff|": 0.0,
            "max |loss diff|": 0.0,
        }
    ]
    gaps = {}
    bf16_cfg = cfg.with_overrides(compute_dtype="bfloat16")
    for name in ("scan_bf16", "unrolled_bf16"):
        if name in by_name:
            losses, _, _ = ladder.run_steps(by_name[name].compiled, bf16_cfg, device, init_params, batches, n)
            gaps[name] = gap = ladder.loss_curve_gap(losses, f32)
            rows.append(
                {
                    "rung": name,
                    "first loss": losses[0],
                    "last loss": losses[-1],
                    "median |loss diff|": gap.median,
                    "max |loss diff|": gap.largest,
                }
            )
    part.tables.append((rows, f"Loss over the first {n} steps (tolerance {loss_tol:.3g})"))
    if not gaps:
        return part
    median = max(g.median for g in gaps.values())
    worst_name, worst = max(gaps.items(), key=lambda kv: kv[1].largest)
    part.figures = {
        "max_abs_loss_diff_bf16_vs_f32": (worst.largest, "loss"),
        "median_abs_loss_diff_bf16_vs_f32": (median, "loss"),
        "median_abs_loss_diff_bf16_vs_f32_tolerance": (loss_tol, "loss"),
    }
    part.lines.append(f"bfloat16 tracks float32: median |loss diff| {median:.3g} <= {loss_tol:.3g}")
    assert median <= loss_tol, (
        f"The bfloat16 loss is {median:.3g} from the float32 loss at a typical step, more than {loss_tol:.3g} "
        "(2 %): the bfloat16 rung does not train as the float32 one does; check its casts and the optimizer's dtype."
    )
    part.lines.append(
        f"largest |loss diff| {worst.largest:.3g} ({worst_name}) at step {worst.step_of_largest + 1}, where the "
        f"float32 loss moved by {worst.jump_at_largest:+.3f} from the step before"
        + ("; a single step apart, where the loss jumps on a hard batch" if worst.largest > loss_tol else "")
    )
    return part


def large_batch_checks(runs: list, cfg, dataset, device, init_params: dict) -> Part:
    """Section 4: the rungs at a larger batch, first step, against float32 on the same examples.

    The bfloat16 rungs: their first loss within 2 % of float32's. The rungs
    with a hand-written backward pass: their first-step gradient (through
    AdamW's first moment) against float32's at ``highest``, at most
    :data:`dpcourse.perf.ladder.KERNEL_GRADIENT_FACTOR` times as far as
    their twin's, JAX's own derivative of the same step.

    Raises:
        AssertionError: a rung fails its check (its sentence says which and what to compare).
    """
    import jax

    from dpcourse import model, placement, train

    part, batch = Part(), cfg.ladder_global_batch
    ok = [r for r in runs if r.status == "ok"]
    loss = jax.jit(lambda p, x, y: model.loss_and_metrics(p, x, y, cfg)[0])
    grad = jax.jit(jax.grad(lambda p, x, y: model.loss_and_metrics(p, x, y, cfg)[0]))
    init_dev, opt, rows = jax.device_put(init_params, device), train.make_optimizer(cfg), []
    for r in ok:
        if r.rung.compute_dtype != "bfloat16" or r.rung.global_batch == batch:
            continue
        rc, n, gb = r.rung.config(cfg), r.rung.name, r.rung.global_batch
        xb, yb = placement.place_single_device(cfg, dataset, device, opt, init_params, gb).batches[0]
        (first,), _, state = ladder.run_steps(r.compiled, rc, device, init_params, [(xb, yb)], 1)
        ref = float(mean_over_slices(loss, init_dev, xb, yb, batch))
        d, tol = abs(first - ref), ladder.bf16_loss_tolerance(ref)
        rows.append({"rung": n, "first loss": first, "float32 loss": ref, "|diff|": d, "tolerance": tol})
        part.figures |= {
            f"first_loss_diff_{n}_vs_f32": (d, "loss"),
            f"first_loss_diff_{n}_vs_f32_tolerance": (tol, "loss"),
        }
        assert d <= tol, f"{n}'s first loss is {d:.3g} from float32's, more than {tol:.3g} (2 %): compare its settings."
        if r.rung.block_backward == "autodiff":
            continue
        twin = next(
            (
                t
                for t in ok
                if t.rung.config(cfg) == rc.with_overrides(block_backward="autodiff") and t.rung.global_batch == gb
            ),
            None,
        )
        if twin is None:
            part.lines.append(f"{n}: its twin with JAX's own backward pass did not run: its gradient is not checked.")
            continue
        with jax.default_matmul_precision("highest"):
            reference = mean_over_slices(grad, init_dev, xb, yb, batch)
        _, _, twin_state = ladder.run_steps(twin.compiled, rc, device, init_params, [(xb, yb)], 1)
        mine = ladder.gradient_error(train.adam_first_moment(state), reference)
        twins = ladder.gradient_error(train.adam_first_moment(twin_state), reference)
        tol = ladder.KERNEL_GRADIENT_FACTOR * twins
        part.figures |= {
            f"grad_rel_diff_{n}_vs_f32": (mine, "relative"),
            f"grad_rel_diff_{n}_vs_f32_tolerance": (tol, "relative"),
        }
        part.lines.append(
            f"{n}: first-step gradient {mine:.2%} from float32 (largest over the parameters of |g - g_f32| / |g_f32|); "
            f"{twin.rung.name}, JAX's own backward pass: {twins:.2%}"
        )
        assert mine <= tol, (
            f"{n}'s gradient is {mine:.2%} from float32's, more than {ladder.KERNEL_GRADIENT_FACTOR:g} x its twin's "
            f"{twins:.2%}: its backward pass computes something else; compare dpcourse.perf.backward with JAX's "
            "derivative of the block."
        )
    part.tables.append((rows, "bfloat16 at a larger batch against float32, first step, same examples"))
    return part


def collectives_part(reports: dict, bf16_lowered_text: str, cfg, multi) -> Part:
    """Section 6: each step's collectives and bytes, and what the bfloat16 pmean asked for against what moves."""
    from dpcourse.compiled import hlo

    grad_mb, platform = costs.gradient_bytes(cfg) / MB, multi.devices[0].platform
    rows, part = [], Part()
    for k, r in reports.items():
        mb = None if r.bytes_per_step is None else r.bytes_per_step / MB
        rows.append(
            {
                "step": k,
                "collectives in program": r.count,
                "inside a loop": r.in_loop_count,
                "runs per step": r.runs_per_step,
                "MB per step": mb,
                "x float32 gradient": None if mb is None else mb / grad_mb,
            }
        )
        key = k.replace(",", "").replace(" ", "_").replace("(04)", "").strip("_").replace("__", "_")
        part.figures[f"collectives_per_step_{key}"] = (r.runs_per_step, "count")
        part.figures[f"collective_bytes_per_step_{key}"] = (r.bytes_per_step, "bytes")
    gb = cfg.global_batch(multi.count)
    part.tables.append((rows, f"Collectives on {multi.label}, global batch {gb} ({platform} compiler)"))
    written = hlo.written_all_reduce_bytes(bf16_lowered_text)
    part.figures["bf16_pmean_written_all_reduce_bytes"] = (sum(b for _, b in written), "bytes")
    written_mb = sum(b for _, b in written) / MB
    moved_mb = list(reports.values())[-1].bytes_per_step / MB
    part.lines += [
        f"float32 gradient: {grad_mb:.3f} MB; in bfloat16: {costs.gradient_bytes(cfg, 2) / MB:.3f} MB",
        f"{list(reports)[-1]}: the program JAX wrote all-reduces {written_mb:.3f} MB "
        f"({', '.join(sorted({d for d, _ in written}))}); the {platform} compiler's program moves {moved_mb:.3f} MB"
        + (" (it promoted the bfloat16 all-reduce to float32)" if moved_mb > 1.5 * written_mb else ""),
    ]
    if platform == "cpu":
        part.lines.append(
            "These placements are the CPU compiler's. XLA's GPU compiler runs other passes (one moves all-reduces "
            "out of while loops) and may place them differently: compile for the GPUs you will train on."
        )
    return part


def fast_step_part(results: list, cfg) -> Part:
    """Section 6: the fast step compiled for GPUs and TPUs, its collectives, and XLA's cost beside the roofline model.

    The model is taken at the sizes the programs were compiled at (a stored compile: the smoke profile's).
    """
    from dpcourse import config

    part = Part()
    done = [r for r in results if r.error is None and r.platform in ("gpu", "tpu")]
    for res in done:
        f = res.steps["fast"]
        temp = f.memory.get("temp_size_in_bytes")
        words = (
            "temporaries not reported by this compile"
            if temp is None
            else "temporaries 0 bytes (the compiler's figure: no device memory past arguments, outputs)"
            if temp == 0
            else f"temporaries {temp:,} bytes"
        )
        part.lines += [
            f"The fast step, {res.label}:",
            f"  {f.count} collective(s), {f.in_loop} inside a loop, {f.bytes_per_step:,} bytes per step; {words}",
        ]
    with_cost = [r for r in done if r.steps["fast"].cost]
    if not with_cost:
        return part
    made_at = with_cost[0].profile
    with_cost = [r for r in with_cost if r.profile == made_at]  # one profile's sizes per table
    at = cfg if made_at == cfg.profile else config.make_config(made_at)
    fast = at.with_overrides(block_unroll="full", compute_dtype="bfloat16")
    b = fast.per_device_batch
    model = {"FLOPs": costs.train_flops_per_step(fast, b), "bytes": roofline.elementwise_bytes_per_step(fast, b)}
    rows = []
    for k, value in model.items():
        row = {"per device, per step": k, "roofline model": f"{value:,.0f}"}
        for res in with_cost:
            xla = res.steps["fast"].cost["flops" if k == "FLOPs" else "bytes accessed"]
            row[f"XLA, {res.target_label}"] = f"{xla:,.0f}"
            row[f"{res.target_label} / model"] = round(xla / value, 2)
        rows.append(row)
    stored = ", stored" if with_cost[0].stored else ""
    part.tables.append(
        (rows, f"Fast step, XLA's cost analysis and the model, batch {b} per device ({made_at} profile{stored})")
    )
    return part
