"""Static checks of the multi-host Jobs: deploy/multihost.yaml (notebook 08) and deploy/multihost-checkpoint.yaml (notebook 11).

A multi-host Job fails in ways that only show after minutes of installing
on expensive nodes: a pod that asks for more GPUs than a node has stays
Pending, a process count that differs from the number of pods makes the
coordinator wait for a process that never comes, a DNS name that does not
match the Service leaves every process unable to reach the coordinator, an
environment variable the package does not read is silently ignored, a flag
the worker does not know ends every process at once. Each of these is
checked here for both Jobs, offline, and the checks are run on broken
copies too; so are the same Jobs on a TPU v5e slice, as kubectl kustomize
builds them from deploy/tpu-slice. What every manifest must do (schema,
checkov, GPU count and JAX pin against terraform and requirements.txt,
security context, shared memory) is checked for the GPU files with the
others, in test_infra_manifests.py, test_infra_checkov.py and
test_infra_consistency.py.

The checkpointing Job adds its own ways to fail: a share that not every pod
can write (not ReadWriteMany, or created in a VPC network the nodes are not
in), a checkpoint folder that is not on the share, a Spot preemption counted
as a failure, a grace period that outlasts Spot's notice. Those are checked
in the second half, with the parts of its script that decide the Job's fate
run for real.
"""

from __future__ import annotations

import ast
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hcl_eval import Evaluator, parse_tfvars, validation_failures, variable_values
from infra_consistency import env_value
from infra_files import DEPLOY_DIR, MANIFESTS, ROOT, TERRAFORM_DIR, load_manifest
from test_infra_checkov import MIN_REASON_CHARS, checkov_binary
from test_infra_manifests import KUBERNETES_VERSIONS

MULTIHOST_MANIFESTS = ("multihost.yaml", "multihost-checkpoint.yaml")
SLICES = ("tpu-slice/multihost", "tpu-slice/multihost-checkpoint")  # kustomize overlays of the two
# A v5e-16: four ct5lp-hightpu-4t hosts of four chips (https://cloud.google.com/kubernetes-engine/docs/concepts/tpus).
TPU_RESOURCE, TPU_ACCELERATOR, TPU_TOPOLOGY = "google.com/tpu", "tpu-v5-lite-podslice", "4x4"
CHECKPOINT_MANIFEST = DEPLOY_DIR / "multihost-checkpoint.yaml"
PACKAGE_MODULE = ROOT / "dpcourse" / "multihost" / "distributed.py"
WORKER_MODULE = "dpcourse.multihost.worker"
PROJECT = {"project_id": "dp-course-workshop"}
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
FILESTORE_PROVISIONER = "filestore.csi.storage.gke.io"
# Basic HDD's smallest instance on GKE 1.33 and later, every version
# KUBERNETES_VERSIONS covers (https://cloud.google.com/filestore/docs/csi-driver).
BASIC_HDD_MIN_BYTES = 100 * 2**30
# GKE's graceful node shutdown gives non-system pods the first 15 s of a Spot
# VM's 30 s notice (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms).
SPOT_NOTICE_S, NON_SYSTEM_POD_SHARE_S = 30, 15
# What the checkpointing Job's script exits with when the ConfigMap names a
# commit that cannot run it (sysexits.h EX_CONFIG); its FailJob rule matches it.
MISCONFIGURED_EXIT = 78


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


def module_source(module: str) -> Path:
    """The file of a course module named as ``python -m`` would take it."""
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def worker_flags(module: str = WORKER_MODULE) -> set[str]:
    """Every ``--flag`` the module's argument parsers declare, read from its source (no JAX needed)."""
    flags = set()
    for node in ast.walk(ast.parse(module_source(module).read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    flags.add(arg.value)
    return flags


def by_kind(docs: list[dict]) -> dict[str, dict]:
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), f"one object of each kind expected, got {kinds}"
    return {d["kind"]: d for d in docs}


def worker(job: dict) -> dict:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def env_entry(container: dict, name: str) -> dict | None:
    return next((e for e in container.get("env", []) if e["name"] == name), None)


def worker_command(container: dict) -> tuple[str, dict[str, str]]:
    """The module the script finally runs and its flags, ``$VARIABLES`` replaced by the container's values.

    Raises:
        AssertionError: the script has no single ``exec python -m`` line, or a
            flag's variable is not set in the container.
    """
    lines = container["command"][-1].splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.strip().startswith("exec python -m ")]
    command = ""
    for line in lines[start:]:
        command += line.strip().removesuffix("\\")
        if not line.rstrip().endswith("\\"):
            break
    words = shlex.split(command)
    assert words[:3] == ["exec", "python", "-m"], words
    module, rest = words[3], words[4:]
    flags = {}
    for flag, value in zip(rest[::2], rest[1::2]):
        if value.startswith("$"):
            resolved = env_value(container, value[1:])
            assert resolved is not None, f"{flag} {value}: the container does not set {value[1:]}"
            value = resolved
        flags[flag] = value
    assert len(rest) == 2 * len(flags), f"every flag of {module} here takes a value: {rest}"
    return module, flags


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes storage quantity with a binary suffix (``100Gi``, ``1Ti``) in bytes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|Pi)", quantity)
    assert match, f"write the size with a binary suffix (Gi, Ti), got {quantity!r}"
    return int(match.group(1)) * 1024 ** ("KMGTP".index(match.group(2)[0]) + 1)


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
    chips = container["resources"]["limits"].get(TPU_RESOURCE)
    for key, name in names.items():
        if (env_entry(container, name) is None) != (chips is not None and key != "INIT_TIMEOUT_ENV"):
            errors.append(f"the worker {'sets' if chips else 'does not set'} {name} ({key} in distributed.py)")
    if errors:
        return errors
    if chips:  # GKE names the hosts <job>-<index>.<subdomain>; JAX's detection reads them (TPU_WORKER_HOSTNAMES)
        selector = template["spec"]["nodeSelector"]
        topology = selector.get("cloud.google.com/gke-tpu-topology", "0")
        n = math.prod(int(side) for side in topology.split("x")) // int(chips)
        port = env_value(container, "JAX_COORDINATOR_PORT") or "8482"  # JAX's default on a TPU slice
        coordinator = f"{job['metadata']['name']}-0.{template['spec'].get('subdomain')}:{port}"
    else:
        n = int(env_value(container, names["NUM_PROCESSES_ENV"]))
        coordinator = env_value(container, names["COORDINATOR_ENV"]) or ""
        field = (env_entry(container, names["PROCESS_ID_ENV"]).get("valueFrom") or {}).get("fieldRef", {})
        if field.get("fieldPath") != COMPLETION_INDEX:
            errors.append(f"{names['PROCESS_ID_ENV']} must come from the completion index ({COMPLETION_INDEX})")
    # Process count: pods that exist == processes the coordinator waits for.
    if spec.get("completionMode") != "Indexed":
        errors.append("the Job must be Indexed: the completion index is the process id")
    if not spec.get("completions") == spec.get("parallelism") == n:
        errors.append(
            f"completions ({spec.get('completions')}), parallelism ({spec.get('parallelism')}) and "
            f"the process count ({n}) must be equal: process 0 waits for {n} processes"
        )
    # Coordinator: pod 0's name through the headless Service, on the port it serves.
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
            f"the coordinator's port {port!r} is not the Service's coordinator port {coordinator_port.get('port')}"
        )
    if container_ports.get(coordinator_port.get("targetPort")) != coordinator_port.get("port"):
        errors.append("the Service's coordinator targetPort does not name a container port with the same number")
    # Time: the first process waits for the last; the Job must outlive that wait.
    init_timeout = int(env_value(container, names["INIT_TIMEOUT_ENV"]))
    if not 0 < init_timeout < spec.get("activeDeadlineSeconds", 0):
        errors.append(f"{names['INIT_TIMEOUT_ENV']}={init_timeout} must be positive and below activeDeadlineSeconds")
    return errors


@pytest.fixture(scope="module", params=MULTIHOST_MANIFESTS)
def manifest(request) -> Path:
    return DEPLOY_DIR / request.param


def built(name: str, folder: Path) -> Path:
    """deploy/<name>, a slice as kubectl kustomize builds it (it reads ../../<gpu>.yaml, outside its folder)."""
    if name in MULTIHOST_MANIFESTS:
        return DEPLOY_DIR / name
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is needed to build deploy/tpu-slice (GitHub's ubuntu runners have it)")
    command = ["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(DEPLOY_DIR / name)]
    path = folder / f"{Path(name).name}.yaml"
    path.write_text(subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout)
    return path


@pytest.fixture(scope="module", params=SLICES)
def slice_file(request, tmp_path_factory) -> Path:
    return built(request.param, tmp_path_factory.mktemp("slice"))


@pytest.fixture(scope="module", params=MULTIHOST_MANIFESTS + SLICES)
def any_docs(request, tmp_path_factory) -> list[dict]:
    """The documents of one Job's file: the GPU ones, then the built slices."""
    return load_manifest(built(request.param, tmp_path_factory.mktemp("slice")))


@pytest.fixture(scope="module")
def docs(manifest) -> list[dict]:
    return load_manifest(manifest)


@pytest.fixture(scope="module")
def objects(docs) -> dict[str, dict]:
    return by_kind(docs)


@pytest.fixture(scope="module")
def job(objects) -> dict:
    return objects["Job"]


def test_both_jobs_are_in_the_manifests_every_infra_check_covers():
    assert set(MULTIHOST_MANIFESTS) <= set(MANIFESTS)


def test_kubernetes_validate_strict(slice_file):
    versions = [arg for v in KUBERNETES_VERSIONS for arg in ("-k", v)]
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", *versions, str(slice_file)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_checkov_finds_nothing_but_the_reasoned_skips(slice_file):
    docs = load_manifest(slice_file)
    result = subprocess.run(
        [
            str(checkov_binary()),
            "--file",
            str(slice_file),
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


def test_holds_a_headless_service_a_network_policy_and_an_indexed_job_under_one_name(any_docs):
    objects = by_kind(any_docs)
    job = objects["Job"]
    assert {"Service", "NetworkPolicy", "Job"} <= set(objects)
    # The checkpointing Job adds its share: a StorageClass and the claim.
    assert set(objects) - {"Service", "NetworkPolicy", "Job"} <= {"StorageClass", "PersistentVolumeClaim"}
    assert {o["metadata"]["name"] for o in objects.values()} == {job["metadata"]["name"]}


def test_the_two_jobs_can_run_side_by_side():
    """Their own names, labels and coordinator: applying one never changes or selects the other's objects."""
    names, labels, coordinators = {}, {}, {}
    for name in MULTIHOST_MANIFESTS:
        objects = by_kind(load_manifest(DEPLOY_DIR / name))
        names[name] = {(kind, o["metadata"]["name"]) for kind, o in objects.items()}
        labels[name] = objects["Job"]["spec"]["template"]["metadata"]["labels"]["app"]
        coordinators[name] = env_value(worker(objects["Job"]), "DPCOURSE_COORDINATOR")
    first, second = MULTIHOST_MANIFESTS
    assert not names[first] & names[second]
    assert labels[first] != labels[second]
    assert coordinators[first] != coordinators[second]


def test_process_count_service_and_package_agree(any_docs):
    assert multihost_errors(any_docs, package_constants()) == []


def test_a_slice_job_is_its_gpu_job_on_a_v5e_16(slice_file, tf_module):
    """Same objects, failure policy and deadlines; four hosts, all their chips, JAX built for the TPU."""
    gpu, tpu = by_kind(load_manifest(DEPLOY_DIR / slice_file.name)), by_kind(load_manifest(slice_file))
    assert {k: v for k, v in gpu.items() if k != "Job"} == {k: v for k, v in tpu.items() if k != "Job"}
    for key in ("backoffLimit", "podFailurePolicy", "podReplacementPolicy", "activeDeadlineSeconds"):
        assert tpu["Job"]["spec"].get(key) == gpu["Job"]["spec"].get(key), key  # test_multihost_preemption's
    spec, container = tpu["Job"]["spec"]["template"]["spec"], worker(tpu["Job"])
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": TPU_ACCELERATOR,
        "cloud.google.com/gke-tpu-topology": TPU_TOPOLOGY,
    }
    assert [t["key"] for t in spec["tolerations"]] == [TPU_RESOURCE]
    assert container["resources"]["limits"][TPU_RESOURCE] == container["resources"]["requests"][TPU_RESOURCE] == 4
    assert "nvidia.com/gpu" not in container["resources"]["limits"] and env_value(container, "JAX_EXTRA") == "tpu"
    hosts = Evaluator({}, tf_module.local_expressions).local("tpu_v5e_hosts_per_topology")[TPU_TOPOLOGY]
    assert tpu["Job"]["spec"]["completions"] == hosts, "terraform's tpu_topology = 4x4 pool has one node per pod"


def test_terraform_accepts_one_node_per_process(manifest, job, tf_module):
    n = job["spec"]["completions"]
    assert n >= 2, "a multi-host Job needs at least 2 processes"
    assert validation_failures(tf_module, {**PROJECT, "gpu_node_count": n}) == {}
    header = manifest.read_text().split("---", 1)[0]
    assert f"gpu_node_count={n}" in header, "the header must say how many GPU nodes to ask terraform for"


def test_one_pod_per_node(any_docs):
    template = by_kind(any_docs)["Job"]["spec"]["template"]
    (term,) = template["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()


def test_lesson_8_job_fails_once_and_never_restarts_a_process():
    job = by_kind(load_manifest(DEPLOY_DIR / "multihost.yaml"))["Job"]
    assert job["spec"]["backoffLimit"] == 0
    assert "podFailurePolicy" not in job["spec"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_network_policy_admits_only_the_jobs_own_pods(any_docs):
    policy = by_kind(any_docs)["NetworkPolicy"]["spec"]
    labels = by_kind(any_docs)["Job"]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= labels.items()


def test_worker_installs_the_pins_and_runs_the_package_worker(job):
    container = worker(job)
    script = container["command"][-1]
    assert script.startswith("set -eu\n"), "every failing step must fail the pod"
    assert (
        '"jax[$JAX_EXTRA]==$JAX_VERSION" -r requirements.txt' in script
        and env_value(container, "JAX_EXTRA") == "cuda12"
    )
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


def test_worker_module_and_every_flag_it_is_given_exist(job):
    """An unknown flag ends every process after the 5-minute install (argparse exits with status 2)."""
    module, flags = worker_command(worker(job))
    assert module == WORKER_MODULE
    assert module_source(module).is_file(), f"python -m {module}: no {module_source(module)}"
    declared = worker_flags(module)
    assert "--checkpoint-dir" in declared, "worker_flags() reads the parser: it must find the flags it declares"
    assert set(flags) <= declared, f"{module} has no {sorted(set(flags) - declared)}"
    assert int(flags["--steps"]) >= 1


# -- broken copies: each mistake is reported --------------------------------


def _broken(tmp_path: Path, manifest: Path, old: str, new: str) -> list[dict]:
    text = manifest.read_text()
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {manifest.name}: update this test"
    path = tmp_path / manifest.name
    path.write_text(text.replace(old, new))
    return load_manifest(path)


# {name}: the Job's name; {past_deadline}: a wait longer than its activeDeadlineSeconds.
INCONSISTENCIES = [
    ("  completions: 2\n", "  completions: 3\n", "must be equal"),
    ("  parallelism: 2\n", "  parallelism: 1\n", "must be equal"),
    ("value: {name}-0.{name}:8476", "value: {name}-0:8476", "pod 0 is reachable as"),
    ("value: {name}-0.{name}:8476", "value: {name}-0.{name}:1234", "port '1234'"),
    ("      subdomain: {name}\n", "", "subdomain"),
    ("  clusterIP: None\n", "", "headless"),
    ("job-completion-index", "job-index", "completion index"),
    ("  completionMode: Indexed\n", "", "must be Indexed"),
    ('value: "900"', 'value: "{past_deadline}"', "below activeDeadlineSeconds"),
    ("name: DPCOURSE_NUM_PROCESSES", "name: NUM_PROCESSES", "does not set DPCOURSE_NUM_PROCESSES"),
]


@pytest.mark.parametrize("old, new, fragment", INCONSISTENCIES)
def test_each_inconsistency_is_caught(tmp_path, manifest, job, old, new, fragment):
    names = {"name": job["metadata"]["name"], "past_deadline": job["spec"]["activeDeadlineSeconds"] + 1}
    broken = _broken(tmp_path, manifest, old.format(**names), new.format(**names))
    errors = multihost_errors(broken, package_constants())
    assert any(fragment in e for e in errors), errors


@pytest.mark.parametrize(
    "old, new, fragment",
    [
        ("gke-tpu-topology: 4x4", "gke-tpu-topology: 2x4", "must be equal"),  # 8 chips: 2 hosts, not 4
        ('value: "8476"', 'value: "8482"', "port '8482'"),
        ("name: JAX_COORDINATOR_PORT", "name: DPCOURSE_COORDINATOR", "sets DPCOURSE_COORDINATOR"),
        ("  subdomain: ", "  hostname: ", "subdomain"),
    ],
)
def test_each_slice_inconsistency_is_caught(tmp_path, slice_file, old, new, fragment):
    errors = multihost_errors(_broken(tmp_path, slice_file, old, new), package_constants())
    assert any(fragment in e for e in errors), errors


def test_an_unknown_flag_is_caught(tmp_path):
    broken = _broken(tmp_path, CHECKPOINT_MANIFEST, '--save-every "$SAVE_EVERY"', '--save-every-n "$SAVE_EVERY"')
    _, flags = worker_command(worker(by_kind(broken)["Job"]))
    assert "--save-every-n" in set(flags) - worker_flags()


# -- the checkpointing Job (notebook 11) ---------------------------------------


@pytest.fixture(scope="module")
def ckpt() -> dict[str, dict]:
    return by_kind(load_manifest(CHECKPOINT_MANIFEST))


@pytest.fixture(scope="module")
def ckpt_job(ckpt) -> dict:
    return ckpt["Job"]


def test_share_is_one_read_write_many_filestore_claim_of_at_least_the_basic_hdd_minimum(ckpt):
    claim, storage_class = ckpt["PersistentVolumeClaim"]["spec"], ckpt["StorageClass"]
    assert claim["accessModes"] == ["ReadWriteMany"], "every process writes its shards into the same folder"
    assert claim["storageClassName"] == storage_class["metadata"]["name"]
    assert storage_class["provisioner"] == FILESTORE_PROVISIONER
    # "standard" is Basic HDD, the tier of GKE's standard-rwx class.
    assert storage_class["parameters"]["tier"] in ("standard", "basic_hdd")
    assert storage_class.get("reclaimPolicy", "Delete") == "Delete", "deleting the claim must delete the instance"
    assert quantity_bytes(claim["resources"]["requests"]["storage"]) >= BASIC_HDD_MIN_BYTES


def test_filestore_instance_is_made_in_the_clusters_network(ckpt, tf, tf_module):
    """Without `network`, the driver uses the VPC "default", which the course's nodes are not in."""
    network = _resource(tf, "google_compute_network", "vpc")["name"]
    assert network == "${var.cluster_name}-net"
    expected = f"{applied_values(tf_module)['cluster_name']}-net"
    assert ckpt["StorageClass"]["parameters"].get("network") == expected


def test_share_is_mounted_in_the_worker_and_is_the_checkpoint_dir(ckpt, ckpt_job):
    spec = ckpt_job["spec"]["template"]["spec"]
    claim = ckpt["PersistentVolumeClaim"]["metadata"]["name"]
    (volume,) = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert volume["persistentVolumeClaim"] == {"claimName": claim}
    container = worker(ckpt_job)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert not mount.get("readOnly", False)
    _, flags = worker_command(container)
    directory = flags["--checkpoint-dir"]
    assert directory == mount["mountPath"] or directory.startswith(mount["mountPath"].rstrip("/") + "/"), (
        f"--checkpoint-dir {directory} is not on the share mounted at {mount['mountPath']}"
    )
    # Writable for the pods' uid: the driver applies fsGroup to Filestore volumes.
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsUser"]


def test_saves_several_times_and_resumes_with_the_same_global_batch(ckpt_job, tf_module):
    container = worker(ckpt_job)
    _, flags = worker_command(container)
    steps, save_every = int(flags["--steps"]), int(flags["--save-every"])
    assert save_every > 0 and steps // save_every >= 2, "a preemption should find at least one saved step"
    # The checkpoint refuses another global batch; a fixed one lets the run resume on another process count.
    devices = ckpt_job["spec"]["completions"] * applied_values(tf_module)["gpu_count"]
    assert int(flags["--global-batch"]) % devices == 0, f"--global-batch must divide by the {devices} GPUs"


def test_a_preemption_is_not_counted_and_every_process_restarts(ckpt_job):
    spec = ckpt_job["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never", "podFailurePolicy requires it"
    rules = spec["podFailurePolicy"]["rules"]
    # Rules apply in order: the disruption rule must come before any exit-code rule.
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    # Job-wide: the survivors of a preemption fail too, and the run restarts as a whole.
    assert "backoffLimitPerIndex" not in spec and "maxFailedIndexes" not in spec
    assert spec["backoffLimit"] >= spec["completions"] - 1, "one preemption must not exhaust backoffLimit"
    # One pod per index at a time: a JAX process id must never run twice.
    assert spec.get("podReplacementPolicy", "Failed") == "Failed"


def test_only_a_misconfiguration_fails_the_job_at_once(ckpt_job):
    rules = ckpt_job["spec"]["podFailurePolicy"]["rules"]
    fail = [r for r in rules if r["action"] == "FailJob"]
    assert fail == [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": "worker", "operator": "In", "values": [MISCONFIGURED_EXIT]},
        }
    ]
    script = worker(ckpt_job)["command"][-1]
    assert script.count(f"exit {MISCONFIGURED_EXIT}\n") == 2, "the checkout and the flag check, nothing else"
    # The worker's own statuses (a failure, a usage error, an injected failure) must not match it; a
    # checkpoint folder it cannot use must (every retry would be refused the same way).
    assert MISCONFIGURED_EXIT not in (1, 2, package_constants()["WORKER_FAILURE_EXIT"])
    assert package_constants()["UNUSABLE_CHECKPOINT_EXIT"] == MISCONFIGURED_EXIT


def test_grace_period_ends_within_spots_notice(ckpt_job):
    grace = ckpt_job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert 0 < grace <= NON_SYSTEM_POD_SHARE_S < SPOT_NOTICE_S


def test_terraform_enables_the_filestore_driver_and_its_api(tf, tf_module):
    cluster = _resource(tf, "google_container_cluster", "course")
    (addons,) = cluster["addons_config"]
    assert addons["gcp_filestore_csi_driver_config"] == [{"enabled": True}]
    required = Evaluator({}, tf_module.local_expressions).local("required_apis")
    assert "file.googleapis.com" in required


def test_header_says_how_to_keep_and_how_to_delete_the_share(ckpt_job):
    header = CHECKPOINT_MANIFEST.read_text().split("---", 1)[0]
    name = ckpt_job["metadata"]["name"]
    assert f"kubectl delete job {name}" in header, "how to run again from the saved steps"
    assert "kubectl delete -f deploy/multihost-checkpoint.yaml" in header, "how to stop the share's billing"
    assert "DisruptionTarget" in header and "backoffLimitPerIndex" in header


def _resource(tf: dict, resource_type: str, name: str) -> dict:
    for entry in tf["main.tf"]["resource"]:
        if resource_type in entry and name in entry[resource_type]:
            return entry[resource_type][name]
    raise AssertionError(f"no resource {resource_type}.{name} in main.tf")


# -- the checkpointing Job's script, run for real ------------------------------


def _script_part(job: dict, first: str, last: str | None, scratch: Path) -> str:
    """Lines of the worker's script from the one starting with ``first`` up to (without) ``last``."""
    lines = worker(job)["command"][-1].splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.strip().startswith(first)]
    end = len(lines) if last is None else next(i for i, line in enumerate(lines) if line.strip().startswith(last))
    return "set -eu\n" + "\n".join(lines[start:end]).replace("/scratch", str(scratch)) + "\n"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture()
def course_repo(tmp_path) -> str:
    if shutil.which("git") is None or shutil.which("sh") is None:
        pytest.skip("git and sh are needed to run the Job's checkout; the image has both, this machine does not")
    repo = tmp_path / "course-src"
    repo.mkdir()
    _git("init", "-q", "-b", "main", cwd=repo)
    (repo / "requirements.txt").write_text("jax==0.10.2\n")
    _git("add", ".", cwd=repo)
    _git("commit", "-q", "-m", "v1", cwd=repo)
    _git("tag", "v1", cwd=repo)
    return str(repo)


def _run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "DPCOURSE_PROCESS_ID": "1", "WORKER_ID": "1"}
    return subprocess.run(["sh", "-c", script], env={**base, **env}, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ref, status", [("v1", 0), ("no-such-branch", MISCONFIGURED_EXIT)])
def test_checkout_of_a_missing_ref_fails_the_job_and_names_the_configmap(ckpt_job, course_repo, tmp_path, ref, status):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = _script_part(ckpt_job, "set -eu", "python3 -m venv", scratch)
    env = {"HOME": str(tmp_path), "COURSE_REPO": course_repo, "COURSE_REF": ref}
    env.update(GIT_COMMITTER_NAME="multihost worker", GIT_COMMITTER_EMAIL="multihost-worker@localhost")
    result = _run(script, env)
    assert result.returncode == status, result.stdout + result.stderr
    if status:
        assert "jax-course-source" in result.stderr, "the error must say which ConfigMap to fix"


def test_an_unreachable_repository_is_retried_not_failed_at_once(ckpt_job, course_repo, tmp_path):
    """A clone can fail for a moment (the network); only what no retry can fix exits with the FailJob status."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = _script_part(ckpt_job, "set -eu", "python3 -m venv", scratch)
    result = _run(script, {"HOME": str(tmp_path), "COURSE_REPO": str(tmp_path / "missing"), "COURSE_REF": "v1"})
    assert result.returncode not in (0, MISCONFIGURED_EXIT), result.stdout + result.stderr


@pytest.mark.parametrize("missing", [None, "--checkpoint-dir"])
def test_a_worker_without_the_checkpoint_flags_fails_the_job(ckpt_job, tmp_path, missing):
    if shutil.which("sh") is None:
        pytest.skip("sh is needed to run the Job's flag check; the image has it, this machine does not")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # Stands in for `python -m dpcourse.multihost.worker --help`: the real flags, less the one missing.
    usage = " ".join(sorted(flag for flag in worker_flags() if flag != missing))
    (fake_bin / "python").write_text(f"#!/bin/sh\necho 'usage: {usage}'\n")
    (fake_bin / "python").chmod(0o755)
    script = _script_part(ckpt_job, "usage=$(", "if [", tmp_path)
    result = _run(script, {"PATH": f"{fake_bin}:/usr/bin:/bin", "COURSE_REF": "v0"})
    if missing is None:
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        assert result.returncode == MISCONFIGURED_EXIT, result.stdout + result.stderr
        assert missing in result.stderr and "jax-course-source" in result.stderr
    # The flags checked are the ones the worker is then given.
    checked = re.search(r"for flag in (.*); do", script).group(1).split()
    assert set(checked) == set(worker_command(worker(ckpt_job))[1]) - {"--steps"}
