"""coursetools.jaxcache: a half-made entry of the shared compilation cache no longer stops its writes."""

from __future__ import annotations

import pytest

from coursetools import jaxcache

KEY = "jit_step-0123"


def _entry(folder, key, atime=True):
    (folder / f"{key}-cache").write_bytes(b"executable")
    if atime:
        (folder / f"{key}-atime").write_bytes((1).to_bytes(8, "little"))


def test_with_a_cap_one_orphan_stops_every_write_of_the_pinned_jax_until_it_is_removed(tmp_path):
    """What make test's capped cache does (jax-ml/jax issue 39880), and the repair."""
    from jax._src.lru_cache import LRUCache

    cache = LRUCache(str(tmp_path), max_size=4_000_000_000)  # make test's cap (Makefile, test_cache_env)
    _entry(tmp_path, "whole")
    _entry(tmp_path, KEY, atime=False)  # a process killed between the entry and its atime
    with pytest.raises(FileNotFoundError, match=f"{KEY}-atime"):
        cache.put("new", b"program")
    assert cache.get("whole") == b"executable"  # reads go on: the failure is silent
    assert jaxcache.remove_orphans(tmp_path) == [tmp_path / f"{KEY}-cache"]
    cache.put("new", b"program")
    assert cache.get("new") == b"program" and cache.get("whole") == b"executable"


def test_only_a_capped_cache_is_cleaned_from_the_environment(tmp_path, monkeypatch):
    _entry(tmp_path, KEY, atime=False)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_MAX_SIZE", raising=False)
    assert jaxcache.remove_orphans() == []  # uncapped: JAX never reads an atime, nothing to repair
    monkeypatch.setenv("JAX_COMPILATION_CACHE_MAX_SIZE", "4000000000")
    assert jaxcache.remove_orphans() == [tmp_path / f"{KEY}-cache"]
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "not-yet"))
    assert jaxcache.remove_orphans() == []


def test_the_lock_is_jaxs_own(tmp_path, monkeypatch):
    """A process between writing an entry and its atime holds the lock: its entry is not taken for an orphan."""
    import filelock

    _entry(tmp_path, KEY, atime=False)
    monkeypatch.setattr(jaxcache, "LOCK_TIMEOUT_S", 0.1)
    with filelock.FileLock(tmp_path / ".lockfile"), pytest.raises(filelock.Timeout):
        jaxcache.remove_orphans(tmp_path)
    assert (tmp_path / f"{KEY}-cache").exists()
