# The course's commands. `make demo` and `make test` do all the set-up themselves.
#   make demo   build the course, run it, autograde sample submissions, show the grades
#   make test   the whole test suite (ruff included), as CI runs it
#   make lab    open the course in JupyterLab
#   make hub    the course on a JupyterHub with real accounts (root; loopback only)
#   make hub-down   stop it (REMOVE=1: and remove its accounts and files)

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
# Debian packages the browser tests and the sandboxed autograde need.
SYSTEM_PACKAGES := chromium bubblewrap

.PHONY: setup system-deps bytecode test lint format lab hub hub-down benchmarks clean

setup: $(STAMP) system-deps $(NODE_STAMP) bytecode

# torch is pinned in pyproject.toml: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --editable '.[test]'
	touch $@

# The course's own bytecode, written ahead: it is installed editable, and the processes that
# import it (kernels, graders, the sandboxed forkservers, which may not write) would otherwise
# each compile it again where bytecode is not written (PYTHONDONTWRITEBYTECODE): 1 to 2 CPU-s a
# submission graded. Only what changed is compiled again.
bytecode: $(STAMP)
	@$(PY) -m compileall -q course

# JupyterHub's proxy (configurable-http-proxy), pinned in package-lock.json, for `make hub`.
$(NODE_STAMP): package.json package-lock.json | system-deps
	@if command -v npm >/dev/null; then npm ci --no-audit --no-fund --silent && touch $@; \
	else echo "note: npm is missing: make hub and its browser test need it (apt-get install npm)"; fi

# Installed when we may (root with apt-get); otherwise the tests that need them skip and say so.
system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else \
		echo "note: missing Debian packages:$$missing (sudo apt-get install -y$$missing); the tests that need them will skip"; \
	fi
	@if ! command -v npm >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing nodejs npm (the hub's proxy)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Two workers, one per core of the 2-core CI machine; a test file stays on one worker, so its
# module fixtures (a graded class, a hub) are built once. JOBS=1 runs it in one process.
JOBS ?= 2
test: setup lint
	$(PY) -m pytest $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadfile)

# Students work in copies (git-ignored), never in the committed release/: `make lab` makes
# work/ (copies of release/) and opens its first notebook; `make lab WORK=selfstudy-work
# FROM=selfstudy` the self-study build. The lab serves the course root, so that nbgrader's
# formgrader (its links to source/ and release/) works too (course/instructor/lab.py).
# `make lab PORT=8890` serves on that port; with no display no browser is opened.
WORK ?= work
FROM ?= release

lab: setup
	$(if $(filter selfstudy,$(FROM)),$(MAKE) selfstudy,)
	$(PY) -m course.instructor.lab $(WORK) --from $(FROM) $(if $(PORT),--port $(PORT),)

# A class on JupyterHub (course.instructor.hub): accounts, the students' environment in
# HUB_ENV, the course and nbgrader's exchange in HUB_ROOT, then the hub on 127.0.0.1:HUB_PORT.
HUB_ROOT ?= /srv/sync-data-parallel
HUB_ENV ?= /opt/sync-data-parallel/env
HUB_PORT ?= 8000

hub: setup
	$(PY) -m course.instructor.hub --root $(HUB_ROOT) --env $(HUB_ENV) --port $(HUB_PORT) $(if $(HUB_PASSWORD),--password $(HUB_PASSWORD),)

# Stop the class's hub; REMOVE=1 also deletes its accounts, HUB_ROOT (grades too) and HUB_ENV.
hub-down: setup
	$(PY) -m course.instructor.hubdown --root $(HUB_ROOT) --env $(HUB_ENV) $(if $(filter 1,$(REMOVE)),--remove,)

benchmarks: setup
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf submitted autograded feedback exchange gradebook.db selfstudy test-artifacts
	@echo "kept work/ (your answers); remove it yourself to start over"

-include mk/*.mk
