"""What each lesson must show in the browser once all its cells have run.

Each text is a table caption or a printed label from ``notebooks/NN_name.py``
(the key result of the lesson), not a measured number, so it does not change
from run to run. ``tests/browser/test_lesson_expectations.py`` checks that
every text still occurs in its notebook's source, so a renamed caption fails
there, cheaply, before the browser run. A lesson missing here (one added
later) gets the checks every lesson gets: every code cell ran, no error
output, no traceback.
"""

from __future__ import annotations

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
}


def key_output(lesson: str) -> tuple[str, ...]:
    """The texts ``lesson`` (``"04_sharding"``) must show; empty for a lesson not listed."""
    return KEY_OUTPUT.get(lesson, ())
