"""The dashboard's pages: each `render(ctx)` is a thin view (named query -> DataFrame -> Plotly figure)."""
