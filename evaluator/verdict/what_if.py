"""The what-if table (`replay --loss a,b,c`): each run's decision under each loss of the list, so a user
sees which loss (correction) keeps the approximation within tolerance at the staleness they run.

A store keeps one loss, so its own figures and its gate stay those of the first loss. Every other loss is
replayed from the same files into a scratch store under a temporary folder and judged there, exactly as a
separate `replay --loss NAME` (same options) and `gate` of it would be; the judged rows of every loss (the
first judged on the store itself) go into the store's table `what_if`, keyed by (run, loss, gated method),
replacing the rows of the runs judged before."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from evaluator.formulas.loss import Loss
from evaluator.gate import DEFAULT_THRESHOLDS
from evaluator.replay.pipeline import replay
from evaluator.store import StoreWriter
from evaluator.verdict.judging import judge_db
from evaluator.verdict.summary import summary_table
from evaluator.verdict.words import sentence, why
from schemas.figures import EXCESS, with_bounds

FIGURE_COLUMNS = (
    "n", "n_steps", *with_bounds("gradient_mass_error"), *with_bounds("clip_flip_rate"),
    *with_bounds(EXCESS + "gradient_mass_error"), *with_bounds("safe_staleness"),
    *with_bounds("safe_staleness_beyond_floor"),
)  # fmt: skip
"""The decision figures a row carries (`summary --by decision`'s, pooled over every staleness)."""


def judged_rows(
    db: str | os.PathLike, name: str, own: bool, thresholds: str | os.PathLike = DEFAULT_THRESHOLDS
) -> list[dict]:
    """The rows of the what-if table of the store at `db` under its loss, named `name`: each judged run's
    decision by `thresholds` (`judge_db`, the staleness the gate judges) with its gated method's figures."""
    judgement = judge_db(db, thresholds)
    figures = {(r["run_id"], r["method"]): r for r in summary_table(db, by="decision").to_pylist()}
    now = datetime.now()
    rows = []
    for d in judgement.decisions:
        if d.method is None:  # thresholds that gate no method: no decision a loss could change
            continue
        found = figures.get((d.run_id, d.method), {})
        rows.append({
            "run_id": d.run_id, "loss": name, "own": own, "description": judgement.loss.describe(),
            "method": d.method, "action": d.action, "max_staleness": d.max_staleness,
            "judged_staleness": d.limit.value, "staleness_source": d.limit.source,
            "reason": why(d.reason) if d.reason is not None else "",
            **{column: found.get(column) for column in FIGURE_COLUMNS},
            "sentence": sentence(d), "judged_at": now,
        })  # fmt: skip
    return rows


def what_if(
    paths: Sequence[str | os.PathLike],
    db: str | os.PathLike,
    losses: Sequence[tuple[str, Loss]],
    *,
    max_staleness: int | None = None,
    staleness_limit: tuple[int, str, str] | None = None,
    thresholds: str | os.PathLike = DEFAULT_THRESHOLDS,
    workers: int | None = None,
    ray: str | None = None,
    sample: float = 1.0,
    on_loss: Callable[[str], None] | None = None,
) -> pa.Table:
    """The what-if table of `paths` under `losses` ((name, loss), the first the store's, which `paths`
    were replayed into `db` under already), recorded in `db` (module docstring) and returned. The other
    losses' replays take `replay`'s options (`max_staleness`, `staleness_limit`, `workers`, `ray`,
    `sample`: the same sequences as the store's);
    `on_loss` hears each one's name before its replay."""
    (own_name, own_loss), others = losses[0], losses[1:]
    rows = judged_rows(db, own_name, True, thresholds)
    with tempfile.TemporaryDirectory(prefix="proxaudit-what-if-") as scratch:
        for i, (name, loss) in enumerate(others):
            if on_loss is not None:
                on_loss(name)
            store = Path(scratch) / str(i)
            replay(
                paths, store, loss=loss, max_staleness=max_staleness, staleness_limit=staleness_limit,
                workers=workers, ray=ray, sample=sample, progress=False,
            )  # fmt: skip
            rows += judged_rows(store, name, False, thresholds)
    table = pa.Table.from_pylist(rows)
    if rows:
        with StoreWriter(db, own_loss) as writer:
            writer.record_what_if(table)
    return table
