"""The JAX compilation cache that make test's layers share: remove the entries a killed process left half made.

``make test`` gives each environment one persistent compilation cache
(Makefile, ``test_cache_env``) with a size cap, because only a capped
cache takes JAX's file lock: with ``jax_compilation_cache_max_size`` at
its default (-1) ``LRUCache`` neither locks nor evicts, and ``put`` writes
the entry in place, where another process may read it half written
(jax/_src/lru_cache.py, JAX 0.10.2).

The cap has a cost in the same file: ``put`` first sweeps the folder
for eviction and reads every ``KEY-cache`` file's ``KEY-atime`` companion
without checking it exists, and ``put`` writes the two one after the
other. A process killed between them (a kernel stopped at a cell time
limit, a test that kills a process) leaves a ``-cache`` file without its
``-atime``, and from then on every write to the cache fails with
``FileNotFoundError`` while reads go on (jax-ml/jax issue 39880; reproduced
with JAX 0.10.2; JAX's fix, pull request 39883, treats such an entry as the
oldest instead, where that JAX has it). :func:`remove_orphans` removes such entries, under JAX's
own lock file, so that no reader is between its check and its read; the
test sessions call it when they start (tests/conftest.py,
:mod:`coursetools.nbmake_guard`), so one killed process costs the cache's
writes for the rest of one session at most.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_SUFFIX, ATIME_SUFFIX = "-cache", "-atime"  # jax/_src/lru_cache.py, JAX 0.10.2 to 0.12
LOCK_NAME = ".lockfile"  # the lock LRUCache takes when a size cap is set
LOCK_TIMEOUT_S = 60.0


def orphans(folder: str | os.PathLike) -> list[Path]:
    """The ``KEY-cache`` files in ``folder`` without their ``KEY-atime``: written by a process that did not finish."""
    folder = Path(folder)
    return sorted(
        p
        for p in folder.glob(f"*{CACHE_SUFFIX}")
        if not (folder / (p.name.removesuffix(CACHE_SUFFIX) + ATIME_SUFFIX)).exists()
    )


def capped_cache_folder(environ: dict | None = None) -> Path | None:
    """The cache folder when the environment sets one with a size cap (JAX's eviction and lock on), else None."""
    env = os.environ if environ is None else environ
    folder = env.get("JAX_COMPILATION_CACHE_DIR", "").strip()
    cap = env.get("JAX_COMPILATION_CACHE_MAX_SIZE", "").strip()
    if not folder or "://" in folder or cap in ("", "-1"):
        return None
    return Path(folder)


def remove_orphans(folder: str | os.PathLike | None = None) -> list[Path]:
    """Remove the orphaned entries of ``folder`` (default: the capped cache of the environment); those removed.

    Takes JAX's lock file first (``filelock``, as ``LRUCache`` does), so no
    process reads or writes an entry meanwhile. A folder that does not
    exist yet has none.

    Raises:
        filelock.Timeout: another process held the lock for :data:`LOCK_TIMEOUT_S`.
    """
    folder = capped_cache_folder() if folder is None else Path(folder)
    if folder is None or not folder.is_dir():
        return []
    import filelock

    with filelock.FileLock(folder / LOCK_NAME, timeout=LOCK_TIMEOUT_S):
        found = orphans(folder)
        for path in found:
            path.unlink(missing_ok=True)
    return found
