# The instructor's pipeline (course/instructor/pipeline.py), included by the main Makefile, which
# defines PY (the venv's python) and the phony `setup` target that builds the venv.

PIPELINE := $(PY) -m course.instructor.pipeline

.PHONY: release demo autograde selfstudy student-view

## release: source/<a>/<a>.py -> .ipynb (course.instructor.authoring), then nbgrader generate_assignment into release/ (commit both)
release: setup
	$(PY) -m course.instructor.authoring
	$(PIPELINE) release

## demo: the whole course end to end in build/demo: release, run, submit, autograde, grades
demo: setup
	$(PIPELINE) demo

## autograde: autograde submitted/ with nbgrader, then feedback, export and the grade table;
## on a Dask cluster with `make autograde SCHEDULER=tcp://HOST:8786`; a hub's course: ROOT=DIR
autograde: setup
	$(PIPELINE) autograde $(if $(ROOT),--root $(ROOT),) $(if $(SCHEDULER),--scheduler $(SCHEDULER),)

## selfstudy: build selfstudy/<a>/<a>.ipynb, with instant feedback on every quiz item
selfstudy: setup
	$(PIPELINE) selfstudy

## student-view: what students get (graded: no keys), for a student repo / Binder: make student-view DEST=../dp-course REPO=you/dp-course [SELFSTUDY=1: sealed keys, self-study only]
student-view: setup
	@test -n "$(DEST)" || { echo "usage: make student-view DEST=<new folder> REPO=<owner/name> [SELFSTUDY=1]"; exit 2; }
	$(PY) -m course.instructor.studentview $(DEST) --repo $(or $(REPO),OWNER/NAME) $(if $(filter 1,$(SELFSTUDY)),--selfstudy,)
