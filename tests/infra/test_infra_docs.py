"""The GKE guide (docs/gke.md) matches terraform/ and deploy/; the README links to every guide.

The guide is the part an instructor follows line by line; these checks catch
it drifting from the files it describes: a renamed output, pod or ConfigMap,
an API added to Terraform but not to the enable command, a missing step.
"""

from __future__ import annotations

import re

import pytest
from hcl_eval import Evaluator
from infra_files import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
GKE_GUIDE = DOCS / "gke.md"


@pytest.fixture(scope="module")
def guide() -> str:
    """The whole GKE guide."""
    assert GKE_GUIDE.is_file(), "docs/gke.md (the GKE guide) is missing"
    return GKE_GUIDE.read_text()


def test_section_heading(guide):
    assert guide.startswith("# Run it on GKE\n")


def test_readme_links_every_guide_and_every_link_resolves():
    text = README.read_text()
    for name in ("docs/gke.md", "docs/multihost.md", "docs/tpu.md", "docs/troubleshooting.md", "LICENSE"):
        assert f"]({name})" in text, f"README.md does not link {name}"
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links {target}, which does not exist"


def test_readme_stays_a_front_door():
    assert len(README.read_text().splitlines()) <= 250, "README.md is over 250 lines: move detail into docs/"


def test_enable_command_covers_every_api_terraform_needs(guide, tf_module):
    command = re.search(r"gcloud services enable (.*?)\n```", guide, re.S)
    assert command, "the guide must enable the APIs with gcloud services enable"
    enabled = set(re.findall(r"[a-z]+\.googleapis\.com", command.group(1)))
    required = set(Evaluator({}, tf_module.local_expressions).local("required_apis"))
    assert required <= enabled, f"missing from the guide: {sorted(required - enabled)}"


def test_terraform_outputs_used_exist(guide, tf):
    outputs = {name for entry in tf["outputs.tf"]["output"] for name in entry}
    used = set(re.findall(r"terraform output -raw (\w+)", guide))
    assert used and used <= outputs, f"unknown outputs: {used - outputs}"


def test_kubernetes_names_match_the_manifests(guide, manifests):
    names = {doc["metadata"]["name"] for docs in manifests.values() for doc in docs}
    for name in ("jax-jupyter", "jax-jupyter-svc", "jax-notebook-tests", "jax-jupyter-workspace"):
        assert name in names, f"{name} is not in deploy/"
    referenced = set(re.findall(r"(?:pod|service|job)/([a-z0-9-]+)", guide))
    referenced |= set(
        re.findall(r"kubectl (?:logs|exec|delete pod|get pod|describe pod)(?: -f)? (jax-[a-z0-9-]+)", guide)
    )
    assert referenced and referenced <= names, f"the guide names objects deploy/ does not have: {referenced - names}"
    init_names = {
        c["name"]
        for docs in manifests.values()
        for d in docs
        if d["kind"] == "Pod"
        for c in d["spec"]["initContainers"]
    }
    for container in re.findall(r"-c ([a-z-]+)", guide):
        assert container in init_names, f"the guide reads the log of container {container}, which does not exist"


def test_configmap_matches_what_the_pods_read(guide, manifests):
    keys = set()
    for docs in manifests.values():
        for doc in docs:
            spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else doc.get("spec", {})
            for container in spec.get("initContainers", []) + spec.get("containers", []):
                for env in container.get("env", []):
                    ref = env.get("valueFrom", {}).get("configMapKeyRef")
                    if ref:
                        keys.add((ref["name"], ref["key"]))
    for name, key in keys:
        assert f"kubectl create configmap {name}" in guide
        assert f"--from-literal={key}=" in guide


def test_every_step_is_there(guide):
    steps = [
        "gcloud services enable",
        "cp terraform/terraform.tfvars.example terraform/terraform.tfvars",
        "terraform init",
        "terraform apply",
        "get_credentials_command",
        "kubectl apply -f deploy/jupyter.yaml",
        "kubectl wait --for=condition=Ready pod/jax-jupyter",
        "grep -o 'token=[a-z0-9]*'",
        "jupyter server list",
        "kubectl port-forward service/jax-jupyter-svc 8884:8884",
        "loadBalancerSourceRanges",
        "kubectl apply -f deploy/notebook-tests.yaml",
        "kubectl delete -f deploy/jupyter.yaml",
        "terraform destroy",
        "gcloud container clusters list",
    ]
    positions = [guide.find(step) for step in steps]
    missing = [step for step, at in zip(steps, positions, strict=True) if at < 0]
    assert not missing, f"missing from the guide: {missing}"
    cleanup = guide[guide.index("## Clean up") :]
    assert 0 <= cleanup.find("kubectl delete -f deploy/jupyter.yaml") < cleanup.find("terraform destroy"), (
        "delete the manifests (disk, load balancer) before destroying the cluster"
    )


def test_four_gpu_variant(guide):
    section = guide[guide.index("## The 4-GPU variant") :]
    section = section[: section.index("\n## ", 1)]
    for text in (
        'machine_type = "g2-standard-48"',
        "gpu_count = 4",
        "nvidia.com/gpu: 4",
        "kubectl delete pod jax-jupyter",
    ):
        assert text in section


def test_troubleshooting_covers_the_known_failures(guide):
    section = guide[guide.index("## Troubleshooting") :]
    for text in (
        "NVIDIA_L4_GPUS",
        "accelerator-types list",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "Insufficient nvidia.com/gpu",
        "No token in the log",
        "/dev/shm",
    ):
        assert text in section, f"troubleshooting lacks {text!r}"


# Node-pool attributes the google provider marks ForceNew: changing one and
# running `terraform apply` replaces the node pool, and the bare lab pod with it.
FORCE_NEW = ("gpu_driver_version", "machine_type", "gpu_count", "spot", "disk_size_gb", "gpu_type")
_SETTING = re.compile(r"`(" + "|".join(FORCE_NEW) + r")\s*=")


def _paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks; a list item's continuation stays in its block."""
    return [block for block in re.split(r"\n\s*\n", text) if block.strip()]


def force_new_instructions_without_warning(text: str) -> list[str]:
    """Blocks that tell the reader to set a ForceNew attribute and apply, without saying what that replaces.

    A block (with the two that follow it: a command, a note) must say that it
    "replaces the node pool" and that the lab pod is re-applied
    (``kubectl apply -f deploy/jupyter.yaml``).
    """
    blocks = _paragraphs(text)
    missing = []
    for i, block in enumerate(blocks):
        if not _SETTING.search(block.replace("\n", " ")):
            continue
        window = " ".join(blocks[i : i + 3]).replace("\n", " ")
        if "terraform apply" not in window:
            continue
        if "replaces the node pool" not in window or "kubectl apply -f deploy/jupyter.yaml" not in window:
            missing.append(block.strip()[:160])
    return missing


def test_every_force_new_instruction_says_the_node_pool_and_lab_pod_are_replaced():
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        missing = force_new_instructions_without_warning(page.read_text())
        assert not missing, (
            f"{page.name}: an instruction sets a ForceNew node-pool attribute and runs terraform apply without "
            f"saying that this replaces the node pool and that the lab pod must be re-applied: {missing}"
        )


def test_the_force_new_check_catches_the_old_wording():
    old = (
        "**Compilation warns that the driver is older than ptxas**: `gpu_driver_version =\n"
        '"LATEST"` in `terraform.tfvars` and `terraform apply` install a newer driver.'
    )
    assert force_new_instructions_without_warning(old)
    fixed = old + " This replaces the node pool; re-apply the lab with `kubectl apply -f deploy/jupyter.yaml`."
    assert not force_new_instructions_without_warning(fixed)
    assert not force_new_instructions_without_warning("Set `gpu_node_count = 2` and run `terraform apply`.")


def test_the_tpu_guide_names_what_the_course_has():
    """docs/tpu.md's functions and commands are the course's own: a rename breaks the guide, not a learner."""
    import importlib

    text = (DOCS / "tpu.md").read_text()
    names = set(re.findall(r"`(dpcourse(?:\.\w+)+)`", text))
    assert {"dpcourse.backend.chips.describe", "dpcourse.backend.chips.held_message"} <= names
    for name in names:
        module, _, attribute = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attribute), f"docs/tpu.md names {name}, which does not exist"
    for lesson in re.findall(r"notebooks/(\d\d_\w+)\.py", text):
        assert (ROOT / "notebooks" / f"{lesson}.py").is_file(), f"docs/tpu.md names {lesson}, which does not exist"
    pin = re.search(r"^jax==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    assert text.count(f'"jax[tpu]=={pin}"') >= 3, f"docs/tpu.md installs another JAX than the pin {pin}"
