"""Make the top-level packages named in ``DPCOURSE_BLOCK_IMPORTS`` look uninstalled, in each process that starts.

On ``PYTHONPATH``, Python imports this file at start-up (``site``), so a
notebook kernel started by the runner gets it too. The path finder answers
"not found" for those names, as if their folders were absent:
``importlib.util.find_spec("rich")`` is None and ``import rich`` raises
``ModuleNotFoundError``, which is what a learner without the package meets.
"""

import importlib.machinery
import os

_BLOCKED = {name.strip() for name in os.environ.get("DPCOURSE_BLOCK_IMPORTS", "").split(",") if name.strip()}

if _BLOCKED:
    _find_spec = importlib.machinery.PathFinder.find_spec

    def _blocking_find_spec(fullname, path=None, target=None):
        if fullname.partition(".")[0] in _BLOCKED:
            return None
        return _find_spec(fullname, path, target)

    importlib.machinery.PathFinder.find_spec = staticmethod(_blocking_find_spec)
