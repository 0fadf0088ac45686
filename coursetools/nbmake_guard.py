"""A pytest plugin for the nbmake layers (``pytest -p coursetools.nbmake_guard --nbmake ...``).

Two faults of an nbmake run are made impossible or named before any
notebook starts:

* **A kernel from another environment.** nbmake starts the kernel a
  notebook's metadata names (``python3``); jupyter_client looks that name up
  on ``JUPYTER_PATH`` first, so a ``python3`` kernelspec of another virtual
  environment there silently ran the lessons on another JAX. This plugin
  writes a kernelspec that starts *this* interpreter, under a name of its
  own, into a temporary folder put first on ``JUPYTER_PATH``, passes it to
  nbmake (``--nbmake-kernel``), and checks that the name resolves to this
  interpreter; if not, the run stops, naming the kernelspec that won.
* **A bad ``XLA_FLAGS`` token**, on which XLA ends the kernel and nbmake
  reports only ``NBMAKE INTERNAL ERROR``: checked first
  (:func:`dpcourse.backend.xlaflags.check_xla_flags`).
* **A shared compilation cache that takes no writes**: its half-made
  entries are removed first (:func:`coursetools.jaxcache.remove_orphans`).

It also gives each lesson its device count (:func:`lesson_device_count`,
``DPCOURSE_TEST_DEVICES``), in the kernel's ``XLA_FLAGS`` as a learner would
set it, and hands the lessons out longest first (:func:`smoke_seconds`), so
that no worker waits alone on a long lesson at the end; the unit layer's
whole-lesson runs read both.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from coursetools.jaxcache import remove_orphans
from dpcourse.backend.xlaflags import XlaFlagsError, check_xla_flags

_made: list[Path] = []

DEVICES_SETTING = "DPCOURSE_TEST_DEVICES"
LESSON_ENV_SETTING = "DPCOURSE_TEST_LESSON_ENV"
COUNT_FLAG = "--xla_force_host_platform_device_count"


def lesson_device_count(lesson: str, setting: str | None = None) -> int | None:
    """The simulated CPU devices lesson ``lesson`` (``NN_name``) runs on under ``setting`` (default ``$DPCOURSE_TEST_DEVICES``).

    ``setting`` is one count (``"3"``: every lesson) or several, comma-separated
    (``"2,4,8"``: lesson NN gets the (NN mod 3)-th, so 03 runs on 2, 04 on 4, 05
    on 8, ...): every run of one lesson in a layer uses one count, and its
    compiles are shared through the persistent compilation cache. Empty or
    unset: None (the environment's own ``XLA_FLAGS``).

    Raises ValueError, naming the setting, for anything but whole numbers >= 2.
    """
    setting = setting if setting is not None else os.environ.get(DEVICES_SETTING, "")
    if not setting.strip():
        return None
    counts = [part.strip() for part in setting.split(",")]
    if not all(part.isdigit() and int(part) >= 2 for part in counts):
        raise ValueError(
            f"{DEVICES_SETTING}={setting!r} is not a whole number >= 2 or a comma-separated list of them: "
            "set one or unset it."
        )
    return int(counts[int(lesson[:2]) % len(counts)])


def lesson_env(setting: str | None = None) -> dict[str, str]:
    """Settings for the lessons' kernels alone (default ``$DPCOURSE_TEST_LESSON_ENV``: ``NAME=value`` words).

    Raises ValueError naming a word without ``=``.
    """
    setting = setting if setting is not None else os.environ.get(LESSON_ENV_SETTING, "")
    words = shlex.split(setting)
    bad = [word for word in words if "=" not in word or not word.partition("=")[0].isidentifier()]
    if bad:
        raise ValueError(f"{LESSON_ENV_SETTING}: {bad[0]!r} is not NAME=value.")
    return dict(word.split("=", 1) for word in words)


def smoke_seconds(timings: Path | None = None) -> dict[str, float]:
    """Each lesson's measured wall seconds at the ``smoke`` profile (``baselines/timings.json``); {} without one."""
    from coursetools import paths

    path = timings or paths.ROOT / "baselines" / "timings.json"
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))["runs"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    smoke = [run for run in runs if isinstance(run, dict) and run.get("profile") == "smoke"]
    return {name: float(rec.get("wall_s", 0)) for run in smoke[:1] for name, rec in run.get("notebooks", {}).items()}


def with_device_count(flags: str, count: int) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) asking for ``count`` simulated CPU devices, any earlier count replaced."""
    kept = [token for token in flags.split() if not token.startswith(COUNT_FLAG + "=")]
    return " ".join([*kept, f"{COUNT_FLAG}={count}"])


def kernel_name(python: str | None = None) -> str:
    """This interpreter's kernelspec name: ``dpcourse-`` and a hash of its path (no other env shares it)."""
    python = python or sys.executable
    return "dpcourse-" + hashlib.sha256(os.path.abspath(python).encode()).hexdigest()[:10]


def install_kernelspec(folder: Path, python: str | None = None) -> str:
    """Write a kernelspec that starts ``python -m ipykernel_launcher`` into ``folder/kernels/<name>``; its name."""
    python = python or sys.executable
    name = kernel_name(python)
    target = Path(folder) / "kernels" / name
    target.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python {sys.version.split()[0]} ({python})",
        "language": "python",
        "metadata": {"debugger": False},
    }
    (target / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return name


def check_kernelspec(name: str, python: str | None = None) -> None:
    """Check that kernelspec ``name`` starts ``python`` (default: this interpreter).

    Raises:
        RuntimeError: it resolves to another interpreter, or to none; the
            message names the kernelspec's folder and what it starts.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    python = os.path.realpath(python or sys.executable)
    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel as err:
        raise RuntimeError(f"The course's kernelspec {name!r} was not found on JUPYTER_PATH.") from err
    started = spec.argv[0] if spec.argv else "?"
    if os.path.realpath(shutil.which(started) or started) != python:
        raise RuntimeError(
            f"The kernelspec {name!r} in {spec.resource_dir} starts {started}, not this test run's Python "
            f"({python}): the notebooks would run on another environment's packages. Remove that kernelspec "
            "or take its folder off JUPYTER_PATH."
        )


def pytest_configure(config: pytest.Config) -> None:
    try:
        check_xla_flags()
        lesson_device_count("00")  # a bad setting stops the run before any kernel
        os.environ.update(lesson_env())  # this process runs only notebooks: their kernels inherit it
    except (XlaFlagsError, ValueError) as err:
        raise pytest.UsageError(str(err)) from None
    remove_orphans()  # the shared compilation cache's half-made entries would stop its writes
    if not hasattr(config.option, "nbmake_kernel"):
        return  # nbmake is not loaded: nothing to set
    folder = Path(tempfile.mkdtemp(prefix="dpcourse-kernels-"))
    _made.append(folder)
    name = install_kernelspec(folder)
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(folder), *filter(None, [os.environ.get("JUPYTER_PATH")])])
    wanted = config.option.nbmake_kernel
    if wanted and wanted != name:
        raise pytest.UsageError(
            f"--nbmake-kernel={wanted}: the course's nbmake layers run this interpreter's own kernel "
            f"({name}, {sys.executable}); drop --nbmake-kernel."
        )
    config.option.nbmake_kernel = name
    try:
        check_kernelspec(name)
    except RuntimeError as err:
        raise pytest.UsageError(str(err)) from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The notebooks longest first, by their measured smoke time (a lesson without one goes first)."""
    seconds = smoke_seconds()
    items.sort(key=lambda item: -seconds.get(Path(str(item.fspath)).stem, float("inf")))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Give the notebook's kernel its lesson's device count (nbmake starts the kernel with this environment)."""
    name = Path(str(item.fspath)).stem
    count = lesson_device_count(name) if name[:2].isdigit() else None
    if count is not None:
        os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), count)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _made:
        shutil.rmtree(_made.pop(), ignore_errors=True)
