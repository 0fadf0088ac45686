"""A run moved between backends (or device layouts) half-way, against the same run uninterrupted on the second.

Taught in notebook 11 (section 9, "Between sessions"), which shows the
comparison measured on a TPU chip (:func:`stored`) and runs it on two
layouts of the CPU. The proof has three parts, each with its tolerance
(:func:`tolerances`):

- bit for bit: the state restored on the second devices is the state saved
  on the first, every leaf; and at the last step the step, data position,
  PRNG key and AdamW's step count equal the uninterrupted run's;
- the backends' arithmetic at the hand-over: one gradient of the restored
  state, computed on both, relative to its largest element;
- the parameters at the last step, against AdamW's bound.

``python -m dpcourse.checkpoints.across --out FILE`` runs both directions
between the default backend's first device and simulated CPU devices, at
JAX's default matmul precision and at ``"highest"``, and writes the JSON
that :func:`stored` reads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from dpcourse.checkpoints import checkpoint, resume

BITWISE = ("step", "data_position", "key", "optimizer_count")  # equal bit for bit, whatever the backends
PRECISIONS = ("default", "highest")
STORED = "across_backends.json"  # the chip's measurement, kept in this package


def tolerances(same_backend: bool, precision: str, learning_rate: float, steps: int) -> dict[str, float]:
    """The tolerances of a moved run: ``{"gradient_rel": ..., "param_abs": ...}``, derived below.

    - The gradient of one state on both devices, relative to its largest
      element. Two layouts of one backend, or a TPU at ``"highest"``
      (float32 products, six bfloat16 passes): float32 rounding in another
      order, plus the backends' own exp and log; the chip's measurement
      (:data:`STORED`) found the gradients 4.6e-6 to 4.7e-6 apart there: 1e-4
      (:data:`dpcourse.train.GRAD_REL_TOL`). A TPU at its
      default: each float32 product's inputs rounded to bfloat16, 8
      significant bits, a relative error up to 2^-8 (about 3.9e-3) per input;
      a sum's errors partly cancel, and the chip's measurement (:data:`STORED`)
      found the gradients 1.8e-3 to 2.1e-3 apart: 1e-2, a few times that.
    - The parameters after ``steps`` AdamW steps: AdamW moves a weight by
      about ``learning_rate`` per step whatever its gradient, so where a
      gradient element's sign differs between the two runs (an element
      smaller than the rounding above), the two runs can part by up to
      2 x ``learning_rate`` per step: 2 x lr x steps, at either precision.
      Within one backend, a different sum order alone: 1e-5
      (:func:`dpcourse.train.equivalence_tolerances` for the CPU).

    Raises:
        ValueError: an unknown precision (the message lists :data:`PRECISIONS`).
    """
    from dpcourse import train

    if precision not in PRECISIONS:
        raise ValueError(f"Unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}.")
    if same_backend:
        return {"gradient_rel": train.GRAD_REL_TOL, "param_abs": train.equivalence_tolerances("cpu", 0.0, 0)[0]}
    gradient_rel = train.GRAD_REL_TOL if precision == "highest" else 1e-2
    return {"gradient_rel": gradient_rel, "param_abs": 2.0 * learning_rate * steps}


def optimizer_count(opt_state) -> int:
    """AdamW's step count in ``opt_state`` (optax's ``count``), as an int.

    Raises:
        ValueError: ``opt_state`` holds no ``count`` (not an optax Adam state).
    """
    import jax

    counts = [
        leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(opt_state)
        if path and "count" in (getattr(path[-1], "name", None), getattr(path[-1], "key", None))
    ]
    if not counts:
        raise ValueError("The optimizer state holds no 'count' leaf: it is not optax's AdamW state.")
    return int(np.asarray(counts[0]))


def exact_fields(state) -> dict[str, Any]:
    """The fields of ``state`` that a move must keep bit for bit (:data:`BITWISE`), as plain values."""
    return {
        "step": int(np.asarray(state["step"])),
        "data_position": int(np.asarray(state["data_position"])),
        "key": [int(v) for v in np.asarray(state["key"]).ravel()],
        "optimizer_count": optimizer_count(state["opt_state"]),
    }


def _host(tree):
    import jax

    return jax.tree.map(lambda a: np.asarray(a), tree)


def gradient(cfg, state, noisy, xs, ys, devices: list):
    """The gradient of the next step's loss at ``state`` on ``devices`` (a 1-D mesh), on the host.

    The next step's batch and noise, as :func:`dpcourse.checkpoints.resume.train_until`
    draws them (the key split, the batch at the data position).
    """
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpcourse import model

    mesh = Mesh(np.array(devices), ("data",))
    _, sub = jax.random.split(state["key"])  # on the devices of ``state``, ``noisy`` and ``xs``
    i = int(np.asarray(state["data_position"])) % xs.shape[0]
    x = np.asarray(noisy(sub, xs[i]))  # the noise drawn where the run draws it, then moved
    batch = NamedSharding(mesh, P("data"))
    x, y = jax.device_put(x, batch), jax.device_put(np.asarray(ys[i]), batch)
    params = jax.device_put(_host(state["params"]), NamedSharding(mesh, P()))
    with jax.default_device(devices[0]):
        grad = jax.jit(jax.grad(lambda p, x, y: model.loss_and_metrics(p, x, y, cfg)[0]))(params, x, y)
    return _host(grad)


def _max_abs(tree_a, tree_b) -> float:
    import jax

    return float(
        max(
            np.max(np.abs(np.asarray(a) - np.asarray(b)))
            for a, b in zip(jax.tree.leaves(tree_a), jax.tree.leaves(tree_b))
        )
    )


def compare(moved, straight, restored, saved, grad_first, grad_second, tol: Mapping[str, float]) -> dict[str, Any]:
    """The proof of one move, as a JSON-ready dict with a verdict per part.

    Args:
        moved: the state at the last step of the run moved half-way.
        straight: the same run's state at that step, uninterrupted on the second devices.
        restored, saved: the state restored on the second devices and the one saved on the first.
        grad_first, grad_second: :func:`gradient` of ``restored`` on the first and on the second devices.
        tol: :func:`tolerances`.
    """
    import jax

    restore_diff = _max_abs(saved, restored)
    moved_exact, straight_exact = exact_fields(moved), exact_fields(straight)
    largest = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(grad_first))
    gradient_rel = _max_abs(grad_first, grad_second) / largest
    param_abs = _max_abs(moved["params"], straight["params"])
    return {
        "restore_max_abs_diff": restore_diff,
        "exact_fields_moved": moved_exact,
        "exact_fields_straight": straight_exact,
        "exact_equal": moved_exact == straight_exact and restore_diff == 0.0,
        "gradient_rel_diff": gradient_rel,
        "gradient_rel_tol": tol["gradient_rel"],
        "param_max_abs_diff": param_abs,
        "param_abs_tol": tol["param_abs"],
        "passed": moved_exact == straight_exact
        and restore_diff == 0.0
        and gradient_rel <= tol["gradient_rel"]
        and param_abs <= tol["param_abs"],
    }


def _run_on(cfg, devices: list, global_batch: int, dataset, n_batches: int):
    import jax
    from jax.sharding import Mesh

    mesh = Mesh(np.array(devices), ("data",))
    with jax.default_device(devices[0]):  # no array of this run lands on the other side's devices
        return resume.build(cfg, mesh, "replicated", global_batch, dataset, n_batches)


def _train(devices: list, *args):
    import jax

    with jax.default_device(devices[0]):
        return resume.train_until(*args)[0]


def first_half(cfg, devices: list, dataset, global_batch: int, steps: int, n_batches: int, folder):
    """Train on ``devices`` to ``steps // 2`` and save that step into ``folder``; ``(state, save_s)``.

    ``save_s`` runs from :func:`dpcourse.checkpoints.checkpoint.save` to the end of ``finish`` (written, committed).
    """
    step_fn, noisy, xs, ys, state0 = _run_on(cfg, devices, global_batch, dataset, n_batches)
    half = _train(devices, state0, step_fn, noisy, xs, ys, steps // 2)
    with checkpoint.open_manager(folder) as manager:
        t0 = time.perf_counter()
        checkpoint.save(manager, steps // 2, half, checkpoint.run_description(cfg, global_batch))
        checkpoint.finish(manager)
        return half, time.perf_counter() - t0


def _target(cfg, devices: list, global_batch: int, dataset, n_batches: int):
    from jax.sharding import Mesh

    built = _run_on(cfg, devices, global_batch, dataset, n_batches)
    mesh = Mesh(np.array(devices), ("data",))
    return built, checkpoint.abstract_target(built[-1], checkpoint.state_shardings(built[-1], mesh, "replicated"))


def prove(cfg, first: list, second: list, dataset, global_batch: int, steps: int, n_batches: int, half, folder):
    """Compare a run moved from ``first`` to ``second`` at ``steps // 2`` with the same run uninterrupted on ``second``.

    ``folder`` holds the moved run's steps ``steps // 2`` (saved on ``first``:
    ``half``) and ``steps`` (trained on ``second``, by the resume command in a
    fresh process or by :func:`move`); both are restored onto ``second``. JAX's
    matmul precision is the caller's (``jax.default_matmul_precision``).

    Returns:
        :func:`compare`'s dict.
    """
    (step_fn, noisy, xs, ys, state0), target = _target(cfg, second, global_batch, dataset, n_batches)
    run = checkpoint.run_description(cfg, global_batch)
    with checkpoint.open_manager(folder) as manager:
        _, restored = checkpoint.restore(manager, target, run, step=steps // 2)
        _, moved = checkpoint.restore(manager, target, run, step=steps)
    straight = _train(second, state0, step_fn, noisy, xs, ys, steps)
    grads = [gradient(cfg, restored, noisy, xs, ys, devices) for devices in (first, second)]
    same = first[0].platform == second[0].platform
    return compare(moved, straight, restored, half, *grads, tolerances(same, _precision(), cfg.learning_rate, steps))


def move(cfg, first: list, second: list, dataset, global_batch: int, steps: int, n_batches: int, folder, say=print):
    """:func:`first_half` on ``first``, then in this process the resume command's calls on ``second``, then :func:`prove`.

    The resume command's calls (:mod:`dpcourse.checkpoints.resume`): restore
    the latest step onto the second devices' target (``say`` is told where
    it was made), :func:`dpcourse.checkpoints.resume.train_until` to
    ``steps``, save. A TPU host's chip is held by one process, so the chip's
    measurement runs both sides here.

    Returns:
        ``(proof, seconds)``: :func:`prove`'s dict, and ``{"save_s": ..., "restore_s": ...}``.
    """
    half, save_s = first_half(cfg, first, dataset, global_batch, steps, n_batches, folder)
    (step_fn, noisy, xs, ys, _), target = _target(cfg, second, global_batch, dataset, n_batches)
    run = checkpoint.run_description(cfg, global_batch)
    with checkpoint.open_manager(folder) as manager:
        t0 = time.perf_counter()
        _, restored = checkpoint.restore(manager, target, run, say=say)
        restore_s = time.perf_counter() - t0
        checkpoint.save(manager, steps, _train(second, restored, step_fn, noisy, xs, ys, steps), run)
        checkpoint.finish(manager)
    proof = prove(cfg, first, second, dataset, global_batch, steps, n_batches, half, folder)
    return proof, {"save_s": save_s, "restore_s": restore_s}


def timed_saves(cfg, devices: list, folder, repeats: int = 3) -> dict[str, Any]:
    """Time ``repeats`` saves of ``cfg``'s step-0 state on ``devices`` after one untimed save (Orbax's set-up).

    Each save is timed from ``save`` to the end of ``finish`` (written and committed).

    Returns:
        ``{"profile", "bytes_on_disk", "array_bytes", "save_s": [...], "device_kind"}``.
    """
    import jax
    from jax.sharding import Mesh

    from dpcourse import model, train

    params = model.init_params(cfg)
    state = checkpoint.make_state(params, train.make_optimizer(cfg).init(params), 0, jax.random.PRNGKey(cfg.seed), 0)
    mesh = Mesh(np.array(devices), ("data",))
    state = jax.device_put(state, checkpoint.state_shardings(state, mesh, "replicated"))
    run = checkpoint.run_description(cfg, cfg.global_batch(len(devices)))
    times = []
    with checkpoint.open_manager(folder, max_to_keep=None) as manager:
        for step in range(repeats + 1):
            t0 = time.perf_counter()
            checkpoint.save(manager, step, state, run)
            checkpoint.finish(manager)
            times.append(time.perf_counter() - t0)
    return {
        "profile": cfg.profile,
        "device_kind": devices[0].device_kind,
        "array_bytes": checkpoint.leaf_bytes(state),
        "bytes_on_disk": checkpoint.directory_bytes(Path(folder) / "0"),
        "first_save_s": times[0],
        "save_s": times[1:],
    }


def _precision() -> str:
    import jax

    value = jax.config.jax_default_matmul_precision
    return "highest" if value in ("highest", "float32") else "default"


def measure(cfg, chip: list, cpus: list, dataset, steps: int, n_batches: int, root, precisions=PRECISIONS, log=None):
    """:func:`move` from ``chip`` to ``cpus`` and back, at each of ``precisions``; one row each (``log`` gets its JSON).

    The global batch is ``cfg``'s for ``len(cpus)`` devices (``chip``'s count must divide it).
    """
    import jax

    runs = []
    for precision in precisions:
        moves = ((f"{chip[0].platform} -> cpu", chip, cpus), (f"cpu -> {chip[0].platform}", cpus, chip))
        for k, (name, first, second) in enumerate(moves):
            folder = Path(root) / f"{precision} {k}"
            t0 = time.perf_counter()
            chosen = jax.default_matmul_precision("highest") if precision == "highest" else contextlib.nullcontext()
            with chosen:
                proof, seconds = move(
                    cfg, first, second, dataset, cfg.global_batch(len(cpus)), steps, n_batches, folder, say=None
                )
            runs.append({"move": name, "precision": precision, **proof, **seconds, "wall_s": time.perf_counter() - t0})
            if log is not None:
                log(json.dumps(runs[-1]))
    return runs


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`measure`'s runs as a table's rows: the move, the precision, each part's difference against its tolerance."""
    return [
        {
            "move": r["move"],
            "matmul precision": r["precision"],
            "exact parts": "bit for bit" if r["exact_equal"] else "NO",
            "hand-over gradient (rel.)": f"{r['gradient_rel_diff']:.2e} (<= {r['gradient_rel_tol']:g})",
            "max |param diff|, last step": f"{r['param_max_abs_diff']:.2e} (<= {r['param_abs_tol']:g})",
            "passed": r["passed"],
        }
        for r in runs
    ]


def stored_label(result: Mapping[str, Any]) -> str:
    """Where the stored comparison was measured: "stored: 1 x TPU v5 lite and 8 CPU devices, 2026-12-06, JAX ..."."""
    v = result["versions"]
    return (
        f"stored: measured on 1 x {result['device_kind']} and {result['cpu_devices']} simulated CPU devices on "
        f"{result['date_utc']} (JAX {v.get('jax')}, libtpu {v.get('libtpu')}, orbax-checkpoint "
        f"{v.get('orbax-checkpoint')}), profile {result['profile']}, global batch {result['global_batch']}, "
        f"{result['steps']} steps moved at step {result['steps'] // 2}"
    )


def stored() -> dict[str, Any]:
    """The comparison measured on a TPU chip (:data:`STORED`, written by this module's command), with its provenance."""
    return json.loads(resources.files("dpcourse.checkpoints").joinpath(STORED).read_text(encoding="utf-8"))


def here_or_stored(data_source: str, root) -> tuple[list[dict[str, Any]], str]:
    """Notebook 11's moves, ``(runs, where they come from)``: measured between this process's TPU chip and its
    CPU devices (the stored measurement's profile and steps, into ``root``), or the chip's stored ones elsewhere."""
    import jax

    if jax.devices()[0].platform != "tpu":
        result = stored()
        return result["runs"], stored_label(result)
    from dpcourse import config, data

    cfg = config.make_config("cpu")
    dataset = data.load_fashion_mnist(source=data_source, limit=cfg.max_train_examples, seed=cfg.seed)
    runs = measure(cfg, jax.devices()[:1], jax.devices("cpu"), dataset, 6, 5, root)
    return runs, f"measured here, profile {cfg.profile}, 6 steps moved at step 3"


def main(argv: list[str] | None = None) -> int:
    """``python -m dpcourse.checkpoints.across --out FILE [--profile P] [--cpu-devices K] [--steps N]``: both directions, both precisions."""
    parser = argparse.ArgumentParser(prog="python -m dpcourse.checkpoints.across", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--cpu-devices", type=int, default=8, help="simulated CPU devices of the CPU side")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--n-batches", type=int, default=5)
    parser.add_argument("--save-profile", default="full", help="the profile whose state's saves are timed")
    parser.add_argument("--save-repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from dpcourse import devices

    devices.setup_devices(args.cpu_devices)
    import jax

    from dpcourse import config, data

    cfg = config.make_config(args.profile)
    dataset = data.load_fashion_mnist(source="synthetic", limit=cfg.max_train_examples, seed=cfg.seed)
    chip, cpus = jax.devices()[:1], jax.devices("cpu")[: args.cpu_devices]
    global_batch = cfg.global_batch(len(cpus))
    runs = []
    with tempfile.TemporaryDirectory(prefix="dpcourse-across-") as root:
        runs = measure(cfg, chip, cpus, dataset, args.steps, args.n_batches, root, PRECISIONS, log=print)
        saves = timed_saves(config.make_config(args.save_profile), chip, Path(root) / "timed", args.save_repeats)
    from dpcourse.checkpoints import provenance

    out = {
        "command": "python -m dpcourse.checkpoints.across " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date_utc": time.strftime("%Y-%m-%d", time.gmtime()),
        "device_kind": chip[0].device_kind,
        "cpu_devices": len(cpus),
        "profile": cfg.profile,
        "global_batch": global_batch,
        "steps": args.steps,
        "learning_rate": cfg.learning_rate,
        "versions": provenance.versions(),
        "runs": runs,
        "saves": saves,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0 if all(r["passed"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
