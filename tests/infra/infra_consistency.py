"""Cross-checks between terraform/, deploy/ and requirements.txt.

A pod that asks for more GPUs than the node has stays Pending forever
("Insufficient nvidia.com/gpu"); one that asks for fewer leaves GPUs idle and
every multi-device number wrong; a JAX version in the manifests that differs
from the course's pin installs a JAX the notebooks were never run with. The
checks here are plain functions so that the tests can run them on the real
files and on deliberately broken copies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"


def pod_specs(doc: dict) -> Iterator[tuple[str, dict]]:
    """(name, pod spec) of a Pod, or of the pod template of a workload."""
    kind = doc.get("kind")
    name = f"{kind}/{doc.get('metadata', {}).get('name')}"
    if kind == "Pod":
        yield name, doc["spec"]
    elif kind in ("Job", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
        yield name, doc["spec"]["template"]["spec"]
    elif kind == "CronJob":
        yield name, doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def containers(spec: dict) -> Iterator[dict]:
    """Init containers, then containers."""
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


def env_value(container: dict, name: str) -> Any:
    """The literal value of one environment variable, or None."""
    for item in container.get("env", []):
        if item["name"] == name:
            return item.get("value")
    return None


def gpu_requests(docs: list[dict]) -> list[tuple[str, int]]:
    """(workload/container, GPUs) for every container that asks for GPUs."""
    found = []
    for doc in docs:
        for workload, spec in pod_specs(doc):
            for container in containers(spec):
                resources = container.get("resources", {})
                for section in ("limits", "requests"):
                    if GPU_RESOURCE in resources.get(section, {}):
                        found.append(
                            (f"{workload}/{container['name']} {section}", int(resources[section][GPU_RESOURCE]))
                        )
    return found


def consistency_errors(
    manifests: dict[str, list[dict]],
    gpu_count: int,
    gpu_type: str,
    jax_pin: str,
) -> list[str]:
    """Every way the manifests disagree with terraform's defaults or the JAX pin.

    Args:
        manifests: the documents of each deploy/*.yaml, by file name.
        gpu_count: terraform's default gpu_count (GPUs per node).
        gpu_type: terraform's default gpu_type (the node's accelerator label).
        jax_pin: the version pinned as ``jax==`` in requirements.txt.

    Returns:
        One readable line per disagreement; empty when all agree.
    """
    errors = []
    for file_name, docs in manifests.items():
        requests = gpu_requests(docs)
        if not requests:
            errors.append(
                f"{file_name}: no container requests {GPU_RESOURCE}; the course needs the node's {gpu_count} GPUs"
            )
        for where, count in requests:
            if count != gpu_count:
                errors.append(
                    f"{file_name}: {where} asks for {GPU_RESOURCE}: {count} but terraform's GPU node has "
                    f"gpu_count = {gpu_count}; the pod would "
                    + ("stay Pending (Insufficient nvidia.com/gpu)" if count > gpu_count else "leave GPUs unused")
                )
        jax_versions = []
        for doc in docs:
            for workload, spec in pod_specs(doc):
                selector = spec.get("nodeSelector", {}).get(ACCELERATOR_LABEL)
                if selector != gpu_type:
                    errors.append(
                        f"{file_name}: {workload} nodeSelector {ACCELERATOR_LABEL}={selector!r}, terraform's gpu_type is {gpu_type!r}"
                    )
                for container in containers(spec):
                    version = env_value(container, "JAX_VERSION")
                    if version is not None:
                        jax_versions.append((f"{workload}/{container['name']}", version))
        if not jax_versions:
            errors.append(f"{file_name}: no container sets JAX_VERSION, so the installed JAX is not pinned")
        for where, version in jax_versions:
            if version != jax_pin:
                errors.append(
                    f"{file_name}: {where} installs jax[cuda12]=={version}, requirements.txt pins jax=={jax_pin}"
                )
    return errors
