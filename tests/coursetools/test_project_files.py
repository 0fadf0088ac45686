"""The files a fork relies on: license, workflows, pre-commit hooks and the committed GPU baseline agree with the project."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
# md5 of the Apache License 2.0 text as the Apache Software Foundation
# publishes it (LICENSE-2.0.txt), the same bytes JAX ships.
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"


def _workflow(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def _run_lines(workflow: dict) -> str:
    return "\n".join(step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"])


def test_license_is_the_apache_2_text_and_the_metadata_says_so():
    assert hashlib.md5((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_MD5
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]


def test_ci_runs_make_test_for_both_environments_and_keeps_results():
    ci = _workflow("ci.yml")
    assert {"push", "pull_request"} <= set(ci[True])  # PyYAML reads the key `on` as True
    job = ci["jobs"]["test"]
    matrix = job["strategy"]["matrix"]["include"]
    assert {(m["python"], m["target"]) for m in matrix} == {("3.11", "test-pinned"), ("3.12", "test-newest")}
    assert "make ${{ matrix.target }}" in _run_lines(ci)
    uses = {step.get("uses", "").split("@")[0]: step for step in job["steps"]}
    assert uses["actions/setup-python"]["with"]["cache"] == "pip"
    assert uses["actions/upload-artifact"]["with"]["path"] == "results/"
    assert uses["actions/upload-artifact"]["if"] == "always()"


def test_weekly_run_takes_the_newest_jax_without_pins():
    weekly = _workflow("weekly.yml")
    assert weekly[True]["schedule"][0]["cron"]
    assert re.search(r"pip install --upgrade jax jaxlib", _run_lines(weekly))


def test_gpu_workflow_compares_with_a_committed_baseline():
    gpu = _workflow("gpu.yml")
    job = gpu["jobs"]["course-on-gpu"]
    assert "gpu" in job["runs-on"] and "self-hosted" in job["runs-on"]
    assert set(gpu[True]) == {"workflow_dispatch", "push"} and gpu[True]["push"]["tags"]
    default = gpu[True]["workflow_dispatch"]["inputs"]["baseline"]["default"]
    assert (ROOT / default).is_file() and default in job["env"]["BASELINE"]
    runs = _run_lines(gpu)
    assert "make course PROFILE=full" in runs
    assert 'python -m coursetools compare "$BASELINE" results/full/results.json' in runs


def test_tpu_workflow_runs_the_one_command_and_compares_when_a_baseline_is_committed():
    tpu = _workflow("tpu.yml")
    job = tpu["jobs"]["course-on-tpu"]
    assert "tpu" in job["runs-on"] and "self-hosted" in job["runs-on"]
    assert set(tpu[True]) == {"workflow_dispatch", "push"} and tpu[True]["push"]["tags"]
    default = tpu[True]["workflow_dispatch"]["inputs"]["baseline"]["default"]
    assert default in job["env"]["BASELINE"] and job["env"]["DPCOURSE_DATA"] == "synthetic"
    runs = _run_lines(tpu)
    assert "make tpu-check" in runs and 'python -m coursetools compare "$BASELINE"' in runs
    makefile = (ROOT / "Makefile").read_text()
    assert "\ntpu-check:" in makefile and "-m coursetools.tpucheck" in makefile


def test_pre_commit_runs_the_pinned_ruff_and_the_notebook_checks():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert {"ruff-check", "ruff-format", "notebook-pairs-in-sync", "notebooks-without-outputs"} <= set(hooks)
    assert hooks["ruff-check"]["entry"].startswith(".venv/bin/ruff")  # the version in requirements-dev.txt
    assert "ruff==" in (ROOT / "requirements-dev.txt").read_text()
    for hook_id, test in (
        ("notebook-pairs-in-sync", "test_pair_in_sync"),
        ("notebooks-without-outputs", "test_committed_notebook_has_no_outputs"),
    ):
        assert test in hooks[hook_id]["entry"]
        assert f"def {test}(" in (ROOT / "tests" / "lessons" / "test_notebooks.py").read_text()
