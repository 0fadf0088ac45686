"""Fill the exercise solutions into the lesson notebooks (for the CI run with solutions).

An exercise cell in a notebook is a code cell tagged ``exercise`` and with
its id, e.g. ``tags=["exercise", "ex04_2"]``; its answer is left as ``...``.
``solutions/NN_name.py`` (jupytext percent format, beside the course, not in
the lesson) holds one cell per exercise tagged with the same id.
:func:`fill_solutions` swaps each exercise cell's source for its solution.

Command line: ``python -m coursetools.solutions --out build/solved
[--notebooks PATH ...] [--again]`` writes the notebooks that have solutions, filled
in, to a folder (for nbmake); ``python -m coursetools run --solutions`` fills them in on the fly.
With ``--again`` each copy runs its code cells a second time after its last
cell (:func:`run_again`), as a learner who goes back after Run All would.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from coursetools import paths

SOLUTIONS_DIR = paths.SOLUTIONS
NOTEBOOK_DIR = paths.NOTEBOOKS
EXERCISE_TAG = "exercise"
_ID = re.compile(r"^ex\d\d_\d+$")


class SolutionError(ValueError):
    """Exercise cells and solution cells do not match up."""


def cell_id(cell) -> str | None:
    """The exercise id among a cell's tags (``"ex04_2"``), or None."""
    ids = [t for t in cell.get("metadata", {}).get("tags", []) if _ID.match(t)]
    return ids[0] if ids else None


def exercise_cells(nb) -> dict[str, int]:
    """Exercise id -> cell index of the cells tagged ``exercise``.

    Raises:
        SolutionError: an ``exercise`` cell without an id tag, or an id used twice.
    """
    found: dict[str, int] = {}
    for index, cell in enumerate(nb.cells):
        if EXERCISE_TAG not in cell.get("metadata", {}).get("tags", []):
            continue
        ident = cell_id(cell)
        if ident is None or ident in found:
            raise SolutionError(f"Cell {index} is tagged 'exercise' but has {'a repeated' if ident else 'no'} id tag.")
        found[ident] = index
    return found


def solution_path(stem: str, directory: Path | None = None) -> Path:
    """``solutions/NN_name.py`` for the notebook ``NN_name`` (``directory`` defaults to :data:`SOLUTIONS_DIR`)."""
    return Path(SOLUTIONS_DIR if directory is None else directory) / f"{stem}.py"


def read_solutions(stem: str, directory: Path | None = None) -> dict[str, str]:
    """Exercise id -> solution source for one notebook; empty when it has no solution file."""
    import jupytext

    path = solution_path(stem, directory)
    if not path.exists():
        return {}
    solved = jupytext.read(path, fmt="py:percent")
    return {cell_id(c): c.source for c in solved.cells if c.cell_type == "code" and cell_id(c)}


def fill_solutions(nb, stem: str, directory: Path | None = None) -> int:
    """Replace every exercise cell of ``nb`` (in place) with its solution; return how many.

    Raises:
        SolutionError: an exercise without a solution, or a solution without
            its exercise cell (the message names them and the file).
    """
    cells = exercise_cells(nb)
    solutions = read_solutions(stem, directory)
    missing = sorted(set(cells) - set(solutions))
    orphans = sorted(set(solutions) - set(cells))
    if missing or orphans:
        raise SolutionError(
            f"{stem}: exercises without a solution in {solution_path(stem, directory)}: {missing or 'none'}; "
            f"solutions without an exercise cell: {orphans or 'none'}."
        )
    for ident, index in cells.items():
        nb.cells[index].source = solutions[ident]
    return len(cells)


def run_again(nb) -> int:
    """Append to ``nb`` (in place) a copy of each code cell but the ``parameters`` one; return how many.

    Executed top to bottom, the copy runs every section again after the
    lesson's last cell: a cell whose inputs an earlier cell deleted fails there.
    """
    import nbformat

    again = [
        nbformat.v4.new_code_cell(c.source, metadata={"tags": ["again"]})
        for c in nb.cells
        if c.cell_type == "code" and "parameters" not in c.get("metadata", {}).get("tags", [])
    ]
    nb.cells += [nbformat.v4.new_markdown_cell("Every code cell again, after the last one."), *again]
    return len(again)


def write_solved(
    notebooks: list[Path], out_dir: Path, directory: Path | None = None, again: bool = False
) -> list[Path]:
    """Write each notebook that has exercises, solutions filled in, to ``out_dir``; ``again``: every one, :func:`run_again`.

    Returns the paths written.
    """
    import nbformat

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        if fill_solutions(nb, path.stem, directory) or again:  # again: a lesson without exercises too
            if again:
                run_again(nb)
            target = out_dir / path.name
            nbformat.write(nb, target)
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursetools.solutions", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the notebooks with solutions filled in")
    parser.add_argument("--notebook-dir", default=str(NOTEBOOK_DIR))
    parser.add_argument(
        "--notebooks",
        nargs="+",
        metavar="PATH",
        help="these .ipynb files only (default: every lesson of --notebook-dir)",
    )
    parser.add_argument("--again", action="store_true", help="run every code cell again after the last one")
    args = parser.parse_args(argv)
    if args.notebooks:
        notebooks = [Path(p) for p in args.notebooks]
        absent = [str(p) for p in notebooks if not p.is_file()]
        if absent:
            print(f"error: no such notebook: {', '.join(absent)}", file=sys.stderr)
            return 2
    else:
        notebooks = sorted(Path(args.notebook_dir).glob("[0-9][0-9]_*.ipynb"))
    from coursetools.outfolder import OutputFolderError
    from coursetools.runner import check_output_folder

    try:
        check_output_folder(Path(args.out), notebooks)  # a file, a read-only folder or the sources: before any work
        written = write_solved(notebooks, Path(args.out), again=args.again)
    except (SolutionError, OutputFolderError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{len(written)} notebooks with solutions filled in: {', '.join(p.name for p in written)} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
