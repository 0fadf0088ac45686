"""The notebook pairs: in sync, committed without outputs, written to the conventions.

The notebooks themselves run under nbmake (``make notebook-test``); these
checks are static and fast.
"""

import json
import re
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXPECTED = [
    "01_setup",
    "02_baseline",
    "03_mesh",
    "04_sharding",
    "05_shard_map",
    "06_pmap",
    "07_sweep",
    "08_multihost",
    "09_performance",
    "10_sharded",
    "11_checkpoint",
    "12_batch_size",
    "13_elastic",
]
PAIRS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.py"))


def _cells(nb):
    return [
        (c["cell_type"], c["source"] if isinstance(c["source"], str) else "".join(c["source"])) for c in nb["cells"]
    ]


def test_all_notebooks_are_present():
    assert PAIRS[: len(EXPECTED)] == EXPECTED


@pytest.mark.parametrize("stem", PAIRS)
def test_pair_in_sync(stem):
    py = jupytext.read(NOTEBOOKS / f"{stem}.py")
    ipynb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    assert _cells(py) == _cells(ipynb), f"{stem}.py and {stem}.ipynb differ: run `make sync`"


@pytest.mark.parametrize("stem", PAIRS)
def test_committed_notebook_has_no_outputs(stem):
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, (
                f"{stem}.ipynb cell {index} holds outputs: clear them before committing"
            )


@pytest.mark.parametrize("stem", PAIRS)
def test_exactly_one_parameters_cell(stem):
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    assert "PROFILE" in "".join(tagged[0]["source"])


@pytest.mark.parametrize("stem", PAIRS)
def test_notebook_states_goal_time_and_what_you_learned(stem):
    text = (NOTEBOOKS / f"{stem}.py").read_text()
    for phrase in ("**Goal.**", "**Assumes.**", "**Time", "## What you learned"):
        assert phrase in text, f"{stem} lacks {phrase}"


@pytest.mark.parametrize("stem", PAIRS)
def test_no_removed_or_experimental_apis(stem):
    code = "\n".join(src for kind, src in _cells(jupytext.read(NOTEBOOKS / f"{stem}.py")) if kind == "code")
    for pattern in (
        r"jax\.experimental\.shard_map",
        r"device_put_replicated\(",
        r"device_put_sharded\(",
        r"jax\.tree_map\(",
    ):
        assert not re.search(pattern, code), f"{stem} uses {pattern}"


def test_no_helper_defined_twice_across_notebooks():
    defined = {}
    for stem in PAIRS:
        for name in re.findall(r"^def (\w+)\(", (NOTEBOOKS / f"{stem}.py").read_text(), flags=re.M):
            assert name not in defined, f"{name} is defined in {defined.get(name)} and {stem}: move it to dpcourse"
            defined[name] = stem


@pytest.mark.parametrize("stem", PAIRS)
def test_no_cell_ends_by_showing_a_records_return_value(stem):
    """A cell ending in a bare ``results.record(...)`` shows ``Record(...)`` to the learner: assign it to ``_``."""
    import ast

    nb = jupytext.read(NOTEBOOKS / f"{stem}.py")
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        body = ast.parse(cell.source).body
        if body and isinstance(body[-1], ast.Expr) and isinstance(body[-1].value, ast.Call):
            call = ast.unparse(body[-1].value.func)
            assert not call.startswith("results."), (
                f"{stem} cell {index} ends with {call}(...), whose return value would show: write `_ = {call}(...)`"
            )
