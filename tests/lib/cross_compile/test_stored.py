"""dpcourse.cross_compile.stored: the compiles make placement stored, read back labelled as stored."""

from __future__ import annotations

import pytest

from dpcourse.cross_compile import stored
from dpcourse.cross_compile.compile import COURSE_STEPS, Job


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_each_stored_file_says_who_made_it_when_and_with_which_jax(platform):
    payload = stored.stored_payload(platform)
    results = stored.stored_results(platform)
    assert payload["made_by"] == "make placement" and payload["date"][:2] == "20" and payload["jax_version"]
    assert results and all(r.stored == f"make placement, {payload['date']}" for r in results)
    assert {r.backend for r in results} == {platform}
    assert all(r.label.endswith(f", stored (make placement, {payload['date']}, JAX {r.jax_version})") for r in results)


def test_both_files_are_read_when_no_platform_is_named():
    assert {r.backend for r in stored.stored_results()} == {"gpu", "tpu"}


def test_a_profile_that_was_not_stored_falls_back_to_the_smoke_one_of_the_same_slice():
    (res,) = stored.find_stored([Job("tpu", "v6e_16x16", 256, "cpu")], COURSE_STEPS)
    assert (res.target, res.n_devices, res.profile) == ("v6e_16x16", 256, "smoke")
    assert list(res.steps) == list(COURSE_STEPS)
    # A step nobody stored is left out, not made up.
    assert stored.find_stored([Job("tpu", "v5e_2x4", 8, "smoke")], {"nosuch": "m:f"}) == []


def test_a_broken_install_is_one_sentence_naming_the_file(monkeypatch):
    monkeypatch.setattr(stored, "STORED_FILES", {"tpu": ("cross_compile", "stored", "missing.json")})
    with pytest.raises(
        ValueError, match=r"^The stored compile cross_compile/stored/missing.json cannot be read .*reinstall"
    ):
        stored.stored_payload("tpu")
