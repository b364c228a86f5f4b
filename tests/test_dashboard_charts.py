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

    def test_a_whisker_and_an_interval_reach_down_to_the_zero_row(self):
        band = go.Scatter(x=[0, 1], y=[0.0, 0.01], hoverinfo="skip", line_width=0)
        point = go.Scatter(
            x=[0, 1], y=[0.02, 0.05], error_y=dict(type="data", array=[0.01, 0.01], arrayminus=[0.02, 0.01])
        )
        fig = log_axis.log_y(go.Figure([band, point]))
        floor = fig.layout.yaxis.tickvals[0]
        assert list(fig.data[0].y) == [floor, 0.01]
        lower = np.asarray(fig.data[1].y) - np.asarray(fig.data[1].error_y.arrayminus)
        assert lower == pytest.approx([floor, 0.04])

    def test_a_quantile_band_from_a_zero_p50_is_closed_not_painted_down_to_the_zero_row(self):
        """The `*_exact` methods: p50 exactly 0 where half the tokens are at minibatch 0. The p50-p90 band
        closes there (its edges meet at p90) instead of filling every decade under the data; elsewhere,
        and the p90-p99 band, are as stored; the p50 line marks the 0 on the 0 row."""
        frame = pd.DataFrame({"staleness": [0, 1, 2], "n": [9] * 3, "mean": [0.02, 0.01, 0.02],
                              "min": [0.0] * 3, "max": [0.5] * 3, "p50": [0.01, 0.0, 1e-6],
                              "p90": [0.05, 0.03, 0.04], "p99": [0.2, 0.1, 0.3]})  # fmt: skip
        fig = go.Figure()
        charts.add_series(fig, frame, "staleness", "loglinear_exact", "#2ca02c")
        log_axis.log_y(fig)
        lower, upper, lower99, upper99 = (np.asarray(t.y, float) for t in fig.data[:4])
        assert upper[1] == lower[1] == 0.03  # closed at p90 where p50 is 0
        assert list(lower[[0, 2]]) == [0.01, 1e-6] and list(upper) == [0.05, 0.03, 0.04]
        assert list(lower99) == [0.05, 0.03, 0.04] and list(upper99) == [0.2, 0.1, 0.3]
        floor = fig.layout.yaxis.tickvals[0]
        assert fig.layout.yaxis.ticktext[0] == "0" and floor not in lower  # no band reaches the 0 row
        p50 = next(t for t in fig.data if t.name == "loglinear_exact p50")
        assert np.isnan(p50.y[1])
        zero_marks = [t for t in fig.data if t.mode == "markers" and t.legendgroup == "loglinear_exact"
                      and t.showlegend is False]  # fmt: skip
        assert any(list(t.x) == [1] and list(t.y) == [floor] for t in zero_marks)

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


def _by_staleness(methods: list[str], **columns) -> pd.DataFrame:
    """Rows per method and staleness 0..2 with the stored statistics (1 for each, unless given)."""
    rows = [{"method": m, "staleness": k, "n": 10, **{c: 1.0 for c in ("mean", "min", "p50", "p90", "p99",
             "max")}} for m in methods for k in range(3)]  # fmt: skip
    frame = pd.DataFrame(rows)
    for name, values in columns.items():
        frame[name] = values
    return frame


ALL = ["ground_truth", *charts.METHOD_COLORS][1:]


@pytest.mark.parametrize(
    "figure",
    [
        lambda: charts.facets_by_method(_by_staleness(ALL), "staleness", "abs_error"),
        lambda: charts.method_pairs(
            _by_staleness(ALL),
            "abs_error",
            (("loglinear", "loglinear_exact"), ("linear", "linear_exact")),
            ("areal", "exact"),
        ),  # fmt: skip
        lambda: weight_charts.weight_diagnostics(_by_staleness(ALL, ess_fraction=0.9, chi2=0.1, kl_k3=0.01)),
    ],
    ids=["facets", "pairs", "diagnostics"],
)
def test_panels_share_one_axis_title_so_titles_never_run_into_each_other(figure):
    """Side by side, a title under each panel ("staleness = step - behave_version (steps)") ran into the
    next one's on a narrow page: one title under all of them instead."""
    fig = figure()
    titles = [fig.layout[k].title.text for k in fig.layout.to_plotly_json() if k.startswith("xaxis")]
    assert titles and not any(titles)
    texts = [a.text for a in fig.layout.annotations]
    assert texts.count(charts.label("staleness")) == 1


@pytest.mark.parametrize("metric", ["behave_imp_weight", "importance_weight"])
def test_a_weight_legend_of_every_method_lies_in_rows_under_the_plot(metric):
    """Beside the plot, the legend of ten methods and the glyph key was taller than the chart and
    `reuse_train_logp` and `proximal_t` were cut off: under it, its rows add to the chart's height."""
    frames = {
        "ranges": weight_charts.weight_ranges(_by_staleness(ALL), metric, DEFAULT_LOSS),
        "diagnostics": weight_charts.weight_diagnostics(_by_staleness(ALL, ess_fraction=0.9, chi2=0.1,
                                                                       kl_k3=0.01)),
    }  # fmt: skip
    for fig in frames.values():
        legend = fig.layout.legend
        assert legend.orientation == "h" and legend.y < 0 and legend.yanchor == "top"
        shown = {t.name for t in fig.data if t.showlegend is not False and t.name}
        assert set(ALL) <= shown


def test_the_ess_fraction_axis_spans_its_values_not_0_to_1():
    """ESS fractions near 1 (weights close to each other) were a flat line at the top of a 0..1 axis."""
    ess = [0.999, 0.98, 0.95, 1.0, 0.995, 0.97]
    fig = weight_charts.weight_diagnostics(
        _by_staleness(["loglinear", "rollout"], ess_fraction=ess, chi2=0.1, kl_k3=0.01)
    )
    lo, hi = fig.layout.yaxis.range
    assert lo <= min(ess) and hi >= max(ess) and lo >= 0
    assert (max(ess) - min(ess)) / (hi - lo) >= 0.8  # the values fill most of the axis
    wide = weight_charts.ess_range(pd.Series([0.1, 0.5, 1.0]))
    assert wide[0] == 0.0 and wide[1] >= 1.0  # never below 0


def test_the_decisive_figures_come_first_in_the_decision_table():
    """Table columns in order: the gradient mass error and its excess over the floor (each with its 95%
    interval), the flip rates, then the safe staleness and the rest; a wide table scrolls, and what is
    off screen goes unread."""
    from dashboard.views import decision

    figures = ["safe_staleness_beyond_floor", "safe_staleness", "gradient_mass_error",
               "excess_gradient_mass_error", "clip_flip_rate", "bound_flip_rate", "n"]  # fmt: skip
    frame = pd.DataFrame({"method": ["loglinear"], **{f: [0.01] for f in figures}})
    for figure in figures[:4]:
        frame[f"{figure}_lower"], frame[f"{figure}_upper"] = 0.005, 0.02
    columns = list(decision.decision_table(frame).columns)
    assert columns[:4] == ["gradient_mass_error", "gradient_mass_error 95%", "excess_gradient_mass_error",
                           "excess_gradient_mass_error 95%"]  # fmt: skip
    assert columns.index("clip_flip_rate") < columns.index("safe_staleness_beyond_floor")
    assert columns[-1] == "n"
