"""Does a recompile after ``jax.clear_caches()`` cost what a fresh program's compile costs?

Run on the machine in question, e.g. ``.venv/bin/python tools/clear_caches_check.py``
(add ``--profile full`` for the course's full-size step). After a warm-up
compile (the process's first compile also pays one-time start-up work, so it
is not compared), it times, ``--rounds`` times each: a fresh program (the
course's plain ``jit`` step at a batch size not compiled before) and the
same program again after ``jax.clear_caches()``, and prints the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    from dpcourse import config
    from dpcourse.backend.xlaflags import exit_on_bad_xla_flags

    if args.profile not in config.profile_names():
        parser.error(f"--profile {args.profile!r} is not a profile: use one of {', '.join(config.profile_names())}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    exit_on_bad_xla_flags()  # before JAX starts
    import jax

    from dpcourse import model, train

    cfg = config.make_config(args.profile)
    opt = train.make_optimizer(cfg)
    params = model.init_params(cfg)
    state = opt.init(params)

    def compile_for(batch: int) -> float:
        step = jax.jit(train.make_train_step(cfg, opt))
        x = jax.ShapeDtypeStruct((batch, 784), "float32")
        y = jax.ShapeDtypeStruct((batch,), "int32")
        t0 = time.perf_counter()
        step.lower(params, state, x, y).compile()
        return time.perf_counter() - t0

    first = compile_for(cfg.per_device_batch)  # the process's first compile: not compared
    fresh, again = [], []
    for i in range(args.rounds):
        batch = cfg.per_device_batch + 8 * (i + 1)  # a shape not compiled before: a fresh program
        fresh.append(compile_for(batch))
        jax.clear_caches()
        again.append(compile_for(batch))
    dev = jax.devices()[0]
    print(f"{dev.device_kind} ({dev.platform}), JAX {jax.__version__}, {args.profile} profile, {args.rounds} rounds")
    print(f"process's first compile: {first:.3f} s (one-time start-up work included; not compared)")
    print(f"fresh program:                   median {statistics.median(fresh):.3f} s")
    print(f"same program after clear_caches: median {statistics.median(again):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
