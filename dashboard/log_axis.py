"""A log y axis that labels enough ticks and shows zeros.

Errors, flip rates and their intervals span decades, and some are exactly 0 (an estimator that is exact at
a staleness, an interval that reaches 0), which a log axis cannot draw: plotly drops such a point, or runs
its line and band off the bottom of the chart. Here the axis gets a bottom row labelled `0` under its
lowest tick: an interval's end or a whisker at 0 is drawn down to it, and a point at 0 becomes a
triangle on it (its line breaks there), with the true value 0 on hover. A quantile band with an edge at 0
(a p50 of exactly 0, as the `*_exact` methods have where half the tokens are at minibatch 0) is closed
there: drawn down to the 0 row it would paint every decade under the data; the centre line's triangle
says 0. Ticks are labelled in plain numbers: 1, 2 and 5 of each decade over a few decades, every decade
over more.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

ZERO_ROW = 3.0  # the 0 row sits this factor under the lowest tick
ZERO_NOTE = "exactly 0: on the bottom row"


def tick_values(lo: float, hi: float) -> list[float]:
    """Tick values covering [lo, hi] (0 < lo <= hi): 1-2-5 per decade up to 4 decades, each decade up to 10,
    then every second one."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    span = max(1, last - first)
    mantissas, every = ((1, 2, 5), 1) if span <= 4 else ((1,), 1 if span <= 10 else 2)
    ticks = [m * 10.0**e for e in range(first, last + 1, every) for m in mantissas]
    inside = [t for t in ticks if lo <= t <= hi]
    below = [t for t in ticks if t < lo][-1:]  # one tick under the data, one over: the data sits inside
    above = [t for t in ticks if t > hi][:1]
    return below + inside + above


def tick_text(value: float) -> str:
    """0.001, 0.02, 5, 100 in plain digits; 1e-05 and 1e+06 as 1e-5 and 1e6."""
    if 1e-4 <= value < 1e5:
        return f"{value:.10g}"
    mantissa, exponent = f"{value:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _values(trace) -> np.ndarray:
    y = getattr(trace, "y", None)
    return (
        np.array([np.nan if v is None else v for v in y], dtype=np.float64) if y is not None else np.array([])
    )


def _shape_values(fig: go.Figure) -> np.ndarray:
    """The y ends of the figure's lines and rectangles drawn in data units (`add_hline`, `add_hrect`): a
    threshold the axis must show, as plotly's own autorange would."""
    ys = [
        y
        for shape in fig.layout.shapes
        if (shape.yref or "y").startswith("y") and "domain" not in (shape.yref or "")
        for y in (shape.y0, shape.y1)
        if y is not None
    ]
    return np.asarray(ys, dtype=np.float64)


def _error_ends(trace, y: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(lower, upper) ends of a trace's asymmetric error bars, or None."""
    error = trace.error_y if isinstance(trace, go.Scatter) else None
    if error is None or error.array is None:
        return None
    minus = error.arrayminus if error.arrayminus is not None else error.array
    return y - np.asarray(minus, np.float64), y + np.asarray(error.array, np.float64)


def _zero_markers(fig: go.Figure, trace: go.Scatter, zero: np.ndarray, floor: float, ends) -> None:
    """Triangles on the 0 row where `trace` is exactly 0, in its colour and legend group."""
    x = np.asarray(trace.x, dtype=object)[zero]
    error = None
    if ends is not None:
        error = dict(type="data", symmetric=False, array=np.maximum(ends[1][zero] - floor, 0),
                     arrayminus=np.zeros(zero.sum()), color=trace.error_y.color, thickness=1.5)  # fmt: skip
    colour = trace.line.color or (trace.marker.color if isinstance(trace.marker.color, str) else None)
    fig.add_trace(
        go.Scatter(
            x=x,
            y=np.full(len(x), floor),
            mode="markers",
            error_y=error,
            showlegend=False,
            marker=dict(symbol="triangle-down", size=9, color=colour),
            legendgroup=trace.legendgroup,
            xaxis=trace.xaxis,
            yaxis=trace.yaxis,
            hovertemplate=f"{trace.name}<br>%{{x}}: 0<extra></extra>",
        )  # fmt: skip
    )


def _close_bands(fig: go.Figure, floor: float) -> None:
    """Close a filled band (an edge, then the trace filled to it: `fill="tonexty"`) where its lower edge is
    0: both edges meet at the upper one (on the 0 row when that is 0 too). A gap would not do: plotly fills
    across it, from the last point before to the first after."""
    for lower, upper in zip(fig.data, fig.data[1:], strict=False):
        if isinstance(upper, go.Scatter) and upper.fill == "tonexty":
            lo, hi = _values(lower), _values(upper)
            top = np.where(hi == 0, floor, hi)
            lower.y, upper.y = np.where(lo == 0, top, lo), top


def _move_zeros(fig: go.Figure, floor: float) -> bool:
    """Put every 0 of the figure's traces on the 0 row; True when there was one."""
    found = False
    for trace in list(fig.data):
        y = _values(trace)
        ends = _error_ends(trace, y)
        zero = y == 0
        if ends is not None and (ends[0] <= 0).any():  # an interval down to 0: its bar ends on the 0 row
            found = True
            trace.error_y.arrayminus = np.where(ends[0] <= 0, np.maximum(y - floor, 0), y - ends[0])
        if not zero.any():
            continue
        found = True
        band = isinstance(trace, go.Scatter) and (trace.fill or trace.hoverinfo == "skip")
        if isinstance(trace, go.Scatter) and not band:
            _zero_markers(fig, trace, zero, floor, ends)
            trace.y = np.where(zero, np.nan, y)  # the line breaks where its value is 0
        else:  # a whisker or a bar: down to the 0 row
            trace.y = np.where(zero, floor, y)
    return found


def log_y(fig: go.Figure) -> go.Figure:
    """Make every y axis of `fig` a log axis with labelled 1-2-5 ticks and, when a value is 0, a 0 row."""
    values = np.concatenate([_values(t) for t in fig.data] + [_shape_values(fig)])
    for trace in fig.data:
        ends = _error_ends(trace, _values(trace))
        values = values if ends is None else np.concatenate([values, *ends])
    positive = values[np.isfinite(values) & (values > 0)]
    if positive.size == 0:
        return fig.update_yaxes(type="log", exponentformat="power")
    ticks = tick_values(float(positive.min()), float(positive.max()))
    floor = ticks[0] / ZERO_ROW
    labels = [tick_text(t) for t in ticks]
    _close_bands(fig, floor)
    if _move_zeros(fig, floor):
        ticks, labels = [floor, *ticks], ["0", *labels]
        marker = dict(symbol="triangle-down", size=9, color="#777")  # a legend entry that draws nothing
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", marker=marker, name=ZERO_NOTE))
    top = math.log10(ticks[-1]) + 0.05
    return fig.update_yaxes(
        type="log", tickvals=ticks, ticktext=labels, range=[math.log10(ticks[0]) - 0.1, top]
    )
