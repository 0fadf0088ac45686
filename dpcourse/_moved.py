"""The previous layout's module names, kept importable for one release with a warning naming the new one."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

# Old name -> the module that now holds its code. The course's tooling moved
# out of the library into ``coursetools/`` in the repository; those names are
# not aliased here (a library never imports the tooling): run
# ``python -m coursetools`` from a checkout instead.
MOVED = {
    "dpcourse.session": "dpcourse.lesson",
    "dpcourse.display": "dpcourse.show",
    "dpcourse.results": "dpcourse.record",
    "dpcourse.cellcheck": "dpcourse.exercises.checks",
    "dpcourse.checks": "dpcourse.exercises.checks",
    "dpcourse.progress": "dpcourse.exercises.progress",
    "dpcourse.xlaflags": "dpcourse.backend.xlaflags",
    "dpcourse.gpuinfo": "dpcourse.backend.gpuinfo",
    "dpcourse.health": "dpcourse.backend.health",
    "dpcourse.collectives": "dpcourse.compiled.collectives",
    "dpcourse.hlo": "dpcourse.compiled.hlo",
    "dpcourse.census": "dpcourse.compiled.census",
    "dpcourse.ceilings": "dpcourse.perf.ceilings",
    "dpcourse.roofline": "dpcourse.perf.roofline",
    "dpcourse.ladder": "dpcourse.perf.ladder",
    "dpcourse.linkbench": "dpcourse.perf.linkbench",
    "dpcourse.single_device": "dpcourse.perf.single_device",
    "dpcourse.distributed": "dpcourse.multihost.distributed",
    "dpcourse.launcher": "dpcourse.multihost.launcher",
    "dpcourse.worker": "dpcourse.multihost.worker",
    "dpcourse.ports": "dpcourse.multihost.ports",
    "dpcourse.multihost_plan": "dpcourse.multihost.plan",
    "dpcourse.gpu_targets": "dpcourse.cross_compile.targets",
    "dpcourse.deviceless": "dpcourse.cross_compile.compile",
    # What lessons 04, 05 and 09 called on it (show_gpu_placement, CPU_ONLY_CAVEAT, PASS_NAME) is the notebook's.
    "dpcourse.gpu_placement": "dpcourse.cross_compile.notebook",
    "dpcourse.course_steps": "dpcourse.cross_compile.steps",
    "dpcourse.sharded_steps": "dpcourse.cross_compile.steps",
    # Compiling for GPUs and TPUs you do not have: one package, cross_compile (it was gpu_compile).
    "dpcourse.gpu_compile": "dpcourse.cross_compile",
    "dpcourse.gpu_compile.compile": "dpcourse.cross_compile.compile",
    "dpcourse.gpu_compile.mocked": "dpcourse.cross_compile.mocked",
    "dpcourse.gpu_compile.notebook": "dpcourse.cross_compile.notebook",
    "dpcourse.gpu_compile.overlap_steps": "dpcourse.cross_compile.overlap_steps",
    "dpcourse.gpu_compile.result": "dpcourse.cross_compile.result",
    "dpcourse.gpu_compile.steps": "dpcourse.cross_compile.steps",
    "dpcourse.gpu_compile.targets": "dpcourse.cross_compile.targets",
    # Lesson 10's builders joined the others in the steps module.
    "dpcourse.gpu_compile.sharded_steps": "dpcourse.cross_compile.steps",
}
# Old names whose command (``python -m``) moved to another module than their code: the report of
# mocked GPU topologies is ``python -m dpcourse.cross_compile.notebook --report`` now.
MOVED_COMMANDS = {"dpcourse.gpu_compile.mocked": "dpcourse.cross_compile.notebook"}


def warn_moved(old: str, new: str, stacklevel: int = 3, frame=None) -> None:
    """Emit the ``DeprecationWarning`` for one old name, saying what to import instead.

    With ``frame``, as from that frame's line: an import's, past importlib's frames (their number varies;
    ``sys:1`` is hidden by the default filters, a notebook cell's ``__main__`` is not).
    """
    text = (
        f"{old} moved to {new} (the course's new layout): import {new} instead; the old name goes in the next release."
    )
    if frame is None:
        return warnings.warn(text, DeprecationWarning, stacklevel=stacklevel)
    g, code = frame.f_globals, frame.f_code
    registry = g.setdefault("__warningregistry__", {})
    warnings.warn_explicit(text, DeprecationWarning, code.co_filename, frame.f_lineno, g.get("__name__"), registry)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and hands back the new module itself (one object: patches and ``isinstance`` agree)."""

    def __init__(self) -> None:
        self._own_specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        module = importlib.import_module(new)
        self._own_specs[new] = module.__spec__
        frame = sys._getframe(1)
        while frame.f_back is not None and "importlib" in frame.f_code.co_filename:
            frame = frame.f_back  # up to the line that imports the old name
        warn_moved(spec.name, new, frame=frame)
        return module

    def exec_module(self, module):
        # importlib set the old name's spec on the module: give it back its own.
        module.__spec__ = self._own_specs.get(module.__name__, module.__spec__)

    def get_code(self, fullname):
        """``python -m`` with an old name runs the new module's code (or the command's, :data:`MOVED_COMMANDS`)."""
        new = MOVED_COMMANDS.get(fullname, MOVED[fullname])
        warn_moved(fullname, new, stacklevel=2)
        spec = importlib.util.find_spec(new)
        return spec.loader.get_code(new)

    def is_package(self, fullname):
        return False


_FINDER = _Alias()


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` once (idempotent)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _FINDER)
