# Two commands do everything on a fresh machine with Python 3.11+ and make:
#   make course   set up .venv, install the pinned requirements, run the course headlessly
#   make test     the same set-up plus the test requirements, then every test
# Other targets: lab (JupyterLab), browser-test, sync (re-pair notebooks), clean.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PROFILE ?=
SMOKE_TIMEOUT ?= 600

.PHONY: course test lint unit-test notebook-test browser-test lab sync clean install dev-install

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-install when a requirements file or the package metadata changes.
$(VENV)/.installed: requirements.txt pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

$(VENV)/.dev-installed: requirements-dev.txt $(VENV)/.installed
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed
dev-install: $(VENV)/.dev-installed

course: $(VENV)/.installed
	$(PY) -m dpcourse run $(if $(PROFILE),--profile $(PROFILE),)

# Layer 0: ruff, lint and format check (settings in pyproject.toml).
lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Layer 1: the package and the notebook pairs (8 simulated CPU devices).
unit-test: $(VENV)/.dev-installed
	$(PY) -m pytest tests --ignore=tests/infra --ignore=tests/browser

# Layer 2: every notebook under nbmake with the smoke profile.
notebook-test: $(VENV)/.dev-installed
	DPCOURSE_PROFILE=smoke $(PY) -m pytest --nbmake --nbmake-timeout=$(SMOKE_TIMEOUT) -p no:cacheprovider notebooks

# Layer 3: terraform/ and deploy/, checked offline (infra.mk).
include infra.mk

# Layer 4: every lesson run in JupyterLab in a real Chromium (Playwright).
# Needs a system Chromium (apt-get install chromium); without one it skips
# loudly, except with CI=true, where that fails.
browser-test: $(VENV)/.dev-installed
	$(PY) -m pytest tests/browser --confcutdir=tests/browser -p no:cacheprovider

test: lint unit-test notebook-test infra-test browser-test

# JupyterLab with the course's settings (jupyter/, see docs/jupyterlab.md):
# token authentication, 127.0.0.1 unless LAB_IP says otherwise (for example
# LAB_IP=0.0.0.0 in a container), --allow-root only when run as root.
LAB_IP ?= 127.0.0.1
LAB_PORT ?= 8888
lab: $(VENV)/.installed
	JUPYTER_CONFIG_PATH="$(CURDIR)/jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ip=$(LAB_IP) --port=$(LAB_PORT) \
		$(if $(filter 0,$(shell id -u)),--allow-root,)

sync: $(VENV)/.dev-installed
	$(VENV)/bin/jupytext --sync notebooks/[0-9][0-9]_*.py

clean:
	rm -rf results .pytest_cache notebooks/.ipynb_checkpoints
