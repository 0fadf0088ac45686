"""terraform/, deploy/ and requirements.txt agree, and a bad edit to any of them is caught.

The mutation tests break a copy of a real file the way a hurried edit would
(4 GPUs in the manifest against a 2-GPU node pool, a JAX version that drifts
from the pin, a default that no longer matches its machine type) and check
that the same functions the real-file tests use report it.
"""

from __future__ import annotations

import shutil

import pytest
from hcl_eval import Evaluator, Module, parse_tfvars, validation_failures, variable_values
from infra_consistency import consistency_errors, gpu_requests
from infra_files import DEPLOY_DIR, MANIFESTS, ROOT, TERRAFORM_DIR, load_manifest, read_pins

PROJECT = {"project_id": "dp-course-workshop"}


def _defaults(module: Module) -> dict:
    return variable_values(module, PROJECT)


def _effective(module: Module) -> tuple[dict, str]:
    """The values terraform apply would use here: terraform.tfvars over the defaults.

    terraform.tfvars is git-ignored, so CI always sees the defaults; on an
    instructor's machine the check follows what they will actually apply
    (the 4-GPU variant, for instance).
    """
    tfvars = TERRAFORM_DIR / "terraform.tfvars"
    if not tfvars.exists():
        return _defaults(module), "defaults in terraform/variables.tf"
    given = {name: Evaluator({}, {}).eval(node) for name, node in parse_tfvars(tfvars).items()}
    return variable_values(module, {**PROJECT, **given}), "terraform/terraform.tfvars over the defaults"


def _check(manifests: dict, module: Module, pins: dict, values: dict | None = None) -> list[str]:
    values = values or _defaults(module)
    return consistency_errors(manifests, values["gpu_count"], values["gpu_type"], pins["jax"])


def test_manifests_agree_with_terraform_and_the_pins(manifests, tf_module, pins):
    values, source = _effective(tf_module)
    assert _check(manifests, tf_module, pins, values) == [], f"terraform values from {source}"


def test_both_manifests_request_the_terraform_gpu_count(manifests, tf_module):
    values, source = _effective(tf_module)
    for name in MANIFESTS:
        requests = gpu_requests(manifests[name])
        assert requests, f"{name} requests no GPUs"
        assert {count for _, count in requests} == {values["gpu_count"]}, f"gpu_count from {source}"


def test_requirements_pin_jax_and_jaxlib_together(pins):
    assert pins["jax"] == pins["jaxlib"], "jax and jaxlib must be pinned to the same version"
    assert "jupyterlab" in pins, "the GKE pod runs the JupyterLab that requirements.txt pins"


def test_infra_requirements_share_pytest_with_the_dev_requirements():
    infra, dev = read_pins(ROOT / "requirements-infra.txt"), read_pins(ROOT / "requirements-dev.txt")
    assert infra["pytest"] == dev["pytest"], "one pytest for every test layer"


def test_job_installs_the_dev_requirements_that_pin_nbmake():
    dev = read_pins(ROOT / "requirements-dev.txt")
    assert "nbmake" in dev and "pytest" in dev
    assert "-r requirements.txt" in (ROOT / "requirements-dev.txt").read_text()


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times: update this test with the file"
    return text.replace(old, new)


def _mutated_manifests(tmp_path, file_name: str, old: str, new: str) -> dict[str, list[dict]]:
    text = (DEPLOY_DIR / file_name).read_text()
    assert text.count(old) >= 1, f"{old!r} not found in {file_name}: update this test with the manifest"
    broken = tmp_path / file_name
    broken.write_text(text.replace(old, new))
    return {name: load_manifest(broken if name == file_name else DEPLOY_DIR / name) for name in MANIFESTS}


@pytest.mark.parametrize("file_name", MANIFESTS)
def test_four_gpus_in_a_manifest_against_the_two_gpu_pool_is_caught(tmp_path, tf_module, pins, file_name):
    broken = _mutated_manifests(tmp_path, file_name, "nvidia.com/gpu: 2", "nvidia.com/gpu: 4")
    errors = _check(broken, tf_module, pins)
    assert errors and all(file_name in e for e in errors), errors
    assert any("nvidia.com/gpu: 4" in e and "gpu_count = 2" in e and "Pending" in e for e in errors), errors


def test_four_gpu_variant_edited_on_both_sides_is_consistent(tmp_path, pins):
    """The GKE guide's 4-GPU recipe (docs/gke.md): g2-standard-48, gpu_count = 4, 4 GPUs in both manifests."""
    workdir = tmp_path / "terraform"
    shutil.copytree(TERRAFORM_DIR, workdir, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    variables = workdir / "variables.tf"
    text = variables.read_text()
    # machine_type's own block (shared_gpu_machine_type has the same default).
    head, block, tail = text.partition('variable "machine_type" {')
    body, end, rest = tail.partition("\n}\n")
    body = _replace_once(body, 'default     = "g2-standard-24"', 'default     = "g2-standard-48"')
    text = _replace_once(head + block + body + end + rest, "default     = 2\n", "default     = 4\n")
    variables.write_text(text)
    module = Module.load(workdir)
    assert validation_failures(module, PROJECT) == {}
    assert _defaults(module)["gpu_count"] == 4
    manifests = {}
    for name in MANIFESTS:
        (tmp_path / name).write_text((DEPLOY_DIR / name).read_text().replace("nvidia.com/gpu: 2", "nvidia.com/gpu: 4"))
        manifests[name] = load_manifest(tmp_path / name)
    assert _check(manifests, module, pins) == []
    # ...and forgetting the manifests in that recipe is caught.
    original = {name: load_manifest(DEPLOY_DIR / name) for name in MANIFESTS}
    assert len(_check(original, module, pins)) == len(MANIFESTS)


@pytest.mark.parametrize("file_name", MANIFESTS)
def test_jax_version_drift_is_caught(tmp_path, tf_module, pins, file_name):
    broken = _mutated_manifests(tmp_path, file_name, f'value: "{pins["jax"]}"', 'value: "0.9.2"')
    errors = _check(broken, tf_module, pins)
    assert any("0.9.2" in e and f"jax=={pins['jax']}" in e for e in errors), errors


def test_wrong_accelerator_selector_is_caught(tmp_path, tf_module, pins):
    broken = _mutated_manifests(
        tmp_path, "jupyter.yaml", "gke-accelerator: nvidia-l4", "gke-accelerator: nvidia-tesla-t4"
    )
    errors = _check(broken, tf_module, pins)
    assert any("nvidia-tesla-t4" in e for e in errors), errors
