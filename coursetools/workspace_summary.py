"""The line ``make lab`` prints as it starts: what ``workspace init``/``update`` did, lesson kinds counted and named."""

from __future__ import annotations

from pathlib import Path

NAMED_AT_MOST = 4  # the start-up line names at most this many lessons of one kind (it must fit one line)


def summary(root: Path, actions: list) -> list[str]:
    """One or two lines for ``make lab``'s start: counts with the lessons they name, then each lesson to look at.

    ``actions``: what :class:`coursetools.workspace.Workspace` did, one :class:`~coursetools.workspace.Action` each.

    For example ``workspace W: 10 lessons (1 updated (06_pmap); 1 kept, new
    version in updates/ (04_sharding); 8 up to date).``
    """
    by_kind: dict[str, list[str]] = {}
    for action in actions:
        by_kind.setdefault(action.kind, []).append(action.lesson)
    order = ("copied", "replaced", "restored", "offered", "waiting", "edited", "unchanged", "unreadable")
    words = {
        "copied": "copied in",
        "replaced": "updated",
        "restored": "copied in again",
        "offered": "kept, new version in updates/",
        "waiting": "kept, new version waiting in updates/",
        "edited": "yours, edited",
        "unchanged": "up to date",
        "unreadable": "unreadable, left as it is",
    }
    parts = []
    for kind in (k for k in order if by_kind.get(k)):
        names = by_kind[kind]
        # Name the lessons a learner looks at; not the long lists of a first start or a quiet update.
        named = kind not in ("unchanged", "edited") and len(names) <= NAMED_AT_MOST
        parts.append(f"{len(names)} {words[kind]}" + (f" ({', '.join(names)})" if named else ""))
    lines = [f"workspace {root}: {len(actions)} lessons ({'; '.join(parts)})."]
    lines += [a.message for a in actions if a.kind in ("offered", "waiting", "unreadable", "restored")]
    return lines
