"""Every local launch of the course, run twice, interrupted, under a CPU hog and two at once: how each one ends.

Not part of ``make test`` (minutes of multi-process runs). Run on the machine
in question, e.g. ``.venv/bin/python tools/launch_bench.py --out build/launch-bench.json``.
The places that launch processes, each through the launcher's command line
(``python -m dpcourse.multihost.launcher``, what ``launch_local`` runs):

- ``08``: lesson 08's run, 2 processes x 2 CPU devices, 3 steps;
- ``11``: lesson 11's multi-process section, a checkpointed run whose
  process 1 fails at step 3, then the resume;
- ``worker``: the GKE worker's program run locally with a checkpoint folder
  (``deploy/multihost-checkpoint.yaml``'s command, started by the launcher).

Each scenario prints one line per launch: its exit status, its wall time,
the machine's load average, and the launcher's first line (a result, or
the one sentence it ended with). An interrupted launch is sent SIGINT after
``--interrupt-after-s``; the line then also says how many of its worker
processes were still alive 2 s later (none is the right answer).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAG_ENV = "DPCOURSE_LAUNCH_BENCH_TAG"


def _command(place: str, folder: Path) -> list[str]:
    command = [sys.executable, "-m", "dpcourse.multihost.launcher", "--profile", "smoke", "--data-source", "synthetic"]
    command += ["--processes", "2", "--devices-per-process", "2", "--timeout-s", "300"]
    if place == "08":
        return command + ["--steps", "3"]
    return command + ["--steps", "4", "--checkpoint-dir", str(folder / f"{place}-ckpt"), "--save-every", "2"]


def _workers_alive(tag: str) -> int:
    """Worker processes whose environment carries ``tag`` (Linux /proc; 0 where it cannot be read)."""
    alive = 0
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if (
                f"{TAG_ENV}={tag}".encode() in (entry / "environ").read_bytes()
                and b"multihost.worker" in (entry / "cmdline").read_bytes()
            ):
                alive += 1
    return alive


def _start(command: list[str]) -> tuple[subprocess.Popen, str]:
    tag = uuid.uuid4().hex
    env = dict(os.environ, **{TAG_ENV: tag})
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A shell's background job ignores SIGINT, and so would the launcher: give it back its default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    return proc, tag


def _finish(proc: subprocess.Popen, start: float, scenario: str, place: str, tag: str, interrupted: bool) -> dict:
    output, _ = proc.communicate()
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith("---")]
    first = lines[0] if lines else ""
    time.sleep(2 if interrupted else 0)
    return {
        "scenario": scenario,
        "place": place,
        "status": proc.returncode,
        "wall_s": round(time.monotonic() - start, 1),
        "load_1min": round(os.getloadavg()[0], 1),
        "said": first[:400],
        "workers_left": _workers_alive(tag),
    }


def run_once(scenario: str, place: str, folder: Path, interrupt_after_s: float | None = None) -> dict:
    start = time.monotonic()
    proc, tag = _start(_command(place, folder))
    if interrupt_after_s is not None:
        time.sleep(interrupt_after_s)
        proc.send_signal(signal.SIGINT)
    return _finish(proc, start, scenario, place, tag, interrupt_after_s is not None)


def run_11(scenario: str, folder: Path) -> list[dict]:
    """Lesson 11: process 1 fails at step 3 (the worker's --fail-at-step), then every process resumes."""
    rows = []
    shutil.rmtree(folder / "11-ckpt", ignore_errors=True)  # as lesson 11's cell does: each run from step 0
    start = time.monotonic()
    # The launcher's command line does not take the failure flags; launch_local does: run it in a child.
    code = (
        "import sys; from dpcourse.multihost import launcher\n"
        "try:\n"
        f"    launcher.launch_local(2, 2, profile='smoke', steps=4, data_source='synthetic', "
        f"checkpoint_dir={str(folder / '11-ckpt')!r}, save_every=2, fail_process=1, fail_at_step=3, "
        "timeout_s=300, init_timeout_s=60)\n"
        "except launcher.WorkerFailed as err:\n"
        "    print(str(err).splitlines()[0]); sys.exit(0)\n"
        "except Exception as err:\n"
        "    print(f'{type(err).__name__}: {err}'.splitlines()[0]); sys.exit(1)\n"
        "print('the run should have failed'); sys.exit(1)\n"
    )
    proc, tag = _start([sys.executable, "-c", code])
    rows.append(_finish(proc, start, scenario, "11 (kill at step 3)", tag, False))
    rows.append(run_once(scenario, "11", folder))
    return rows


def hog(n: int) -> list[subprocess.Popen]:
    """``n`` processes that spin on a core each."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write every row as JSON here too")
    parser.add_argument("--interrupt-after-s", type=float, default=4.0)
    parser.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 1), help="spinning processes")
    parser.add_argument("--scenarios", default="twice,interrupted,hog,busy,together")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    chosen = args.scenarios.split(",")
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as tmp:
        folder = Path(tmp)

        def show(new: list[dict]) -> None:
            for row in new:
                print(json.dumps(row), flush=True)
            rows.extend(new)

        if "twice" in chosen:
            for _ in range(2):
                show([run_once("twice", "08", folder)])
                show(run_11("twice", folder))
                show([run_once("twice", "worker", folder)])
        if "interrupted" in chosen:
            for place in ("08", "worker"):
                show([run_once("interrupted", place, folder, args.interrupt_after_s)])
        if "hog" in chosen:
            hogs = hog(args.hogs)
            try:
                time.sleep(5)  # the load average takes a while to rise
                show([run_once("hog", "08", folder)])
                show(run_11("hog", folder / "hog"))
                show([run_once("hog", "worker", folder / "hog")])
            finally:
                for proc in hogs:
                    proc.kill()
                    proc.wait()
        if "busy" in chosen:  # a start-up bound far too short for a busy machine: said as such, re-run advised
            hogs = hog(args.hogs)
            try:
                time.sleep(5)
                start = time.monotonic()
                proc, tag = _start(_command("08", folder) + ["--timeout-s", "2", "--init-timeout-s", "1"])
                show([_finish(proc, start, "busy, --timeout-s 2", "08", tag, False)])
            finally:
                for proc in hogs:
                    proc.kill()
                    proc.wait()
        if "together" in chosen:
            start = time.monotonic()
            both = [_start(_command("08", folder)), _start(_command("worker", folder / "together"))]
            show([_finish(p, start, "together", place, tag, False) for (p, tag), place in zip(both, ("08", "worker"))])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
