"""Notebook 09's step on one chip: where its time goes (profiler traces) and levers toward 85 % MFU.

Run from the repository root on a TPU host (or anywhere, with a small profile):

    python tools/tpu_breakdown.py --profile full --out DIR

Writes ``DIR/breakdown.json`` (every variant's step time, compile time,
kernel census and, for the profiled ones, the breakdown of
:mod:`dpcourse.perf.breakdown`), ``DIR/trace_layout.json`` (the trace's
processes, threads and most frequent event names: what the trace holds) and
``DIR/traces.tar.gz`` (the traces and program texts, to read again).

    python tools/tpu_breakdown.py --store DIR [DIR ...] --rates-from RESULTS.json

then splits the stored traces again at the matmul rates lesson 09 measured
(its ``ceiling_bfloat16`` and ``ceiling_float32_default`` records in a
``tpu-check`` results file of the same machine) and writes the package's
stored breakdown, ``dpcourse/perf/stored_breakdown.json``, with the levers'
table.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import tarfile
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dpcourse import config, costs, data, model, train
from dpcourse.perf import backward, breakdown, ceilings, fusions


def block_vjp(mix: float):
    """One repeat of the block with a hand-written backward pass that keeps only ``h`` and ``z = h W + b``."""
    gelu_grad = jax.grad(lambda z: jax.nn.gelu(z))

    @jax.custom_vjp
    def block(h, w, b):
        return (1.0 - mix) * h + mix * jax.nn.gelu(h @ w + b)

    def fwd(h, w, b):
        z = h @ w + b
        return (1.0 - mix) * h + mix * jax.nn.gelu(z), (h, z, w)

    def bwd(res, g):
        h, z, w = res
        gz = (mix * g * jax.vmap(jax.vmap(gelu_grad))(z)).astype(h.dtype)
        return (1.0 - mix) * g + gz @ w.T, h.T @ gz, gz.sum(0)

    block.defvjp(fwd, bwd)
    return block


def forward_with(how: str, cfg):
    """The model's forward pass (unrolled, bfloat16) with the block written ``how``: remat_dots, vjp or pallas_1024."""

    def forward(params, x):
        p = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
        h = jax.nn.gelu(x.astype(jnp.bfloat16) @ p["w_in"] + p["b_in"])
        mix = cfg.block_mix
        if how in ("vjp", "pallas_1024"):
            blk = block_vjp(mix) if how == "vjp" else backward.block_with_kernel(mix, rows=1024)
            for _ in range(cfg.block_repeats):
                h = blk(h, p["w_block"], p["b_block"])
        else:
            one = jax.checkpoint(
                lambda h, w, b: (1.0 - mix) * h + mix * jax.nn.gelu(h @ w + b),
                policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
            )
            for _ in range(cfg.block_repeats):
                h = one(h, p["w_block"], p["b_block"])
        return (h @ p["w_out"] + p["b_out"]).astype(jnp.float32)

    return forward


def step_with(forward, optimizer):
    """The course's train step (``train.make_train_step``) around another forward pass."""
    import optax

    def loss(params, x, y):
        logits = forward(params, x)
        value = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return value, {"loss": value, "accuracy": (jnp.argmax(logits, -1) == y).mean()}

    def step(params, state, x, y):
        (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params, x, y)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, metrics

    return step


def variants(cfg, platform_name: str) -> list[dict]:
    """The programs to measure: the lesson's default step, unroll 8, the best rung and the levers."""
    b, big = cfg.ladder_global_batch, cfg.ladder_large_batch
    k = max(1, min(8, cfg.block_repeats))
    best = dict(unroll="full", dtype="bfloat16", batch=big)
    out = [
        dict(name="scan_f32", unroll=1, dtype="float32", batch=b, profile=True),
        dict(name=f"scan_unroll{k}_f32", unroll=k, dtype="float32", batch=b, profile=True),
        dict(name="scan_bf16", unroll=1, dtype="bfloat16", batch=b),
        dict(name=f"unrolled_bf16_batch{big}", **best, profile=True),
        dict(name=f"unrolled_bf16_batch{2 * big}", unroll="full", dtype="bfloat16", batch=2 * big, profile=True),
        dict(name=f"unrolled_bf16_batch{big}_x_bf16", **best, x_dtype="bfloat16"),
        dict(name=f"unrolled_bf16_batch{big}_remat_dots", **best, forward="remat_dots"),
        dict(name=f"unrolled_bf16_batch{big}_vjp", **best, forward="vjp", profile=True),
        dict(name="scan_f32_slope", unroll=1, dtype="float32", batch=b, backward="saved_slope", profile=True),
        dict(name="scan_bf16_slope", unroll=1, dtype="bfloat16", batch=b, backward="saved_slope"),
        dict(name=f"unrolled_bf16_batch{big}_slope", **best, backward="saved_slope", profile=True),
        dict(name=f"unrolled_bf16_batch{b}_slope", unroll="full", dtype="bfloat16", batch=b, backward="saved_slope"),
        dict(
            name=f"unrolled_bf16_batch{2 * big}_slope",
            unroll="full",
            dtype="bfloat16",
            batch=2 * big,
            backward="saved_slope",
        ),
        dict(name=f"unrolled_bf16_batch{big}_slope_x_bf16", **best, backward="saved_slope", x_dtype="bfloat16"),
    ]
    if platform_name == "tpu":
        out += [
            dict(name=f"unrolled_bf16_batch{big}_vmem96m", **best, options={"xla_tpu_scoped_vmem_limit_kib": 98304}),
            dict(name=f"unrolled_bf16_batch{big}_no_rwb", **best, options={"xla_tpu_rwb_fusion": False}),
            dict(name=f"pallas_bf16_batch{big}", **best, backward="pallas", profile=True),
            dict(name=f"pallas_bf16_batch{big}_rows1024", **best, forward="pallas_1024"),
        ]
    return out


def build(v: dict, cfg, init_host, device):
    """Lower and compile one variant; returns (cfg, optimizer, executable, compile s, hlo text) or the error."""
    rcfg = cfg.with_overrides(
        block_unroll=v["unroll"], compute_dtype=v["dtype"], block_backward=v.get("backward", "autodiff")
    )
    opt = train.make_optimizer(rcfg)
    if v.get("forward"):
        step = jax.jit(step_with(forward_with(v["forward"], rcfg), opt))
    else:
        step = jax.jit(train.make_train_step(rcfg, opt))
    from jax.sharding import SingleDeviceSharding

    on = SingleDeviceSharding(device)
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on), init_host)
    state = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on), jax.eval_shape(opt.init, params)
    )
    x = jax.ShapeDtypeStruct((v["batch"], 784), jnp.dtype(v.get("x_dtype", "float32")), sharding=on)
    y = jax.ShapeDtypeStruct((v["batch"],), jnp.int32, sharding=on)
    lowered = step.lower(params, state, x, y)
    t0 = time.perf_counter()
    exe = lowered.compile(compiler_options=v["options"]) if v.get("options") else lowered.compile()
    return rcfg, opt, exe, time.perf_counter() - t0, exe.as_text()


def place(v, rcfg, opt, init_host, dataset, device, n_batches=2):
    params = jax.device_put(init_host, device)
    state = opt.init(params)
    x_host, y_host = data.stacked_batches(dataset, n_batches, v["batch"])
    xd = jnp.dtype(v.get("x_dtype", "float32"))
    batches = [
        (jax.device_put(x_host[i].astype(xd), device), jax.device_put(y_host[i], device)) for i in range(n_batches)
    ]
    return params, state, batches


def time_steps(exe, params, state, batches, warmup, repeats, steps):
    for i in range(warmup):
        params, state, m = exe(params, state, *batches[i % len(batches)])
    jax.block_until_ready((params, state))
    times, losses = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(steps):
            params, state, m = exe(params, state, *batches[i % len(batches)])
            losses.append(m["loss"])
        jax.block_until_ready((params, state))
        times.append((time.perf_counter() - t0) / steps)
    return float(np.median(times)) * 1e3, [float(v) for v in jax.device_get(losses)], params, state


def layout(path: Path) -> dict:
    """What the trace holds: processes, threads, and each thread's most frequent complete events."""
    events = breakdown._events(path)
    procs = {e.get("pid"): e.get("args", {}).get("name") for e in events if e.get("name") == "process_name"}
    threads = {
        f"{e.get('pid')}/{e.get('tid')}": e.get("args", {}).get("name")
        for e in events
        if e.get("name") == "thread_name"
    }
    per: dict = {}
    samples: dict = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        key = f"{e.get('pid')}/{e.get('tid')}"
        per.setdefault(key, Counter())[e.get("name")] += 1
        samples.setdefault(key, e)
    return {
        "processes": {str(k): v for k, v in procs.items()},
        "threads": threads,
        "top_events": {k: c.most_common(25) for k, c in per.items()},
        "sample_event": {k: json.dumps(v)[:1500] for k, v in samples.items()},
    }


LEVERS = {
    "unrolled_bf16_batch{big}": "the best rung as the lesson runs it",
    "unrolled_bf16_batch{big2}": "twice the global batch: the step's fixed costs spread over more examples",
    "unrolled_bf16_batch{big}_x_bf16": "the batch sent in bfloat16 (the step casts it to bfloat16 anyway)",
    "unrolled_bf16_batch{big}_vjp": "the block's backward pass written by hand, saving only h and h W + b",
    "unrolled_bf16_batch{big}_remat_dots": "jax.checkpoint saving only the matmuls' outputs",
    "unrolled_bf16_batch{big}_no_rwb": "compiler option xla_tpu_rwb_fusion=false",
    "unrolled_bf16_batch{big}_vmem96m": "compiler option xla_tpu_scoped_vmem_limit_kib=98304",
    "unrolled_bf16_batch{big}_slope": "the block's backward pass reusing GELU's derivative from the forward pass",
    "unrolled_bf16_batch{b}_slope": "the same at global batch {b}",
    "unrolled_bf16_batch{big2}_slope": "the same at global batch {big2}",
    "scan_f32_slope": "the course's scan step (float32) reusing GELU's derivative",
    "scan_bf16_slope": "scan in bfloat16 reusing GELU's derivative",
    "pallas_bf16_batch{big}": "the block's backward pass as one Pallas kernel (tiles of 512 rows)",
    "pallas_bf16_batch{big}_rows1024": "the same kernel on tiles of 1024 rows",
}


def store(folders: list[Path], rates_from: Path, dest: Path) -> dict:
    """The package's stored chip breakdown from runs' ``breakdown.json`` and ``traces.tar.gz``.

    A variant measured in several runs is taken from the last folder named.
    Every split and lever keeps the date of its run.
    """
    records = {r["metric"]: r["value"] for r in json.loads(rates_from.read_text())["records"]}
    rates = {"float32": records["ceiling_float32_default"], "bfloat16": records["ceiling_bfloat16"]}
    reports = [json.loads((folder / "breakdown.json").read_text()) for folder in folders]
    for key in ("device_kind", "jax", "libtpu", "profile"):
        if len({r[key] for r in reports}) > 1:
            raise SystemExit(
                f"--store: the runs differ in {key} ({sorted({r[key] for r in reports})}): store one at a time."
            )
    report = reports[-1]
    cfg = config.make_config(report["profile"])
    splits, variants = {}, {}
    for folder, run in zip(folders, reports):
        work = Path(tempfile.mkdtemp())
        with tarfile.open(folder / "traces.tar.gz") as tar:
            tar.extractall(work, filter="data")
        for name, v in run["variants"].items():
            variants[name] = v | {"date": run["date"]}
            if not (work / name).is_dir() or v.get("forward", "model.forward") != "model.forward":
                continue
            text = (work / name / "program.hlo.txt").read_text()
            ks, where = breakdown.kernels(work / name / "trace.json.gz", breakdown.kernel_kinds(text))
            rcfg = cfg.with_overrides(block_unroll=v["unroll"], compute_dtype=v["dtype"])
            flops = costs.train_flops_per_step(rcfg, v["batch"])
            bd = breakdown.split(ks, 3, v["ms_per_step"], flops, rates[v["dtype"]], name, where)
            splits[name] = bd.to_json() | {"compile_s": v["compile_s"], "date": run["date"]}
    big, b = cfg.ladder_large_batch, cfg.ladder_global_batch
    levers = []
    for key, what in LEVERS.items():
        name = key.format(big=big, big2=2 * big, b=b)
        v = variants.get(name)
        if v is None or v.get("status") != "ok":
            continue
        levers.append(
            {
                "variant": name,
                "lever": what.format(big=big, big2=2 * big, b=b),
                "ms/step": v["ms_per_step"],
                "MFU (197 TFLOP/s)": v["mfu_197"],
                "compile s": v["compile_s"],
                "date": v["date"],
            }
        )
    stored = {
        "device_kind": report["device_kind"],
        "date": ", ".join(sorted({r["date"] for r in reports})),
        "jax": report["jax"],
        "libtpu": report["libtpu"],
        "profile": report["profile"],
        "command": "python tools/tpu_breakdown.py --profile full --out DIR [--only VARIANT ...]; "
        "python tools/tpu_breakdown.py --store DIR [DIR ...] --rates-from <tpu-check results of the same machine>",
        "rates_flops_per_s": rates,
        "repeats": cfg.block_repeats,
        "breakdowns": splits,
        "levers": levers,
    }
    dest.write_text(json.dumps(stored, indent=1) + "\n")
    return stored


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="full")
    ap.add_argument("--out")
    ap.add_argument("--trace-steps", type=int, default=3)
    ap.add_argument("--only", nargs="+", help="measure only the variants of these names")
    ap.add_argument(
        "--store", type=Path, nargs="+", help="folders this script wrote: store their breakdowns in the package"
    )
    ap.add_argument("--rates-from", type=Path, help="with --store: a tpu-check results file of the same machine")
    args = ap.parse_args(argv)
    if args.store:
        if not args.rates_from:
            ap.error("--store needs --rates-from: the tpu-check results file whose ceilings give the matmul rates.")
        store(args.store, args.rates_from, Path("dpcourse/perf") / breakdown.STORED)
        return 0
    if not args.out:
        ap.error("--out DIR is needed: the folder for breakdown.json and the traces.")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config.make_config(args.profile)
    device = jax.devices()[0]
    x, y = data.prepare(*data.synthetic_images(max(4 * cfg.ladder_large_batch, 4096)))
    dataset = data.Dataset(x, y, "synthetic", "")
    init_host = model.init_params(cfg)
    report: dict = {
        "profile": args.profile,
        "device_kind": device.device_kind,
        "platform": device.platform,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "variants": {},
    }
    try:
        from importlib.metadata import version

        import libtpu  # noqa: F401

        report["libtpu"] = version("libtpu")
    except Exception:  # noqa: BLE001
        report["libtpu"] = None
    n = cfg.matmul_size
    t0 = time.perf_counter()
    ops = ceilings.random_operands(n, device)
    rates = {s: ceilings.matmul_rate(n, s, device, ops, repeats=5, best=True) for s in ("float32 default", "bfloat16")}
    del ops
    report["ceilings"] = {s: c.rate for s, c in rates.items()}
    # The block's own matmul, alone: [batch, W] @ [W, W] in bfloat16, at the best rung's batch.
    a = jnp.ones((cfg.ladder_large_batch, cfg.width), jnp.bfloat16)
    w = jnp.ones((cfg.width, cfg.width), jnp.bfloat16)
    s = ceilings.time_calls(lambda a, w: a @ w, (a, w), repeats=5, best=True)
    report["block_matmul_bf16_flops_per_s"] = 2.0 * cfg.ladder_large_batch * cfg.width**2 / s
    report["ceilings_s"] = time.perf_counter() - t0
    print("ceilings", report["ceilings"], "block matmul", report["block_matmul_bf16_flops_per_s"], flush=True)

    vs = variants(cfg, device.platform)
    if args.only:
        vs = [v for v in vs if v["name"] in args.only]

    def safe_build(v):
        try:
            return build(v, cfg, init_host, device)
        except Exception as err:  # noqa: BLE001 - a variant that fails is recorded
            return err

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(vs)) as pool:
        built = list(pool.map(safe_build, vs))
    report["compile_wall_s"] = time.perf_counter() - t0
    work = Path(tempfile.mkdtemp())
    keep = io.BytesIO()
    tar = tarfile.open(fileobj=keep, mode="w:gz")  # noqa: SIM115 - closed after the loop that fills it
    layout_done = False
    for v, b in zip(vs, built):
        rec: dict = {k: v[k] for k in ("unroll", "dtype", "batch")} | {
            "x_dtype": v.get("x_dtype", "float32"),
            "forward": v.get("forward", "model.forward"),
            "backward": v.get("backward", "autodiff"),
            "options": v.get("options", {}),
        }
        report["variants"][v["name"]] = rec
        if isinstance(b, Exception):
            rec["status"] = f"failed: {type(b).__name__}: {str(b)[:300]}"
            print(v["name"], rec["status"], flush=True)
            continue
        rcfg, opt, exe, compile_s, text = b
        try:
            params, state, batches = place(v, rcfg, opt, init_host, dataset, device)
            ms, losses, params, state = time_steps(exe, params, state, batches, 2, 3, max(cfg.steps, 5))
            flops = costs.train_flops_per_step(rcfg, v["batch"])
            rate = rates[ceilings.ceiling_for(v["dtype"])].rate
            census = fusions.census(text)
            rec.update(
                status="ok",
                ms_per_step=ms,
                compile_s=compile_s,
                tflops=flops / ms * 1e-9,
                mfu_197=flops / ms * 1e3 / 197e12,
                of_ceiling=flops / ms * 1e3 / rate,
                losses=losses[:10],
                census=census.__dict__,
                program_kernel_kinds=dict(Counter(breakdown.kernel_kinds(text).values())),
            )
            try:
                m = exe.memory_analysis()
                rec["memory"] = {
                    k: int(getattr(m, k))
                    for k in (
                        "argument_size_in_bytes",
                        "output_size_in_bytes",
                        "temp_size_in_bytes",
                        "alias_size_in_bytes",
                    )
                }
            except Exception:  # noqa: BLE001
                pass
            print(v["name"], f"{ms:.3f} ms", f"{rec['mfu_197']:.1%}", f"compile {compile_s:.1f} s", flush=True)
            if v.get("profile"):
                folder = work / v["name"]
                jax.block_until_ready((params, state))
                with jax.profiler.trace(str(folder)):
                    for i in range(args.trace_steps):
                        params, state, _ = exe(params, state, *batches[i % len(batches)])
                    jax.block_until_ready((params, state))
                path = breakdown.trace_file(folder)
                kinds = breakdown.kernel_kinds(text)
                ks, where = breakdown.kernels(path, kinds)
                if not layout_done:
                    (out / "trace_layout.json").write_text(json.dumps(layout(path), indent=1, default=str))
                    layout_done = True
                tar.add(path, arcname=f"{v['name']}/trace.json.gz")
                info = tarfile.TarInfo(f"{v['name']}/program.hlo.txt")
                raw = text.encode()
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
                if ks:
                    bd = breakdown.split(ks, args.trace_steps, ms, flops, rate, v["name"], where)
                    rec["breakdown"] = bd.to_json()
                    rec["breakdown_parts_ms"] = bd.parts_ms
                    rec["breakdown_gap"] = bd.gap
                    for line in bd.sentences():
                        print("  ", line, flush=True)
                else:
                    rec["breakdown"] = "no kernel of the program's names in the trace"
                    print("  ", rec["breakdown"], flush=True)
            del params, state, batches
        except Exception as err:  # noqa: BLE001
            rec["status"] = f"failed: {type(err).__name__}: {str(err)[:300]}"
            rec["traceback"] = traceback.format_exc()[-2000:]
            print(v["name"], rec["status"], flush=True)
        (out / "breakdown.json").write_text(json.dumps(report, indent=1, default=str))
    tar.close()
    (out / "traces.tar.gz").write_bytes(keep.getvalue())
    (out / "breakdown.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
