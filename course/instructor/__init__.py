"""The instructor's tools: author, release, grade and hand out the course.

``authoring`` (jupytext scripts -> notebooks), ``pipeline`` (release, demo, autograde,
feedback, grades: ``python -m course.instructor.pipeline``; grading itself is
:mod:`course.grading`), ``selfstudy`` (notebooks with instant feedback), ``hub`` (a class on
JupyterHub), ``studentview`` (what students get).
"""

__all__ = [
    "authoring",
    "bank",
    "commands",
    "cues",
    "forkedkernels",
    "grades",
    "hub",
    "hubconfig",
    "hubdown",
    "lab",
    "pipeline",
    "reference",
    "selfstudy",
    "studentlab",
    "studentview",
    "submissions",
    "workcopies",
    "zygote",
]
