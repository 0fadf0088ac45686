"""Tests of dpcourse.perf.linkbench: the timed psum and the ring model fitted to it."""

import numpy as np
import pytest
from jax.sharding import Mesh

from dpcourse import costs
from dpcourse.perf import linkbench
from dpcourse.perf.linkbench import AllReducePoint, fit_link


def _points(n, latency_s, bandwidth, sizes):
    return [AllReducePoint(s, costs.ring_allreduce_s(s, n, bandwidth, latency_s), 0.0) for s in sizes]


def test_fit_recovers_latency_and_bandwidth_of_exact_ring_times():
    pts = _points(8, 3e-6, 450e9, [4_096, 65_536, 1_048_576, 7_454_760])
    fit = fit_link(pts, 8)
    assert fit.latency_s == pytest.approx(3e-6, rel=1e-6)
    assert fit.bus_bytes_per_s == pytest.approx(450e9, rel=1e-6)
    assert fit.n_points == 4


def test_a_negative_intercept_is_clipped_to_zero_latency():
    pts = [AllReducePoint(1000, 0.5e-6, 0.0), AllReducePoint(2000, 2.0e-6, 0.0)]
    fit = fit_link(pts, 2)
    assert fit.latency_s == 0.0
    # Through the origin with relative errors: u = b / t = (2e9, 1e9), slope = sum(u) / sum(u^2)
    # = 3e9 / 5e18 = 6e-10 s/byte; bandwidth = 2 (N - 1) / N / slope = 1 / 6e-10.
    assert fit.bus_bytes_per_s == pytest.approx(1 / 6e-10, rel=1e-9)


@pytest.mark.parametrize(
    "pts, n, match",
    [
        ([AllReducePoint(1000, 1e-6, 0.0)] * 2, 8, "two or more different sizes"),
        ([AllReducePoint(1000, 2e-6, 0.0), AllReducePoint(2000, 1e-6, 0.0)], 8, "does not grow"),
        ([AllReducePoint(1000, 1e-6, 0.0), AllReducePoint(2000, 2e-6, 0.0)], 1, "at least 2 devices"),
    ],
)
def test_fit_refuses_what_it_cannot_fit(pts, n, match):
    with pytest.raises(ValueError, match=match):
        fit_link(pts, n)


def test_timed_psum_runs_on_simulated_devices(cpu_devices):
    mesh = Mesh(np.array(cpu_devices[:4]), ("data",))
    pts = linkbench.measure(mesh, [4_096, 65_536], chain=2, repeats=1)
    assert [p.n_bytes for p in pts] == [4_096, 65_536]
    for p in pts:
        assert p.seconds > 0
        assert p.bus_bytes_per_s == pytest.approx(2 * 3 / 4 * p.n_bytes / p.seconds)


@pytest.mark.parametrize("kwargs", [{"n_bytes": 2}, {"n_bytes": 64, "chain": 0}, {"n_bytes": 64, "repeats": 0}])
def test_time_allreduce_rejects_bad_arguments(cpu_devices, kwargs):
    mesh = Mesh(np.array(cpu_devices[:2]), ("data",))
    with pytest.raises(ValueError):
        linkbench.time_allreduce(mesh, **kwargs)
