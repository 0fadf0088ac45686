"""Paths and loaders shared by the tests of terraform/ and deploy/."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import hcl2
import yaml
from hcl2.utils import SerializationOptions

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM_DIR = ROOT / "terraform"
DEPLOY_DIR = ROOT / "deploy"
MANIFESTS = ("jupyter.yaml", "notebook-tests.yaml", "multihost.yaml", "multihost-checkpoint.yaml")

# Strip the quotes from strings and leave comments out: values then read as
# Terraform writes them ("g2-standard-24", "${var.zone}").
HCL_OPTIONS = SerializationOptions(strip_string_quotes=True, with_comments=False, explicit_blocks=False)


def load_hcl(path: Path) -> dict:
    """One .tf file as python-hcl2's dictionary."""
    with path.open() as handle:
        return hcl2.load(handle, serialization_options=HCL_OPTIONS)


def load_manifest(path: Path) -> list[dict]:
    """The documents of one manifest file, empty documents dropped."""
    with path.open() as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def read_pins(path: Path) -> dict[str, str]:
    """Exact pins (``name==version``) of a requirements file, names lower-cased."""
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;#]+)", line)
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(3)
    return pins


def terraform_binary() -> str | None:
    """The terraform executable, if this machine has one."""
    return shutil.which("terraform")


def terraform_env() -> dict[str, str]:
    """Environment for offline terraform runs: no version check, no prompts."""
    env = dict(os.environ)
    env.update({"CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1", "TF_INPUT": "0"})
    return env
