"""A global mesh the learner set (``jax.set_mesh`` without ``with``): named in one sentence wherever a lesson stops under it.

Notebook 03 teaches that ``jax.set_mesh(mesh)`` may be called without
``with``: the mesh then stays in context for every later cell, and every
sharded step JAX runs checks its arguments' mesh against it. A mesh of
another shape or other devices than the lesson's own makes a later cell fail
deep inside JAX (``For primitive dot_general, context mesh ... should match
the aval mesh``, ``The context mesh ... should match the mesh passed to
shard_map``: 26 to 80 lines, JAX 0.10.2), whichever cell the learner set it
in.

:func:`guard` is the one mechanism for that: :func:`dpcourse.lesson.start_lesson`
installs it, and from then on an error that reaches the top of a cell (in
IPython, Jupyter or a notebook runner: the shell's custom exception handler)
or of the program (a lesson run as a plain ``python`` script:
``sys.excepthook``) while a global mesh other than the lesson's own is set
is shown as one sentence (:func:`explain`) naming that mesh, the lesson's
own, the error's type and how to clear it. Any error stopped under such a
mesh is shown so, since the mesh cannot be ruled out as its cause: cleared,
the cell run again shows the error itself, and in IPython ``%tb`` shows it
at once (it is the sentence's cause). With no such mesh every error is
shown exactly as before. :func:`check_global_mesh` is the same test made up
front.
"""

from __future__ import annotations

import sys


class ForeignMeshError(RuntimeError):
    """A global mesh set with ``jax.set_mesh`` is not the lesson's own; the message says how to clear it."""


CLEAR = "clear it with jax.set_mesh(None) (or restart the kernel), then run this cell again."
CLEAR_SCRIPT = "clear it (jax.set_mesh(None)), then run the script again."

_own = {"mesh": None}  # the mesh of the lesson that installed the guard last
_installed = {"shell": None, "hook": None}


def describe(mesh) -> str:
    """``{'data': 4, 'model': 2} (Explicit, Explicit axes)``: a mesh's axes, sizes and axis types."""
    sizes = ", ".join(f"'{name}': {size}" for name, size in zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    kinds = ", ".join(str(t).split(".")[-1] for t in mesh.axis_types)
    return f"{{{sizes}}} ({kinds} axes)"


def _shape(mesh, axis_types: bool) -> tuple:
    return (mesh.axis_names, mesh.axis_sizes, *((tuple(mesh.axis_types),) if axis_types else ()))


def foreign_mesh(mesh, axis_types: bool = False):
    """The global mesh now in context if it is not ``mesh`` (axes, sizes and devices), else None.

    ``axis_types``: the axis types must match too. A lesson runs under an
    Explicit twin of its Auto mesh set before it places its arrays, not
    after (JAX 0.10.2: ``context mesh ... should match the aval mesh``).
    ``mesh=None`` (work that needs no mesh) counts any global mesh as foreign.
    """
    import jax

    current = jax.sharding.get_abstract_mesh()
    if current.empty:
        return None
    if mesh is not None and _shape(current, axis_types) == _shape(mesh, axis_types):
        concrete = getattr(jax.sharding, "get_mesh", lambda: None)()
        devices = getattr(concrete, "devices", None)
        if devices is None or devices.size == 0 or [d.id for d in devices.flat] == [d.id for d in mesh.devices.flat]:
            return None
    return current


def check_global_mesh(mesh=None) -> None:
    """Refuse a global mesh (``jax.set_mesh(m)`` without ``with``) that the lesson's ``mesh`` cannot run under.

    A global mesh with the axes, sizes and devices of ``mesh`` (of either
    axis type, as notebook 03 allows) passes: the lessons run under it.
    ``mesh=None`` (work that needs no mesh) refuses any global mesh.

    Raises:
        ForeignMeshError: one sentence naming the mesh that is set, the
            lesson's, and how to clear it.
    """
    current = foreign_mesh(mesh)
    if current is None:
        return
    mine = f"its own mesh {describe(mesh)}" if mesh is not None else "no mesh"
    raise ForeignMeshError(
        f"A global mesh {describe(current)} is set (jax.set_mesh without `with`), and this lesson needs {mine}: {CLEAR}"
    )


def explain(error: BaseException, mesh=None, script: bool = False, axis_types: bool = True) -> ForeignMeshError | None:
    """The course's sentence for ``error`` when it stopped a lesson's code under a foreign global mesh, else None.

    ``mesh``: the lesson's own (default: the one :func:`guard` was given);
    ``script``: the advice for a plain ``python`` run instead of a cell;
    ``axis_types``: the Explicit twin of the lesson's mesh counts as foreign
    (:func:`foreign_mesh`). The sentence carries ``error`` as its cause.
    Never raises: whatever cannot be read gives None (the error is then
    shown as it is).
    """
    if isinstance(error, ForeignMeshError) or not isinstance(error, Exception) or "jax" not in sys.modules:
        return None
    mesh = mesh if mesh is not None else _own["mesh"]
    try:
        current = foreign_mesh(mesh, axis_types=axis_types)
        if current is None:
            return None
        mine = f" its own mesh {describe(mesh)}" if mesh is not None else " no mesh"
        sentence = (
            f"A global mesh {describe(current)} is set (jax.set_mesh without `with`), and this lesson, which needs"
            f"{mine}, stopped under it ({type(error).__name__}): {CLEAR_SCRIPT if script else CLEAR}"
        )
    except Exception:  # a broken JAX state must not hide the learner's error
        return None
    err = ForeignMeshError(sentence)
    err.__cause__ = error
    return err


def stop_if_foreign(err: BaseException) -> None:
    """Raise the course's sentence (:func:`explain`) when ``err`` stopped under a foreign global mesh.

    For code that records a failure and goes on (a sweep's size, a ladder's
    rung, a ceiling): under a mesh the learner set every later one would fail
    the same way, so the lesson stops there with the sentence instead. The
    Explicit twin of the lesson's mesh does not stop it: the lessons run
    under it, and a failure there is the run's own.
    """
    sentence = explain(err, axis_types=False)
    if sentence is not None:
        raise sentence from err


def _show_in_ipython(shell, etype, value, tb, tb_offset=None):
    """IPython's custom exception handler: the course's sentence alone, or the error as IPython shows it."""
    result = getattr(shell.displayhook, "exec_result", None)
    if result is None:  # the cell did not compile: IPython's own report
        shell.showsyntaxerror()
        return None
    err = value if isinstance(value, ForeignMeshError) else explain(value)
    if err is None:
        shell.showtraceback((etype, value, tb), running_compiled_code=True)
        return None
    result.error_in_exec = err  # what the kernel replies (a notebook runner's error line)
    shell.showtraceback((ForeignMeshError, err, None), exception_only=True)
    return None


def _show_in_script(etype, value, tb):
    """``sys.excepthook``: the course's sentence alone on stderr, or the error as the previous hook shows it."""
    err = value if isinstance(value, ForeignMeshError) else explain(value, script=True)
    if err is None:
        _installed["hook"](etype, value, tb)
        return
    print(f"ForeignMeshError: {err}", file=sys.stderr)


def guard(mesh) -> str:
    """Show any error a foreign global mesh causes from now on as the course's sentence; ``mesh`` is the lesson's own.

    In IPython (Jupyter, a notebook runner) it sets the shell's custom
    exception handler for every ``Exception``: that handler shows an error
    as IPython does unless a foreign global mesh is set when the error
    reaches the top of the cell. Elsewhere (a lesson run as a script) it
    wraps ``sys.excepthook`` the same way. Calling it again (a lesson
    started again, another lesson) only changes the lesson's mesh. A
    custom exception handler someone else set is left in place.

    Returns:
        ``"ipython"``, ``"script"`` or ``"left"`` (another handler was set).
    """
    _own["mesh"] = mesh
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:  # pragma: no cover - IPython is an install requirement
        shell = None
    if shell is not None:
        if _installed["shell"] is shell:
            return "ipython"
        if shell.custom_exceptions:
            return "left"
        shell.set_custom_exc((Exception,), _show_in_ipython)
        _installed["shell"] = shell
        return "ipython"
    if sys.excepthook is not _show_in_script:
        _installed["hook"] = sys.excepthook
        sys.excepthook = _show_in_script
    return "script"
