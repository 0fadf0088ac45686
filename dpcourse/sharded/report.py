"""Lesson 10's harness, one call each: its tables, the checks that hold each form to replicated DP, its records.

The forms themselves (the shardings, the constraints, the steps) are written
in the lesson's cells; this module shows what they hold and send, checks
them, and reads the compiles for GPUs and TPU slices and the cost model's
prediction of them. Each function prints or displays; the checks raise
``AssertionError`` with one sentence that names the form and what differs.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import jax
from IPython.display import display
from jax.sharding import PartitionSpec as P

from dpcourse import config, costs, model, record, show, train
from dpcourse.compiled import census, collectives
from dpcourse.cross_compile import steps as sharded_steps
from dpcourse.exercises import checks
from dpcourse.sharded import forms

FIT_FORMS = {"replicated": "replicated", "zero1": "ZeRO-1", "fsdp": "FSDP gathered per layer"}
PACKAGE_FORMS = ("ZeRO-1", "ZeRO-1, all-reduce first", "FSDP, naive", "FSDP, gathered once", "accumulation, scan")
STATE_KEYS = {"replicated DP": "replicated", "ZeRO-1": "zero1", "FSDP": "fsdp"}


def _require(ok: bool, sentence: str) -> None:
    if not ok:
        raise AssertionError(sentence)


def show_replicated_state(held: dict[str, int], n_params: int, n_devices: int) -> None:
    """Section 1: the bytes a device holds under replicated DP, against 4 and 8 bytes per parameter.

    ``held``: ``{"parameters": bytes, "AdamW state": bytes}`` on one device.
    AdamW's state also holds its step count (one int32): 4 bytes over the formula.

    Raises:
        AssertionError: the parameters differ from the formula, or the state by other than +4.
    """
    formula = forms.state_bytes_formula(n_params, n_devices, "replicated")
    rows = [
        {"what": "parameters", "measured": held["parameters"], "formula": formula["params"]},
        {"what": "AdamW state", "measured": held["AdamW state"], "formula": formula["adam"]},
    ]
    caption = f"Bytes on device 0 of {n_devices}, replicated (formula: 4 and 8 bytes per parameter)"
    display(show.table(rows, caption=caption))
    _require(
        held["parameters"] == formula["params"],
        f"device 0 holds {held['parameters']:,} bytes of parameters; the formula says {formula['params']:,.0f}",
    )
    extra = held["AdamW state"] - formula["adam"]
    _require(
        extra == 4,
        f"device 0 holds {extra:+,.0f} bytes of AdamW state beyond the formula; expected +4 (the step count)",
    )


def show_fit(memory_bytes: dict[str, float], n_gpus: int) -> None:
    """Section 1: parameters whose float32 state fits a device's datasheet memory, per form, on ``n_gpus``."""
    rows = []
    for name, mem in memory_bytes.items():
        row = {"device (datasheet memory)": f"{name} ({mem / 1e9:.0f} GB)"}
        for form, label in FIT_FORMS.items():
            row[f"{label}, {n_gpus} GPUs"] = f"{forms.params_that_fit(mem, n_gpus, form) / 1e9:.2f} G"
        rows.append(row)
    display(show.table(rows, caption="Parameters whose float32 state fits (no activations)"))


def show_specs(params: dict, param_specs: dict, state_specs, opt_state, n_devices: int, min_elements: int) -> None:
    """Section 2: each leaf's spec from the lesson's ``spec_for``, beside :func:`forms.shard_specs`'s, and the plan.

    Raises:
        AssertionError: a leaf's spec, or the optimizer state's specs, differ from the package's.
    """
    plan = forms.shard_specs(params, n_devices, min_elements=min_elements)
    rows = [
        {"leaf": k, "shape": tuple(v.shape), "spec": str(param_specs[k]), "package": str(plan.specs[k])}
        for k, v in params.items()
    ]
    caption = f"Specs on {n_devices} devices (this lesson's spec_for, and sharded.shard_specs)"
    display(show.table(rows, caption=caption))
    print(plan.describe())
    differ = [k for k in params if param_specs[k] != plan.specs[k]]
    _require(not differ, f"spec_for differs from the package for {differ}")
    package_state = forms.shard_specs(opt_state, n_devices, min_elements=min_elements).specs
    _require(state_specs == package_state, "the optimizer state's specs from spec_for differ from shard_specs'")


def show_state_bytes(states: dict[str, tuple], n_params: int, n: int, device) -> None:
    """Section 3: parameters and AdamW state on ``device`` per form (``states``: form -> (params, opt_state)).

    The forms are those of :data:`STATE_KEYS`; the line under the table reads
    the measured ratios against the formula's.
    """
    replicated = sum(forms.per_device_bytes(t, device) for t in states["replicated DP"])
    rows = []
    for form, (p, s) in states.items():
        f = forms.state_bytes_formula(n_params, n, STATE_KEYS[form])
        on_p, on_s = forms.per_device_bytes(p, device), forms.per_device_bytes(s, device)
        rows.append(
            {
                "form": form,
                "parameters": on_p,
                "AdamW state": on_s,
                "formula (params + AdamW)": int(f["params"] + f["adam"]),
                "replicated / this": f"{replicated / (on_p + on_s):.2f}",
                "formula ratio": f"{forms.state_ratio_formula(n, STATE_KEYS[form]):.2f}",
            }
        )
    display(show.table(rows, caption=f"Bytes per device (device 0 of {n}), measured with addressable_shards"))
    print(ratio_sentence({r["form"]: (float(r["replicated / this"]), float(r["formula ratio"])) for r in rows}))


def ratio_sentence(ratios: dict[str, tuple[float, float]]) -> str:
    """Form -> (measured, formula) ratio of replicated DP's bytes to the form's, read in one clause each.

    The formula counts every leaf as sharded; a leaf that no dimension lets
    split, or one too small to shard, stays whole, so the measured ratio
    falls short of it, and is 1 where nothing is sharded.
    """
    parts = []
    for form, (got, want) in ratios.items():
        if abs(got - want) <= 0.005 * want:
            how = "as the formula says"
        elif got < want:
            how = "nothing sharded" if abs(got - 1.0) < 0.005 else "short of the formula: some leaves stay whole"
        else:
            how = "above the formula"
        parts.append(f"{form} {got:.2f} against {want:.2f} ({how})")
    return "Replicated / this form, measured against the formula: " + "; ".join(parts) + "."


def show_step_memory(compiled: dict, n_params: int, n_devices: int) -> dict[str, dict[str, int]]:
    """Section 3: ``memory_analysis()`` of each compiled step, per device and per parameter; returns the figures."""
    mem = {form: census.memory_figures(c) for form, c in compiled.items()}
    rows = [
        {
            "form": form,
            "argument bytes": f["argument_bytes"],
            "temporary bytes": f["temp_bytes"],
            "bytes per parameter": f"{(f['argument_bytes'] + f['temp_bytes']) / n_params:.1f}",
        }
        for form, f in mem.items()
    ]
    display(show.table(rows, caption=f"Memory per device during the step, {n_devices} devices"))
    return mem


def check_same_training(
    final: dict, start: tuple, backend: str, n_devices: int, k: int, steps: int, tol: float
) -> dict:
    """Section 5: each form's ``(params, opt_state, metrics)`` after ``steps`` against replicated DP's.

    Shows the table (max |diff| of the parameters, bitwise or not) and holds
    each form leaf by leaf (:func:`checks.compare_steps`, which names a
    gradient N or K times too large) and to ``tol``. Returns form -> max |diff|.

    Raises:
        AssertionError: a form is not the same training, in one sentence.
    """
    ref = final["replicated DP"]
    diffs = {form: train.max_abs_diff(ref[0], out[0]) for form, out in final.items()}
    rows = [
        {
            "form": form,
            "max |diff| vs replicated": d,
            "bitwise equal": "yes" if d == 0.0 else "no",
            "required": f"< {tol:g}",
            "loss before the last step": float(final[form][2]["loss"]),
        }
        for form, d in diffs.items()
    ]
    display(show.table(rows, caption=f"Parameters after {steps} steps, each form vs replicated DP"))
    factors = [checks.device_factor(n_devices), checks.microbatch_factor(k)]
    what = f"the parameters, AdamW state and metrics after {steps} steps"
    for form, out in final.items():
        same = checks.compare_steps(out, ref, start, f"{form}: {what}", "replicated DP", backend, factors)
        _require(same.same, same.message)
        _require(
            diffs[form] < tol,
            checks.beyond(f"{form}: the parameters after {steps} steps and replicated DP's", diffs[form], tol),
        )
    return diffs


def check_against_package(final: dict, run, cfg, mesh, start: tuple, batches, k: int, tol: float) -> None:
    """Section 5: the lesson's forms against :mod:`dpcourse.cross_compile.steps`' twins, same start and batches.

    ``run(step, params, opt_state, batches)`` is the lesson's loop; ``start``
    its replicated ``(params, opt_state)``. The twins are lowered here (a mesh
    set with ``jax.set_mesh`` belongs to this thread) and compiled on every core.

    Raises:
        AssertionError: a form of the lesson's cells differs from the package's, named.
    """
    built = {form: getattr(sharded_steps, sharded_steps.FORM_KEYS[form])(cfg, mesh) for form in PACKAGE_FORMS}
    lowered = {form: step.lower(*args) for form, (step, args) in built.items()}
    with ThreadPoolExecutor() as pool:
        compiled = dict(zip(lowered, pool.map(lambda low: low.compile(), lowered.values())))
    n = len(mesh.devices.flat)
    factors = [checks.device_factor(n), checks.microbatch_factor(k)]
    rows = []
    for form, (_, args) in built.items():
        p0 = jax.device_put(start[0], jax.tree.map(lambda a: a.sharding, args[0]))
        s0 = jax.device_put(start[1], jax.tree.map(lambda a: a.sharding, args[1]))
        out = run(compiled[form], p0, s0, batches)
        diff = train.max_abs_diff(final[form][0], out[0])
        rows.append({"form": form, "max |your cell - package|": diff})
        what = f"{form}: your cell's parameters, AdamW state and metrics"
        same = checks.compare_steps(
            final[form], out, start, what, "the package's", mesh.devices.flat[0].platform, factors
        )
        _require(same.same, same.message)
        _require(diff < tol, checks.beyond(f"{form}: your cell's parameters and the package's", diff, tol))
    display(show.table(rows))


def show_census(compiled: dict, n_devices: int, backend: str) -> dict:
    """Section 6: the collectives of each compiled step on this backend; returns form -> its report."""
    reports = {form: collectives.parse_hlo(c.as_text()) for form, c in compiled.items()}
    caption = f"Collectives per step, {backend}, {n_devices} devices, JAX {jax.__version__}"
    display(show.table([census.census_row(form, r, n_devices) for form, r in reports.items()], caption=caption))
    if backend == "cpu":
        scatters = sum(len(r.of_kind("reduce-scatter")) for r in reports.values())
        looped = [f for f, r in reports.items() if any(c.in_loop for c in r.of_kind("all-reduce"))]
        print(f"reduce-scatters in these {len(reports)} CPU programs: {scatters}; an all-reduce")
        print(f"  inside a loop in {len(looped)}: {'; '.join(looped)}")
        if not scatters:
            print(
                "The CPU compiler does not turn these steps' all-reduce and slice into a\n"
                "reduce-scatter (an explicit lax.psum_scatter compiles to one): the ZeRO and\n"
                "FSDP pattern shows in a GPU compile, below."
            )
    return reports


def _kinds(step) -> list[str]:
    return list(dict.fromkeys(c["kind"] for c in step.collectives))


def _show(res) -> bool:
    if res.error:
        print(f"{res.label}: {res.error}")
        return False
    rows = census.form_rows(res.steps, sharded_steps.FORM_LABELS, res.n_devices)
    display(show.table(rows, caption=f"Collectives per step, {res.label}, JAX {res.jax_version}"))
    return True


def show_cross_compiles(results: list) -> None:
    """Section 6: a table per GPU and TPU target; under each TPU table the forms whose kinds of collective
    differ from the GPU program's, and after them where the TPU slices' programs differ."""
    gpus = [r for r in results if r.backend != "tpu"]
    for res in gpus:
        _show(res)
    slices = []
    for res in (r for r in results if r.backend == "tpu"):
        if not _show(res):
            continue
        slices.append(res)
        gpu = next((g for g in gpus if not g.error and g.profile == res.profile), None)
        for name, s in res.steps.items() if gpu is not None else ():
            if name in gpu.steps and _kinds(s) != _kinds(gpu.steps[name]):
                print(f"{sharded_steps.FORM_LABELS[name]}, the kinds of collective it runs:")
                print(f"  {gpu.target_label}: {', '.join(_kinds(gpu.steps[name]))}")
                print(f"  {res.target_label}: {', '.join(_kinds(s))}")
    for other in slices[1:]:
        first = slices[0]
        for name, s in first.steps.items():
            o = other.steps.get(name)
            if o is None or s.error or o.error or (s.count, s.bytes_per_step) == (o.count, o.bytes_per_step):
                continue
            print(f"{sharded_steps.FORM_LABELS[name]}, {first.target_label} against {other.target_label}:")
            for r, st in ((first, s), (other, o)):
                print(
                    f"  {r.target_label}: {st.count} collectives ({', '.join(_kinds(st))}), "
                    f"{st.bytes_per_step:,} result bytes per step"
                )


def _leaves(res, cfg) -> tuple[dict, str]:
    """The model's leaves at the profile ``res`` was compiled with (a stored one may differ), and which."""
    if res.profile == cfg.profile:
        return model.init_params(cfg), "this run's sizes"
    said = f"the {res.profile} profile's sizes, as compiled; this run is {cfg.profile}"
    return model.init_params(config.make_config(res.profile)), said


def show_gpu_figures(results: list, cfg, k: int, min_elements: int) -> None:
    """Section 6: from each GPU program, the share of the gradient the scan accumulation all-reduces in every
    microbatch, what each form sends against replicated DP, and what FSDP's small all-reduce carries."""
    for res in results:
        if res.backend == "tpu" or res.error or any(s.error for s in res.steps.values()):
            continue
        leaves, said = _leaves(res, cfg)
        plan = forms.shard_specs(leaves, res.n_devices, min_elements=min_elements)
        grad_bytes = sum(a.nbytes for a in leaves.values())
        replicated_leaf_bytes = sum(leaves[key].nbytes for key in leaves if plan.specs[key] == P())
        got = {name: census.report_from_rows(s.collectives) for name, s in res.steps.items()}
        sent = {name: census.sent_bytes_per_step(r, res.n_devices) for name, r in got.items()}
        in_loop = sum(c.bytes for c in got["accum_scan"].of_kind("all-reduce") if c.in_loop)
        block_and_bias = leaves["w_block"].nbytes + leaves["b_block"].nbytes
        small = [c.bytes for c in got["fsdp_gathered"].of_kind("all-reduce")]
        share, base = in_loop / grad_bytes, sent["dp_replicated"]
        print(f"{res.label} ({said}):")
        print(f"  accumulation, scan: {in_loop:,} bytes all-reduced in each of {k} microbatches,")
        print(f"    {share:.0%} of the gradient (w_block and b_block: {block_and_bias:,});")
        print(f"    the other {1 - share:.0%} once after the loop;")
        print(f"    sends {sent['accum_scan'] / base:.2f} x replicated DP's bytes")
        print(f"  ZeRO-1, naive: sends {sent['zero1'] / base:.2f} x replicated DP's bytes")
        print(f"  ZeRO-1, all-reduce first: sends {sent['zero1_allreduce_first'] / base:.2f} x replicated DP's bytes")
        print(f"  FSDP gathered once: all-reduce of {small} bytes = the replicated leaves'")
        print(f"    gradients {replicated_leaf_bytes:,} + the two metrics 8")


def _predict(cfg, n_devices: int, k: int) -> dict:
    return census.predict_communication(costs.gradient_bytes(cfg), 4 * cfg.width**2, n_devices, k, cfg.block_repeats)


def show_prediction(pred: dict, cfg, n_devices: int, k: int, links: dict[str, str], slices: dict) -> None:
    """Section 7: the cost model's collectives per form (``pred``, of :func:`census.predict_communication` on
    ``n_devices``), bytes sent and microseconds per step.

    ``links``: column label -> a GPU in :func:`costs.find_peak` (a ring of
    ``n_devices``); ``slices``: column label -> a v5e slice's shape, at its own
    chip count over ICI (:func:`costs.tpu_collective_s`). Bandwidth terms only.
    """
    v5e = costs.find_peak("TPU v5 lite")
    at_slice = {label: _predict(cfg, math.prod(shape), k) for label, shape in slices.items()}
    rows = []
    for form, p in pred.items():
        row = {"form": form, **{kind: p[kind] for kind in census.KINDS}, "sent per device": int(p["wire_bytes"])}
        for label, gpu in links.items():
            t = census.predicted_time_s(p, n_devices, costs.find_peak(gpu).link_bytes_per_s)
            row[f"us on {label}"] = f"{t * 1e6:.1f}"
        for label, shape in slices.items():
            s = at_slice[label][form]
            t = sum(
                s[kind] * costs.tpu_collective_s(kind, s["payload"][kind] / s[kind], v5e, shape, False)
                for kind in census.KINDS
                if s[kind]
            )
            row[f"us on {label}"] = f"{t * 1e6:.1f}"
        rows.append(row)
    display(show.table(rows, caption=f"Predicted collectives per step, {n_devices} devices, K = {k}"))


def compare_with_prediction(results: list, cfg, n_devices: int, k: int) -> None:
    """Section 7: each GPU program's runs per kind and bytes sent against the prediction at the sizes it was
    compiled for (a stored compile may be of another profile or device count), "within 10%" or not."""
    for res in results:
        if res.backend == "tpu":
            continue
        if res.error:
            print(f"{res.label}: {res.error}")
            continue
        if (res.profile, res.n_devices) != (cfg.profile, n_devices):
            print(f"{res.label}: compiled for the {res.profile} profile on {res.n_devices} GPUs")
            print(f"  (this run: {cfg.profile} on {n_devices}), so compared with the prediction at those sizes")
        pred = _predict(config.make_config(res.profile), res.n_devices, k)
        for name, s in res.steps.items():
            report = census.report_from_rows(s.collectives)
            got, want = census.census(report), pred[sharded_steps.FORM_LABELS[name]]
            runs = [f"{kind} {got[kind].runs_per_step} ({want[kind]})" for kind in census.KINDS]
            sent = census.sent_bytes_per_step(report, res.n_devices)
            ratio = sent / want["wire_bytes"]
            close = "within 10%" if abs(ratio - 1) <= 0.10 else "not within 10%"
            print(f"{res.label}, {sharded_steps.FORM_LABELS[name]}:")
            print("    runs (predicted): " + ", ".join(runs))
            print(f"    sent {sent:,.0f} B, predicted {want['wire_bytes']:,.0f}: {ratio:.2f}x, {close}")


def record_forms(start: dict, mem: dict, reports: dict, diffs: dict, tol: float, results: list, device) -> None:
    """The lesson's figures for results.json: per form its state bytes on ``device``, its step's memory and
    collectives, its difference from replicated DP; per GPU compiled here, each step's collectives."""
    for form, (p, s) in start.items():
        key = sharded_steps.FORM_KEYS[form]
        figures = {
            f"state_bytes_per_device_{key}": (
                forms.per_device_bytes(p, device) + forms.per_device_bytes(s, device),
                "bytes",
            ),
            f"argument_bytes_{key}": (mem[form]["argument_bytes"], "bytes"),
            f"temp_bytes_{key}": (mem[form]["temp_bytes"], "bytes"),
            f"collectives_per_step_{key}": (reports[form].runs_per_step, "count"),
            f"collective_bytes_per_step_{key}": (reports[form].bytes_per_step, "bytes"),
        }
        if form != "replicated DP":
            figures[f"max_abs_param_diff_vs_replicated_{key}"] = (diffs[form], "abs")
            figures[f"max_abs_param_diff_vs_replicated_{key}_tolerance"] = (tol, "abs")
        record.figures(figures)
    for res in results:
        if res.backend == "tpu" or res.error or res.stored:
            continue
        for name, s in res.steps.items():
            at = f"{name}_gpu_{res.target}_{res.n_devices}"
            record.figures(
                {
                    f"collectives_per_step_{at}": (s.runs_per_step, "count"),
                    f"collective_bytes_per_step_{at}": (s.bytes_per_step, "bytes"),
                }
            )
    record.figures({"reduced_shardings_available": (int("accumulation, reduced" in start), "bool")})
