"""Where a checkpoint was made (backend, devices, mesh, versions), and what a restore elsewhere changes.

Taught in notebook 11 (section 9, "Between sessions"): every
:func:`dpcourse.checkpoints.checkpoint.save` writes :func:`describe` of the
saved state into the step's run description, and a restore says
:func:`restored_sentence`: where the step was made, where it is restored,
and what that does to the numbers. The fields that decide the training
(the profile, the model's configuration, the global batch) are checked
before any array is read (:func:`dpcourse.checkpoints.checkpoint.check_run`);
these are told, never refused: a checkpoint is meant to move between
machines.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
from collections.abc import Mapping
from typing import Any

from dpcourse.checkpoints.errors import shape_error

KEY = "provenance"  # the run description's entry that holds it
# Distributions whose versions a checkpoint records (the ones that compute, save or lay out the state).
LIBRARIES = ("jax", "jaxlib", "libtpu", "orbax-checkpoint", "optax", "dpcourse")
# :func:`describe`'s shape, checked where a step's record is read: one of another shape is told, not read.
_MAPPING = {"type": "object", "additionalProperties": {"type": ["integer", "string"]}}
SCHEMA = {"type": "object", "properties": {"device_count": {"type": "integer"}, "mesh": _MAPPING, "versions": _MAPPING}}


def versions() -> dict[str, str]:
    """The installed versions of :data:`LIBRARIES` (those installed; libtpu only on a TPU host or with the extra)."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _devices_and_mesh(tree) -> tuple[list, dict[str, int]]:
    """The devices of the first leaf of ``tree`` that has a sharding (arrays or ``jax.ShapeDtypeStruct``), and its mesh."""
    import jax

    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            continue
        mesh = getattr(sharding, "mesh", None)
        if mesh is not None and hasattr(mesh, "devices"):
            return list(mesh.devices.flat), {str(k): int(v) for k, v in mesh.shape.items()}
        devices = sorted(sharding.device_set, key=lambda d: d.id)
        return devices, {}
    return [], {}


def describe(tree) -> dict[str, Any]:
    """Where ``tree`` lives: its backend, device kind and count, mesh, the library versions and the time (UTC).

    Args:
        tree: the state saved (arrays) or a restore's target (``jax.ShapeDtypeStruct`` with shardings).

    Returns:
        A JSON-ready dict; ``backend`` and ``device_kind`` are None when no leaf has a sharding.
    """
    devices, mesh = _devices_and_mesh(tree)
    return {
        "backend": devices[0].platform if devices else None,
        "device_kind": devices[0].device_kind if devices else None,
        "device_count": len(devices),
        "process_count": len({d.process_index for d in devices}) if devices else 0,
        "mesh": mesh,
        "versions": versions(),
        "saved_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def where(made: Mapping[str, Any]) -> str:
    """A few words for :func:`describe`'s dict: "8 cpu devices (cpu, mesh data=8), JAX 0.10.2"."""
    n = made.get("device_count", 0)
    mesh = ", ".join(f"{k}={v}" for k, v in (made.get("mesh") or {}).items())
    kind = made.get("device_kind") or "unknown"
    jax_version = (made.get("versions") or {}).get("jax", "?")
    return f"{n} {kind} device{'s' if n != 1 else ''} ({made.get('backend')}, mesh {mesh or 'none'}), JAX {jax_version}"


def changes(saved: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """What differs between where a step was made and where it is restored: backend, device kind, count, mesh, versions."""
    found = []
    for key, name in (("backend", "backend"), ("device_kind", "device kind"), ("device_count", "device count")):
        if saved.get(key) != here.get(key):
            found.append(f"{name} {saved.get(key)} -> {here.get(key)}")
    if (saved.get("mesh") or {}) != (here.get("mesh") or {}):
        found.append(f"mesh {saved.get('mesh')} -> {here.get('mesh')}")
    was, now = saved.get("versions") or {}, here.get("versions") or {}
    for name in sorted(set(was) & set(now)):
        if was[name] != now[name]:
            found.append(f"{name} {was[name]} -> {now[name]}")
    return found


def effect(saved: Mapping[str, Any], here: Mapping[str, Any]) -> str:
    """What the change from ``saved`` to ``here`` does to the numbers, in one clause."""
    if saved.get("backend") != here.get("backend") or saved.get("device_kind") != here.get("device_kind"):
        return (
            "another backend rounds its float32 matmuls differently (a TPU's default is one bfloat16 pass), so the "
            "steps from here differ from an uninterrupted run by more than rounding, within AdamW's bound of "
            "2 x learning rate per step; the step, data position, PRNG key and optimizer step count carry over "
            "exactly"
        )
    if saved.get("device_count") != here.get("device_count") or (saved.get("mesh") or {}) != (here.get("mesh") or {}):
        return (
            "the gradient's sum runs over another device count, in another order, so the steps from here differ "
            "from an uninterrupted run by rounding; the step, data position, PRNG key and optimizer step count "
            "carry over exactly"
        )
    if changes(saved, here):
        return "the same devices with other library versions: the compiled step may round its last bits differently"
    return "the same backend, devices and versions: the steps from here are the ones an uninterrupted run takes"


def restored_sentence(step: int, saved_run: Mapping[str, Any], target) -> str:
    """One sentence for a restore: where ``step`` was made, where it goes now, what changed and what that does.

    Args:
        saved_run: the step's run description (its :data:`KEY` entry is the provenance, when it was written).
        target: the restore's target (its shardings say where it goes).
    """
    here = describe(target)
    made = saved_run.get(KEY)
    profile = saved_run.get("profile")
    if not made:
        return (
            f"Step {step} (profile {profile}) holds no record of where it was made (saved without "
            f"dpcourse.checkpoints.checkpoint.save); restored onto {where(here)}."
        )
    wrong = shape_error(made, SCHEMA)
    if wrong:
        return (
            f"Step {step} (profile {profile}) holds a record of where it was made of another shape ({wrong}), "
            f"so what changed is not known; restored onto {where(here)}."
        )
    differ = changes(made, here)
    what = f"changed: {'; '.join(differ)}" if differ else "nothing changed"
    return (
        f"Step {step} (profile {profile}) was saved on {where(made)} at {made.get('saved_utc')}; restored onto "
        f"{where(here)}; {what}: {effect(made, here)}."
    )
