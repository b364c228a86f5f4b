"""The live page's reads: the commit the store is at and when it was made, the commits that judged a run
anew (DuckLake snapshots), the run's decision at each of them (time travel: `open_store(db, version=n)`),
and the alerts `proxaudit watch --alerts FILE` wrote.

A run is judged anew by the commit that stores its findings and intervals after a file of it: the commit
that writes its `run_state` row. Every other commit leaves its decision as it was.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from evaluator.gate import load_thresholds
from evaluator.store import open_store
from evaluator.store.checks import snapshot_id
from evaluator.store.lake import STORE
from evaluator.verdict import Decision, judge_store
from evaluator.watch.sinks import read_alerts
from schemas.store import DEFAULT_TOLERANCE, Tolerance

ALERT_COLUMNS = ("time", "run_id", "kind", "state", "previous", "reason")


@dataclass(frozen=True)
class Commit:
    """One snapshot of the store: its id and when it was committed (seconds since the epoch)."""

    snapshot_id: int
    committed_at: float


def _commits(con, ids: list[int]) -> list[Commit]:
    rows = con.execute(
        f"SELECT snapshot_id, epoch(snapshot_time) FROM ducklake_snapshots('{STORE}') "
        "WHERE list_contains(?, snapshot_id) ORDER BY snapshot_id",
        [ids],
    ).fetchall()
    return [Commit(int(n), float(t)) for n, t in rows]


def latest_commit(db: Path) -> Commit:
    """The snapshot a reader opening the store now reads, and its commit time."""
    with open_store(db) as con:
        return _commits(con, [snapshot_id(con)])[0]


def run_commits(db: Path, run_id: str) -> list[Commit]:
    """The commits that judged `run_id` anew (wrote its `run_state` row), oldest first."""
    with open_store(db) as con:
        latest = snapshot_id(con)
        ids = con.execute(
            f"SELECT DISTINCT snapshot_id FROM ducklake_table_changes('{STORE}', 'main', 'run_state', 0, ?) "
            "WHERE run_id = ? AND change_type IN ('insert', 'update_postimage')",
            [latest, run_id],
        ).fetchall()
        return _commits(con, [n for (n,) in ids])


def decision_at(
    db: Path, thresholds: str, run_id: str, version: int, tolerance: Tolerance = DEFAULT_TOLERANCE
) -> Decision | None:
    """The decision on `run_id` under the thresholds file as the store stood at snapshot `version` (None:
    the run was not judged there)."""
    parsed = load_thresholds(thresholds)
    with open_store(db, version=version) as con:
        judgement = judge_store(
            con, parsed, str(db), run_id, tolerance=tolerance, alternatives=False, trainers=False
        )
    return next((d for d in judgement.decisions if d.run_id == run_id), None)


def history_row(commit: Commit, d: Decision | None) -> dict:
    """One commit of a run's history: the decision and the figure it rests on, with its interval."""
    observed = d.reason.observed if d and d.reason else None
    return {
        "snapshot_id": commit.snapshot_id,
        "committed_at": pd.Timestamp(commit.committed_at, unit="s", tz="UTC"),
        "action": d.action if d else None,
        "max_staleness": d.max_staleness if d else None,
        "method": d.method if d else None,
        "figure": d.reason.measure if d and d.reason else None,
        "where": d.reason.where if d and d.reason else None,
        "value": observed.value if observed else None,
        "lower": observed.lower if observed else None,
        "upper": observed.upper if observed else None,
        "bound": d.reason.bound if d and d.reason else None,
    }


def alerts(path: str | os.PathLike, run_id: str) -> pd.DataFrame:
    """The alerts about `run_id` and the watched folders (run_id null), newest first (`ALERT_COLUMNS`)."""
    records = [r for r in read_alerts(path) if r.get("run_id") in (run_id, None)]
    frame = pd.DataFrame.from_records(records, columns=list(ALERT_COLUMNS))
    return frame.iloc[::-1].reset_index(drop=True)
