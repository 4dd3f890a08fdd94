"""The ring's pictures: its animation as a plotly figure (``figures``) and a widget (``widgets``).

``style`` (colours, sizes, the step counter), ``base`` (the figure's traces and layout),
``view`` (what changes at each step), ``deviations`` (a run that is not a ring, in words),
``halves`` (one half of the ring) and ``figures`` (the kernel-free animation) need no kernel
(exported HTML, feedback pages); ``widgets`` is the only module that imports ipywidgets. The
ring and zero lessons show these; the FSDP lesson draws its step with the same machinery
(``course.lessons.fsdp``).
"""

__all__ = ["base", "deviations", "figures", "halves", "style", "view", "widgets"]
