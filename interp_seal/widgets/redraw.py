"""Show a new figure in a widget without sending plotly's bundle again.

Plotly's ``FigureWidget`` is an anywidget whose front-end module, plotly.js included, is a
trait of every instance: each new ``FigureWidget`` sends about 5 MB to the browser, which
evaluates it before drawing (measured on the dashboard: ~3.5 s per click when every click built
three new figure widgets). ``redraw`` instead changes an existing widget's traces and layout
inside ``batch_update``, so that only the changed values travel; a new widget is built only the
first time, or when the figure's traces are of other kinds or number.
"""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go

KEPT = ("type", "uid")


def redraw(
    current: go.FigureWidget | None, figure: go.Figure, box: w.Box | None = None
) -> go.FigureWidget:
    """``current`` showing ``figure`` (changed in place), or a new ``FigureWidget`` of it when
    there is none or its traces differ in kind; a new widget replaces ``box``'s children.
    Click handlers attached to ``current``'s traces stay attached."""
    if current is not None and _kinds(current) == _kinds(figure):
        with current.batch_update():
            for shown, new in zip(current.data, figure.data, strict=True):
                shown.update(_replacing(shown, new), overwrite=True)
            current.layout.update(_replacing(current.layout, figure.layout), overwrite=True)
        return current
    widget = go.FigureWidget(figure)
    if box is not None:
        box.children = (widget,)
    return widget


def _replacing(shown, new) -> dict:
    """``new``'s properties, with those that only ``shown`` has set to None (removed); a
    trace keeps its kind and the ``uid`` the widget tracks it by."""
    values = new.to_plotly_json()
    for key in KEPT:
        values.pop(key, None)
    for key in shown.to_plotly_json():
        if key not in KEPT:
            values.setdefault(key, None)
    return values


def _kinds(figure: go.Figure) -> list[str]:
    return [trace.type for trace in figure.data]
