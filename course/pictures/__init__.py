"""The pictures: the ring animation as a plotly figure (``figures``) and as a widget (``widgets``).

``style`` (colours, sizes, the step counter), ``base`` (the figure's traces and layout),
``view`` (what changes at each step), ``deviations`` (a run that is not a ring, in words) and
``figures`` (the kernel-free animation) need no kernel (exported HTML, feedback pages);
``widgets`` is the only module that imports ipywidgets. One FSDP step is drawn the same way:
``fsdp_schedule`` (its events, plain data), ``fsdp_layout`` and ``fsdp`` (the figure),
``fsdp_widget`` (the controls, ipywidgets taken from ``widgets``).
"""
