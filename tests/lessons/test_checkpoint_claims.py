"""What notebook 11 says about Orbax is what the pinned Orbax does, on both JAX versions.

Each test pins one sentence of the lesson to the library's behaviour
(orbax-checkpoint 0.12.8, requirements.txt and requirements-newest.txt):

- section 2: the manager that saves lists a step as soon as ``save`` returns
  (``checkpoint_manager.py``: ``save()`` calls ``_add_checkpoint_info`` before
  the background write ends); a manager opened later skips the temporary
  folder (``_src/path/step.py``: ``_build_metadata`` returns None for a path
  that is not finalized);
- section 2: ``save()`` first waits for the previous save and raises its
  error (``checkpoint_manager.py``: ``save()`` calls ``wait_until_finished()``
  before it starts), and the background thread commits a step nobody
  waits for;
- section 5: a leftover ``<step>.orbax-checkpoint-tmp`` survives a save of
  another step, goes when that step is saved again (``_src/path/atomicity.py``
  removes an existing temporary folder of the step it creates), and goes at
  once with ``cleanup_tmp_directories=True``, off by default;
- section 6: replicated leaves are saved replica-parallel by default
  (``_src/serialization/jax_array_handlers.py``:
  ``_get_default_use_replica_parallel``), each replica writing a slice;
- section 3: a restore without target shardings in a process with fewer
  devices than the saved mesh fails with Orbax's "Topology mismatch" error
  (``_src/handlers/standard_checkpoint_handler.py``);
- section 7: the folder's size against the arrays: metadata added, zstd
  compression (on by default) taken off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse.checkpoints import checkpoint

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60  # the longest a test waits for Orbax's background thread to reach the commit


def _state(cpu_devices, spec=None):
    spec = P() if spec is None else spec
    mesh = Mesh(np.array(cpu_devices), ("data",))
    return {"w": jax.device_put(np.arange(8 * 16, dtype=np.float32).reshape(8, 16), NamedSharding(mesh, spec))}


def _steps_on_disk(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name[0].isdigit())


@contextlib.contextmanager
def _commit_held():
    """Hold Orbax's commit (the rename of the temporary folder) until the block ends; yields the event set on arrival."""
    arrived, release = threading.Event(), threading.Event()
    real = os.rename

    def rename(src, dst, *args, **kwargs):
        if str(src).endswith(checkpoint.TMP_SUFFIX):
            arrived.set()
            release.wait(WAIT_S)
        return real(src, dst, *args, **kwargs)

    os.rename = rename
    try:
        yield arrived
    finally:
        release.set()
        os.rename = real


def test_the_saving_manager_lists_a_step_at_once_and_a_manager_opened_later_skips_it(tmp_path, cpu_devices):
    folder = tmp_path / "ckpt"
    manager = ocp.CheckpointManager(folder)
    try:
        with _commit_held() as arrived:
            manager.save(3, args=ocp.args.StandardSave(_state(cpu_devices)))
            assert arrived.wait(WAIT_S), "Orbax's background write never reached the commit"
            assert _steps_on_disk(folder) == ["3" + checkpoint.TMP_SUFFIX]
            assert manager.latest_step() == 3  # listed while the step is still a temporary folder
            with ocp.CheckpointManager(folder) as restart:
                assert restart.latest_step() is None and restart.all_steps() == []
        manager.wait_until_finished()
    finally:
        manager.close()
    with ocp.CheckpointManager(folder) as restart:
        assert restart.latest_step() == 3


def test_a_failed_background_save_is_raised_by_the_next_save_and_the_step_is_committed_without_a_wait(
    tmp_path, cpu_devices
):
    # Section 2: save() waits for the previous save and raises its error (checkpoint_manager.py: save()
    # calls wait_until_finished() before it starts); the background thread commits a step nobody waits for.
    folder, state = tmp_path / "ckpt", _state(cpu_devices)
    with checkpoint.quiet_orbax_log(), ocp.CheckpointManager(folder) as manager:
        bad = ocp.args.Composite(state=ocp.args.StandardSave(state), run=ocp.args.JsonSave({"x": np.float32(1)}))
        manager.save(1, args=bad)
        good = ocp.args.Composite(state=ocp.args.StandardSave(state), run=ocp.args.JsonSave({"x": 1.0}))
        with pytest.raises(TypeError, match="not JSON serializable"):
            manager.save(2, args=good)
        manager.save(3, args=good)
        deadline = time.monotonic() + WAIT_S
        while "3" not in _steps_on_disk(folder) and time.monotonic() < deadline:
            time.sleep(0.05)  # no wait_until_finished(): the thread commits on its own
        assert "3" in _steps_on_disk(folder), _steps_on_disk(folder)
    with ocp.CheckpointManager(folder) as restart:
        assert restart.all_steps() == [3]


def test_a_leftover_temporary_folder_survives_a_save_of_another_step(tmp_path, cpu_devices):
    folder, state = tmp_path / "ckpt", _state(cpu_devices)
    with ocp.CheckpointManager(folder) as manager:
        manager.save(1, args=ocp.args.StandardSave(state))
    shutil.copytree(folder / "1", folder / ("4" + checkpoint.TMP_SUFFIX))  # a save of step 4 killed before its commit
    with checkpoint.quiet_orbax_log(), ocp.CheckpointManager(folder) as manager:
        manager.save(2, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()
        assert _steps_on_disk(folder) == ["1", "2", "4" + checkpoint.TMP_SUFFIX]
        manager.save(4, args=ocp.args.StandardSave(state))  # the same step again replaces it
    assert _steps_on_disk(folder) == ["1", "2", "4"]
    shutil.copytree(folder / "1", folder / ("7" + checkpoint.TMP_SUFFIX))
    assert ocp.CheckpointManagerOptions().cleanup_tmp_directories is False  # off by default
    options = ocp.CheckpointManagerOptions(cleanup_tmp_directories=True)
    with ocp.CheckpointManager(folder, options=options) as manager:
        manager.save(5, args=ocp.args.StandardSave(state))
    assert _steps_on_disk(folder) == ["1", "2", "4", "5"]


def test_replicated_leaves_are_saved_replica_parallel_by_default(cpu_devices, monkeypatch):
    """Each of the 8 replicas of a replicated [8, 16] array writes one [1, 16] slice."""
    from orbax.checkpoint._src.serialization import jax_array_handlers, replica_slices

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    assert jax_array_handlers._get_default_use_replica_parallel() is True
    assert ocp.type_handlers.ArrayHandler()._use_replica_parallel is True
    arr = _state(cpu_devices)["w"]
    parts = replica_slices.get_replica_slices(arr, replica_id=0, use_replica_parallel=True)
    assert parts.local_shape == (1, 16) and len(parts.replica_slices) == len(cpu_devices)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")  # the default is off where JAX_PLATFORMS names the GPU
    assert jax_array_handlers._get_default_use_replica_parallel() is False


_RESTORE_ON_FEWER = """
import sys
from dpcourse import devices
devices.setup_devices(int(sys.argv[2]))
import jax, numpy as np, orbax.checkpoint as ocp
target = {"w": jax.ShapeDtypeStruct((8, 16), np.float32)}  # no sharding: Orbax uses the saved one
with ocp.CheckpointManager(sys.argv[1]) as reader:
    reader.restore(1, args=ocp.args.StandardRestore(target))
"""


def test_a_restore_without_target_shardings_on_fewer_devices_fails_with_a_topology_mismatch(tmp_path, cpu_devices):
    with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
        manager.save(1, args=ocp.args.StandardSave(_state(cpu_devices, P("data"))))
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    run = subprocess.run(
        [sys.executable, "-c", _RESTORE_ON_FEWER, str(tmp_path / "ckpt"), str(len(cpu_devices) // 2)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode != 0, "the restore onto fewer devices should fail"
    assert "ValueError: Topology mismatch detected" in run.stderr, run.stderr[-2000:]


def test_the_folder_holds_metadata_and_zstd_compressed_arrays(tmp_path, cpu_devices):
    """Random float32 hardly compresses, zeros vanish: the balance notebook 11 prints is zstd's against the metadata."""
    rng = np.random.default_rng(0)
    mesh = Mesh(np.array(cpu_devices), ("data",))
    arrays = {
        "random": jax.device_put(rng.standard_normal((256, 256), dtype=np.float32), NamedSharding(mesh, P())),
        "zeros": jax.device_put(np.zeros((256, 256), np.float32), NamedSharding(mesh, P())),
    }
    sizes = {}
    for name, arr in arrays.items():
        with ocp.CheckpointManager(tmp_path / name) as manager:
            manager.save(0, args=ocp.args.StandardSave({"a": arr}))
        sizes[name] = checkpoint.directory_bytes(tmp_path / name / "0")
    array_bytes = 256 * 256 * 4
    assert sizes["zeros"] < 0.1 * array_bytes  # the metadata, a few kilobytes, and almost nothing else
    # zstd level 1 takes several percent off random float32 (the exponent bytes repeat): 7.5% measured with
    # both JAX versions; the bounds leave room for a codec's next release, not for "none" or "half"
    assert 0.88 * array_bytes < sizes["random"] - sizes["zeros"] < 0.97 * array_bytes
