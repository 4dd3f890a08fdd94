# The course's commands. `make demo` and `make test` do all the set-up themselves.
#   make demo   build the course, run it, autograde sample submissions, show the grades
#   make test   the whole test suite (ruff included), as CI runs it
#   make lab    open the course in JupyterLab

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Debian packages the browser tests and the sandboxed autograde need.
SYSTEM_PACKAGES := chromium bubblewrap

.PHONY: setup system-deps test lint format lab benchmarks clean

setup: $(STAMP) system-deps

# torch is pinned in pyproject.toml: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --editable '.[test]'
	touch $@

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

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: setup lint
	$(PY) -m pytest

# Students work in copies (git-ignored), never in the committed release/: `make lab` makes
# work/ (copies of release/) and opens its first notebook; `make lab WORK=selfstudy-work
# FROM=selfstudy` the self-study build. The lab serves the course root, so that nbgrader's
# formgrader (its links to source/ and release/) works too (course/instructor/lab.py).
WORK ?= work
FROM ?= release

lab: setup
	$(if $(filter selfstudy,$(FROM)),$(MAKE) selfstudy,)
	$(PY) -m course.instructor.lab $(WORK) --from $(FROM)

benchmarks: setup
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf submitted autograded feedback exchange gradebook.db selfstudy test-artifacts
	@echo "kept work/ (your answers); remove it yourself to start over"

-include mk/*.mk
