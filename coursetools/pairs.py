"""Safe re-pairing of the notebooks: ``python -m coursetools sync`` (``make sync``).

Each notebook is a jupytext pair, ``NN_name.py`` and ``NN_name.ipynb``.
``jupytext --sync`` copies the more recently modified file over the other,
so when both were edited since they were last in sync one edit is lost. This
module keeps the cells of each pair as they were at its last sync (in the
git-ignored :data:`STATE_NAME`, or the committed version when there is no
record yet) and refuses to sync a pair whose two files both changed
differently since then, keeping both edits.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

STATE_NAME = ".pairs-synced.json"


class PairConflict(RuntimeError):
    """Both files of a pair changed since their last sync, differently; nothing was synced."""


@dataclass(frozen=True)
class PairStatus:
    """Where one pair stands: ``action`` is "in sync", "from py", "from ipynb" or "conflict"."""

    py: Path
    ipynb: Path
    action: str


def cell_fingerprint(text: str, fmt: str) -> str:
    """SHA-256 of a notebook's cells (type, source, tags), read with jupytext in ``fmt`` ("py:percent", "ipynb").

    Outputs, execution counts and other metadata do not count: running a
    notebook and saving it is not an edit.
    """
    import jupytext

    notebook = jupytext.reads(text, fmt=fmt)
    cells = [
        [cell.cell_type, cell.source.strip(), sorted(cell.get("metadata", {}).get("tags", []))]
        for cell in notebook.cells
    ]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()


class UnreadableNotebook(RuntimeError):
    """A file of a pair cannot be read as a notebook; nothing was synced."""


def _fingerprint_file(path: Path) -> str:
    try:
        return cell_fingerprint(path.read_text(encoding="utf-8"), "ipynb" if path.suffix == ".ipynb" else "py:percent")
    except Exception as err:  # noqa: BLE001 - jupytext/nbformat raise many kinds for a damaged file
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise UnreadableNotebook(
            f"{path} cannot be read as a notebook ({type(err).__name__}: {first}). Nothing was synced. "
            f"Restore it (`git checkout -- {path.name}`), or delete it to rebuild it from the other file "
            "of its pair, then run `make sync` again."
        ) from err


def _committed_fingerprint(py: Path) -> str | None:
    """Fingerprint of the ``.py`` as committed in git's HEAD, or None outside git or for a new file."""
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=py.parent, capture_output=True, text=True, check=True
        ).stdout.strip()
        rel = py.resolve().relative_to(Path(top).resolve()).as_posix()
        out = subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=top, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None
    return cell_fingerprint(out.stdout, "py:percent") if out.returncode == 0 else None


def read_state(folder: Path) -> dict[str, str]:
    """Fingerprints recorded at the last sync, by ``.py`` file name (empty when there is no record)."""
    try:
        return json.loads((folder / STATE_NAME).read_text())
    except (OSError, ValueError):
        return {}


def pair_status(py: Path, state: dict[str, str]) -> PairStatus:
    """Compare both files of a pair with their last synced cells.

    The baseline is the state record, else the committed ``.py``; without
    either, the more recently modified file is taken as the edit (jupytext's
    own rule).
    """
    ipynb = py.with_suffix(".ipynb")
    if not ipynb.exists():
        return PairStatus(py, ipynb, "from py")
    now_py, now_nb = _fingerprint_file(py), _fingerprint_file(ipynb)
    if now_py == now_nb:
        return PairStatus(py, ipynb, "in sync")
    base = state.get(py.name) or _committed_fingerprint(py)
    if base is None:
        newer = "from py" if py.stat().st_mtime >= ipynb.stat().st_mtime else "from ipynb"
        return PairStatus(py, ipynb, newer)
    if now_py != base and now_nb != base:
        return PairStatus(py, ipynb, "conflict")
    if now_py != base:
        return PairStatus(py, ipynb, "from py")
    return PairStatus(py, ipynb, "from ipynb")


def conflict_message(conflicts: list[PairStatus]) -> str:
    names = "; ".join(f"{c.py} and {c.ipynb}" for c in conflicts)
    return (
        f"Not synced: both files changed since they were last in sync, differently: {names}. "
        "Syncing would overwrite one of the edits, so both files are left as they are. Copy the edit "
        "from one file into the other (or undo one, e.g. `git checkout -- FILE`), then run `make sync` again."
    )


def sync(folder: Path, jupytext_cmd: list[str] | None = None) -> list[PairStatus]:
    """Re-pair every ``NN_name.py``/``.ipynb`` in ``folder``, each from the file that was edited.

    Nothing is written when any pair is in conflict. After a sync the pairs'
    cells are recorded in ``folder/STATE_NAME``.

    Args:
        folder: the notebooks' folder.
        jupytext_cmd: the jupytext command (default: this interpreter's ``-m jupytext``).

    Returns:
        The status of each pair, as it was before the sync.

    Raises:
        PairConflict: some pair changed on both sides (the message names both files of each).
        FileNotFoundError: ``folder`` has no numbered ``.py`` notebooks.
        RuntimeError: jupytext failed (its output is in the message).
        UnreadableNotebook: a file of a pair is not a readable notebook (a RuntimeError; nothing written).
    """
    folder = Path(folder)
    pys = sorted(folder.glob("[0-9][0-9]_*.py"))
    if not pys:
        raise FileNotFoundError(f"No numbered notebooks (NN_name.py) in {folder}.")
    state = read_state(folder)
    statuses = [pair_status(py, state) for py in pys]
    conflicts = [s for s in statuses if s.action == "conflict"]
    if conflicts:
        raise PairConflict(conflict_message(conflicts))
    cmd = jupytext_cmd or [sys.executable, "-m", "jupytext"]
    for status in statuses:
        if status.action == "in sync":
            continue
        source = status.py if status.action == "from py" else status.ipynb
        # jupytext --sync takes the newer file of the pair as the source (the .py on a tie): make the
        # source newer by a whole second, enough for file systems that keep whole seconds.
        other = status.ipynb if source == status.py else status.py
        newer = max(time.time_ns(), other.stat().st_mtime_ns + 1_000_000_000) if other.exists() else time.time_ns()
        os.utime(source, ns=(newer, newer))
        out = subprocess.run([*cmd, "--sync", str(source)], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"jupytext --sync {source} failed:\n{out.stdout}{out.stderr}")
    new_state = {s.py.name: _fingerprint_file(s.py) for s in statuses}
    (folder / STATE_NAME).write_text(json.dumps(new_state, indent=1, sort_keys=True) + "\n")
    return statuses
