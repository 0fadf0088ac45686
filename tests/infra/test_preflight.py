"""tools/preflight.py (make preflight): the GPU quotas against terraform.tfvars, with a stand-in gcloud on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from infra_files import ROOT

SCRIPT = ROOT / "tools" / "preflight.py"

STAND_IN = """#!{python}
# A stand-in for gcloud: answers the two describe commands from JSON files.
import json, os, sys
from pathlib import Path
folder = Path(os.environ["FAKE_GCLOUD_DIR"])
with (folder / "calls.log").open("a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if (folder / "fail").exists():
    sys.stderr.write((folder / "fail").read_text())
    sys.exit(1)
args = sys.argv[1:]
if args[:3] == ["compute", "regions", "describe"]:
    print((folder / ("region-" + args[3] + ".json")).read_text())
elif args[:3] == ["compute", "project-info", "describe"]:
    print((folder / "project.json").read_text())
else:
    sys.stderr.write("stand-in gcloud: unexpected command " + " ".join(args) + "\\n")
    sys.exit(2)
"""


def quotas(**metrics) -> str:
    return json.dumps(
        {"name": "x", "quotas": [{"metric": m, "limit": lim, "usage": use} for m, (lim, use) in metrics.items()]}
    )


@pytest.fixture()
def gcloud(tmp_path):
    """A folder with the stand-in gcloud first on PATH; returns (folder, environment)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "gcloud"
    fake.write_text(STAND_IN.format(python=sys.executable))
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", FAKE_GCLOUD_DIR=str(tmp_path))
    (tmp_path / "region-us-central1.json").write_text(quotas(NVIDIA_L4_GPUS=(8, 0), CPUS=(24, 0)))
    (tmp_path / "project.json").write_text(quotas(GPUS_ALL_REGIONS=(8, 0)))
    return tmp_path, env


def run(tmp_path: Path, env: dict, tfvars_text: str | None) -> subprocess.CompletedProcess:
    tfvars = tmp_path / "terraform.tfvars"
    if tfvars_text is not None:
        tfvars.write_text(tfvars_text)
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(tfvars)], capture_output=True, text=True, env=env, timeout=60
    )


BASE = 'project_id = "dp-course-workshop"\n'


def test_enough_quota_passes_and_asks_gcloud_for_the_region_and_project(gcloud):
    folder, env = gcloud
    result = run(folder, env, BASE)
    assert result.returncode == 0, result.stderr
    assert "1 node(s) x 2 L4 GPU(s) = 2 GPUs" in result.stdout and "go on with terraform apply" in result.stdout
    calls = (folder / "calls.log").read_text()
    assert "compute regions describe us-central1 --project=dp-course-workshop --format=json" in calls
    assert "compute project-info describe --project=dp-course-workshop --format=json" in calls


def test_short_regional_quota_names_it_with_needed_and_available(gcloud):
    folder, env = gcloud
    (folder / "region-europe-west4.json").write_text(quotas(NVIDIA_L4_GPUS=(4, 1)))
    tfvars = BASE + 'region = "europe-west4"\nzone = "europe-west4-a"\ngpu_node_count = 2\n'
    result = run(folder, env, tfvars)
    assert result.returncode == 1
    assert "Quota NVIDIA_L4_GPUS (region europe-west4) is short: needed 4 GPUs, available 3" in result.stderr
    assert "(limit 4, in use 1)" in result.stderr and "Request at least 5" in result.stderr
    assert "IAM & Admin > Quotas" in result.stderr
    assert "GPUS_ALL_REGIONS" not in result.stderr  # that one has 8


def test_short_project_quota_of_a_new_project(gcloud):
    folder, env = gcloud
    (folder / "project.json").write_text(quotas(GPUS_ALL_REGIONS=(0, 0)))
    result = run(folder, env, BASE + 'machine_type = "g2-standard-48"\ngpu_count = 4\n')
    assert result.returncode == 1
    assert "Quota GPUS_ALL_REGIONS (project dp-course-workshop) is short: needed 4 GPUs, available 0" in result.stderr


def test_spot_nodes_use_the_preemptible_quota(gcloud):
    folder, env = gcloud
    result = run(folder, env, BASE + "spot = true\n")
    assert result.returncode == 1  # the region lists no PREEMPTIBLE_NVIDIA_L4_GPUS: none granted
    assert "Quota PREEMPTIBLE_NVIDIA_L4_GPUS (region us-central1) is short: needed 2 GPUs, available 0" in result.stderr


def test_gcloud_failure_is_reported_with_what_to_check(gcloud):
    folder, env = gcloud
    (folder / "fail").write_text("ERROR: (gcloud.compute.regions.describe) You do not currently have an active account")
    result = run(folder, env, BASE)
    assert result.returncode == 2
    assert "active account" in result.stderr and "gcloud auth login" in result.stderr


def test_without_gcloud_or_tfvars_it_says_what_to_do(tmp_path):
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # no gcloud there
    result = run(tmp_path, env, None)
    assert result.returncode == 2 and "cp terraform/terraform.tfvars.example" in result.stderr
    result = run(tmp_path, env, BASE)
    assert result.returncode == 2 and "gcloud is not on PATH" in result.stderr
    result = run(tmp_path, env, 'region = "us-central1"\n')
    assert result.returncode == 2 and "does not set project_id" in result.stderr
