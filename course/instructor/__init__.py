"""The instructor's tools: author, release, grade and hand out the course.

``authoring`` (jupytext scripts -> notebooks), ``pipeline`` (release, demo, autograde,
feedback, grades: ``python -m course.instructor.pipeline``), ``classrun`` (a class graded in
parallel: ``intake`` inspects each submission, ``scratch`` grades it, ``slots`` lends it a
uid), ``integrity`` and ``sandbox`` (grading that does not trust the kernel),
``selfstudy`` (notebooks with instant feedback).
"""
