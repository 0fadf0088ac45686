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
    (tmp_path / "region-us-central1.json").write_text(quotas(NVIDIA_L4_GPUS=(8, 0), CPUS=(96, 0)))
    (tmp_path / "project.json").write_text(quotas(GPUS_ALL_REGIONS=(8, 0), CPUS_ALL_REGIONS=(200, 0)))
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


def test_spot_without_preemptible_quota_uses_the_standard_quota_and_passes(gcloud):
    # no PREEMPTIBLE_NVIDIA_L4_GPUS listed, 8 standard L4 free.
    folder, env = gcloud
    result = run(folder, env, BASE + "spot = true\n")
    assert result.returncode == 0, result.stderr
    assert "Spot nodes use it because no PREEMPTIBLE_NVIDIA_L4_GPUS quota is granted there" in result.stdout
    assert "go on with terraform apply" in result.stdout


def test_spot_with_preemptible_quota_listed_at_zero_still_uses_the_standard_quota(gcloud):
    folder, env = gcloud
    (folder / "region-us-central1.json").write_text(
        quotas(NVIDIA_L4_GPUS=(8, 0), PREEMPTIBLE_NVIDIA_L4_GPUS=(0, 0), CPUS=(96, 0))
    )
    result = run(folder, env, BASE + "spot = true\n")
    assert result.returncode == 0, result.stderr


def test_spot_real_shortage_names_the_standard_quota_that_applies(gcloud):
    folder, env = gcloud
    (folder / "region-us-central1.json").write_text(quotas(NVIDIA_L4_GPUS=(2, 1), CPUS=(96, 0)))
    result = run(folder, env, BASE + "spot = true\n")
    assert result.returncode == 1
    assert (
        "Quota NVIDIA_L4_GPUS (region us-central1; Spot nodes use it because no PREEMPTIBLE_NVIDIA_L4_GPUS"
        in result.stderr
    )
    assert "needed 2 GPUs, available 1" in result.stderr


def test_spot_with_granted_preemptible_quota_is_checked_against_it(gcloud):
    folder, env = gcloud
    (folder / "region-us-central1.json").write_text(
        quotas(NVIDIA_L4_GPUS=(8, 0), PREEMPTIBLE_NVIDIA_L4_GPUS=(1, 0), CPUS=(96, 0))
    )
    result = run(folder, env, BASE + "spot = true\n")
    assert result.returncode == 1
    assert "Quota PREEMPTIBLE_NVIDIA_L4_GPUS (region us-central1) is short: needed 2 GPUs, available 1" in result.stderr
    assert "Quota NVIDIA_L4_GPUS" not in result.stderr


def test_the_time_shared_pool_counts_at_its_maximum(gcloud):
    folder, env = gcloud
    result = run(folder, env, BASE + "shared_gpu_max_node_count = 4\n")
    assert result.returncode == 1  # 2 + 4 x 2 = 10 GPUs, 8 in each quota
    assert "up to 4 node(s) x 2 L4 GPU(s) = 8 GPUs (4 learners per GPU)" in result.stdout
    assert "Quota NVIDIA_L4_GPUS (region us-central1) is short: needed 10 GPUs, available 8" in result.stderr
    assert "Quota GPUS_ALL_REGIONS (project dp-course-workshop) is short: needed 10 GPUs" in result.stderr
    result = run(folder, env, BASE + "shared_gpu_max_node_count = 3\n")
    assert result.returncode == 0, result.stderr


def test_the_cpu_pool_counts_against_the_vcpu_quotas(gcloud):
    folder, env = gcloud
    (folder / "region-us-central1.json").write_text(quotas(NVIDIA_L4_GPUS=(8, 0), CPUS=(48, 8)))
    result = run(folder, env, BASE + "cpu_max_node_count = 6\n")
    assert result.returncode == 1  # 6 x e2-standard-8 = 48 vCPUs, 40 free
    assert "Quota CPUS (region us-central1) is short: needed 48 vCPUs, available 40" in result.stderr
    result = run(folder, env, BASE + 'cpu_max_node_count = 6\ncpu_machine_type = "n2-standard-8"\n')
    assert result.returncode == 0, result.stderr  # N2 uses N2_CPUS, not listed here: not checked
    (folder / "region-us-central1.json").write_text(quotas(NVIDIA_L4_GPUS=(8, 0), CPUS=(96, 0), N2_CPUS=(24, 0)))
    result = run(folder, env, BASE + 'cpu_max_node_count = 6\ncpu_machine_type = "n2-standard-8"\n')
    assert result.returncode == 1
    assert "Quota N2_CPUS (region us-central1) is short: needed 48 vCPUs, available 24" in result.stderr
    # CPUS_ALL_REGIONS covers every pool: 5 x 8 (CPU pool) + 24 (one g2-standard-24) = 64.
    (folder / "project.json").write_text(quotas(GPUS_ALL_REGIONS=(8, 0), CPUS_ALL_REGIONS=(64, 0)))
    assert run(folder, env, BASE + "cpu_max_node_count = 5\n").returncode == 0
    result = run(folder, env, BASE + "cpu_max_node_count = 6\n")
    assert result.returncode == 1
    assert (
        "Quota CPUS_ALL_REGIONS (project dp-course-workshop) is short: needed 72 vCPUs, available 64" in result.stderr
    )


def test_g2_gpu_counts_match_terraform():
    import importlib.util

    import hcl2

    spec = importlib.util.spec_from_file_location("preflight", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["preflight"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    with (ROOT / "terraform" / "locals.tf").open() as handle:
        (locals_block,) = [b for b in hcl2.load(handle)["locals"] if "g2_gpus_per_machine_type" in b]
    table = {k.strip('"'): v for k, v in locals_block["g2_gpus_per_machine_type"].items()}
    assert table == module.G2_GPUS
