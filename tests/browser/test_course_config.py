"""jupyter/jupyter_server_config.py: what it sets, and that a learner's own value wins."""

from __future__ import annotations

import os

import pytest
from labserver import COURSE_CONFIG
from traitlets.config.loader import PyFileConfigLoader


def _load():
    return PyFileConfigLoader("jupyter_server_config.py", path=str(COURSE_CONFIG)).load_config()


def test_kernels_get_preallocation_off_by_default(monkeypatch):
    # setenv first, so that the value the config adds is removed afterwards.
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "unset-by-test")
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
    config = _load()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert config.LabApp.news_url is None
    assert config.LabApp.check_for_updates_class == "jupyterlab.NeverCheckForUpdate"


@pytest.mark.parametrize("value", ["true", ".5"])
def test_the_learners_setting_is_kept(monkeypatch, value):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", value)
    _load()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == value


def test_token_authentication_is_not_turned_off():
    config = _load()
    assert "token" not in config.get("IdentityProvider", {})
    assert "token" not in config.get("ServerApp", {})
    assert config.get("ServerApp", {}).get("ip") in (None, "127.0.0.1", "localhost")
