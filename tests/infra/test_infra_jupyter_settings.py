"""The GKE pod serves the course with the repository's JupyterLab settings, as `make lab` does."""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from infra_consistency import env_value
from infra_files import DEPLOY_DIR, ROOT, load_manifest


def _jupyter_container() -> dict:
    pod = next(d for d in load_manifest(DEPLOY_DIR / "jupyter.yaml") if d["kind"] == "Pod")
    return next(c for c in pod["spec"]["containers"] if c["name"] == "jupyter")


def test_pod_reads_the_course_settings_from_the_served_repository():
    container = _jupyter_container()
    root = next(a.split("=", 1)[1] for a in container["command"] if a.startswith("--ServerApp.root_dir="))
    config_path = env_value(container, "JUPYTER_CONFIG_PATH")
    assert config_path, "the jupyter container sets no JUPYTER_CONFIG_PATH"
    # The lab serves the learner's workspace inside the clone (/workspace); the settings are the clone's.
    clone = PurePosixPath("/workspace")
    assert PurePosixPath(root).is_relative_to(clone)
    folder = PurePosixPath(config_path).relative_to(clone)
    assert (ROOT / folder / "jupyter_server_config.py").is_file()
    overrides = json.loads((ROOT / folder / "labconfig" / "default_setting_overrides.json").read_text())
    assert overrides["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]["python"] == "Jupytext Notebook"
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    assert f"$(CURDIR)/{folder}" in (ROOT / "Makefile").read_text(), "make lab must use the same folder"


def test_pod_serves_the_workspace_that_its_init_container_makes():
    pod = next(d for d in load_manifest(DEPLOY_DIR / "jupyter.yaml") if d["kind"] == "Pod")
    (init,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "make-workspace"]
    command = init["command"]
    assert command[1:5] == ["-m", "coursetools", "workspace", "init"], command
    served = next(a.split("=", 1)[1] for a in _jupyter_container()["command"] if a.startswith("--ServerApp.root_dir="))
    assert command[command.index("--dir") + 1] == served


def test_pod_kernels_do_not_preallocate_gpu_memory():
    assert env_value(_jupyter_container(), "XLA_PYTHON_CLIENT_PREALLOCATE") == "false"
