"""dpcourse.placement: the placements of notebook 04, reused by 05 to 07."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from dpcourse import config, data, model, placement, train

CFG = config.make_config("smoke")


@pytest.fixture(scope="module")
def dataset():
    return data.load_fashion_mnist("synthetic", limit=CFG.max_train_examples)


def test_data_parallel_placement_replicates_params_and_shards_batches(cpu_devices, dataset):
    mesh = Mesh(np.array(cpu_devices), ("data",))
    opt = train.make_optimizer(CFG)
    placed = placement.place_data_parallel(CFG, dataset, mesh, opt, model.init_params(CFG), 64)
    assert placed.params["w_block"].sharding.spec == P()
    x, y = placed.batches[0]
    assert x.shape == (64, 784) and y.shape == (64,)
    assert {s.data.shape for s in x.addressable_shards} == {(8, 784)}  # 64 / 8 devices
    assert len(placed.batches) == CFG.n_batches
    np.testing.assert_array_equal(np.asarray(x), placed.x_host[0])


def test_single_device_placement_holds_the_same_values(cpu_devices, dataset):
    opt = train.make_optimizer(CFG)
    init = model.init_params(CFG)
    placed = placement.place_single_device(CFG, dataset, cpu_devices[3], opt, init, 64)
    assert placed.params["w_in"].devices() == {cpu_devices[3]}
    assert placed.batches[1][0].devices() == {cpu_devices[3]}
    np.testing.assert_array_equal(np.asarray(placed.params["w_in"]), init["w_in"])
    assert jax.tree.structure(placed.opt_state) == jax.tree.structure(opt.init(init))


def test_uneven_global_batch_is_refused(cpu_devices, dataset):
    mesh = Mesh(np.array(cpu_devices), ("data",))
    opt = train.make_optimizer(CFG)
    with pytest.raises(ValueError):
        placement.place_data_parallel(CFG, dataset, mesh, opt, model.init_params(CFG), 60)
