"""Static checks of deploy/multihost.yaml: valid, secure, and consistent with terraform, the pins and the package.

A multi-host Job fails in ways that only show after minutes of installing
on expensive nodes: a pod that asks for more GPUs than a node has stays
Pending, a process count that differs from the number of pods makes the
coordinator wait for a process that never comes, a DNS name that does not
match the Service leaves every process unable to reach the coordinator, an
environment variable the package does not read is silently ignored. Each of
these is checked here, offline, and the checks are run on broken copies too.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hcl_eval import Evaluator, parse_tfvars, validation_failures, variable_values
from infra_consistency import consistency_errors, containers, env_value
from infra_files import DEPLOY_DIR, ROOT, TERRAFORM_DIR, load_manifest
from test_infra_checkov import MIN_REASON_CHARS, checkov_binary
from test_infra_manifests import KUBERNETES_VERSIONS, NVIDIA_LIB, YAMLLINT_CONFIG

MANIFEST = DEPLOY_DIR / "multihost.yaml"
PACKAGE_MODULE = ROOT / "dpcourse" / "multihost" / "distributed.py"
PROJECT = {"project_id": "dp-course-workshop"}
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def applied_values(module) -> dict:
    """Terraform's values as `terraform apply` would use them here: terraform.tfvars over the defaults.

    terraform.tfvars is git-ignored, so CI sees the defaults; an instructor's
    machine is checked against what they will apply (the 4-GPU variant, say),
    as in test_infra_consistency.py.
    """
    tfvars = TERRAFORM_DIR / "terraform.tfvars"
    given = {}
    if tfvars.exists():
        given = {name: Evaluator({}, {}).eval(node) for name, node in parse_tfvars(tfvars).items()}
    return variable_values(module, {**PROJECT, **given})


def package_constants() -> dict[str, object]:
    """Module-level constants of dpcourse/multihost/distributed.py, read without importing it (no JAX here)."""
    tree = ast.parse(PACKAGE_MODULE.read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def by_kind(docs: list[dict]) -> dict[str, dict]:
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), f"one object of each kind expected, got {kinds}"
    return {d["kind"]: d for d in docs}


def worker(job: dict) -> dict:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def env_entry(container: dict, name: str) -> dict | None:
    return next((e for e in container.get("env", []) if e["name"] == name), None)


def multihost_errors(docs: list[dict], package: dict[str, object]) -> list[str]:
    """Every way the Job, its Service and the package's variables disagree; empty when they agree."""
    errors = []
    objects = by_kind(docs)
    job, service = objects["Job"], objects["Service"]
    spec = job["spec"]
    template = spec["template"]
    container = worker(job)
    keys = ("COORDINATOR_ENV", "NUM_PROCESSES_ENV", "PROCESS_ID_ENV", "INIT_TIMEOUT_ENV")
    names = {key: package[key] for key in keys}
    for key, name in names.items():
        if env_entry(container, name) is None:
            errors.append(f"the worker does not set {name} ({key} in dpcourse/multihost/distributed.py)")
    if errors:
        return errors
    # Process count: pods that exist == processes the coordinator waits for.
    n = int(env_value(container, names["NUM_PROCESSES_ENV"]))
    if spec.get("completionMode") != "Indexed":
        errors.append("the Job must be Indexed: the completion index is the process id")
    if not spec.get("completions") == spec.get("parallelism") == n:
        errors.append(
            f"completions ({spec.get('completions')}), parallelism ({spec.get('parallelism')}) and "
            f"{names['NUM_PROCESSES_ENV']} ({n}) must be equal: process 0 waits for {n} processes"
        )
    field = (env_entry(container, names["PROCESS_ID_ENV"]).get("valueFrom") or {}).get("fieldRef", {})
    if field.get("fieldPath") != COMPLETION_INDEX:
        errors.append(f"{names['PROCESS_ID_ENV']} must come from the completion index ({COMPLETION_INDEX})")
    # Coordinator: pod 0's name through the headless Service, on the port it serves.
    coordinator = env_value(container, names["COORDINATOR_ENV"]) or ""
    host, _, port = coordinator.rpartition(":")
    service_name = service["metadata"]["name"]
    expected_host = f"{job['metadata']['name']}-0.{service_name}"
    if host != expected_host:
        errors.append(f"{names['COORDINATOR_ENV']} host is {host!r}; pod 0 is reachable as {expected_host!r}")
    if template["spec"].get("subdomain") != service_name:
        errors.append(f"the pods' subdomain must be the Service's name {service_name!r}, or pod 0 has no DNS name")
    if service["spec"].get("clusterIP") != "None":
        errors.append("the Service must be headless (clusterIP: None) to give each pod its own DNS name")
    if not service["spec"]["selector"].items() <= template["metadata"]["labels"].items():
        errors.append("the Service does not select the Job's pods")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    container_ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    coordinator_port = ports.get("coordinator", {})
    if not port.isdigit() or int(port) != coordinator_port.get("port"):
        errors.append(
            f"{names['COORDINATOR_ENV']} port {port!r} is not the Service's coordinator port "
            f"{coordinator_port.get('port')}"
        )
    if container_ports.get(coordinator_port.get("targetPort")) != coordinator_port.get("port"):
        errors.append("the Service's coordinator targetPort does not name a container port with the same number")
    # Time: the first process waits for the last; the Job must outlive that wait.
    init_timeout = int(env_value(container, names["INIT_TIMEOUT_ENV"]))
    if not 0 < init_timeout < spec.get("activeDeadlineSeconds", 0):
        errors.append(f"{names['INIT_TIMEOUT_ENV']}={init_timeout} must be positive and below activeDeadlineSeconds")
    return errors


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return load_manifest(MANIFEST)


@pytest.fixture(scope="module")
def objects(docs) -> dict[str, dict]:
    return by_kind(docs)


@pytest.fixture(scope="module")
def job(objects) -> dict:
    return objects["Job"]


def test_kubernetes_validate_strict():
    versions = [arg for v in KUBERNETES_VERSIONS for arg in ("-k", v)]
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", *versions, str(MANIFEST)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint():
    result = subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-c", str(YAMLLINT_CONFIG), str(MANIFEST)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_checkov_finds_nothing_but_the_reasoned_skips(docs):
    result = subprocess.run(
        [
            str(checkov_binary()),
            "--file",
            str(MANIFEST),
            "--framework",
            "kubernetes",
            "--skip-download",
            "--compact",
            "--output",
            "json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(result.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["summary"]["passed"] > 0 and report["summary"]["parsing_errors"] == 0, report["summary"]
    failed = [f"{c['check_id']} {c['check_name']}: {c['resource']}" for c in report["results"]["failed_checks"]]
    assert not failed, "fix these, or skip each with its reason beside it:\n" + "\n".join(failed)
    declared = {}
    for doc in docs:
        resource = f"{doc['kind']}.{doc['metadata'].get('namespace', 'default')}.{doc['metadata']['name']}"
        for key, value in (doc["metadata"].get("annotations") or {}).items():
            if key.startswith("checkov.io/skip"):
                check_id, _, reason = value.partition("=")
                assert len(reason.strip()) >= MIN_REASON_CHARS, f"{resource} skips {check_id} without a real reason"
                declared[(resource, check_id.strip())] = reason
    reported = {(c["resource"], c["check_id"]) for c in report["results"]["skipped_checks"]}
    assert reported == set(declared), f"undeclared skips {reported - set(declared)}; unused {set(declared) - reported}"


def test_holds_a_headless_service_a_network_policy_and_an_indexed_job(objects):
    assert set(objects) == {"Service", "NetworkPolicy", "Job"}
    assert {o["metadata"]["name"] for o in objects.values()} == {"jax-multihost"}


def test_agrees_with_terraform_and_the_jax_pin(docs, tf_module, pins):
    """GPUs per pod = terraform's gpu_count, the L4 node selector, JAX_VERSION = requirements.txt."""
    values = applied_values(tf_module)
    assert consistency_errors({"multihost.yaml": docs}, values["gpu_count"], values["gpu_type"], pins["jax"]) == []


def test_process_count_service_and_package_agree(docs):
    assert multihost_errors(docs, package_constants()) == []


def test_terraform_accepts_one_node_per_process(job, tf_module):
    n = job["spec"]["completions"]
    assert n >= 2, "a multi-host Job needs at least 2 processes"
    assert validation_failures(tf_module, {**PROJECT, "gpu_node_count": n}) == {}
    header = MANIFEST.read_text().split("---", 1)[0]
    assert f"gpu_node_count={n}" in header, "the header must say how many GPU nodes to ask terraform for"


def test_one_pod_per_node(job):
    template = job["spec"]["template"]
    (term,) = template["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()


def test_fails_once_and_never_restarts_a_process(job):
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_network_policy_admits_only_the_jobs_own_pods(objects, job):
    policy = objects["NetworkPolicy"]["spec"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= labels.items()


def test_gpu_pod_has_shm_driver_path_and_the_single_node_security(job, objects):
    spec = job["spec"]["template"]["spec"]
    container = worker(job)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory", "NCCL needs a memory-backed /dev/shm"
    assert NVIDIA_LIB in (env_value(container, "LD_LIBRARY_PATH") or "").split(":")
    jupyter = {d["kind"]: d for d in load_manifest(DEPLOY_DIR / "jupyter.yaml")}["Pod"]
    assert spec["securityContext"] == {
        k: v for k, v in jupyter["spec"]["securityContext"].items() if k != "fsGroupChangePolicy"
    }
    assert spec["automountServiceAccountToken"] is False
    assert spec["nodeSelector"] == jupyter["spec"]["nodeSelector"]
    assert spec["tolerations"] == jupyter["spec"]["tolerations"]
    jupyter_images = {c["image"] for c in containers(jupyter["spec"])}
    assert {c["image"] for c in containers(spec)} == jupyter_images
    for c in containers(spec):
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        home = env_value(c, "HOME")
        assert any(home.startswith(m["mountPath"]) for m in c["volumeMounts"]), "HOME must be writable"


def test_worker_installs_the_pins_and_runs_the_package_worker(job):
    container = worker(job)
    script = container["command"][-1]
    assert '"jax[cuda12]==$JAX_VERSION" -r requirements.txt' in script
    assert "--no-deps -e ." in script
    assert re.search(r"exec python -m dpcourse\.multihost\.worker\b", script)
    refs = {
        e["name"]: e["valueFrom"]["configMapKeyRef"]
        for e in container["env"]
        if "configMapKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {
        "COURSE_REPO": {"name": "jax-course-source", "key": "repo"},
        "COURSE_REF": {"name": "jax-course-source", "key": "ref"},
    }
    # The same data in every process: a download failure must fail, not fall back to synthetic data in one pod.
    assert env_value(container, "DPCOURSE_DATA") in ("real", "synthetic")


# -- broken copies: each mistake is reported --------------------------------


def _broken(tmp_path: Path, old: str, new: str) -> list[dict]:
    text = MANIFEST.read_text()
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in multihost.yaml: update this test"
    path = tmp_path / "multihost.yaml"
    path.write_text(text.replace(old, new))
    return load_manifest(path)


@pytest.mark.parametrize(
    "old, new, fragment",
    [
        ("  completions: 2\n", "  completions: 3\n", "must be equal"),
        ("  parallelism: 2\n", "  parallelism: 1\n", "must be equal"),
        ("value: jax-multihost-0.jax-multihost:8476", "value: jax-multihost-0:8476", "pod 0 is reachable as"),
        ("value: jax-multihost-0.jax-multihost:8476", "value: jax-multihost-0.jax-multihost:1234", "port '1234'"),
        ("      subdomain: jax-multihost\n", "", "subdomain"),
        ("  clusterIP: None\n", "", "headless"),
        ("job-completion-index", "job-index", "completion index"),
        ("  completionMode: Indexed\n", "", "must be Indexed"),
        ('value: "900"', 'value: "7200"', "below activeDeadlineSeconds"),
        ("name: DPCOURSE_NUM_PROCESSES", "name: NUM_PROCESSES", "does not set DPCOURSE_NUM_PROCESSES"),
    ],
)
def test_each_inconsistency_is_caught(tmp_path, old, new, fragment):
    errors = multihost_errors(_broken(tmp_path, old, new), package_constants())
    assert any(fragment in e for e in errors), errors


def test_four_gpus_against_the_two_gpu_pool_is_caught(tmp_path, tf_module, pins):
    values = variable_values(tf_module, PROJECT)
    broken = _broken(tmp_path, "nvidia.com/gpu: 2", "nvidia.com/gpu: 4")
    errors = consistency_errors({"multihost.yaml": broken}, values["gpu_count"], values["gpu_type"], pins["jax"])
    assert any("nvidia.com/gpu: 4" in e and "Pending" in e for e in errors), errors


def test_jax_version_drift_is_caught(tmp_path, tf_module, pins):
    values = variable_values(tf_module, PROJECT)
    broken = _broken(tmp_path, f'value: "{pins["jax"]}"', 'value: "0.9.2"')
    errors = consistency_errors({"multihost.yaml": broken}, values["gpu_count"], values["gpu_type"], pins["jax"])
    assert any("0.9.2" in e for e in errors), errors


def test_package_constants_are_read():
    constants = package_constants()
    assert constants["COORDINATOR_ENV"] == "DPCOURSE_COORDINATOR"
    assert constants["PROCESS_ID_ENV"] == "DPCOURSE_PROCESS_ID"
