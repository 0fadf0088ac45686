"""Before `terraform apply`: are there enough GPUs in the quotas for what terraform.tfvars asks?

    python tools/preflight.py [terraform/terraform.tfvars]     (make preflight)

Reads the variables from ``terraform.tfvars`` (defaults from
``terraform/variables.tf``), works out the L4 GPUs the node pool needs
(``gpu_node_count`` nodes x ``gpu_count`` GPUs), and compares them, through
``gcloud``, with what is left of two quotas:

- the region's ``NVIDIA_L4_GPUS`` (``PREEMPTIBLE_NVIDIA_L4_GPUS`` for Spot
  nodes), from ``gcloud compute regions describe REGION --format=json``;
- the project's ``GPUS_ALL_REGIONS``, from
  ``gcloud compute project-info describe --format=json``.

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


def _find_quota(payload: dict, metric: str, scope: str) -> Quota:
    for entry in payload.get("quotas", []):
        if entry.get("metric") == metric:
            return Quota(metric, scope, float(entry.get("limit", 0)), float(entry.get("usage", 0)))
    # Not listed: Compute Engine grants none of it there.
    return Quota(metric, scope, 0.0, 0.0)


def gpu_quotas(project: str, region: str, spot: bool) -> list[Quota]:
    """The regional L4 quota and the project-wide GPU quota, read with gcloud."""
    region_metric = SPOT_REGION_QUOTA if spot else REGION_QUOTA
    regional = _gcloud_json(["compute", "regions", "describe", region, f"--project={project}"])
    project_info = _gcloud_json(["compute", "project-info", "describe", f"--project={project}"])
    return [
        _find_quota(regional, region_metric, f"region {region}"),
        _find_quota(project_info, PROJECT_QUOTA, f"project {project}"),
    ]


def shortfalls(quotas: list[Quota], needed: int) -> list[str]:
    """One message per quota with fewer than ``needed`` GPUs available; empty when all suffice."""
    messages = []
    for quota in quotas:
        if quota.available < needed:
            messages.append(
                f"Quota {quota.metric} ({quota.scope}) is short: needed {needed} GPUs, available "
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
        nodes, per_node = int(values.get("gpu_node_count", 1)), int(values.get("gpu_count", 2))
        spot = bool(values.get("spot", False))
        needed = nodes * per_node
        quotas = gpu_quotas(str(values["project_id"]), str(values["region"]), spot)
    except PreflightError as err:
        print(f"preflight: {err}", file=sys.stderr)
        return 2
    print(
        f"preflight: {tfvars} asks for {nodes} node(s) x {per_node} L4 GPU(s) = {needed} GPUs"
        f"{' (Spot)' if spot else ''} in project {values['project_id']}, region {values['region']}."
    )
    for quota in quotas:
        print(f"  {quota.metric} ({quota.scope}): limit {quota.limit:g}, in use {quota.usage:g}")
    short = shortfalls(quotas, needed)
    for message in short:
        print(f"preflight: {message}", file=sys.stderr)
    if not short:
        print("preflight: the GPU quotas allow it; go on with terraform apply.")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
