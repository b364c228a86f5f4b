"""Each run's decision on a store: the gate's checks judged (`evaluator.gate`), the engine floor read, the
decision made, the trainer options that would ship further found, and each trainer's own mismatch figure
read (`trainer_mismatch`). `judge_store` works on an open connection (a command that re-judges after each
commit keeps one), `judge_db` opens the store itself."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import duckdb

from evaluator.formulas.loss import DEFAULT_LOSS
from evaluator.gate import DEFAULT_THRESHOLDS, evaluate, gate_on, load_thresholds
from evaluator.store import open_store
from evaluator.store.figures import engine_floors, minibatches
from evaluator.store.memo import Memo
from evaluator.store.reader import require_run, stored_loss
from evaluator.store.trainers import trainer_figures
from evaluator.verdict.decision import Alternative, Decision, Judgement, decide
from evaluator.verdict.floor import FloorVerdict
from evaluator.verdict.options import options_for
from schemas.figures import lookup
from schemas.store import DEFAULT_TOLERANCE, Tolerance
from schemas.thresholds import Thresholds


def floor_bounds(thresholds: Thresholds, tolerance: Tolerance = DEFAULT_TOLERANCE) -> dict[str, float]:
    """The bounds the engine floor is judged against: the tolerance, or the thresholds' own floor checks."""
    bounds = {
        "gradient_mass_error": tolerance.max_gradient_mass_error,
        "clip_flip_rate": tolerance.max_clip_flip_rate,
    }
    for check in thresholds.checks:
        if check.figure is not None and check.max is not None and lookup(check.figure)[1] == "floor":
            bounds[lookup(check.figure)[0].name] = check.max
    return bounds


def _alternatives(
    con: duckdb.DuckDBPyConnection, d: Decision, minibatch_count: int | None, max_staleness: int | None
) -> tuple[Alternative, ...]:
    """The trainer options the run can use that pass the gated method's blocking checks further than it."""
    if d.method is None or d.action == "ship":
        return ()
    blocking = [v.check for v in d.checks if v.check.method == d.method and not v.check.warn_only]
    found = []
    for option in options_for(minibatch_count):
        if option.method == d.method:
            continue
        theirs = Thresholds("", tuple(replace(check, method=option.method) for check in blocking))
        verdicts, _ = evaluate(con, theirs, only_run=d.run_id, max_staleness=max_staleness)
        other = decide(d.run_id, tuple(verdicts), d.limit, d.floor)
        further = other.action == "ship_up_to" and other.max_staleness > (d.max_staleness or 0)
        if other.action == "ship" or further:
            found.append(Alternative(option, other.action, other.max_staleness))
    return tuple(found)


def judge_store(
    con: duckdb.DuckDBPyConnection,
    thresholds: Thresholds,
    db: str = "",
    run: str | None = None,
    max_staleness: int | None = None,
    tolerance: Tolerance = DEFAULT_TOLERANCE,
    alternatives: bool = True,
    trainers: bool = True,
) -> Judgement:
    """The gate's result of `thresholds` on the store of `con` (of `run` alone if given) and each judged
    run's decision, the engine floor judged against `tolerance` where the thresholds have no floor check,
    with each trainer's own mismatch figure on the judged runs; without `alternatives` (the other trainer
    options that would ship further) or `trainers` (those figures) where a caller shows none. Each read
    query is asked of the store once (`Memo`: `con` reads one snapshot)."""
    con = Memo.of(con)
    result = gate_on(con, thresholds, db, run, max_staleness)
    floors, counts = engine_floors(con), minibatches(con)
    bounds = floor_bounds(thresholds, tolerance)
    decisions = []
    for run_id, limit in sorted(result.limits.items()):
        d = decide(run_id, result.of_run(run_id), limit, FloorVerdict(floors.get(run_id, {}), bounds))
        if alternatives:
            d = replace(d, alternatives=_alternatives(con, d, counts.get(run_id), max_staleness))
        decisions.append(d)
    judged = {d.run_id for d in decisions}
    figures = tuple(f for f in trainer_figures(con, run) if f.run_id in judged) if trainers else ()
    return Judgement(result, tuple(decisions), stored_loss(con) or DEFAULT_LOSS, figures)


def judge_db(
    db: str | Path,
    thresholds: str | Path = DEFAULT_THRESHOLDS,
    run: str | None = None,
    max_staleness: int | None = None,
    tolerance: Tolerance = DEFAULT_TOLERANCE,
) -> Judgement:
    """`judge_store` on the store at `db`, opened read-only (`StoreError`), with the thresholds file at
    `thresholds` (`ThresholdsError`, before the store is opened); a `run` it lacks is a `UsageError`."""
    parsed = load_thresholds(thresholds)
    with open_store(db) as con:
        require_run(con, run, db)
        return judge_store(con, parsed, str(db), run, max_staleness, tolerance)
