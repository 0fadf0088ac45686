"""The repository's layout (docs/layout.md): what the library may import, module sizes, the test tree, JAX not started on import."""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "dpcourse"
TOOLKIT = ROOT / "coursetools"
TOOLING_ONLY = {"nbclient", "nbformat", "jupytext", "jupyter_client", "coursetools", "nbmake", "pytest"}
TOP_LEVEL_LINES = 4000
MODULE_LINES = 600


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_library_never_imports_the_tooling_even_inside_a_function():
    found = {str(p.relative_to(ROOT)): sorted(_imported(p) & TOOLING_ONLY) for p in _modules(LIBRARY)}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_library_never_looks_for_the_repository_from_its_own_file():
    users = []
    for p in _modules(LIBRARY):
        if any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(ast.parse(p.read_text()))):
            users.append(str(p.relative_to(ROOT)))
    assert users == []


def test_only_the_paths_module_of_the_toolkit_derives_the_repository_from_its_file():
    users = []
    for p in _modules(TOOLKIT):
        if any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(ast.parse(p.read_text()))):
            users.append(p.name)
    assert users == ["paths.py"]


def test_the_library_top_level_stays_thin_and_every_module_is_small():
    top = sum(len(p.read_text().splitlines()) for p in LIBRARY.glob("*.py"))
    assert top <= TOP_LEVEL_LINES, f"dpcourse/*.py hold {top} lines: move a topic into a sub-package"
    big = {
        str(p.relative_to(ROOT)): n
        for p in _modules(LIBRARY) + _modules(TOOLKIT)
        if (n := len(p.read_text().splitlines())) >= MODULE_LINES
    }
    assert big == {}, "a module past 600 lines is usually two"


def _test_file(module: Path) -> Path:
    if module.is_relative_to(TOOLKIT):
        return ROOT / "tests" / "coursetools" / f"test_{module.stem.lstrip('_')}.py"
    rel = module.relative_to(LIBRARY)
    return ROOT / "tests" / "lib" / rel.parent / f"test_{module.stem.lstrip('_')}.py"


def test_every_module_has_its_test_file_where_the_tree_mirrors_it():
    missing = [
        f"{p.relative_to(ROOT)} -> {_test_file(p).relative_to(ROOT)}"
        for p in _modules(LIBRARY) + _modules(TOOLKIT)
        if p.name not in ("__init__.py", "__main__.py") and not _test_file(p).exists()
    ]
    assert missing == []


def test_every_module_opens_with_a_one_line_docstring():
    bad = []
    for p in _modules(LIBRARY) + _modules(TOOLKIT):
        doc = ast.get_docstring(ast.parse(p.read_text()), clean=False)
        if not doc or not doc.split("\n")[0].strip():
            bad.append(str(p.relative_to(ROOT)))
    assert bad == []


def test_importing_the_library_and_every_sub_package_never_starts_a_jax_backend():
    packages = sorted(
        ".".join(p.parent.relative_to(ROOT).parts) for p in LIBRARY.rglob("__init__.py") if "__pycache__" not in p.parts
    )
    assert "dpcourse.cross_compile" in packages and len(packages) >= 8
    code = textwrap.dedent(
        f"""
        import importlib, sys
        for name in {packages!r}:
            importlib.import_module(name)
        bridge = sys.modules.get("jax._src.xla_bridge")
        started = bool(bridge and bridge._backends)
        print("jax imported:", "jax" in sys.modules, "backend started:", started)
        assert not started
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "backend started: False" in proc.stdout
