"""The dashboard's figures as data: a log axis that labels enough ticks and shows zeros, the mean in the
legend, intervals as error bars, the weight glyphs explained, the inspector's segment labels apart."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from dashboard import charts, drift_charts, log_axis, token_charts, weight_charts
from evaluator.formulas.loss import DEFAULT_LOSS


class TestLogAxis:
    def test_ticks_are_1_2_5_over_few_decades_and_decades_over_many(self):
        assert log_axis.tick_values(0.0012, 0.3) == pytest.approx(
            [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5]
        )
        assert log_axis.tick_values(3e-7, 20) == pytest.approx(
            [1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1, 10, 100]
        )
        assert log_axis.tick_values(3e-12, 1) == pytest.approx([1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 1])
        assert [log_axis.tick_text(v) for v in (1e-5, 0.002, 5.0, 1e6)] == ["1e-5", "0.002", "5", "1e6"]

    def test_a_zero_is_drawn_on_the_zero_row(self):
        fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[0.1, 0.0, 0.01], name="m", line=dict(color="#123456")))
        log_axis.log_y(fig)
        axis = fig.layout.yaxis
        assert axis.type == "log" and axis.ticktext[0] == "0" and axis.tickvals[0] < 0.01 / 2
        assert np.isnan(fig.data[0].y[1]) and fig.data[0].y[0] == 0.1  # the line breaks at the zero
        marker = fig.data[1]
        assert list(marker.x) == [1] and list(marker.y) == [axis.tickvals[0]]
        assert marker.marker.color == "#123456" and "0<extra>" in marker.hovertemplate
        assert fig.data[-1].name == log_axis.ZERO_NOTE  # said in the legend
        assert min(axis.tickvals) >= 10 ** axis.range[0] and max(axis.tickvals) <= 10 ** axis.range[1]

    def test_a_band_and_an_interval_reach_down_to_the_zero_row(self):
        band = go.Scatter(x=[0, 1], y=[0.0, 0.01], hoverinfo="skip", line_width=0)
        point = go.Scatter(
            x=[0, 1], y=[0.02, 0.05], error_y=dict(type="data", array=[0.01, 0.01], arrayminus=[0.02, 0.01])
        )
        fig = log_axis.log_y(go.Figure([band, point]))
        floor = fig.layout.yaxis.tickvals[0]
        assert list(fig.data[0].y) == [floor, 0.01]
        lower = np.asarray(fig.data[1].y) - np.asarray(fig.data[1].error_y.arrayminus)
        assert lower == pytest.approx([floor, 0.04])

    def test_no_zero_no_zero_row(self):
        fig = log_axis.log_y(go.Figure(go.Scatter(x=[0, 1], y=[0.3, 2.0])))
        assert "0" not in fig.layout.yaxis.ticktext and len(fig.data) == 1
        assert list(fig.layout.yaxis.ticktext) == ["0.2", "0.5", "1", "2", "5"]

    def test_a_threshold_line_is_inside_the_axis(self):
        """A bound drawn with add_hline above every value (the behaviour-weight bound 5 over weights
        near 1) stays on the chart, as plotly's own autorange keeps it."""
        fig = go.Figure(go.Scatter(x=[0, 1], y=[0.8, 1.3]))
        fig.add_hline(y=5.0)
        fig.add_hrect(y0=0.05, y1=0.1)
        axis = log_axis.log_y(fig).layout.yaxis
        assert 10 ** axis.range[0] < 0.05 and 10 ** axis.range[1] > 5.0
        assert 5 in axis.tickvals and 0.05 in axis.tickvals


def test_the_mean_is_in_the_legend():
    stats = {"mean": [0.1, 0.2], "min": [0.0, 0.1], "max": [0.3, 0.4], "p50": [0.1, 0.2], "p90": [0.2, 0.3]}
    frame = pd.DataFrame({"staleness": [0, 1], "n": [5, 5], "p99": [0.3, 0.4], **stats})
    fig = go.Figure()
    charts.add_series(fig, frame, "staleness", "loglinear", "#1f77b4")
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert legend == ["loglinear mean", "loglinear p50"]


def test_decision_intervals_are_error_bars():
    frame = pd.DataFrame({"method": ["loglinear"] * 2, "staleness": [0, 1], "n": [9, 9],
                          "gradient_mass_error": [0.01, 0.03], "gradient_mass_error_lower": [0.005, 0.02],
                          "gradient_mass_error_upper": [0.02, 0.05]})  # fmt: skip
    fig = drift_charts.figure_by_staleness(
        frame, "gradient_mass_error", limit=0.01, limit_name="tolerance", log_y=True
    )
    line = fig.data[0]
    assert list(line.error_y.array) == pytest.approx([0.01, 0.02])
    assert list(line.error_y.arrayminus) == pytest.approx([0.005, 0.01])
    assert fig.data[1].name == "tolerance 0.01"  # the tolerance is a legend entry, not a floating label


def test_weight_glyphs_are_explained_in_the_legend():
    frame = pd.DataFrame({"method": ["loglinear"], "staleness": [1], "n": [9], "mean": [1.0], "min": [0.5],
                          "p50": [1.0], "p90": [1.2], "p99": [1.5], "max": [2.0]})  # fmt: skip
    fig = weight_charts.weight_ranges(frame, "importance_weight", DEFAULT_LOSS)
    names = {t.name for t in fig.data if t.legendrank == 1}
    assert names == {"whisker: min..max", "bar: p50..p99", "ticks: p50, p90", "diamond: mean"}


def test_segment_labels_of_short_segments_do_not_share_a_line():
    """Versions 5, 6, 7 on one token each: their labels alternate between two heights."""
    logps = {c: -1.0 for c in ("behave_logp", "prox_logp", "theta_logp")}
    tokens = pd.DataFrame({"pos": range(6), "behave_version": [4, 4, 5, 6, 7, 7], "proximal_t_version": None,
                           "proximal_t_logp": None, **logps})  # fmt: skip
    estimates = pd.DataFrame({"pos": range(6), "method": "rollout", "estimate": -1.0, "error": 0.0})
    fig, described = token_charts.token_logps(tokens, estimates, ["rollout"])
    labels = [(a.text, a.y) for a in fig.layout.annotations]
    assert [t for t, _ in labels] == ["v4", "v5", "v6", "v7"]
    assert all(a[1] != b[1] for a, b in zip(labels, labels[1:], strict=False))
    assert described[1] == "segment 1: pos 2..2, behave_version 5"
    assert {"rollout (estimate)", "rollout - prox_logp"} <= {t.name for t in fig.data}
