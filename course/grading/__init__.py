"""Grading: a class's submissions to their grades, running none of their code outside a sandbox.

``classrun`` (a class: ``intake`` inspects each submission, ``executors`` hands each to a worker
of a local pool or a Dask cluster as plain data, ``results`` checks and merges what comes
back), ``scratch`` (one submission in a scratch course, as a uid ``slots`` leases for it,
``autograder`` and ``warm``: nbgrader autograde forked warm), ``judge`` (nbgrader's Execute
replaced, in the ``pipelines`` the config names: ``quiz`` reads answers from the text,
``student`` and ``rankbox`` run the student's functions on confined ranks, in ``sandbox``;
``copies`` flags near copies of the solution).
"""

__all__ = [
    "autograder",
    "cells",
    "cgroups",
    "classrun",
    "copies",
    "early",
    "executors",
    "gradebook",
    "inert",
    "intake",
    "judge",
    "limits",
    "pipelines",
    "preload",
    "quiz",
    "rankbox",
    "results",
    "sandbox",
    "scratch",
    "slots",
    "student",
    "warm",
]
