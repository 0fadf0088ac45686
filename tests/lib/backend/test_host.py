"""dpcourse.backend.host: the host's cores and memory, and the sentence 01 prints from them."""

import os

import pytest

from dpcourse.backend import host


def test_the_cores_and_memory_are_this_hosts():
    assert 1 <= host.host_cores() <= (os.cpu_count() or 1)
    memory = host.host_memory_bytes()
    assert memory is None or memory > 2**20  # any host that runs JAX has more than 1 MiB


def test_the_sentence_reads_the_counts_it_is_given():
    two_cores = host.host_sentence(2, 24 * 2**30, 8)
    assert "2 cores, 24.0 GiB" in two_cores and "8 simulated devices share 2 cores (about 0.25 each)" in two_cores
    assert "adds no compute" in two_cores
    many = host.host_sentence(13, None, 8)
    assert "memory not reported" in many and "8 simulated devices on 13 cores" in many and "share 13" not in many
    assert "one CPU device uses them all" in host.host_sentence(1, 2**30, 1) and "1 core," in host.host_sentence(
        1, 2**30, 1
    )
    with pytest.raises(ValueError, match="at least 1 core"):
        host.host_sentence(0, None, 8)
