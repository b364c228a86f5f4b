"""The Streamlit dashboard, read-only over the metrics store: `app` (the page shell), `queries` (named
queries -> DataFrames, through `evaluator.store.open_store`), `raw_logs` (the token inspector's raw
Parquet, verified against the digests recorded at replay), `charts` (shared Plotly helpers) and the
figures of each page (`drift_charts`, `weight_charts`, `token_charts`), `views/` (one module per page).

May import: `evaluator.store` (reading), `evaluator.gate` (the Overview's verdicts), `evaluator.sources`,
the base modules and `schemas`; never replay or the writer's side."""
