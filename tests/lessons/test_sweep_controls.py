"""Notebook 07's controls cell without ipywidgets: skipped with a note, the rest runs.

The cell is read from ``notebooks/07_sweep.py`` and executed as it is, with
``ipywidgets`` hidden, so a change to the notebook is what gets tested.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import jupytext

from dpcourse import show as display

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "07_sweep.py"


def _controls_cell() -> str:
    cells = [c.source for c in jupytext.read(NOTEBOOK).cells if c.cell_type == "code"]
    (cell,) = [c for c in cells if "optional_widgets()" in c]
    return cell


def _run(monkeypatch, hide: bool):
    if hide:
        monkeypatch.setitem(sys.modules, "ipywidgets", None)  # `import ipywidgets` raises ImportError
    shown = []
    cfg = SimpleNamespace(block_repeats=2, per_device_batch=8)
    namespace = {"show": display, "cfg": cfg, "display": shown.append}
    exec(compile(_controls_cell(), str(NOTEBOOK), "exec"), namespace)
    return namespace, shown


def test_controls_are_skipped_with_one_note_without_ipywidgets(monkeypatch, capsys):
    namespace, shown = _run(monkeypatch, hide=True)
    assert namespace["widgets"] is None and shown == []
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "Interactive controls skipped" in out
    # The comparison the lesson runs next is defined whether or not the controls exist.
    assert callable(namespace["compare_devices"]) and callable(namespace["show_comparison"])


def test_controls_are_built_with_ipywidgets(monkeypatch):
    namespace, shown = _run(monkeypatch, hide=False)
    assert namespace["widgets"] is not None
    assert len(shown) == 1 and type(shown[0]).__name__ == "VBox"
