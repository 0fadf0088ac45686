"""A resumable training run: the loop of notebook 11, and the fresh process that resumes it.

Notebook 11 writes the loop in its own cells (a noisy-input step that
splits the PRNG key each step and reads the batch at the data position);
:func:`train_until` is the package's version, which the lesson checks its
cell against, and which the fresh process runs: ``python -m dpcourse.checkpoints.resume
--dir DIR --until N ...`` restores the latest step of ``DIR`` onto its own
mesh (any device count that divides the global batch, replicated or FSDP),
trains to step N, saves it and prints a JSON summary on its last line.
A directory that already holds step N has nothing to do (said, exit 0);
one past N is refused, as the multi-process worker does
(:func:`dpcourse.checkpoints.checkpoint.steps_to_train`); a second run on
the same directory is refused while the first holds it. With ``--kill-at
commit`` (``--kill-at-commit``) it saves once more and is killed (SIGKILL)
after writing every array and before the commit, with ``--kill-at
writing`` while the arrays are written: the half-written step must never
be restored.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

NOISE_STD = 0.05  # standard deviation of the Gaussian noise added to each input pixel (pixels lie in [0, 1])


def build(cfg, mesh, form: str, global_batch: int, dataset, n_batches: int):
    """Everything a run of notebook 11 needs on ``mesh``: ``(step_fn, noisy, x_batches, y_batches, init_state)``.

    ``step_fn(params, opt_state, x, y) -> (params, opt_state, metrics)`` is
    lesson 10's step of ``form`` (``"replicated"`` or ``"fsdp"``, gathered
    once); ``noisy(key, x)`` adds :data:`NOISE_STD` Gaussian noise drawn from
    ``key`` to ``x`` with ``x``'s sharding; the batches are
    ``[n_batches, global_batch, 784]`` float32 and ``[n_batches, global_batch]``
    int32, sharded over the batch dimension; ``init_state`` is step 0 (on
    the form's shardings).

    Raises:
        ValueError: ``global_batch`` does not divide by the mesh's device count, or an unknown form.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpcourse import data, model, train
    from dpcourse.checkpoints import checkpoint
    from dpcourse.sharded import forms as sharded

    axis = mesh.axis_names[0]
    train.check_global_batch(global_batch, mesh.shape[axis])
    optimizer = train.make_optimizer(cfg)
    params0 = model.init_params(cfg)
    state0 = checkpoint.make_state(params0, optimizer.init(params0), 0, jax.random.PRNGKey(cfg.seed), 0)
    shardings = checkpoint.state_shardings(state0, mesh, form)
    if form == "replicated":
        step_fn = sharded.make_replicated_step(cfg, optimizer, mesh, params0, state0["opt_state"], axis)
    else:
        step_fn, _, _ = sharded.make_fsdp_step(cfg, optimizer, mesh, params0, state0["opt_state"], True, axis)
    x_host, y_host = data.stacked_batches(dataset, n_batches, global_batch)
    x_sh = NamedSharding(mesh, P(None, axis, None))
    xs, ys = jax.device_put(x_host, x_sh), jax.device_put(y_host, NamedSharding(mesh, P(None, axis)))
    batch_sh = NamedSharding(mesh, P(axis, None))
    noisy = jax.jit(lambda key, x: x + NOISE_STD * jax.random.normal(key, x.shape, x.dtype), out_shardings=batch_sh)
    return step_fn, noisy, xs, ys, jax.device_put(state0, shardings)


def train_until(state, step_fn, noisy, xs, ys, until: int):
    """Train from ``state`` to step ``until``: split the key, read the batch at the data position, step.

    Returns:
        The state at step ``until`` (the same tree as ``state``) and the loss of each step taken.
    """
    import jax

    state = dict(state)
    losses = []
    while int(state["step"]) < until:
        key, sub = jax.random.split(state["key"])
        i = int(state["data_position"]) % xs.shape[0]
        params, opt_state, metrics = step_fn(state["params"], state["opt_state"], noisy(sub, xs[i]), ys[i])
        losses.append(float(metrics["loss"]))
        state.update(
            params=params,
            opt_state=opt_state,
            step=np.int32(int(state["step"]) + 1),
            key=key,
            data_position=np.int32(int(state["data_position"]) + 1),
        )
    return state, losses


def command(folder, cfg, devices: list, n_devices: int, global_batch: int, n_batches: int, data_source: str):
    """The argument list (never a shell line) of a fresh process that resumes ``folder``, as notebook 11 starts it.

    It runs on the platform of the notebook's ``devices``, except TPU chips: the notebook's process holds them
    and no other can open them (:mod:`dpcourse.backend.chips`), so it resumes on as many simulated CPU devices.
    """
    platform = "cpu" if devices[0].platform == "tpu" else devices[0].platform
    out = [sys.executable, "-m", "dpcourse.checkpoints.resume", "--dir", str(folder), "--devices", str(n_devices)]
    out += ["--platform", platform, "--profile", cfg.profile, "--data-source", data_source]
    return out + ["--global-batch", str(global_batch), "--n-batches", str(n_batches)]


def across_process_counts(
    cfg, devices: list, splits, folder, steps: int, data_source: str, global_batch: int, timeout_s
):
    """Notebook 11's section 6: ``splits[0]`` processes x devices train, saving every 2 steps, and process 1 dies
    at step 3; ``splits[1]`` resume from the latest step. Prints what runs; returns the table's row, against one
    process on ``devices`` straight through. Raises AssertionError when process 1 did not fail."""
    from dpcourse import train
    from dpcourse.checkpoints import checkpoint, scratch
    from dpcourse.multihost import launcher, worker

    scratch.fresh(folder)  # run again, the cell starts over from step 0
    common = dict(profile=cfg.profile, steps=steps, data_source=data_source, global_batch=global_batch)
    common.update(checkpoint_dir=str(folder), save_every=2, timeout_s=timeout_s, init_timeout_s=60)
    t0 = time.perf_counter()
    print("{} processes x {} devices, process 1 set to fail at step 3 ...".format(*splits[0]))
    try:
        launcher.launch_local(*splits[0], fail_process=1, fail_at_step=3, **common)
        raise AssertionError("process 1 should have failed at step 3")
    except launcher.WorkerFailed as err:
        print(str(err).splitlines()[0])
    with checkpoint.open_manager(folder) as reader:
        latest = reader.latest_step()
    print(f"latest step after the kill: {latest} ({time.perf_counter() - t0:.0f} s)")
    print("{} processes x {} devices resume ...".format(*splits[1]))
    rerun = launcher.launch_local(*splits[1], **common)
    print(launcher.output_tail(rerun.stdout[0]))
    print(f"({time.perf_counter() - t0:.0f} s) 1 process x {len(devices)} devices straight through, for reference")
    reference, _, _ = worker.single_process_reference(cfg.profile, steps, devices, data_source, global_batch)
    print(f"done ({time.perf_counter() - t0:.0f} s)")
    return {
        "run": "{} x {} killed at step 3, resumed as {} x {}".format(*splits[0], *splits[1]),
        "latest step after the kill": latest,
        "resumed from": rerun.summary["resumed_from"],
        "max |param diff| vs straight": train.max_abs_diff(reference, rerun.params),
    }


KILL_PHASES = ("writing", "commit")  # --kill-at: while the arrays are written, or after them and before the commit
# Nothing saved: this command resumes a run, it never starts one (notebook 11 trains the run from step 0).
NOTHING_TO_RESUME = (
    "The checkpoint directory {dir} {what}, so there is nothing to resume (this command goes on from a saved "
    "step): check the folder's name, or train from step 0 first as notebook 11 does (its section 2, \"Save with "
    'Orbax", saves the run half way) and give that folder to --dir.'
)


def _main(args: argparse.Namespace, say) -> dict:
    from dpcourse import devices
    from dpcourse.checkpoints import checkpoint

    path = checkpoint.check_directory(args.dir)  # before JAX starts: a wrong folder or device count is said at once
    if not path.is_dir():  # a mistyped name is never made into a folder
        raise checkpoint.CheckpointError(NOTHING_TO_RESUME.format(dir=args.dir, what="does not exist (none was made)"))
    checkpoint.check_devices_for_batch(args.global_batch, args.devices, args.dir)
    with checkpoint.hold(args.dir, "python -m dpcourse.checkpoints.resume " + " ".join(sys.argv[1:])):
        if args.platform == "cpu" and not devices.backend_started():
            # The notebook's devices are simulated: an accelerator it holds (a TPU chip) is never opened here.
            import jax

            os.environ["JAX_PLATFORMS"] = "cpu"
            jax.config.update("jax_platforms", "cpu")
        devices.setup_devices(args.devices)
        return _resume(args, say)


def _resume(args: argparse.Namespace, say) -> dict:
    """Restore the latest step, train to ``--until`` and save it, while this process holds the directory."""
    import jax
    from jax.sharding import Mesh

    from dpcourse import config, data
    from dpcourse.checkpoints import checkpoint

    cfg = config.get_config(args.profile, backend="cpu")
    dataset = data.load_fashion_mnist(source=args.data_source, limit=cfg.max_train_examples, seed=cfg.seed)
    pool = jax.devices(args.platform) if args.platform else jax.devices()
    mesh = Mesh(np.array(pool[: args.devices]), ("data",))
    step_fn, noisy, xs, ys, state0 = build(cfg, mesh, args.form, args.global_batch, dataset, args.n_batches)
    run = checkpoint.run_description(cfg, args.global_batch)
    manager = checkpoint.open_manager(args.dir)
    if not manager.all_steps():
        manager.close()
        raise checkpoint.CheckpointError(NOTHING_TO_RESUME.format(dir=args.dir, what="holds no complete step"))
    target = checkpoint.abstract_target(state0, checkpoint.state_shardings(state0, mesh, args.form))
    t0 = time.perf_counter()
    told = []  # where the step was made and what changed: in the summary, so that stderr holds only a failure
    restored_step, state = checkpoint.restore(manager, target, run, warn=say, say=told.append)
    restore_s = time.perf_counter() - t0
    if args.kill_at:
        if args.kill_at == "writing":  # the background thread is writing the arrays
            checkpoint.save(manager, restored_step + 1, state, run)
            os.kill(os.getpid(), 9)  # SIGKILL (the number: Windows' signal module has no name for it)
        with checkpoint.fail_at_commit(kill=True):
            checkpoint.save(manager, restored_step + 1, state, run)
            checkpoint.finish(manager)
        raise AssertionError("the process should have been killed at the commit")
    losses = []
    if checkpoint.steps_to_train(restored_step, args.until, args.dir, "--until"):
        state, losses = train_until(state, step_fn, noisy, xs, ys, args.until)
        checkpoint.save(manager, args.until, state, run)
        checkpoint.finish(manager)
    else:
        say(f"{args.dir} already holds step {args.until}: nothing to train or save (raise --until to go on).")
    manager.close()
    return {
        "restored_step": int(restored_step),
        "final_step": int(state["step"]),
        "devices": args.devices,
        "form": args.form,
        "losses": losses,
        "restore_s": restore_s,
        "restored_from": told[0],
        "jax_version": jax.__version__,
    }


class _HeldLog:
    """Orbax's log and stray tracebacks, held in memory (bounded) while the command runs; written to a file only on failure.

    A handler that writes to a file as records come would fail on the full
    disk that made the save fail, and logging would then print its own
    errors over the one sentence; one held in memory cannot fail.
    """

    MAX_RECORDS = 200

    def __init__(self):
        import logging

        self.lines: list[str] = []
        self.handler = logging.Handler()
        self.handler.emit = self._emit

    def _emit(self, record) -> None:
        import contextlib

        with contextlib.suppress(Exception):
            if len(self.lines) < self.MAX_RECORDS:
                self.lines.append(self.handler.format(record))

    def add(self, text: str) -> None:
        if len(self.lines) < self.MAX_RECORDS:
            self.lines.append(text)

    def keep(self) -> str:
        """Write the held lines to a file in the temp folder; ``(details: PATH)``, or why there are none."""
        import tempfile

        try:
            folder = tempfile.gettempdir()
        except (OSError, ValueError) as err:  # "No usable temporary directory": every candidate is full or read-only
            return f"(no details kept: no usable temporary folder, {type(err).__name__})"
        path = Path(folder) / f"dpcourse-resume-{os.getpid()}.log"
        try:
            path.write_text("\n".join(self.lines) + "\n", encoding="utf-8")
        except OSError as err:
            with contextlib.suppress(OSError):
                path.unlink()
            return f"(no details kept: the temporary folder {folder} cannot be written, {os.strerror(err.errno or 0)})"
        return f"(details: {path})"


def main(argv: list[str] | None = None) -> int:
    """``python -m dpcourse.checkpoints.resume --dir DIR --until N [--devices K] [--form fsdp] ...``.

    Returns the exit status: 0 (also when the directory already holds step
    N: nothing to do, said on stderr), 1 for a checkpoint that cannot be
    used or saved, or any other failure (one sentence on stderr, first;
    Orbax's log and the traceback go to a log file it names, when the temp
    folder has room for one), 2 for bad arguments. Never raises.
    """
    import logging
    import threading
    import traceback

    from dpcourse import config
    from dpcourse.backend.xlaflags import exit_on_bad_xla_flags
    from dpcourse.checkpoints import checkpoint

    parser = argparse.ArgumentParser(prog="python -m dpcourse.checkpoints.resume", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="checkpoint directory (its latest step is resumed)")
    parser.add_argument("--until", type=int, default=None, help="train to this step (>= 1), then save it")
    parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices of this process's mesh")
    parser.add_argument(
        "--platform",
        choices=["cpu", "gpu", "tpu"],
        default=None,
        help="the platform of the notebook's devices (cpu: its simulated CPU devices, and no accelerator is "
        "opened); default: JAX's default backend",
    )
    parser.add_argument("--form", choices=checkpoint.FORMS, default="replicated")
    parser.add_argument("--profile", choices=config.profile_names(), default=None)
    parser.add_argument("--data-source", choices=["auto", "real", "synthetic"], default=None)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--n-batches", type=int, required=True, help="batches in the data stream")
    kill = parser.add_mutually_exclusive_group()
    kill.add_argument("--kill-at", choices=KILL_PHASES, default=None, help="save once more and die (SIGKILL) then")
    kill.add_argument("--kill-at-commit", dest="kill_at", action="store_const", const="commit", help="--kill-at commit")
    args = parser.parse_args(argv)
    exit_on_bad_xla_flags()  # before JAX starts: XLA would end the process with its whole flag list
    if args.until is None and args.kill_at is None:
        parser.error("--until N is required: the step to train to (the latest saved step is resumed).")
    # Orbax logs a failed background save from its own thread (a traceback per try): held, not on the screen.
    held = _HeldLog()
    absl = logging.getLogger("absl")
    before = absl.propagate
    absl.addHandler(held.handler)
    absl.propagate = False
    hooks = sys.unraisablehook, threading.excepthook
    # A read that failed leaves Tensorstore's other callbacks to find Orbax's event loop closed: held too.
    sys.unraisablehook = lambda u: held.add("".join(traceback.format_exception(u.exc_value)))
    threading.excepthook = lambda e: held.add("".join(traceback.format_exception(e.exc_value)))
    try:
        summary = _main(args, lambda sentence: print(sentence, file=sys.stderr, flush=True))
    except (checkpoint.CheckpointError, ValueError, OSError) as err:
        held.add(traceback.format_exc())
        sentence = str(err) if not isinstance(err, OSError) else checkpoint.explain(err, f"resume from {args.dir}")
        print(f"error: {sentence} {held.keep()}", file=sys.stderr, flush=True)
        return 1
    except Exception as err:  # noqa: BLE001 - anything else still ends in one line and an exit status
        held.add(traceback.format_exc())
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        print(f"error: {type(err).__name__}: {first} {held.keep()}", file=sys.stderr, flush=True)
        return 1
    finally:
        absl.removeHandler(held.handler)
        absl.propagate = before
        sys.unraisablehook, threading.excepthook = hooks
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    code = 1
    try:
        code = main()
    except SystemExit as exited:  # argparse's usage errors
        code = exited.code if isinstance(exited.code, int) else 2
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        # A failed save leaves Orbax's background thread behind, which would keep the interpreter alive:
        # the error is said, so end now, whatever happened.
        os._exit(code)
