"""A printable one-page card for the room, from the running hub: address, password, what to do when stuck.

    python hub/card.py [--out .hub/room-card.html]      (make room-card)

It reads what hub/launch.py wrote in HUB_DIR when `make hub` started: the
address learners open (``HUB_DIR/address``: ``HUB_PUBLIC_URL``, else the
hub's own) and the workshop password (``HUB_DIR/password``), so the card
says what the hub does, whatever settings this shell has. Print it from a
browser (one A4 or Letter page) and lay one on each table.
"""

from __future__ import annotations

import argparse
import html
import ipaddress
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]


class CardError(RuntimeError):
    """The hub gives no card (not started yet, or an address only this machine opens); the message says what to do."""


def _loopback(address: str) -> bool:
    host = urlsplit(address).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def settings(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The address learners open and the workshop password, as the hub in ``HUB_DIR`` was started with.

    Raises:
        CardError: the hub has not started from ``HUB_DIR`` yet, or its
            address opens only on this machine (a room needs ``HUB_PUBLIC_URL``).
    """
    env = dict(os.environ if environ is None else environ)
    hub_dir = Path(env.get("HUB_DIR", ROOT / ".hub")).resolve()
    found = {}
    for name in ("address", "password"):
        kept = hub_dir / name
        if not kept.is_file():
            raise CardError(
                f"{kept} is missing: start the hub (make hub) with this HUB_DIR first; it writes the {name} there."
            )
        found[name] = kept.read_text().strip()
    if _loopback(found["address"]):
        raise CardError(
            f"the hub's address {found['address']} opens only on its own machine: start `make hub` with "
            "HUB_PUBLIC_URL set to the address learners open (e.g. https://hub.example.org/ of the TLS proxy in "
            "front, docs/instructor.md 'TLS in front'), then make the card again."
        )
    return {**found, "admin": env.get("HUB_ADMIN", "instructor")}


def render(found: dict[str, str]) -> str:
    """The card as one HTML page (every value escaped)."""
    e = html.escape
    steps = [
        (
            "Sign in",
            f"Open <b>{e(found['address'])}</b>. The first time: a user name (your own, the same all day), "
            "a password of your own (8 or more characters: only you know it) and, in the second field, the workshop "
            f"password <b class='pw'>{e(found['password'])}</b>. After that: your name and your own password "
            "(forgot it? ask the instructor).",
        ),
        (
            "Your lessons",
            "The lab opens on your own copy of every lesson (one <code>NN_name.ipynb</code> each). "
            "Nothing you do there changes anyone else's.",
        ),
        (
            "Run a lesson",
            "From the top: Run, Run All Cells, or Shift+Enter cell by cell. Each exercise: replace the "
            "<code>...</code>, then run the check below it.",
        ),
        (
            "The kernel died",
            "Kernel, Restart Kernel and Run All Cells: a lesson works only from its first cell. "
            "If it dies at the same cell again, raise your hand.",
        ),
        (
            "A fresh copy of a lesson",
            "In a terminal of the lab: <code>python -m coursetools workspace reset 05 "
            "--dir ~/workspace</code> (yours is kept in <code>old/</code>). Then close the lesson's tab without saving "
            "and open it again.",
        ),
        (
            "Fell behind",
            "The instructor can fill the solutions into your copy of a lesson (yours is kept in "
            "<code>old/</code>). Ask.",
        ),
        (
            "Your progress",
            "Each check writes <code>progress.json</code> in your workspace, which the instructor's "
            "board reads. It is yours: open it or delete it.",
        ),
        ("Going home", "File, Download, or zip your workspace from a terminal: idle servers stop after an hour."),
    ]
    rows = "".join(f"<tr><th>{e(title)}</th><td>{text}</td></tr>" for title, text in steps)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Workshop card</title><style>
@page {{ size: A4; margin: 14mm; }}
body {{ font: 13pt/1.35 system-ui, sans-serif; margin: 0 auto; max-width: 180mm; color: #111; }}
h1 {{ font-size: 20pt; margin: 0 0 4mm; }} table {{ border-collapse: collapse; width: 100%; }}
th {{ text-align: left; vertical-align: top; width: 42mm; padding: 2.5mm 3mm 2.5mm 0; }}
td {{ padding: 2.5mm 0; border-bottom: 1px solid #ccc; }} th {{ border-bottom: 1px solid #ccc; }}
code {{ font-size: 11pt; }} .pw {{ font-family: monospace; font-size: 15pt; }}
</style></head><body><h1>Data-parallel training in JAX: the workshop</h1><table>{rows}</table>
<p>The instructor signs in as <code>{e(found["admin"])}</code>.</p></body></html>
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="the HTML file (default: HUB_DIR/room-card.html)")
    args = parser.parse_args(argv)
    try:
        found = settings()
    except CardError as err:
        print(f"room-card: {err}", file=sys.stderr)
        return 2
    out = args.out or Path(os.environ.get("HUB_DIR", ROOT / ".hub")).resolve() / "room-card.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(render(found), encoding="utf-8")
    os.replace(tmp, out)
    print(f"room-card: {out} (open it in a browser and print one page per table)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
