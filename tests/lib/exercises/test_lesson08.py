"""The checkers of lesson 08 (dpcourse.exercises.lesson08): right answers pass, each planted mistake is named."""

import jax
import numpy as np

from dpcourse.config import make_config
from dpcourse.exercises import lesson08
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, WRONG


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


def _contiguous(x, pid, num_processes, per_process):
    rows = x.shape[0] // num_processes
    return x[pid * rows : (pid + 1) * rows]


def _round_robin(x, pid, num_processes, per_process):
    b = x.shape[0] // (num_processes * per_process)
    return np.concatenate([x[k * b : (k + 1) * b] for k in range(pid, num_processes * per_process, num_processes)])


def _lesson_cell(stem, tag):
    import jupytext

    from coursetools.solutions import NOTEBOOK_DIR

    nb = jupytext.read(NOTEBOOK_DIR / f"{stem}.py")
    cells = [c.source for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"{stem} must have one cell tagged {tag}"
    return cells[0]


def test_08_1_local_batch():
    expect(lesson08.local_batch(_round_robin), CORRECT)
    # The lesson's own layout (a mesh in process order) is not this exercise's answer.
    expect(lesson08.local_batch(_contiguous), WRONG, "mesh in process order")
    expect(lesson08.local_batch(lambda x, pid, p, d: x), WRONG, "whole global batch")
    expect(lesson08.local_batch(lambda x, pid, p, d: x[pid::p]), WRONG, "single row")
    per_device = lambda x, pid, p, d: x[pid * (x.shape[0] // (p * d)) :][: x.shape[0] // (p * d)]  # noqa: E731
    expect(lesson08.local_batch(per_device), WRONG, "one device's rows")
    backwards = lambda x, pid, p, d: _round_robin(x, pid, p, d)[::-1]  # noqa: E731
    expect(lesson08.local_batch(backwards), WRONG, "increasing order")
    expect(lesson08.local_batch(lambda x, pid, p, d: [0, 1]), BAD_INPUT, "array of rows")
    expect(lesson08.local_batch(lambda x, pid: x), BAD_INPUT, "TypeError")
    expect(lesson08.local_batch(None), NOT_ATTEMPTED)


def test_08_1_references_match_a_mesh_in_each_order(cpu_devices):
    # contiguous_rows: the lesson's mesh (devices in process order); reference_rows: the round-robin mesh.
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    procs = [cpu_devices[4 * pid : 4 * pid + 4] for pid in range(2)]  # 2 "processes" of 4 devices
    for order, reference in (
        ([d for group in procs for d in group], lesson08.contiguous_rows),
        ([procs[k % 2][k // 2] for k in range(8)], lesson08.reference_rows),
    ):
        index_map = NamedSharding(Mesh(np.array(order), ("data",)), P("data")).devices_indices_map((16,))
        for pid in range(2):
            rows = sorted(r for d in procs[pid] for r in range(16)[index_map[d][0]])
            assert rows == list(reference(pid, 2, 4, 16))


def test_08_2_valid_global_batch():
    expect(lesson08.valid_global_batch((104, 52), 2, 4), CORRECT)
    expect(lesson08.valid_global_batch((102, 34), 3, 2), CORRECT)
    expect(lesson08.valid_global_batch((100, 50), 2, 4), WRONG, "local devices but not by all 8")
    expect(lesson08.valid_global_batch((101, 50), 2, 4), WRONG, "does not divide by the 8")
    expect(lesson08.valid_global_batch((112, 56), 2, 4), WRONG, "not the smallest")
    expect(lesson08.valid_global_batch((104, 104), 2, 4), WRONG, "No process loads the whole")
    expect(lesson08.valid_global_batch((104, 13), 2, 4), WRONG, "per-device batch")
    expect(lesson08.valid_global_batch(104, 2, 4), BAD_INPUT, "tuple of 2")
    expect(lesson08.valid_global_batch(..., 2, 4), NOT_ATTEMPTED)


def test_08_lesson_cell_equals_the_package(cpu_devices):
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpcourse import data
    from dpcourse.multihost import distributed, worker

    ns = dict(jax=jax, np=np, NamedSharding=NamedSharding, P=P, data=data, distributed=distributed)
    exec(_lesson_cell("08_multihost", "lesson_process_rows"), ns)
    mesh = Mesh(np.array(cpu_devices), ("data",))
    dataset = data.load_fashion_mnist(source="synthetic", limit=300, seed=0)
    rows, x, y = ns["global_batches"](mesh, dataset, 2, 32, cpu_devices)
    rows_pkg, x_pkg, y_pkg = worker.load_global_batches(mesh, dataset, 2, 32)
    assert rows == rows_pkg == [(0, 32)]
    assert np.array_equal(np.asarray(x), np.asarray(x_pkg)) and np.array_equal(np.asarray(y), np.asarray(y_pkg))
    assert x.sharding == x_pkg.sharding
    sharding = NamedSharding(mesh, P(None, "data", None))
    for pid in range(2):  # what each of two processes of 4 devices would hold, as the workers report it
        assert ns["rows_held"](sharding, (2, 32, 784), cpu_devices[4 * pid : 4 * pid + 4]) == [
            (16 * pid, 16 * pid + 16)
        ]


def test_08_2_the_lessons_own_global_batch_is_not_accepted():
    # The lesson's own global batch (per-device batch x 8 devices) is below 100.
    gb = make_config("smoke").global_batch(8)
    assert gb < 100
    expect(lesson08.valid_global_batch((gb, gb // 2), 2, 4), WRONG, "not the smallest such size of at least 100")
