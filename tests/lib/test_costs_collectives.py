"""dpcourse.costs: the all-gather and reduce-scatter bytes and times of lesson 10."""

import pytest

from dpcourse import costs


def test_all_gather_and_reduce_scatter_bytes():
    assert costs.all_gather_bytes(8_000, 8) == 7_000
    assert costs.reduce_scatter_bytes(8_000, 8) == 7_000
    assert costs.all_gather_bytes(8_000, 1) == 0
    # An all-reduce is a reduce-scatter followed by an all-gather: the same bytes in all.
    ar = costs.ring_allreduce_s(8e9, 8, 1e9)
    assert costs.ring_reduce_scatter_s(8e9, 8, 1e9) + costs.ring_all_gather_s(8e9, 8, 1e9) == pytest.approx(ar)


def test_ring_times_with_latency():
    assert costs.ring_all_gather_s(0.0, 8, 1e9, latency_s=2e-6) == pytest.approx(7 * 2e-6)
    assert costs.ring_reduce_scatter_s(4e9, 4, 1e9, latency_s=1e-6) == pytest.approx(3.0 + 3e-6)


@pytest.mark.parametrize("args", [(1.0, 0, 1e9, 0.0), (1.0, 2, 0.0, 0.0), (1.0, 2, 1e9, -1.0)])
def test_ring_times_reject_bad_arguments(args):
    for fn in (costs.ring_all_gather_s, costs.ring_reduce_scatter_s):
        with pytest.raises(ValueError, match="Need n_devices >= 1"):
            fn(*args)
    with pytest.raises(ValueError):
        costs.all_gather_bytes(-1, 2)
