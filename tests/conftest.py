"""Test set-up: 8 simulated CPU devices, configured before JAX starts.

Every test in this folder runs in one process that sees 8 CPU devices, as
in the jax-ml/jax documentation's CI. Tests that need a fresh JAX (device
settings, late changes) start a subprocess.
"""

import os
import sys
from pathlib import Path

import pytest

N_TEST_DEVICES = 8

from dpcourse import devices  # noqa: E402  (does not start JAX)

devices.setup_devices(N_TEST_DEVICES)

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data" / "fashion-mnist"


def pytest_sessionstart(session):
    """Remove the shared compilation cache's half-made entries, which would stop its writes (coursetools.jaxcache)."""
    from coursetools.jaxcache import remove_orphans

    remove_orphans()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Group the tests for pytest-xdist's ``--dist loadgroup`` (the Makefile's unit-test).

    A file's tests go to one worker, as ``--dist loadfile`` would send them
    (they share module fixtures: a compiled step, a started process), except
    the whole-lesson runs (marker ``lesson``), each about half a minute and
    sharing nothing: each is its own group, so the two workers share them
    instead of one worker running a whole file of lessons.
    """
    for item in items:
        if any(True for _ in item.iter_markers("xdist_group")):
            continue
        group = item.nodeid if item.get_closest_marker("lesson") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def cpu_devices():
    import jax

    devs = jax.devices("cpu")
    assert len(devs) == N_TEST_DEVICES, "conftest must configure devices before JAX starts"
    return devs


@pytest.fixture()
def shared_data_dir():
    """The real Fashion-MNIST label files shipped beside the project, or skip."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (a fresh clone has no ../shared); real-byte tests skipped.")
    return SHARED_DATA


@pytest.fixture()
def python_exe():
    return sys.executable


@pytest.fixture(autouse=True)
def _no_recording(monkeypatch):
    """Tests never append to a results file unless they ask for it."""
    monkeypatch.delenv("DPCOURSE_RESULTS", raising=False)
    monkeypatch.delenv("DPCOURSE_PROFILE", raising=False)
    monkeypatch.delenv("DPCOURSE_DATA", raising=False)
    from dpcourse import record as results

    results.disable()
    saved = dict(results._context)
    yield
    results.disable()
    results._context.clear()
    results._context.update(saved)


@pytest.fixture()
def no_ipv6(monkeypatch):
    """A machine with IPv6 switched off: binding an IPv6 socket fails with EADDRNOTAVAIL, as Linux does."""
    import errno
    import socket

    real_socket = socket.socket

    class NoIPv6(real_socket):
        def bind(self, address):
            if self.family == socket.AF_INET6:
                raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
            return super().bind(address)

    monkeypatch.setattr(socket, "socket", NoIPv6)


@pytest.fixture()
def extra():
    """Skip (fail in CI) when the gpu-compile extra is not installed; names what is missing."""
    from dpcourse.gpu_compile import targets

    missing = targets.extra_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: the gpu-compile extra must be installed (make gpu-compile): {missing}")
        pytest.skip(f"the gpu-compile extra is not installed: {missing}")
