"""The token inspector's reads: which ingested files hold a run's step, and, from the reachable ones only
(`dashboard.raw_logs`), its sequences and their tokens (the pages load them by name, as `dashboard.queries`'
reads)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dashboard import raw_logs
from dashboard.queries import _frame


def log_files(db: Path, run_id: str, step: int) -> pd.DataFrame:
    """The ingested Parquet files holding tokens of `run_id` at `step`, and whether each is reachable: a
    file is opened only where replay read it and only while it holds the same bytes, so a store cannot
    make the inspector read any other file."""
    frame = _frame(
        db,
        """SELECT DISTINCT f.file_id, f.path, f.digest, f.n_rows, f.ingested_at
           FROM ingested_file f JOIN file_tokens t USING (file_id)
           WHERE t.run_id = ? AND t.step = ? ORDER BY f.file_id""",
        [run_id, step],
    )
    frame["readable"] = [
        raw_logs.readable_copy(p, d, n)
        for p, d, n in frame[["path", "digest", "n_rows"]].itertuples(index=False)
    ]
    frame["reachable"] = frame["readable"].notna()
    return frame.drop(columns="digest")


def _reachable(db: Path, run_id: str, step: int) -> list[str]:
    """Local paths of the reachable raw logs holding `run_id` at `step`."""
    return [p for p in log_files(db, run_id, step)["readable"] if p is not None]


def sequences(db: Path, run_id: str, step: int, limit: int = 500) -> pd.DataFrame:
    """The sequences of `run_id` at `step` in the reachable raw token logs (`raw_logs.sequences`)."""
    return raw_logs.sequences(_reachable(db, run_id, step), run_id, step, limit)


def sequence_tokens(db: Path, run_id: str, step: int, seq_id: int) -> pd.DataFrame:
    """Every token of one sequence from the reachable raw token logs (`raw_logs.sequence_tokens`)."""
    return raw_logs.sequence_tokens(_reachable(db, run_id, step), run_id, step, seq_id)
