"""The pictures: the ring animation as a plotly figure (``figures``) and as a widget (``widgets``).

``figures`` needs no kernel (exported HTML, feedback pages); ``widgets`` is the only module
that imports ipywidgets.
"""
