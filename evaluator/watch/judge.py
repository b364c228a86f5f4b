"""What `watch` judges after each file: each run's decision (`evaluator.verdict.judge_store`: the gate's
thresholds on the store, the approximation judged at each staleness 1..S) as the small record an alert
carries (`RunVerdict`), and the method and tolerance the trends follow (`gated`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from evaluator.gate import DEFAULT_THRESHOLDS, load_thresholds
from evaluator.gate.verdicts import MoreSteps
from evaluator.store import open_store
from evaluator.verdict import judge_store, sentence
from schemas.figures import lookup
from schemas.store import DEFAULT_TOLERANCE
from schemas.thresholds import Thresholds


@dataclass(frozen=True)
class RunVerdict:
    """One run's decision as an alert carries it: `action` (ship, ship_up_to, do_not_ship, undecided),
    `max_staleness` (k: ship with the trainer's maximum staleness <= k), the gated `method`, the decision's
    sentence as `reason`, and for `undecided` about how many more steps with prox_logp would decide it."""

    run_id: str
    action: str
    max_staleness: int | None
    method: str | None
    reason: str
    steps_to_decide: MoreSteps = None


@dataclass(frozen=True)
class Gated:
    """The method the thresholds gate (their first blocking check's) and the bound on its excess gradient
    mass error (the tolerance a trend heads for)."""

    method: str | None
    tolerance: float


def default_thresholds() -> Thresholds:
    return load_thresholds(DEFAULT_THRESHOLDS)


def gated(thresholds: Thresholds) -> Gated:
    blocking = [c for c in thresholds.checks if c.method and not c.warn_only]
    method = blocking[0].method if blocking else None
    bounds = [
        c.max
        for c in blocking
        if c.method == method and c.figure and c.max is not None
        and lookup(c.figure)[0].name == "gradient_mass_error"
    ]  # fmt: skip
    return Gated(method, min(bounds, default=DEFAULT_TOLERANCE.max_gradient_mass_error))


def judge_runs(
    db: str | os.PathLike, thresholds: Thresholds | None = None, max_staleness: int | None = None
) -> list[RunVerdict]:
    """The decision on every run of the store at `db` (read-only) under `thresholds` (the default ones),
    judged at each staleness 1..`max_staleness` (None: what replay recorded, else the log's), by run."""
    with open_store(db) as con:
        judgement = judge_store(
            con, thresholds or default_thresholds(), str(db), max_staleness=max_staleness,
            alternatives=False, trainers=False,
        )  # fmt: skip
    return [
        RunVerdict(d.run_id, d.action, d.max_staleness, d.method, sentence(d), d.steps_to_decide)
        for d in judgement.decisions
    ]
