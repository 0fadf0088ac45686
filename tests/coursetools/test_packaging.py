"""The package metadata names everything the course imports, and the pinned lists agree with it."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Distributions the course runs rather than imports: the runner starts kernels
# with `python -m ipykernel_launcher` (coursetools.runner.kernel_argv).
RUN_NOT_IMPORTED = {"ipykernel"}
# The pins the newest-JAX environment changes; every other pin is shared.
NEWEST_ONLY = {"jax", "jaxlib", "optax"}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = [*project["dependencies"], *project["optional-dependencies"]["display"]]
    return {normalise(re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0]) for dep in deps}


def imported_modules(files: list[Path]) -> dict[str, set[str]]:
    """Top-level modules imported by ``files`` (absolute imports only), each with the files importing it."""
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(path.relative_to(ROOT).as_posix())
    return found


# A pytest plugin of the test layers (make notebook-test): it runs only under pytest, a
# development requirement (requirements-dev.txt), never in a learner's course run.
TEST_LAYER = {"nbmake_guard.py"}


def course_sources() -> list[Path]:
    package = [p for p in sorted((ROOT / "dpcourse").glob("*.py")) if p.name not in TEST_LAYER]
    return package + sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


def test_every_imported_distribution_is_in_the_package_metadata():
    # ipywidgets and ipykernel were missing, so `pip install .` gave a course
    # whose 07 failed and whose kernels could not start.
    to_distribution = metadata.packages_distributions()
    needed: dict[str, set[str]] = {}
    for module, files in imported_modules(course_sources()).items():
        if module in sys.stdlib_module_names or module == "dpcourse":
            continue
        distributions = to_distribution.get(module)
        assert distributions, f"{module} (imported by {sorted(files)}) is not installed here"
        for dist in distributions:
            needed.setdefault(normalise(dist), set()).update(files)
    for dist in RUN_NOT_IMPORTED:
        needed.setdefault(dist, set()).add("coursetools/runner.py")
    missing = {dist: sorted(files) for dist, files in needed.items() if dist not in declared()}
    assert not missing, f"add to [project] dependencies in pyproject.toml: {missing}"


def test_the_import_scan_sees_the_notebooks_imports():
    found = imported_modules(course_sources())
    # 07 imports matplotlib itself; ipywidgets comes in through dpcourse.show.
    assert "notebooks/07_sweep.py" in found["matplotlib"]
    assert "dpcourse/show.py" in found["ipywidgets"]
    assert "jax" in found and "IPython" in found


def pins(name: str) -> dict[str, str]:
    """Each pin of a requirements file: the distribution's name (with `; marker` where it has one) to its version."""
    result = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            requirement, _, marker = line.partition(";")
            dist, version = requirement.strip().split("==")
            result[normalise(dist) + (f"; {marker.strip()}" if marker else "")] = version
    return result


def test_a_pin_for_one_platform_has_a_pin_for_the_others():
    for name in ("requirements.txt", "requirements-newest.txt"):
        orbax = {key: version for key, version in pins(name).items() if key.startswith("orbax-checkpoint")}
        assert orbax == {
            'orbax-checkpoint; sys_platform != "win32"': "0.12.8",
            'orbax-checkpoint; sys_platform == "win32"': "0.11.32",
        }, name


def test_the_newest_jax_list_changes_only_jax_jaxlib_and_optax():
    newest, pinned = pins("requirements-newest.txt"), pins("requirements.txt") | pins("requirements-dev.txt")
    shared = {d: v for d, v in newest.items() if d not in NEWEST_ONLY}
    assert shared == {d: pinned[d] for d in shared}, "requirements-newest.txt must share the other pins"
    assert set(pins("requirements.txt")) <= set(newest), "requirements-newest.txt lacks a runtime pin"
    assert set(newest) >= NEWEST_ONLY


@pytest.mark.parametrize("name", ["requirements.txt", "requirements-newest.txt"])
def test_the_jax_that_ci_installs_is_inside_the_declared_range(name):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    spec = next(dep for dep in project["dependencies"] if re.match(r"jax[<>=]", dep))
    low, high = re.fullmatch(r"jax>=([\d.]+),<([\d.]+)", spec).groups()

    def key(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.split("."))

    version = pins(name)["jax"]
    assert key(low) <= key(version) < key(high), f"{name} pins jax {version}, outside {spec}"


def test_every_folder_of_the_package_is_listed_so_a_wheel_carries_it():
    """A folder left out of ``packages`` (data only, such as gpu_target_configs) is missing from a wheel."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(path.relative_to(ROOT).parts)
        for path in [ROOT / "dpcourse", *(ROOT / "dpcourse").rglob("*")]
        if path.is_dir() and path.name != "__pycache__" and any(p.is_file() for p in path.iterdir())
    }
    assert folders <= listed, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(folders - listed)}"


def test_the_editable_install_notice_is_dropped_and_other_warnings_are_not():
    """``make install`` sets PYTHONWARNINGS for ``pip install -e .``: setuptools' boxed notice, nothing else.

    setuptools (``InformationOnly.emit("Editable installation.", ...)`` in
    ``command/editable_wheel.py``, 80 to 84) warns with a message that starts
    ``Editable installation.``; the build backend runs in a process of its
    own that inherits the variable.
    """
    import subprocess

    makefile = (ROOT / "Makefile").read_text()
    spec = re.search(r"^EDITABLE_NOTICE \?= (.+)$", makefile, re.M).group(1)
    assert 'PYTHONWARNINGS="$(EDITABLE_NOTICE)" $(PY) -m pip install' in makefile
    script = (
        "import warnings\n"
        "class InformationOnly(UserWarning): pass\n"
        "warnings.warn('Editable installation.\\n!!\\n\\n  Please be careful ...\\n\\n!!', InformationOnly)\n"
        "warnings.warn('Another notice.', InformationOnly)\n"
    )
    env = {"PYTHONWARNINGS": spec, "PATH": "/usr/bin:/bin"}
    err = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env).stderr
    assert "Editable installation" not in err and "Another notice." in err
