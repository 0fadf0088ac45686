"""Static checks of deploy/*.yaml, and a run of the pod's course-fetching script.

kubernetes-validate --strict checks the manifests against the Kubernetes
schemas it ships (offline) for the versions GKE's release channels offer;
yamllint checks the YAML itself. The rest are the requirements of a pod
that learners actually use: GPUs, shared memory for NCCL, the driver's
library path, a security context the image supports, a Service that is not
open to the internet by default, and a workspace that survives restarts.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from infra_consistency import containers, env_value, pod_specs
from infra_files import DEPLOY_DIR, MANIFESTS

# GKE's release channels offer roughly the four newest minor versions;
# kubernetes-validate 1.37 ships schemas up to 1.37.
KUBERNETES_VERSIONS = ("1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0")
YAMLLINT_CONFIG = Path(__file__).with_name("yamllint.yaml")
NVIDIA_LIB = "/usr/local/nvidia/lib64"


def _kubernetes_validate(*paths: Path) -> subprocess.CompletedProcess:
    versions = [arg for v in KUBERNETES_VERSIONS for arg in ("-k", v)]
    return subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", *versions, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _by_kind(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module")
def jupyter(manifests) -> dict[tuple[str, str], dict]:
    return _by_kind(manifests["jupyter.yaml"])


@pytest.fixture(scope="module")
def pod(jupyter) -> dict:
    return jupyter[("Pod", "jax-jupyter")]


@pytest.fixture(scope="module")
def job(manifests) -> dict:
    return _by_kind(manifests["notebook-tests.yaml"])[("Job", "jax-notebook-tests")]


def test_kubernetes_validate_strict():
    result = _kubernetes_validate(*(DEPLOY_DIR / name for name in MANIFESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_kubernetes_validate_catches_a_misspelt_field(tmp_path):
    broken = tmp_path / "jupyter.yaml"
    text = (DEPLOY_DIR / "jupyter.yaml").read_text()
    broken.write_text(text.replace("  nodeSelector:\n", "  nodeSelectors:\n", 1))
    result = _kubernetes_validate(broken)
    assert result.returncode != 0 and "nodeSelectors" in result.stdout + result.stderr


def test_yamllint():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "yamllint",
            "--strict",
            "-c",
            str(YAMLLINT_CONFIG),
            *(str(DEPLOY_DIR / n) for n in MANIFESTS),
            str(DEPLOY_DIR / "tpu-slice"),  # the slices' kustomizations
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_jupyter_manifest_holds_claim_policy_pod_and_service(jupyter):
    assert set(jupyter) == {
        ("PersistentVolumeClaim", "jax-jupyter-workspace"),
        ("NetworkPolicy", "jax-jupyter"),
        ("Pod", "jax-jupyter"),
        ("Service", "jax-jupyter-svc"),
    }


def test_workspace_claim(jupyter, pod):
    claim = jupyter[("PersistentVolumeClaim", "jax-jupyter-workspace")]["spec"]
    assert claim["storageClassName"] == "standard-rwo"
    assert claim["accessModes"] == ["ReadWriteOnce"]
    size = claim["resources"]["requests"]["storage"]
    assert size.endswith("Gi") and int(size[:-2]) >= 20, "the CUDA environment alone takes about 8 GB"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["workspace"]["persistentVolumeClaim"]["claimName"] == "jax-jupyter-workspace"


def test_every_workload_schedules_on_the_l4_node(manifests):
    for name in MANIFESTS:
        for doc in manifests[name]:
            for workload, spec in pod_specs(doc):
                assert spec["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}, workload
                assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"], (
                    workload
                )


def test_gpu_containers_have_shm_and_driver_library_path(manifests):
    for name in MANIFESTS:
        for doc in manifests[name]:
            for workload, spec in pod_specs(doc):
                volumes = {v["name"]: v for v in spec["volumes"]}
                for container in spec["containers"]:
                    if "nvidia.com/gpu" not in container["resources"].get("limits", {}):
                        continue
                    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
                    assert "/dev/shm" in mounts, f"{workload}: NCCL needs a memory-backed /dev/shm"
                    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
                    assert shm["medium"] == "Memory"
                    library_path = env_value(container, "LD_LIBRARY_PATH") or ""
                    assert NVIDIA_LIB in library_path.split(":"), f"{workload}: LD_LIBRARY_PATH must hold {NVIDIA_LIB}"


def test_pod_serves_8884_with_a_readiness_probe(pod):
    (container,) = pod["spec"]["containers"]
    assert {"name": "http", "containerPort": 8884, "protocol": "TCP"} in container["ports"]
    assert container["readinessProbe"]["httpGet"]["port"] == 8884
    assert "--port=8884" in container["command"]
    # The learner's workspace (made by the make-workspace init container), not the clone.
    assert "--ServerApp.root_dir=/workspace/course" in container["command"]


def test_security_context_is_restrictive_and_supported(manifests):
    for name in MANIFESTS:
        text = (DEPLOY_DIR / name).read_text()
        for doc in manifests[name]:
            for workload, spec in pod_specs(doc):
                pod_context = spec["securityContext"]
                assert pod_context["runAsNonRoot"] is True, workload
                uid = pod_context["runAsUser"]
                assert uid >= 10000 and pod_context["runAsGroup"] == uid
                assert pod_context["seccompProfile"] == {"type": "RuntimeDefault"}
                assert spec["automountServiceAccountToken"] is False
                # The header comment names the image and the uid it runs as.
                assert f"uid/gid {uid}" in text, f"{name}: say in the header which uid the pod runs as"
                for container in containers(spec):
                    context = container["securityContext"]
                    assert context["allowPrivilegeEscalation"] is False, container["name"]
                    assert context["readOnlyRootFilesystem"] is True, container["name"]
                    assert context["capabilities"] == {"drop": ["ALL"]}, container["name"]
                    assert not context.get("privileged", False)
                    # A uid without a passwd entry: HOME must point somewhere writable.
                    home = env_value(container, "HOME")
                    assert home, f"{container['name']}: HOME must be set (uid {uid} has no home directory)"
                    writable = [m["mountPath"] for m in container["volumeMounts"]]
                    assert any(home == p or home.startswith(p + "/") for p in writable), (
                        f"{container['name']}: HOME={home} is on the read-only root filesystem"
                    )


def test_images_are_pinned_and_named_in_the_header(manifests):
    for name in MANIFESTS:
        text = (DEPLOY_DIR / name).read_text()
        images = {c["image"] for doc in manifests[name] for _, spec in pod_specs(doc) for c in containers(spec)}
        assert len(images) == 1, f"{name}: one image for every container, got {images}"
        (image,) = images
        assert re.fullmatch(r"python:3\.12\.\d+-bookworm", image), (
            f"{name}: pin an exact Python patch release, got {image}"
        )
        assert image in text.split("---", 1)[0], f"{name}: the header comment must name the image {image}"


def test_service_is_not_open_to_the_internet_by_default(jupyter, pod):
    service = jupyter[("Service", "jax-jupyter-svc")]["spec"]
    assert service["ports"] == [{"name": "http", "port": 8884, "targetPort": "http", "protocol": "TCP"}]
    assert service["selector"].items() <= pod["metadata"]["labels"].items()
    kind = service.get("type", "ClusterIP")
    if kind == "LoadBalancer":
        ranges = service.get("loadBalancerSourceRanges", [])
        assert ranges and "0.0.0.0/0" not in ranges, "a LoadBalancer needs an allow-list"
    else:
        assert kind == "ClusterIP"
    assert "type" not in service, "leave type out so a kubectl patch to LoadBalancer survives re-applies"


def test_network_policies_select_the_workloads(manifests):
    for name in MANIFESTS:
        docs = manifests[name]
        policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
        assert policies, f"{name}: no NetworkPolicy"
        for doc in docs:
            for workload, _spec in pod_specs(doc):
                labels = (
                    doc["metadata"]["labels"] if doc["kind"] == "Pod" else doc["spec"]["template"]["metadata"]["labels"]
                )
                assert any(p["spec"]["podSelector"]["matchLabels"].items() <= labels.items() for p in policies), (
                    workload
                )
    (policy,) = [d for d in manifests["jupyter.yaml"] if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8884}]}]


def test_environment_is_built_from_the_course_requirements(pod):
    install = next(c for c in pod["spec"]["initContainers"] if c["name"] == "install-env")
    script = install["command"][-1]
    assert '"jax[cuda12]==$JAX_VERSION"' in script
    assert "-r /workspace/requirements.txt" in script
    assert "--no-deps -e /workspace" in script
    (container,) = pod["spec"]["containers"]
    assert container["command"][0] == "/opt/env/venv/bin/jupyter"
    assert env_value(container, "PATH").startswith("/opt/env/venv/bin:")


def test_job_runs_the_notebooks_once_with_the_full_profile(job):
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] > 0
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    (container,) = spec["containers"]
    assert env_value(container, "DPCOURSE_PROFILE") == "full"
    script = container["command"][-1]
    assert script.startswith("set -eu\n"), "every failing step must fail the Job"
    assert "-r requirements-dev.txt" in script and '"jax[cuda12]==$JAX_VERSION"' in script
    lines = [line.strip() for line in script.strip().splitlines()]
    (pytest_line,) = [line for line in lines if "-m pytest" in line]
    assert pytest_line == 'python -m pytest --nbmake --nbmake-timeout="$CELL_TIMEOUT_S" -v notebooks/ || status=$?'
    assert lines[-1] == 'exit "$status"', "pytest's exit status must be the Job's"
    assert "jax.default_backend()" in script, "a JAX that fell back to the CPU must fail the GPU runner"


# -- the course-fetching init container, run for real -------------------------


def _fetch_script(pod: dict, volume: Path) -> str:
    fetch = next(c for c in pod["spec"]["initContainers"] if c["name"] == "fetch-course")
    assert fetch["volumeMounts"][0] == {"name": "workspace", "mountPath": "/volume"}
    return fetch["command"][-1].replace("/volume", str(volume))


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture()
def course_repo(tmp_path) -> dict[str, str]:
    """A small git repository standing in for the course: tag v1, then one more commit."""
    if shutil.which("git") is None or shutil.which("sh") is None:
        pytest.skip("git and sh are needed to run the fetch-course script; neither is optional on GKE, only here")
    repo = tmp_path / "course-src"
    repo.mkdir()
    _git("init", "-q", "-b", "main", cwd=repo)
    (repo / "requirements.txt").write_text("jax==0.10.2\n")
    (repo / "notebooks").mkdir()
    (repo / "notebooks" / "01_setup.py").write_text("print('v1')\n")
    _git("add", ".", cwd=repo)
    _git("commit", "-q", "-m", "v1", cwd=repo)
    _git("tag", "v1", cwd=repo)
    v1 = _git("rev-parse", "HEAD", cwd=repo)
    (repo / "notebooks" / "01_setup.py").write_text("print('v2')\n")
    _git("commit", "-q", "-am", "v2", cwd=repo)
    return {"url": str(repo), "v1": v1, "v2": _git("rev-parse", "HEAD", cwd=repo)}


def _run_fetch(pod, volume: Path, repo: str, ref: str) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(volume.parent),
        "COURSE_REPO": repo,
        "COURSE_REF": ref,
        "GIT_COMMITTER_NAME": "course setup",
        "GIT_COMMITTER_EMAIL": "course-setup@localhost",
    }
    return subprocess.run(
        ["sh", "-c", _fetch_script(pod, volume)], env=env, capture_output=True, text=True, timeout=120
    )


def test_fetch_course_clones_the_ref_into_an_empty_workspace(pod, course_repo, tmp_path):
    volume = tmp_path / "volume"
    volume.mkdir()
    result = _run_fetch(pod, volume, course_repo["url"], "v1")
    assert result.returncode == 0, result.stdout + result.stderr
    workspace = volume / "workspace"
    assert _git("rev-parse", "HEAD", cwd=workspace) == course_repo["v1"]
    assert (workspace / "notebooks" / "01_setup.py").read_text() == "print('v1')\n"
    assert (volume / "env").is_dir()


def test_fetch_course_never_overwrites_a_learners_edits(pod, course_repo, tmp_path):
    volume = tmp_path / "volume"
    volume.mkdir()
    assert _run_fetch(pod, volume, course_repo["url"], "v1").returncode == 0
    notebook = volume / "workspace" / "notebooks" / "01_setup.py"
    notebook.write_text("print('my answer')\n")
    (volume / "workspace" / "scratch.ipynb").write_text("{}")
    # A restart, even with the ConfigMap moved on to a newer ref, keeps everything.
    again = _run_fetch(pod, volume, course_repo["url"], course_repo["v2"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert "keeping them" in again.stdout
    assert notebook.read_text() == "print('my answer')\n"
    assert (volume / "workspace" / "scratch.ipynb").exists()
    assert _git("rev-parse", "HEAD", cwd=volume / "workspace") == course_repo["v1"]


@pytest.mark.parametrize("problem", ["unknown ref", "unreachable repository"])
def test_fetch_course_failure_leaves_the_workspace_empty_for_a_retry(pod, course_repo, tmp_path, problem):
    volume = tmp_path / "volume"
    volume.mkdir()
    repo, ref = course_repo["url"], "v1"
    if problem == "unknown ref":
        ref = "no-such-branch"
    else:
        repo = str(tmp_path / "missing-repo")
    result = _run_fetch(pod, volume, repo, ref)
    assert result.returncode == 1
    assert "jax-course-source" in result.stderr, "the error must say which ConfigMap to fix"
    assert list((volume / "workspace").iterdir()) == []
    # With the ConfigMap fixed, the next start clones normally.
    assert _run_fetch(pod, volume, course_repo["url"], "v1").returncode == 0


def test_both_manifests_read_the_same_configmap(pod, job):
    def refs(container):
        return {e["name"]: e["valueFrom"]["configMapKeyRef"] for e in container["env"] if "valueFrom" in e}

    fetch = next(c for c in pod["spec"]["initContainers"] if c["name"] == "fetch-course")
    (runner,) = job["spec"]["template"]["spec"]["containers"]
    expected = {
        "COURSE_REPO": {"name": "jax-course-source", "key": "repo"},
        "COURSE_REF": {"name": "jax-course-source", "key": "ref"},
    }
    assert refs(fetch) == expected and refs(runner) == expected


# -- the Job's verdict: pytest's exit status, with the results printed ---------


@pytest.mark.parametrize("pytest_status", [0, 1])
def test_job_exits_with_pytest_status_and_prints_results(job, tmp_path, pytest_status):
    if shutil.which("sh") is None:
        pytest.skip("sh is needed to run the Job's script; the image has it, this machine does not")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    script = container["command"][-1]
    verdict = script[script.index("status=0") :]
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # Stands in for `python -m pytest ...`: nbmake's verdict is pytest's exit status.
    (fake_bin / "python").write_text(f'#!/bin/sh\necho "pytest $*"\nexit {pytest_status}\n')
    (fake_bin / "python").chmod(0o755)
    results = tmp_path / "results.jsonl"
    results.write_text('{"notebook": "02_baseline", "metric": "examples_per_s"}\n')
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "DPCOURSE_RESULTS": str(results), "CELL_TIMEOUT_S": "1800"}
    result = subprocess.run(["sh", "-c", verdict], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == pytest_status, result.stdout + result.stderr
    block = result.stdout[
        result.stdout.index("RESULTS-BEGIN\n") + len("RESULTS-BEGIN\n") : result.stdout.index("RESULTS-END")
    ]
    assert block == results.read_text()
    assert "--nbmake --nbmake-timeout=1800 -v notebooks/" in result.stdout


def test_job_refuses_a_jax_that_fell_back_to_the_cpu(job, tmp_path):
    """The GPU check in the Job, run here where JAX only has a CPU: it must fail."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("JAX is not installed in this environment (make dev-install installs it); the check needs it")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    script = container["command"][-1]
    check = script[script.index("<<'PY'\n") + len("<<'PY'\n") : script.index("\nPY\n")]
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA L4'\necho 'GPU 1: NVIDIA L4'\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "nvidia-smi lists 2 GPU(s); the CUDA set-up is broken" in result.stderr
