# Two commands do everything on a fresh machine with Python 3.11+ and make:
#   make course   set up .venv, install the pinned requirements, run the course headlessly
#   make test     the same set-up plus the test requirements, then every test
# Other targets: lab (JupyterLab), sync (re-pair notebooks), clean.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PROFILE ?=
SMOKE_TIMEOUT ?= 600

.PHONY: course test lint unit-test notebook-test solutions-test lab sync clean install dev-install

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
	$(PY) -m pytest tests --ignore=tests/infra

# Layer 2: every notebook under nbmake with the smoke profile.
notebook-test: $(VENV)/.dev-installed
	DPCOURSE_PROFILE=smoke $(PY) -m pytest --nbmake --nbmake-timeout=$(SMOKE_TIMEOUT) -p no:cacheprovider notebooks

# Layer 2b: the lessons with the exercises' solutions (solutions/) filled in, smoke
# profile; strict mode makes any checker that does not report success fail.
SOLVED_DIR ?= build/solved
solutions-test: $(VENV)/.dev-installed
	rm -rf $(SOLVED_DIR)
	$(PY) -m dpcourse.exercises.solutions --out $(SOLVED_DIR)
	DPCOURSE_PROFILE=smoke DPCOURSE_EXERCISES_STRICT=1 $(PY) -m pytest --nbmake --nbmake-timeout=$(SMOKE_TIMEOUT) -p no:cacheprovider $(SOLVED_DIR)

# Layer 3: terraform/ and deploy/, checked offline (infra.mk).
include infra.mk

test: lint unit-test notebook-test solutions-test infra-test

lab: $(VENV)/.installed
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

sync: $(VENV)/.dev-installed
	$(VENV)/bin/jupytext --sync notebooks/[0-9][0-9]_*.py

clean:
	rm -rf results .pytest_cache notebooks/.ipynb_checkpoints $(SOLVED_DIR)
