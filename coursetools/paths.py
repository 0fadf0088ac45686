"""Where things are in the course's repository: the one module of the toolkit that knows its paths."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = ROOT / "solutions"
BASELINES = ROOT / "baselines"
TIMINGS = BASELINES / "timings.json"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SITE_PAGES = ROOT / "site"
SITE_VENDOR = ROOT / "tools" / "site" / "node_modules"
WORKSPACE = ROOT / "workspace"
