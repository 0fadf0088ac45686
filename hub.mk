# A room of learners (issue 20): included by the main Makefile.
#
#   hub            JupyterHub for a workshop on this machine (hub/launch.py;
#                  settings HUB_* in hub/jupyterhub_config.py, docs/instructor.md)
#   hub-end        end the workshop: every learner's account, home, scratch files and password (LEARNER=NAME: one)
#   hub-test       the room test in Chromium and the GKE hub config checked offline (tests/hub)
#   plan-workshop  nodes, GPUs and cost for LEARNERS (tools/plan_workshop.py)
#   room-card      a printable page for each table: the hub's address, password, what to do (hub/card.py)
#   wheelhouse     the pinned requirements for Linux, macOS and Windows in wheelhouse/
#   wheelhouse-test  download three platforms, install offline into a fresh venv, import the course

.PHONY: hub hub-end hub-install hub-test room-card plan-workshop wheelhouse wheelhouse-test

HUB_REQUIREMENTS ?= requirements-hub.txt

# As root, every learner's server runs the course's Python as a user of their own: on a clone with no
# environment yet, `make hub` builds it from a Python they can run (hub/pythons.py: not one under a
# closed home such as pyenv's in /root). PYTHON= on the command line is used as given.
ifneq ($(filter hub hub-install,$(MAKECMDGOALS)),)
ifeq ($(origin PYTHON)$(wildcard $(PY)),file)
PYTHON := $(or $(shell $(PYTHON) hub/pythons.py --pick 2>/dev/null),$(PYTHON))
endif
endif

$(VENV)/.hub-installed: $(HUB_REQUIREMENTS) $(VENV)/.installed
	$(PY) -m pip install --quiet -r $(HUB_REQUIREMENTS)
	touch $@

# configurable-http-proxy from npm, pinned in tools/hub/package-lock.json.
tools/hub/node_modules/.installed: tools/hub/package-lock.json
	cd tools/hub && npm ci --no-audit --no-fund --silent
	touch $@

hub-install: $(VENV)/.hub-installed tools/hub/node_modules/.installed

hub: hub-install
	$(PY) hub/launch.py

# A learner's name is data: it reaches hub/end.py in the environment, never expanded by make or the
# shell ($(value) keeps `$(...)`, backticks, quotes and newlines as typed; unexport keeps make from
# expanding it when it hands the command line's variables to the recipe).
LEARNER ?=
unexport LEARNER
hub-end: export HUB_END_LEARNER := $(value LEARNER)
hub-end: hub-install
	$(PY) hub/end.py

# --confcutdir keeps tests/conftest.py (JAX device set-up) out; -s shows the measured timings.
# HUB_TEST_PORT (default 8900) moves the test hub's 12 ports, for two runs on one machine.
hub-test: hub-install $(VENV)/.dev-installed
	$(PY) -m pytest tests/hub --confcutdir=tests/hub -p no:cacheprovider -s

room-card: $(VENV)/.installed
	$(PY) hub/card.py

LEARNERS ?= 24
MIX ?= cpu=0.5,shared-l4=0.5
PRICES ?=
PRICE_DATE ?=
plan-workshop: $(VENV)/.installed
	$(PY) tools/plan_workshop.py --learners $(LEARNERS) --mix $(MIX) \
		$(foreach p,$(PRICES),--price $(p)) $(if $(PRICE_DATE),--price-date $(PRICE_DATE),)

wheelhouse: $(PY)
	$(PY) tools/wheelhouse.py --dest $(WHEELHOUSE)
	$(if $(wildcard $(VENV)/.installed),$(PY) tools/wheelhouse_data.py pack --dest $(WHEELHOUSE),@echo "wheelhouse: the Fashion-MNIST files are added once the course is installed here (make course, then make wheelhouse)")

# About 600 MB of downloads and an offline install (a few minutes); part of make test
# (test-pinned), skipped with the reason where the package registry cannot be reached; -s shows
# the sizes per platform and the offline install time.
wheelhouse-test: $(VENV)/.dev-installed
	$(PY) -m pytest tests/wheelhouse --confcutdir=tests/wheelhouse -p no:cacheprovider -s
