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


# The tests that execute a whole lesson (marker ``lesson``), by file and function. pytest-xdist's
# controller sees test ids only, not markers, so it reads them here (xdist_scope); each worker checks
# at collection that this list and the marker agree.
WHOLE_LESSON_TESTS = frozenset(
    {
        "tests/lessons/test_global_mesh.py::test_the_lesson_runs_with_a_global_mesh",
        "tests/lessons/test_global_mesh.py::test_a_lesson_without_a_global_mesh_run_runs_solved_and_again",
        "tests/lessons/test_global_mesh.py::test_a_learners_own_mesh_of_another_shape_is_run_under_or_named",
        "tests/lib/exercises/test_lesson07.py::test_07_1_the_lessons_own_fit_is_not_accepted_as_the_plateau",
    }
)


def xdist_scope(nodeid: str) -> str:
    """The unit of work pytest-xdist gives one worker: a whole-lesson run alone, any other test with its file.

    A file's tests share module fixtures (a compiled step, a started process),
    so one worker runs them all; the whole-lesson runs, each up to a minute
    and sharing nothing, are spread over the workers one by one.
    """
    if nodeid.split("[", 1)[0] in WHOLE_LESSON_TESTS:
        return nodeid
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Put the whole-lesson runs first, longest first (the longest units go out first), and check WHOLE_LESSON_TESTS.

    Raises pytest.UsageError naming a test whose ``lesson`` marker and
    WHOLE_LESSON_TESTS disagree.
    """
    for item in items:
        listed = item.nodeid.split("[", 1)[0] in WHOLE_LESSON_TESTS
        if listed != (item.get_closest_marker("lesson") is not None):
            raise pytest.UsageError(
                f"{item.nodeid}: {'listed in' if listed else 'marked lesson but not in'} WHOLE_LESSON_TESTS "
                f"(tests/conftest.py){' without the lesson marker' if listed else ''}: "
                "mark it and list it, or neither."
            )
    from coursetools.nbmake_guard import smoke_seconds

    seconds = smoke_seconds()  # the whole-lesson runs longest first, by the lesson's measured smoke time
    items.sort(
        key=lambda item: (
            item.get_closest_marker("lesson") is None,
            -seconds.get(item.nodeid.partition("[")[2][:-1].split("-")[0], 0.0),
        )
    )


def pytest_xdist_make_scheduler(config, log):
    """For ``--dist loadscope`` (the Makefile's unit-test): scopes by :func:`xdist_scope`."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFileAndLessonRun(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return ByFileAndLessonRun(config, log)


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
    from dpcourse.cross_compile import targets

    missing = targets.extra_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: the gpu-compile extra must be installed (make gpu-compile): {missing}")
        pytest.skip(f"the gpu-compile extra is not installed: {missing}")


@pytest.fixture
def tpu_extra():
    """Skip (fail in CI) when the tpu-compile extra (libtpu) is not installed; names what is missing."""
    from dpcourse.cross_compile import targets

    missing = targets.extra_missing("tpu")
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: the tpu-compile extra must be installed (make tpu-compile): {missing}")
        pytest.skip(f"the tpu-compile extra is not installed: {missing}")
