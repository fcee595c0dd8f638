"""``widgets.redraw``: a figure widget shows the new figure exactly, without being rebuilt."""

from __future__ import annotations

import plotly.graph_objects as go

from interp_seal.widgets.redraw import redraw


def shown(widget: go.FigureWidget) -> dict:
    """What the widget holds, without the trace ids the widget adds."""
    data = widget.to_plotly_json()
    for trace in data["data"]:
        trace.pop("uid", None)
    data["layout"] = {k: v for k, v in data["layout"].items() if v not in ([], ())}
    return data


def test_redraw_changes_the_widget_in_place_to_exactly_the_new_figure():
    first = go.Figure(
        [go.Heatmap(z=[[1, 2], [3, 4]], colorscale="RdBu"), go.Scatter(y=[1, 2], name="a")],
        layout={"title": {"text": "first"}, "shapes": [{"type": "rect", "x0": 0, "x1": 1}]},
    )
    second = go.Figure(
        [go.Heatmap(z=[[5, 6], [7, 8]], zmin=-1), go.Scatter(y=[3, 4, 5], name="b")],
        layout={"title": {"text": "second"}},
    )
    widget = redraw(None, first)
    clicks = []
    widget.data[0].on_click(lambda *args: clicks.append(args))
    uids = [trace.uid for trace in widget.data]
    again = redraw(widget, second)
    assert again is widget and [trace.uid for trace in again.data] == uids
    assert shown(again) == shown(go.FigureWidget(second))  # colorscale and shape removed
    assert again.data[0]._click_callbacks  # handlers stay attached


def test_redraw_builds_a_new_widget_when_the_traces_differ_and_fills_the_box():
    import ipywidgets as w

    box = w.Box()
    widget = redraw(None, go.Figure(go.Scatter(y=[1])), box)
    assert box.children == (widget,)
    other = redraw(widget, go.Figure(go.Bar(y=[1])), box)
    assert other is not widget and box.children == (other,)
    assert shown(other) == shown(go.FigureWidget(go.Figure(go.Bar(y=[1]))))
