"""dpcourse._moved: the previous layout's module names still import, as the new modules, with a warning naming them."""

import ast
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from dpcourse import _moved

PREVIOUS = Path(__file__).resolve().parents[1] / "data" / "previous_layout"
# The course's tooling left the library: these old names are not aliased (python -m coursetools).
TOOLING = {
    "dpcourse.runner",
    "dpcourse.compare",
    "dpcourse.timings",
    "dpcourse.pairs",
    "dpcourse.workspace",
    "dpcourse.site",
    "dpcourse.outfolder",
    "dpcourse.nbmake_guard",
    "dpcourse.placement_report",
    "dpcourse.exercises.solutions",
}


def test_every_old_name_is_the_new_module_and_warns_with_the_new_import():
    # One process for all names: each import of the package's modules costs seconds here.
    code = textwrap.dedent(
        f"""
        import importlib, warnings
        problems = []
        for old, new_name in {sorted(_moved.MOVED.items())!r}:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = importlib.import_module(old)
            new = importlib.import_module(new_name)
            texts = [str(w.message) for w in caught if w.category is DeprecationWarning]
            if module is not new or new.__spec__.name != new_name:
                problems.append(f"{{old}} is not {{new_name}}")
            if not any(f"import {{new_name}} instead" in t for t in texts):
                problems.append(f"{{old}}: no warning naming {{new_name}}: {{texts}}")
        assert not problems, problems
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_from_dpcourse_import_an_old_name_works_as_lessons_wrote_it():
    code = "from dpcourse import display as show, results, session\nprint(show.__name__, results.__name__, session.__name__)"
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["dpcourse.show", "dpcourse.record", "dpcourse.lesson"]


def test_an_old_attribute_of_dpcourse_sharded_reaches_its_forms_with_a_warning():
    from dpcourse import sharded
    from dpcourse.sharded import forms

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = sharded.shard_specs
    assert got is forms.shard_specs
    assert any("dpcourse.sharded.forms.shard_specs" in str(w.message) for w in caught)
    with pytest.raises(AttributeError, match="no attribute 'not_a_form'"):
        sharded.not_a_form  # noqa: B018


def _dpcourse_uses(source: str) -> tuple[set[str], set[tuple[str, str]]]:
    """The dpcourse modules a lesson imports, and each ``alias.attribute`` it reads on them."""
    tree = ast.parse(source)
    modules: set[str] = set()
    local: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dpcourse"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if node.module == "dpcourse" or full in _moved.MOVED or alias.name[0].islower():
                    modules.add(node.module)
                    local[alias.asname or alias.name] = (node.module, alias.name)
    attrs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in local:
            module, name = local[node.value.id]
            attrs.add((f"{module}:{name}", node.attr))
    return modules, attrs


def test_every_dpcourse_name_an_edited_lesson_of_the_previous_layout_uses_still_resolves():
    uses = {}
    for path in sorted(PREVIOUS.glob("[0-9][0-9]_*.py")):
        modules, attrs = _dpcourse_uses(path.read_text())
        assert modules, path.name
        uses[path.stem] = sorted(attrs)
    assert len(uses) == 10
    code = textwrap.dedent(
        f"""
        import importlib, warnings
        warnings.simplefilter("ignore")
        missing = []
        for lesson, attrs in {uses!r}.items():
            for spec, attr in attrs:
                module, name = spec.split(":")
                obj = importlib.import_module(module)
                try:
                    obj = getattr(obj, name)
                except AttributeError:
                    obj = importlib.import_module(module + "." + name)
                if not hasattr(obj, attr):
                    missing.append(f"{{lesson}}: {{module}}.{{name}}.{{attr}}")
        assert not missing, missing
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_tooling_names_are_not_aliased_by_the_library():
    assert not TOOLING & set(_moved.MOVED)
    assert all(not new.startswith("coursetools") for new in _moved.MOVED.values())


def test_the_old_mocked_report_command_still_runs_and_names_the_new_one(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-m", "dpcourse.gpu_compile.mocked", "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.returncode == 0 and "--report" in proc.stdout, proc.stderr
    assert "import dpcourse.cross_compile.notebook instead" in proc.stderr


def test_python_m_dpcourse_hands_over_to_the_toolkit_and_says_so(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dpcourse", "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "python -m coursetools" in proc.stderr and "run" in proc.stdout


@pytest.mark.slow
@pytest.mark.lesson
def test_a_lesson_of_the_previous_layout_runs_whole(tmp_path, monkeypatch):
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(PREVIOUS / "03_mesh.py")
    monkeypatch.setenv("DPCOURSE_PROFILE", "smoke")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stderr")
    assert "dpcourse.session moved to dpcourse.lesson" in printed, printed[-2000:]


def _kernel_stderr(source: str, tmp_path, monkeypatch) -> str:
    """What a notebook kernel with Python's default warning filters prints to stderr for one cell."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.delenv("PYTHONWARNINGS", raising=False)  # the default filters, as in JupyterLab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    return "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("name") == "stderr")


@pytest.mark.parametrize(
    "source",
    ["import dpcourse.session as session", "from dpcourse import session", "from dpcourse.session import start_lesson"],
)
def test_a_notebook_cell_that_imports_an_old_name_shows_the_warning_with_the_default_filters(
    source, tmp_path, monkeypatch
):
    printed = _kernel_stderr(source, tmp_path, monkeypatch)
    assert "DeprecationWarning: dpcourse.session moved to dpcourse.lesson" in printed, printed
    assert "sys:1" not in printed, printed


def test_the_warning_names_the_line_that_imports_the_old_name(tmp_path):
    script = tmp_path / "edited_lesson.py"
    script.write_text("x = 1\nimport dpcourse.display\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"{script}:2: DeprecationWarning: dpcourse.display moved to dpcourse.show" in proc.stderr, proc.stderr
