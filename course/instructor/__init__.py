"""The instructor's tools: author, release, grade and hand out the course.

``authoring`` (jupytext scripts -> notebooks), ``pipeline`` (release, demo, autograde,
feedback, grades: ``python -m course.instructor.pipeline``), ``classrun`` (a class graded in
parallel: ``intake`` inspects each submission, ``scratch`` grades it, ``slots`` lends it a
uid), ``judge`` (grading that runs none of the submission's code itself: ``quiz`` reads
answers from the text, ``student`` and ``rankbox`` run its functions on confined ranks, in
``sandbox``), ``selfstudy`` (notebooks with instant feedback).
"""
