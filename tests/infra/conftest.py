"""Shared fixtures for the offline checks of terraform/ and deploy/.

These tests need python-hcl2, kubernetes-validate, yamllint and PyYAML
(requirements-infra.txt), not JAX: `make infra-test` runs them with
``--confcutdir=tests/infra`` so the course's tests/conftest.py (which sets up
JAX devices) is not loaded for them.
"""

from __future__ import annotations

import pytest
from hcl_eval import Module
from infra_files import DEPLOY_DIR, MANIFESTS, ROOT, TERRAFORM_DIR, load_hcl, load_manifest, read_pins


@pytest.fixture(scope="session")
def tf_module() -> Module:
    """Every block of terraform/*.tf, with expressions kept for evaluation."""
    return Module.load(TERRAFORM_DIR)


@pytest.fixture(scope="session")
def tf() -> dict[str, dict]:
    """terraform/*.tf as python-hcl2 dictionaries, by file name."""
    return {path.name: load_hcl(path) for path in sorted(TERRAFORM_DIR.glob("*.tf"))}


@pytest.fixture(scope="session")
def manifests() -> dict[str, list[dict]]:
    """The documents of each deploy/*.yaml, by file name."""
    return {name: load_manifest(DEPLOY_DIR / name) for name in MANIFESTS}


@pytest.fixture(scope="session")
def pins() -> dict[str, str]:
    """requirements.txt's exact pins."""
    return read_pins(ROOT / "requirements.txt")
