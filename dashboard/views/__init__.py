"""The dashboard's pages: each `render(ctx)` is a thin view (named query -> DataFrame -> Plotly figure).

`PAGES` maps each page's URL slug (`?page=...`) to its title and render function, in sidebar order.
"""

from __future__ import annotations

from dashboard.views import compare, drift, inspector, live, overview, training, weights

PAGES = {
    "overview": ("Overview", overview.render),
    "drift": ("Drift by staleness", drift.render),
    "weights": ("Importance weights by staleness", weights.render),
    "training": ("Over training", training.render),
    "compare": ("Run comparison", compare.render),
    "tokens": ("Token inspector", inspector.render),
    "live": ("Live audit", live.render),
}
