"""What each lesson must show in the browser, and where its executed copy comes from.

Each text is a table caption or a printed label from ``notebooks/NN_name.py``
(the key result of the lesson), not a measured number, so it does not change
from run to run. ``tests/browser/test_lesson_expectations.py`` checks that
every text still occurs in its notebook's source, so a renamed caption fails
there, cheaply, before the browser run. A lesson missing here (one added
later) gets the checks every lesson gets: every code cell ran, no error
output, no traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

KEY_OUTPUT: dict[str, tuple[str, ...]] = {
    "01_setup": ("What JAX sees",),
    "02_baseline": ("loss before training:", "The workload"),
    "03_mesh": ("each device holds",),
    # The equivalence table (1 device vs N devices) and the collectives table.
    "04_sharding": ("1 device vs N devices, same global batch", "Collectives of jit(train_step)"),
    # The collectives table of the explicit step.
    "05_shard_map": ("Collectives of jit(shard_map step)", "Collectives per step"),
    "06_pmap": ("pmap vs shard_map, same start, same global batch",),
    "07_sweep": ("Sweep on",),
    "08_multihost": ("The environment each process got", "Loss per step (global mean, before each update)"),
    # The ladder table and the all-reduce placement of the fast step.
    "09_performance": ("The ladder on", "Collectives on"),
    # Every form against replicated DP, and the collective census per form.
    "10_sharded": ("each form vs replicated DP", "Collectives per step, "),
    # The resumed runs against the straight one, and the restores onto other meshes.
    "11_checkpoint": ("resumed to", "Restored leaves against the saved state"),
    # The steps-to-target table and the 1-vs-N comparison.
    "12_batch_size": ("Steps to held-out loss", "Same global batch, 1 device vs N devices"),
    # The agreed preemption step, and the checkpoint-interval table.
    "13_elastic": ("agreed step, by process:", "Optimal checkpoint interval (Daly) and its cost"),
}


def key_output(lesson: str) -> tuple[str, ...]:
    """The texts ``lesson`` (``"04_sharding"``) must show; empty for a lesson not listed."""
    return KEY_OUTPUT.get(lesson, ())


# Lessons the browser test always runs itself from the Run menu, even where an
# executed copy exists: 07, whose controls need a live kernel to take a slider
# change and a button press, and so shows that a lesson runs in the lab as a
# learner starts it.
LIVE_LESSONS = ("07_sweep",)

# Where `make notebook-test`, or make test's unit layer (PLAIN_PASS_DIR), leaves the executed copies (NOTEBOOK_TEST_DIR);
# `make browser-test` passes it in this variable.
EXECUTED_ENV = "DPCOURSE_EXECUTED_LESSONS"


def _sources(nb: dict) -> list[tuple[str, str]]:
    def text(source) -> str:
        return "".join(source) if isinstance(source, list) else source

    return [(cell["cell_type"], text(cell["source"])) for cell in nb["cells"]]


PACKAGE = Path(__file__).resolve().parents[2] / "dpcourse"


def executed_copy(lesson: Path, folder: Path | None, package: Path = PACKAGE) -> tuple[dict | None, str]:
    """The executed copy of ``lesson`` (a ``notebooks/NN_name.ipynb``) in ``folder``, when it is current.

    Current means: the same cells as the lesson (type and source, in order),
    every code cell executed, and written after the last change to the lesson
    or to the package (any file under ``package``, ``dpcourse/``, whose code and data, such as
    the GPU target descriptions lesson 10 compiles for, decide what a lesson prints). Returns ``(notebook, why)``: the notebook with the
    lesson's own metadata (an nbmake run may name its own kernel), or None and
    the reason the lesson must run in the browser instead.
    """
    if folder is None:
        return None, f"no executed copies given ({EXECUTED_ENV} is not set)"
    copy = Path(folder) / lesson.name
    if not copy.exists():
        return None, f"no executed copy at {copy}"
    try:
        executed = json.loads(copy.read_text(encoding="utf-8"))
        source = json.loads(lesson.read_text(encoding="utf-8"))
        if _sources(executed) != _sources(source):
            return None, f"{copy} has other cells than {lesson} (it is from an older version)"
        unrun = [
            i for i, c in enumerate(executed["cells"]) if c["cell_type"] == "code" and not c.get("execution_count")
        ]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return None, f"{copy} cannot be read as a notebook: {err}"
    if unrun:
        return None, f"{copy}: code cell {unrun[0] + 1} did not run"
    files = [p for p in Path(package).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    changed = max([lesson.stat().st_mtime] + [p.stat().st_mtime for p in files])
    if copy.stat().st_mtime < changed:
        return None, f"{copy} is older than the last change to {lesson.name} or dpcourse/"
    executed["metadata"] = source["metadata"]
    return executed, f"executed copy {copy}"
