"""Checkers for the exercises of notebook 08 (multi-host: each process's rows, a valid global batch)."""

from __future__ import annotations

import numpy as np

from dpcourse.exercises.base import as_callable, as_number, as_tuple, bad_input, checker, describe, wrong

# (processes, devices per process, global batch) the checker of 08.1 tries.
CASES_08_1 = ((2, 4, 16), (4, 2, 24), (3, 1, 12), (1, 8, 8))
TARGET_08_2 = 100  # "the smallest valid global batch of at least 100 examples"


def reference_rows(process_id: int, num_processes: int, devices_per_process: int, global_batch: int) -> range:
    """Rows of the global batch that one process's devices hold.

    The mesh of notebook 08 (``distributed.global_mesh``) orders devices by
    process, so along ``data`` device ``d`` holds rows ``[d b, (d + 1) b)``
    with ``b = global_batch / (num_processes x devices_per_process)`` and a
    process holds its devices' rows: one contiguous block.
    """
    per_device = global_batch // (num_processes * devices_per_process)
    first_device = process_id * devices_per_process
    return range(first_device * per_device, (first_device + devices_per_process) * per_device)


@checker("ex08_1", "a function local_batch(x_global, process_id, num_processes, devices_per_process) -> rows")
def local_batch(answer) -> str:
    """Exercise 08.1: the process-local part of a global batch.

    The checker calls the learner's function on a numbered global batch
    ``[B, 3]`` for several process counts and every process id, and
    compares with :func:`reference_rows`.
    """
    fn = as_callable(answer, "local_batch(x_global, process_id, num_processes, devices_per_process)")
    for num_processes, per_process, batch in CASES_08_1:
        x_global = np.arange(batch * 3, dtype=np.float32).reshape(batch, 3)
        for pid in range(num_processes):
            ref = x_global[list(reference_rows(pid, num_processes, per_process, batch))]
            got = fn(x_global, pid, num_processes, per_process)
            if not hasattr(got, "shape"):
                raise bad_input(f"Expected an array of rows of x_global; got {describe(got)}.")
            got = np.asarray(got)
            if got.shape == x_global.shape and np.array_equal(got, x_global) and num_processes > 1:
                raise wrong(
                    "Every process returned the whole global batch: each process loads only the rows its own devices hold."
                )
            if got.shape != ref.shape:
                if got.shape[:1] == (batch // (num_processes * per_process),):
                    raise wrong(
                        "That is one device's rows: a process holds the rows of all its devices_per_process devices."
                    )
                raise wrong(
                    f"With {num_processes} processes x {per_process} devices and a global batch of {batch}, process "
                    f"{pid} holds {ref.shape[0]} rows; you returned shape {got.shape}."
                )
            if np.array_equal(got, ref):
                continue
            if np.array_equal(got, x_global[pid::num_processes]):
                raise wrong(
                    "Interleaved rows (x[pid::num_processes]): the mesh puts each process's devices next to each "
                    "other, so a process holds one contiguous block of rows."
                )
            for other in range(num_processes):
                if np.array_equal(got, x_global[list(reference_rows(other, num_processes, per_process, batch))]):
                    raise wrong(
                        f"Process {pid} returned the rows of process {other}: the block starts at pid x its size."
                    )
            raise wrong(
                f"Process {pid} of {num_processes} should hold rows {reference_rows(pid, num_processes, per_process, batch)}."
            )
    return (
        "Right: each process takes the contiguous block of rows that its devices hold, for every process count tried."
    )


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
