# Offline checks of terraform/ and deploy/ (layer 3 of the tests).
# Included by the main Makefile; also runs on its own:
#   make -f infra.mk infra-test
#
#   infra-install  requirements-infra.txt (python-hcl2, kubernetes-validate,
#                  yamllint, PyYAML) into $(VENV)
#   infra-test     checkov in its own venv, then pytest tests/infra
#   preflight      before terraform apply: the GPU quotas (through gcloud)
#                  against what terraform/terraform.tfvars asks for
#
# deploy/tpu-slice (the multi-host Jobs on a TPU slice) is built with
# `kubectl kustomize`; without kubectl on PATH those tests are skipped.
# `terraform validate` needs the google provider, which is not downloaded
# here: tests/infra evaluates the variables' rules itself and runs
# `terraform fmt` and `terraform plan` on the variables alone.
#
# checkov gets its own virtual environment ($(CHECKOV_VENV)): its dependency
# bc-python-hcl2 installs a top-level `hcl2` module that would shadow
# python-hcl2 in $(VENV).

VENV ?= .venv
CHECKOV_VENV ?= .venv-checkov
INFRA_BOOTSTRAP_PYTHON ?= $(or $(PYTHON),python3)
INFRA_PY := $(VENV)/bin/python
CHECKOV := $(CHECKOV_VENV)/bin/checkov
# --skip-download: offline (no external checks or guidelines fetched).
CHECKOV_FLAGS := --skip-download --compact --quiet

.PHONY: infra-install infra-test preflight

# The main Makefile defines PY and the rule that makes $(VENV); on its own,
# this file makes the environment itself.
ifndef PY
$(INFRA_PY):
	$(INFRA_BOOTSTRAP_PYTHON) -m venv $(VENV)
endif

$(VENV)/.infra-installed: requirements-infra.txt | $(INFRA_PY)
	$(INFRA_PY) -m pip install --quiet -r requirements-infra.txt
	touch $@

$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	test -x $(CHECKOV_VENV)/bin/python || $(INFRA_BOOTSTRAP_PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet -r requirements-checkov.txt
	touch $@

infra-install: $(VENV)/.infra-installed

# checkov exits non-zero on any failed check; accepted ones are skipped in the
# files themselves, each with its reason (#checkov:skip=ID:reason in
# terraform/, checkov.io/skipN annotations in deploy/). --confcutdir keeps the
# course's tests/conftest.py (JAX device set-up) out of these tests.
infra-test: infra-install $(CHECKOV_VENV)/.installed
	$(CHECKOV) --directory terraform --framework terraform secrets $(CHECKOV_FLAGS)
	$(CHECKOV) --directory deploy --framework kubernetes secrets $(CHECKOV_FLAGS)
	CHECKOV=$(CHECKOV) $(INFRA_PY) -m pytest tests/infra --confcutdir=tests/infra

# Before `terraform apply`: NVIDIA_L4_GPUS in the region and GPUS_ALL_REGIONS
# in the project against gpu_node_count x gpu_count (tools/preflight.py).
TFVARS ?= terraform/terraform.tfvars
preflight: infra-install
	$(INFRA_PY) tools/preflight.py $(TFVARS)
