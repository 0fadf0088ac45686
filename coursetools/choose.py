"""Which notebooks a course run executes: lessons by name or number, or notebooks the user names by path."""

from __future__ import annotations

import os
from pathlib import Path

from coursetools import paths

NOTEBOOK_DIR = paths.NOTEBOOKS


def _is_path(name: str) -> bool:
    """Whether ``name`` is a path the user gave (a folder in it, or an existing ``.ipynb``), not a lesson name."""
    return os.sep in name or "/" in name or (name.endswith(".ipynb") and Path(name).expanduser().is_file())


def _given_notebook(name: str) -> Path:
    path = Path(name).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"No notebook at {name!r} ({path.resolve()} does not exist). Check the path, or give a lesson by "
            "name or number (e.g. 01 or 03_mesh)."
        )
    if path.is_dir():
        raise FileNotFoundError(f"{name!r} is a folder, not a notebook: give the path of an .ipynb file in it.")
    if path.suffix != ".ipynb":
        hint = f" (the notebook of this pair is {path.with_suffix('.ipynb')})" if path.suffix == ".py" else ""
        raise FileNotFoundError(f"{name!r} is not a notebook: give the path of an .ipynb file{hint}.")
    return path.resolve()


def find_notebooks(directory: Path = NOTEBOOK_DIR, only: list[str] | None = None) -> list[Path]:
    """The numbered ``NN_name.ipynb`` notebooks in order, optionally filtered.

    ``only`` holds lesson names or prefixes (``"03"``, ``"03_mesh"``,
    ``"03_mesh.ipynb"``), chosen from ``directory``, or paths to notebooks
    (``other/01_setup.ipynb``: a name with a folder in it, or an ``.ipynb``
    file that exists), which run as given, in the order given after the
    lessons.

    Raises:
        FileNotFoundError: the folder has no numbered notebooks (and no path
            was given), a name in ``only`` matches none (the message lists
            the valid names), a path does not exist or is not an ``.ipynb``
            file, or two chosen notebooks have the same file name (their
            executed copies would overwrite each other).
    """
    names = [name for name in only or [] if not _is_path(name)]
    given = [_given_notebook(name) for name in only or [] if _is_path(name)]
    found = sorted(p for p in Path(directory).glob("[0-9][0-9]_*.ipynb"))
    if not found and (names or not given):
        raise FileNotFoundError(f"No numbered notebooks (NN_name.ipynb) in {directory}.")
    if not only:
        return found
    chosen = []
    for name in names:
        stem = Path(name).stem
        matches = [p for p in found if p.stem == stem or p.stem.startswith(stem + "_") or p.stem[:2] == stem]
        if not matches:
            valid = ", ".join(p.stem for p in found)
            raise FileNotFoundError(f"No notebook matches {name!r}. Valid names: {valid}.")
        chosen.extend(m for m in matches if m not in chosen)
    chosen = sorted(chosen) + [p for p in given if p not in chosen]
    seen: dict[str, Path] = {}
    for path in chosen:
        if path.name in seen and seen[path.name] != path:
            raise FileNotFoundError(
                f"{seen[path.name]} and {path} have the same file name: their executed copies and records "
                "would overwrite each other in the output folder. Run them in separate runs (or with --out)."
            )
        seen[path.name] = path
    return chosen
