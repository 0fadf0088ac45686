"""Lesson 10's forms beyond replicated data parallelism: ZeRO-1, FSDP and gradient accumulation (:mod:`dpcourse.sharded.forms`).

``from dpcourse import sharded`` and ``sharded.<name>`` (the previous layout,
where this was one module) still work for one release, with a
``DeprecationWarning`` naming :mod:`dpcourse.sharded.forms`.
"""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib

    from dpcourse._moved import warn_moved

    forms = importlib.import_module("dpcourse.sharded.forms")
    if not hasattr(forms, name):
        raise AttributeError(f"module 'dpcourse.sharded' has no attribute {name!r}")
    warn_moved(f"dpcourse.sharded.{name}", f"dpcourse.sharded.forms.{name}")
    return getattr(forms, name)
