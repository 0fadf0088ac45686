"""Before `terraform apply`: are there enough GPUs in the quotas for what terraform.tfvars asks?

    python tools/preflight.py [terraform/terraform.tfvars]     (make preflight)

Reads the variables from ``terraform.tfvars`` (defaults from
``terraform/variables.tf``), works out what every node pool may use at its
autoscaling maximum (the dedicated GPU pool: ``gpu_node_count`` x
``gpu_count``; the time-shared pool: ``shared_gpu_max_node_count`` x the GPUs
of ``shared_gpu_machine_type``; the CPU pool: ``cpu_max_node_count`` x the
vCPUs of ``cpu_machine_type``), and compares it, through ``gcloud``, with what
is left of these quotas:

- the region's L4 quota, from ``gcloud compute regions describe REGION``:
  ``NVIDIA_L4_GPUS``; for Spot nodes ``PREEMPTIBLE_NVIDIA_L4_GPUS`` when the
  region grants some (limit above 0), otherwise ``NVIDIA_L4_GPUS`` too: Spot
  VMs consume the standard quota unless preemptible quota has been granted
  (Compute Engine, "Create and use Spot VMs", quotas section);
- the project's ``GPUS_ALL_REGIONS``, from ``gcloud compute project-info describe``;
- the CPU pool's vCPUs against the region's ``CPUS`` (E2 and N1 types) or the
  family's own quota (``N2_CPUS``, ``C3_CPUS``, ...) when the region lists it,
  and every pool's vCPUs against the project's ``CPUS_ALL_REGIONS`` when listed.
  The G2 nodes' vCPUs are not checked against a regional quota (their family
  quota is not in the API's published list); GPUs are the scarce part there.

Each quota there is ``{"metric": ..., "limit": ..., "usage": ...}``;
available = limit - usage. GPUs this project already uses count as in use, so
on a cluster that exists, its own GPUs are not available to it a second time.

Exit status: 0 enough, 1 a quota is short (the message names it, needed vs
available, and how to request more), 2 the check could not run (no gcloud, no
tfvars, gcloud failed: the message says what to do).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import hcl2

ROOT = Path(__file__).resolve().parents[1]
TERRAFORM_DIR = ROOT / "terraform"
PROJECT_QUOTA = "GPUS_ALL_REGIONS"
REGION_QUOTA = "NVIDIA_L4_GPUS"
SPOT_REGION_QUOTA = "PREEMPTIBLE_NVIDIA_L4_GPUS"
GCLOUD_TIMEOUT_S = 60
QUOTAS_PAGE = "https://console.cloud.google.com/iam-admin/quotas"
# GPUs built into each G2 machine type (as terraform/locals.tf; tests/infra keeps the two equal).
G2_GPUS = {
    "g2-standard-4": 1,
    "g2-standard-8": 1,
    "g2-standard-12": 1,
    "g2-standard-16": 1,
    "g2-standard-24": 2,
    "g2-standard-32": 1,
    "g2-standard-48": 4,
    "g2-standard-96": 8,
}


class PreflightError(RuntimeError):
    """The check cannot run; the message says what to do (exit status 2)."""


@dataclass(frozen=True)
class Quota:
    """One Compute Engine quota: its metric name, where it applies, its limit and usage."""

    metric: str
    scope: str  # "region us-central1" or "project my-project"
    limit: float
    usage: float

    @property
    def available(self) -> float:
        return self.limit - self.usage


def _unquote(value):
    """python-hcl2 keeps the quotes of string literals: ``'"us-central1"'`` -> ``us-central1``."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def terraform_values(tfvars: Path, variables_tf: Path = TERRAFORM_DIR / "variables.tf") -> dict:
    """The variables as ``terraform apply`` would use them: ``tfvars`` over the defaults of ``variables_tf``.

    Raises:
        PreflightError: ``tfvars`` is missing or cannot be parsed, or it lacks ``project_id``.
    """
    if not tfvars.is_file():
        raise PreflightError(
            f"{tfvars} does not exist. Copy the example first: "
            "cp terraform/terraform.tfvars.example terraform/terraform.tfvars, then set project_id."
        )
    values = {}
    with variables_tf.open() as handle:
        for block in hcl2.load(handle).get("variable", []):
            for name, body in block.items():
                if "default" in body:
                    values[_unquote(name)] = _unquote(body["default"])
    try:
        with tfvars.open() as handle:
            given = hcl2.load(handle)
    except Exception as err:  # python-hcl2 raises lark's exceptions, with the line and column
        raise PreflightError(f"{tfvars} cannot be parsed: {err}") from None
    values.update({name: _unquote(value) for name, value in given.items() if not name.startswith("__")})
    if not values.get("project_id"):
        raise PreflightError(f"{tfvars} does not set project_id: set it to your Google Cloud project's ID.")
    return values


def _gcloud_json(args: list[str]) -> dict:
    """Run ``gcloud ARGS --format=json`` and parse its output.

    Raises:
        PreflightError: gcloud is not installed, fails (signed out, unknown
            project or region, API off), or prints something that is not JSON.
    """
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise PreflightError(
            "gcloud is not on PATH. Install the gcloud CLI (https://cloud.google.com/sdk/docs/install), "
            "sign in with `gcloud auth login`, then run make preflight again."
        )
    command = [gcloud, *args, "--format=json"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=GCLOUD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PreflightError(f"`gcloud {' '.join(args)}` did not answer within {GCLOUD_TIMEOUT_S} s.") from None
    if done.returncode != 0:
        raise PreflightError(
            f"`gcloud {' '.join(args)}` failed (exit status {done.returncode}):\n{done.stderr.strip()}\n"
            "Check that you are signed in (gcloud auth login), that the project ID and region are right, "
            "and that the Compute Engine API is enabled (gcloud services enable compute.googleapis.com)."
        )
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise PreflightError(f"`gcloud {' '.join(args)}` printed no JSON:\n{done.stdout[:500]}") from None


def _find_quota(payload: dict, metric: str, scope: str) -> Quota | None:
    """The quota ``metric`` of ``payload`` (a gcloud describe answer), or None when it is not listed."""
    for entry in payload.get("quotas", []):
        if entry.get("metric") == metric:
            return Quota(metric, scope, float(entry.get("limit", 0)), float(entry.get("usage", 0)))
    return None


def vcpus(machine_type: str) -> int:
    """vCPUs of a predefined machine type, from its name: ``e2-standard-8`` -> 8.

    Raises:
        PreflightError: the name does not end in a number (a custom type).
    """
    tail = machine_type.rsplit("-", 1)[-1]
    if not tail.isdigit():
        raise PreflightError(f"cannot tell the vCPUs of machine type {machine_type!r}: use a predefined type.")
    return int(tail)


@dataclass(frozen=True)
class Needs:
    """What the cluster may use at its autoscaling maxima."""

    lines: list[str]  # one per pool, for the report
    gpus: int
    cpu_pool_vcpus: int
    cpu_family: str
    all_vcpus: int


def needs(values: dict) -> Needs:
    """GPUs and vCPUs of every node pool at its maximum, from the terraform variables."""
    nodes, per_node = int(values.get("gpu_node_count", 1)), int(values.get("gpu_count", 2))
    machine = str(values.get("machine_type", "g2-standard-24"))
    shared_nodes = int(values.get("shared_gpu_max_node_count", 0))
    shared_machine = str(values.get("shared_gpu_machine_type", "g2-standard-24"))
    shared_per_node = G2_GPUS.get(shared_machine)
    if shared_nodes and shared_per_node is None:
        raise PreflightError(f"shared_gpu_machine_type {shared_machine!r} is not a G2 machine type.")
    cpu_nodes = int(values.get("cpu_max_node_count", 0))
    cpu_machine = str(values.get("cpu_machine_type", "e2-standard-8"))
    lines = [f"GPU pool: {nodes} node(s) x {per_node} L4 GPU(s) = {nodes * per_node} GPUs"]
    gpus = nodes * per_node
    all_vcpus = nodes * vcpus(machine)
    if shared_nodes:
        clients = int(values.get("max_shared_clients_per_gpu", 1))
        lines.append(
            f"time-shared GPU pool: up to {shared_nodes} node(s) x {shared_per_node} L4 GPU(s) = "
            f"{shared_nodes * shared_per_node} GPUs ({clients} learners per GPU)"
        )
        gpus += shared_nodes * shared_per_node
        all_vcpus += shared_nodes * vcpus(shared_machine)
    cpu_pool_vcpus = cpu_nodes * vcpus(cpu_machine) if cpu_nodes else 0
    if cpu_nodes:
        lines.append(f"CPU pool: up to {cpu_nodes} node(s) x {cpu_machine} = {cpu_pool_vcpus} vCPUs")
        all_vcpus += cpu_pool_vcpus
    return Needs(lines, gpus, cpu_pool_vcpus, cpu_machine.split("-", 1)[0].upper(), all_vcpus)


def gpu_quotas(project: str, region: str, spot: bool, regional: dict, project_info: dict) -> list[Quota]:
    """The L4 quotas that apply: the region's (standard or preemptible, see the module's docstring) and the project's."""
    scope = f"region {region}"
    standard = _find_quota(regional, REGION_QUOTA, scope) or Quota(REGION_QUOTA, scope, 0.0, 0.0)
    if spot:
        preemptible = _find_quota(regional, SPOT_REGION_QUOTA, scope)
        if preemptible is not None and preemptible.limit > 0:
            regional_quota = preemptible
        else:
            regional_quota = Quota(
                REGION_QUOTA,
                f"{scope}; Spot nodes use it because no {SPOT_REGION_QUOTA} quota is granted there",
                standard.limit,
                standard.usage,
            )
    else:
        regional_quota = standard
    project_quota = _find_quota(project_info, PROJECT_QUOTA, f"project {project}")
    return [regional_quota, project_quota or Quota(PROJECT_QUOTA, f"project {project}", 0.0, 0.0)]


def cpu_quotas(project: str, region: str, family: str, regional: dict, project_info: dict) -> list[Quota]:
    """The CPU pool's regional vCPU quota (family quota if listed, else CPUS) and CPUS_ALL_REGIONS if listed."""
    scope = f"region {region}"
    found = []
    # E2 and N1 count against CPUS; other families against their own quota
    # (N2_CPUS, C3_CPUS, ...), checked only when the region lists it.
    metric = "CPUS" if family in ("E2", "N1") else f"{family}_CPUS"
    regional_quota = _find_quota(regional, metric, scope)
    if regional_quota is not None:
        found.append(regional_quota)
    all_regions = _find_quota(project_info, "CPUS_ALL_REGIONS", f"project {project}")
    if all_regions is not None:
        found.append(all_regions)
    return found


def shortfalls(quotas: list[Quota], needed: int, unit: str = "GPUs") -> list[str]:
    """One message per quota with fewer than ``needed`` units available; empty when all suffice."""
    messages = []
    for quota in quotas:
        if quota.available < needed:
            messages.append(
                f"Quota {quota.metric} ({quota.scope}) is short: needed {needed} {unit}, available "
                f"{quota.available:g} (limit {quota.limit:g}, in use {quota.usage:g}). Request at least "
                f"{needed + quota.usage:g} in the console, IAM & Admin > Quotas ({QUOTAS_PAGE}): filter on "
                f"{quota.metric}{' and the region' if quota.scope.startswith('region') else ''}, select it, "
                "Edit quotas. Approval takes minutes to days; then run make preflight again."
            )
    return messages


def main(argv: list[str] | None = None) -> int:
    """Check the quotas for ``terraform.tfvars``; print the verdict; return the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    tfvars = Path(argv[0]) if argv else TERRAFORM_DIR / "terraform.tfvars"
    try:
        values = terraform_values(tfvars)
        need = needs(values)
        spot = bool(values.get("spot", False))
        project, region = str(values["project_id"]), str(values["region"])
        regional = _gcloud_json(["compute", "regions", "describe", region, f"--project={project}"])
        project_info = _gcloud_json(["compute", "project-info", "describe", f"--project={project}"])
    except PreflightError as err:
        print(f"preflight: {err}", file=sys.stderr)
        return 2
    gpu = gpu_quotas(project, region, spot, regional, project_info)
    cpu = cpu_quotas(project, region, need.cpu_family, regional, project_info)
    print(
        f"preflight: {tfvars} asks for {need.gpus} L4 GPUs{' (Spot)' if spot else ''} "
        f"in project {project}, region {region}:"
    )
    for line in need.lines:
        print(f"  {line}")
    for quota in gpu + cpu:
        print(f"  {quota.metric} ({quota.scope}): limit {quota.limit:g}, in use {quota.usage:g}")
    short = shortfalls(gpu, need.gpus)
    for quota in cpu:
        needed = need.all_vcpus if quota.metric == "CPUS_ALL_REGIONS" else need.cpu_pool_vcpus
        short += shortfalls([quota], needed, "vCPUs")
    for message in short:
        print(f"preflight: {message}", file=sys.stderr)
    if not short:
        print("preflight: the quotas allow it; go on with terraform apply.")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
