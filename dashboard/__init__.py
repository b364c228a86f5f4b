"""The Streamlit dashboard (read-only over the metrics store)."""
