"""Finding the system Chromium; CI detection."""

from __future__ import annotations

import os

import pytest
from chromium import CHROMIUM_ENV, find_chromium, in_ci, missing_message


def test_env_names_the_browser(tmp_path, monkeypatch):
    fake = tmp_path / "my-chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(CHROMIUM_ENV, str(fake))
    assert find_chromium() == fake


def test_a_wrong_env_path_is_an_error_not_a_skip(tmp_path, monkeypatch):
    monkeypatch.setenv(CHROMIUM_ENV, str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match=CHROMIUM_ENV):
        find_chromium()


def test_none_on_an_empty_path(tmp_path, monkeypatch):
    monkeypatch.delenv(CHROMIUM_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_chromium() is None
    assert "apt-get install chromium" in missing_message()


def test_found_on_path(tmp_path, monkeypatch):
    monkeypatch.delenv(CHROMIUM_ENV, raising=False)
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    assert find_chromium() == fake


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("1", True), ("", False), ("false", False)])
def test_in_ci(monkeypatch, value, expected):
    monkeypatch.setenv("CI", value)
    assert in_ci() is expected
