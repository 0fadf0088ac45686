"""dpcourse.multihost.distributed: the runtime's settings, the global mesh and process-local rows.

The worker's tests are in tests/lib/multihost/test_worker.py, the multi-process runs in
tests/lib/multihost/test_launcher.py.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from dpcourse import data
from dpcourse.multihost import distributed

PROFILE = "smoke"
# Synthetic data, always: no network access, and the same bytes in every process.
SOURCE = "synthetic"
# A failing worker must end well within this (seconds), init timeout included.
BOUND_S = 30


def test_spec_from_env_reads_the_three_variables():
    spec = distributed.spec_from_env(
        {
            "DPCOURSE_COORDINATOR": "jax-multihost-0.jax-multihost:8476",
            "DPCOURSE_NUM_PROCESSES": "2",
            "DPCOURSE_PROCESS_ID": "1",
        }
    )
    assert spec == distributed.DistributedSpec("jax-multihost-0.jax-multihost:8476", 2, 1, 300)
    assert distributed.spec_from_env({**_env(), "DPCOURSE_INIT_TIMEOUT_S": "15"}).init_timeout_s == 15


@pytest.mark.parametrize("slices", [1, 2, 4])
def test_a_tpu_slices_pods_are_placed_by_jaxs_own_detection(monkeypatch, slices):
    """v5e-16 slices (4 hosts of 4 chips each): the variables GKE sets, the ids JAX's GkeTpuCluster computes."""
    from jax._src.clusters import cloud_tpu_cluster

    monkeypatch.setattr(cloud_tpu_cluster, "get_tpu_env_value_from_metadata", lambda key: None)  # no TPU VM here
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", ",".join(f"jax-multihost-{i}.jax-multihost" for i in range(4)))
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "8476")  # deploy/tpu-slice: the Service's port
    places = set()
    for slice_id in range(slices):
        for worker in range(4):
            monkeypatch.setenv("TPU_WORKER_ID", str(worker))
            if slices > 1:
                monkeypatch.setenv("MEGASCALE_NUM_SLICES", str(slices))
                monkeypatch.setenv("MEGASCALE_SLICE_ID", str(slice_id))
            spec = distributed.tpu_slice_spec()
            assert spec.coordinator_address == "jax-multihost-0.jax-multihost:8476"
            places.add((spec.process_id, spec.num_processes))
    assert places == {(i, 4 * slices) for i in range(4 * slices)}
    monkeypatch.setenv("TPU_PROCESS_ADDRESSES", "local")  # Kaggle's one-host TPU image
    with pytest.raises(distributed.DistributedSetupError, match="no multi-host slice .* one process"):
        distributed.tpu_slice_spec()
    for name in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(name)
    assert distributed.tpu_slice_spec() is None


def test_spec_from_env_names_every_missing_variable():
    with pytest.raises(distributed.DistributedSetupError) as info:
        distributed.spec_from_env({"DPCOURSE_NUM_PROCESSES": "2"})
    message = str(info.value)
    assert "DPCOURSE_COORDINATOR, DPCOURSE_PROCESS_ID not set" in message
    assert "deploy/multihost.yaml" in message


def _env(coordinator="h:1", num_processes="2", process_id="0"):
    return {
        "DPCOURSE_COORDINATOR": coordinator,
        "DPCOURSE_NUM_PROCESSES": num_processes,
        "DPCOURSE_PROCESS_ID": process_id,
    }


@pytest.mark.parametrize(
    "env, fragment",
    [
        (_env(coordinator="10.0.0.2"), "not host:port"),
        (_env(coordinator="h:99999"), "not host:port"),
        (_env(num_processes="two"), "not a whole number"),
        (_env(process_id="2"), "outside 0..1"),
        (_env(num_processes="0"), "num_processes must be >= 1"),
    ],
)
def test_spec_from_env_rejects_bad_values(env, fragment):
    with pytest.raises(distributed.DistributedSetupError, match=fragment):
        distributed.spec_from_env(env)


def test_initialize_refuses_once_a_backend_started(cpu_devices):
    with pytest.raises(distributed.DistributedSetupError, match="restart the kernel"):
        distributed.initialize("127.0.0.1:1234", 2, 0)


def test_process_local_batches_are_the_rows_of_the_global_batches():
    dataset = data.load_fashion_mnist(source=SOURCE, limit=100)  # 100 examples: batches wrap around
    x_all, y_all = data.stacked_batches(dataset, 3, 48)
    rows = [(8, 24), (40, 48)]
    x_local, y_local = distributed.process_local_batches(dataset, 3, 48, rows)
    columns = np.r_[8:24, 40:48]
    np.testing.assert_array_equal(x_local, x_all[:, columns])
    np.testing.assert_array_equal(y_local, y_all[:, columns])
    with pytest.raises(ValueError, match="outside a global batch of 48"):
        distributed.process_local_batches(dataset, 3, 48, [(40, 56)])


def test_process_rows_follow_the_sharding(cpu_devices):
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    shape = (2, 64, 784)
    mesh = Mesh(np.array(cpu_devices[::-1]), ("data",))  # any device order
    assert distributed.process_rows(NamedSharding(mesh, P(None, "data", None)), shape, axis=1) == [(0, 64)]
    assert distributed.process_rows(NamedSharding(mesh, P()), shape, axis=1) == [(0, 64)]


def test_global_mesh_spans_every_device_in_process_order(cpu_devices):
    # The CPU devices, named explicitly: on a GPU host JAX's default backend is the GPU.
    mesh = distributed.global_mesh(backend="cpu")
    assert mesh.axis_names == ("data",) and list(mesh.devices.flat) == sorted(cpu_devices, key=lambda d: d.id)


def test_global_mesh_defaults_to_every_device_of_the_default_backend():
    import jax

    mesh = distributed.global_mesh("batch")
    assert mesh.axis_names == ("batch",)
    assert list(mesh.devices.flat) == sorted(jax.devices(), key=lambda d: (d.process_index, d.id))


@pytest.mark.parametrize(
    "address, expected",
    [
        ("[::1]:8476", ("::1", 8476)),
        ("[fe80::1%eth0]:1234", ("fe80::1%eth0", 1234)),
        ("127.0.0.1:8476", ("127.0.0.1", 8476)),
        ("jax-multihost-0.jax-multihost:8476", ("jax-multihost-0.jax-multihost", 8476)),
    ],
)
def test_coordinator_address_accepts_names_ipv4_and_bracketed_ipv6(address, expected):
    assert distributed.check_coordinator_address(address) == expected


@pytest.mark.parametrize(
    "address, fragment",
    [
        ("::1:8476", r"IPv6 address must be written in brackets, \[::1\]:8476"),
        ("fe80::1:80", r"\[fe80::1\]:80"),
        ("[10.0.0.1]:8476", "brackets are for IPv6 addresses, and '10.0.0.1' is not one"),
        ("[::1]", "not host:port"),
        ("[::1]:0", "not host:port"),
    ],
)
def test_coordinator_address_refuses_unbracketed_ipv6(address, fragment):
    with pytest.raises(distributed.DistributedSetupError, match=fragment):
        distributed.check_coordinator_address(address)
    with pytest.raises(distributed.DistributedSetupError, match=fragment):
        distributed.spec_from_env(_env(coordinator=address))


def test_format_coordinator_address_brackets_ipv6_only():
    assert distributed.format_coordinator_address("::1", 8476) == "[::1]:8476"
    assert distributed.format_coordinator_address("[::1]", 8476) == "[::1]:8476"
    assert distributed.format_coordinator_address("127.0.0.1", 8476) == "127.0.0.1:8476"
    assert (
        distributed.format_coordinator_address("jax-multihost-0.jax-multihost", 1) == "jax-multihost-0.jax-multihost:1"
    )


def test_relative_diff_is_scale_free():
    ref = {"w": np.array([2.0, -4.0]), "b": np.array([1.0])}
    assert distributed.relative_diff(ref, {"w": np.array([2.0, -4.0]), "b": np.array([1.0])}) == 0.0
    assert distributed.relative_diff(ref, {"w": np.array([2.0, -3.0]), "b": np.array([1.0])}) == pytest.approx(0.25)
    doubled = {k: 2 * v for k, v in ref.items()}  # psum over 2 devices where pmean was meant
    assert distributed.relative_diff(ref, doubled) == pytest.approx(1.0)


def test_params_digest_sees_one_changed_value():
    params = {"w": np.zeros((3, 3), np.float32), "b": np.zeros(3, np.float32)}
    same = {"b": np.zeros(3, np.float32), "w": np.zeros((3, 3), np.float32)}
    assert distributed.params_digest(params) == distributed.params_digest(same)
    same["w"][1, 1] = 1e-7
    assert distributed.params_digest(params) != distributed.params_digest(same)


def test_a_unix_socket_coordinator_is_accepted_and_its_path_checked():
    assert distributed.check_coordinator_address("unix:/tmp/run/coordinator.sock") == ("/tmp/run/coordinator.sock", 0)
    with pytest.raises(distributed.DistributedSetupError, match="unix:/absolute/path"):
        distributed.check_coordinator_address("unix:run/coordinator.sock")
    for path in ("/" + "d" * 200, "/tmp/a?b/c.sock", "/tmp/%41/c.sock", "/tmp/\u00e9 #/c.sock"):
        with pytest.raises(distributed.DistributedSetupError, match="at most 103 bytes .* only ASCII letters"):
            distributed.check_coordinator_address(f"unix:{path}")
    spec = distributed.spec_from_env(
        {"DPCOURSE_COORDINATOR": "unix:/tmp/r/c.sock", "DPCOURSE_NUM_PROCESSES": "2", "DPCOURSE_PROCESS_ID": "1"}
    )
    assert spec.coordinator_address == "unix:/tmp/r/c.sock"


def test_a_process_joins_only_once_every_launched_process_has_imported_jax(tmp_path):
    import threading

    env = {"DPCOURSE_READY_DIR": str(tmp_path), "DPCOURSE_READY_COUNT": "2"}
    waiter = threading.Thread(target=distributed.wait_for_the_others, args=(0, env, 30.0))
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive() and (tmp_path / "ready.0").exists()  # process 1 is still importing JAX
    distributed.wait_for_the_others(1, env, 30.0)
    waiter.join(5)
    assert not waiter.is_alive()
    distributed.wait_for_the_others(0, {}, 30.0)  # no launcher (a GKE pod): returns at once
