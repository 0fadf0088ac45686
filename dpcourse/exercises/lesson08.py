"""Checkers for the exercises of notebook 08 (multi-host: each process's rows on a round-robin mesh, a valid global batch)."""

from __future__ import annotations

import numpy as np

from dpcourse.exercises.base import as_callable, as_number, as_tuple, bad_input, checker, describe, wrong

# (processes, devices per process, global batch) the checker of 08.1 tries.
CASES_08_1 = ((2, 4, 16), (4, 2, 24), (3, 1, 12), (1, 8, 8))
TARGET_08_2 = 100  # "the smallest valid global batch of at least 100 examples"


def contiguous_rows(process_id: int, num_processes: int, devices_per_process: int, global_batch: int) -> range:
    """Rows one process holds when the mesh orders devices by process (notebook 08's ``global_mesh``).

    Device ``d`` along ``data`` holds rows ``[d b, (d + 1) b)`` with ``b =
    global_batch / (num_processes x devices_per_process)``; a process's
    devices are neighbours, so it holds one contiguous block.
    """
    per_device = global_batch // (num_processes * devices_per_process)
    first_device = process_id * devices_per_process
    return range(first_device * per_device, (first_device + devices_per_process) * per_device)


def reference_rows(process_id: int, num_processes: int, devices_per_process: int, global_batch: int) -> list[int]:
    """Rows one process holds when the mesh lists devices round-robin over the processes (exercise 08.1).

    Mesh position ``k`` is a device of process ``k % num_processes``, and
    holds rows ``[k b, (k + 1) b)`` with ``b`` the per-device batch; so
    process ``p`` holds the blocks at positions ``p, p + P, p + 2P, ...``.
    """
    per_device = global_batch // (num_processes * devices_per_process)
    positions = range(process_id, num_processes * devices_per_process, num_processes)
    return [k * per_device + r for k in positions for r in range(per_device)]


@checker("ex08_1", "a function local_batch(x_global, process_id, num_processes, devices_per_process) -> rows")
def local_batch(answer) -> str:
    """Exercise 08.1: the process-local part of a global batch on a round-robin mesh.

    The checker calls the learner's function on a numbered global batch
    ``[B, 3]`` for several process counts and every process id, and
    compares with :func:`reference_rows` (rows in increasing order, as
    ``jax.make_array_from_process_local_data`` expects them).
    """
    fn = as_callable(answer, "local_batch(x_global, process_id, num_processes, devices_per_process)")
    for num_processes, per_process, batch in CASES_08_1:
        x_global = np.arange(batch * 3, dtype=np.float32).reshape(batch, 3)
        per_device = batch // (num_processes * per_process)
        for pid in range(num_processes):
            ref = x_global[reference_rows(pid, num_processes, per_process, batch)]
            got = fn(x_global, pid, num_processes, per_process)
            if not hasattr(got, "shape"):
                raise bad_input(f"Expected an array of rows of x_global; got {describe(got)}.")
            got = np.asarray(got)
            if got.shape == x_global.shape and np.array_equal(got, x_global) and num_processes > 1:
                raise wrong(
                    "Every process returned the whole global batch: each process loads only the rows its "
                    "own devices hold."
                )
            if got.shape != ref.shape:
                if got.shape[:1] == (per_device,):
                    raise wrong(
                        "That is one device's rows: a process holds the rows of all its devices_per_process devices."
                    )
                raise wrong(
                    f"With {num_processes} processes x {per_process} devices and a global batch of {batch}, "
                    f"process {pid} holds {ref.shape[0]} rows; you returned shape {got.shape}."
                )
            if np.array_equal(got, ref):
                continue
            contiguous = x_global[list(contiguous_rows(pid, num_processes, per_process, batch))]
            if np.array_equal(got, contiguous):
                raise wrong(
                    "One contiguous block is what a mesh in process order gives (the lesson's). On this mesh "
                    "the devices alternate between processes, so a process holds every num_processes-th block "
                    "of per-device rows."
                )
            if np.array_equal(got, x_global[pid::num_processes]):
                raise wrong(
                    "Every num_processes-th single row: but each device holds a block of per-device-batch rows, "
                    "and it is these blocks that alternate between processes."
                )
            if sorted(map(tuple, got)) == sorted(map(tuple, ref)):
                raise wrong(
                    "The right rows, in another order: keep them in increasing order, as they lie in the global batch."
                )
            raise wrong(
                f"Process {pid} of {num_processes} ({per_process} devices each, global batch {batch}) should hold "
                f"rows {reference_rows(pid, num_processes, per_process, batch)}."
            )
    return "Right: each process takes every num_processes-th block of per-device rows, for every process count tried."


@checker("ex08_2", "a tuple (global_batch, rows_per_process) of two ints")
def valid_global_batch(answer, num_processes: int, devices_per_process: int) -> str:
    """Exercise 08.2: the smallest valid global batch of at least 100, and the rows each process loads.

    Valid: divisible by the global device count ``num_processes x
    devices_per_process``.
    """
    batch_ans, rows_ans = as_tuple(answer, 2, "(global_batch, rows_per_process)")
    batch_ans, rows_ans = (
        as_number(batch_ans, "the global batch", positive=True),
        as_number(rows_ans, "the rows per process", positive=True),
    )
    n_global = num_processes * devices_per_process
    ref_batch = -(-TARGET_08_2 // n_global) * n_global
    ref_rows = ref_batch // num_processes
    if batch_ans != ref_batch:
        if batch_ans % n_global:
            if batch_ans % devices_per_process == 0:
                raise wrong(
                    f"{batch_ans:g} divides by the {devices_per_process} local devices but not by all {n_global} "
                    "global devices; the batch is split over the global mesh."
                )
            raise wrong(f"{batch_ans:g} does not divide by the {n_global} global devices.")
        raise wrong(
            f"{batch_ans:g} divides by {n_global}, but it is not the smallest such size of at least {TARGET_08_2}."
        )
    if rows_ans == ref_rows:
        return (
            f"Right: {ref_batch} examples, {ref_rows} rows per process ({ref_rows // devices_per_process} per device)."
        )
    if rows_ans == ref_batch:
        raise wrong("No process loads the whole global batch: each loads 1 / num_processes of it.")
    if rows_ans == ref_batch // n_global:
        raise wrong("That is the per-device batch; a process loads the rows of all its devices.")
    raise wrong(f"Each of the {num_processes} processes loads global_batch / num_processes rows.")
