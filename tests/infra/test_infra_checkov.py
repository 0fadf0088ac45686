"""checkov over terraform/ and deploy/: no failed check, and every skip is written down and used.

checkov lives in its own virtual environment (.venv-checkov, made by
`make infra-test`) because its dependency bc-python-hcl2 installs a
top-level ``hcl2`` module that would shadow python-hcl2 here; this test runs
it as a subprocess. A skip is accepted only with its reason beside it:
``#checkov:skip=ID:reason`` in Terraform, a ``checkov.io/skipN: ID=reason``
annotation in the manifests. A skip that checkov no longer reports (the check
now passes, or the resource moved) fails too, so stale reasons do not pile up.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from infra_files import DEPLOY_DIR, MANIFESTS, ROOT, TERRAFORM_DIR

MIN_REASON_CHARS = 40
TERRAFORM_SKIP = re.compile(r"#\s*checkov:skip=([A-Z0-9_]+):(.*)$")
RESOURCE_LINE = re.compile(r'^resource\s+"([^"]+)"\s+"([^"]+)"')


def checkov_binary() -> Path:
    configured = os.environ.get("CHECKOV")
    path = Path(configured) if configured else ROOT / ".venv-checkov" / "bin" / "checkov"
    if not path.exists():
        pytest.skip(
            f"checkov not found at {path}: it needs its own virtual environment, "
            "which `make infra-test` creates (.venv-checkov from requirements-checkov.txt)"
        )
    return path


def declared_terraform_skips() -> dict[tuple[str, str, str], str]:
    """(file, resource address, check ID) -> reason, from the skip comments."""
    skips = {}
    for path in sorted(TERRAFORM_DIR.glob("*.tf")):
        resource = None
        for line in path.read_text().splitlines():
            found = RESOURCE_LINE.match(line)
            if found:
                resource = f"{found.group(1)}.{found.group(2)}"
            found = TERRAFORM_SKIP.search(line)
            if found:
                assert resource is not None, f"{path.name}: skip comment outside a resource block: {line.strip()}"
                skips[(path.name, resource, found.group(1))] = found.group(2).strip()
    return skips


def declared_manifest_skips() -> dict[tuple[str, str, str], str]:
    """(file, Kind.namespace.name, check ID) -> reason, from the skip annotations."""
    skips = {}
    for name in MANIFESTS:
        for doc in yaml.safe_load_all((DEPLOY_DIR / name).read_text()):
            if not doc:
                continue
            metadata = doc["metadata"]
            resource = f"{doc['kind']}.{metadata.get('namespace', 'default')}.{metadata['name']}"
            for key, value in (metadata.get("annotations") or {}).items():
                if key.startswith("checkov.io/skip"):
                    check_id, separator, reason = value.partition("=")
                    assert separator, f"{name}: {key} has no '=reason' after {value!r}"
                    assert "=" not in reason, (
                        f"{name}: {key}: checkov splits on '=', so the reason must not contain one"
                    )
                    skips[(name, resource, check_id.strip())] = reason.strip()
    return skips


def run_checkov(directory: Path) -> list[dict]:
    result = subprocess.run(
        [
            str(checkov_binary()),
            "--directory",
            str(directory),
            "--framework",
            "terraform",
            "kubernetes",
            "secrets",
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
    assert result.stdout.strip(), f"checkov printed nothing (exit {result.returncode}):\n{result.stderr}"
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = sum(r["summary"]["failed"] for r in reports)
    assert (result.returncode != 0) == (failed > 0), f"checkov exit {result.returncode} with {failed} failures"
    return reports


@pytest.fixture(scope="module")
def reports() -> dict[str, list[dict]]:
    return {"terraform": run_checkov(TERRAFORM_DIR), "deploy": run_checkov(DEPLOY_DIR)}


@pytest.mark.parametrize("directory, check_type", [("terraform", "terraform"), ("deploy", "kubernetes")])
def test_checkov_scanned_and_found_no_failure(reports, directory, check_type):
    by_type = {r["check_type"]: r for r in reports[directory]}
    assert check_type in by_type, f"checkov found nothing to check in {directory}/"
    summary = by_type[check_type]["summary"]
    assert summary["resource_count"] > 0 and summary["passed"] > 0, summary
    assert summary["parsing_errors"] == 0, by_type[check_type]["results"].get("parsing_errors")
    failures = [
        f"{c['check_id']} {c['check_name']}: {c['resource']} ({c['file_path']})"
        for r in reports[directory]
        for c in r["results"]["failed_checks"]
    ]
    assert not failures, "fix these, or skip each with its reason beside it:\n" + "\n".join(failures)


def test_every_skip_has_a_reason():
    for (file_name, resource, check_id), reason in {**declared_terraform_skips(), **declared_manifest_skips()}.items():
        assert len(reason) >= MIN_REASON_CHARS and " " in reason, (
            f"{file_name} {resource} skips {check_id} without a real reason: {reason!r}"
        )


def test_every_declared_skip_is_one_checkov_reports(reports):
    declared = {(Path(f).name, r, c) for f, r, c in {**declared_terraform_skips(), **declared_manifest_skips()}}
    reported = {
        (Path(c["file_path"]).name, c["resource"], c["check_id"])
        for directory in reports.values()
        for r in directory
        for c in r["results"]["skipped_checks"]
    }
    assert reported == declared, (
        f"skipped without a reason in the files: {sorted(reported - declared)}; "
        f"declared but not used (remove them): {sorted(declared - reported)}"
    )
