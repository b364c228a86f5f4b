"""The CI gate: a judge over the metrics store. It reads the figures a thresholds file's checks name from
DuckDB (`evaluator.store.figures`, as `Observed` values) and applies the checks' conditions
(`evaluator.gate.rules`); it never calls the estimators.

Each (check, run) pair gets one verdict: pass, warn, fail or skip. A metric the database does not hold
for a run, or too few tokens in the selection, is never a pass. A check at each staleness, and an excess
over the engine floor pooled over stalenesses, judge the stalenesses 1 to S, the staleness the trainer runs
(`staleness_limits`).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from evaluator.errors import ThresholdsError
from evaluator.formulas.loss import DEFAULT_LOSS, Loss
from evaluator.gate.ground_truth import explained
from evaluator.gate.rules import failing, insufficient, judge, judge_levels
from evaluator.gate.verdicts import GateResult, StalenessLimit, Verdict
from evaluator.inputs import read_text
from evaluator.store import open_store
from evaluator.store.figures import observe, observe_levels, runs_with_metric, stale_levels
from evaluator.store.memo import Memo
from evaluator.store.reader import require_run, runs_without_truth, stored_loss, stored_max_staleness
from schemas.figures import lookup, of_run
from schemas.store import DEFAULT_TOLERANCE, METRIC_TABLE
from schemas.thresholds import DEFAULT_THRESHOLDS, Check, Thresholds, ThresholdsFormatError, parse_thresholds

__all__ = [
    "DEFAULT_THRESHOLDS",
    "GateResult",
    "Verdict",
    "evaluate",
    "gate_on",
    "judge",
    "run_gate",
    "load_thresholds",
]


def staleness_limits(
    con: duckdb.DuckDBPyConnection, min_tokens: int, max_staleness: int | None = None
) -> dict[str, StalenessLimit]:
    """Each run's S, the largest staleness judged: `max_staleness` (`--max-staleness`), else what replay
    recorded from the trainer's config, else the run's largest staleness with at least `min_tokens` loss
    tokens with prox_logp (absent: none has)."""
    runs = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM file_tokens ORDER BY 1").fetchall()]
    if max_staleness is not None:
        return dict.fromkeys(runs, StalenessLimit(max_staleness, f"--max-staleness {max_staleness}"))
    recorded = stored_max_staleness(con)
    if recorded is not None:
        return dict.fromkeys(runs, StalenessLimit(*recorded))
    levels = stale_levels(con, min_tokens)
    source = f"the log: its largest staleness with at least {min_tokens:,} tokens with prox_logp"
    return {run: StalenessLimit(levels.get(run), source) for run in runs}


def _not_applicable(check: Check, loss: Loss) -> str | None:
    """Why the check's metric does not exist under the store's loss (a loss without a behaviour-weight
    bound flips no bound decision), or None."""
    metric = lookup(check.figure)[0].metric if check.figure else check.metric
    definition = next((m for m in METRIC_TABLE if m.name == metric), None)
    if definition is None or definition.when is None or getattr(loss, definition.when):
        return None
    return f"the store's loss ({loss.describe()}) has no {metric} decision: nothing to judge"


def _needs_limit(check: Check) -> bool:
    """Whether the check judges the stalenesses 1 to S: at each staleness, or an excess pooled over them."""
    if check.staleness is not None or check.figure is None:
        return False
    return check.each_staleness or lookup(check.figure)[1] == "excess"


def _runs_to_judge(check: Check, runs: list[str], only_run: str | None) -> list[str] | Verdict:
    """The runs a check applies to, or a verdict that settles it without data."""
    if check.run is not None and only_run is not None and check.run != only_run:
        why = f"pinned to run {check.run!r}; --run selects {only_run!r}"
        return Verdict(check, check.run, "skip", "not_selected", why)
    if check.run is None and only_run is not None and only_run == check.baseline_run:
        why = f"--run selects {only_run!r}, this check's baseline"
        return Verdict(check, only_run, "skip", "not_selected", why)
    if check.run is not None or only_run is not None:
        return [check.run or only_run]
    return [run for run in runs if run != check.baseline_run]


def _missing(check: Check, run_id: str, runs: list[str], present: set[str]) -> Verdict | None:
    """A failing verdict when the run, its metric, or the baseline's metric is not in the store."""
    if run_id not in runs:
        why = f"run {run_id!r} is not in the database (runs: {', '.join(runs) or 'none'})"
        return Verdict(check, run_id, failing(check), "missing_run", why)
    subject = "/".join(filter(None, (check.method, check.figure or check.metric)))
    if run_id not in present:
        why = f"run {run_id!r} has no {subject} rows"
        return Verdict(check, run_id, failing(check), "missing_metric", why)
    if check.baseline_run is not None and check.baseline_run not in present:
        where = "is not in the database" if check.baseline_run not in runs else "has no such rows"
        why = f"baseline run {check.baseline_run!r} {where} ({subject})"
        return Verdict(check, run_id, failing(check), "missing_baseline", why)
    return None


class _Judging:
    """One thresholds file on one store: the runs, each run's S, and each selection's figures read once."""

    def __init__(self, con: duckdb.DuckDBPyConnection, max_staleness: int | None) -> None:
        self.con, self.max_staleness = con, max_staleness
        self.runs = [
            r for (r,) in con.execute("SELECT DISTINCT run_id FROM file_tokens ORDER BY 1").fetchall()
        ]
        self.limits: dict[int, dict[str, StalenessLimit]] = {}
        self.used: dict[str, StalenessLimit] = {}

    def limit(self, min_tokens: int, run_id: str) -> StalenessLimit:
        """The run's S at `min_tokens` (the first one asked for is the run's in the result)."""
        if min_tokens not in self.limits:
            self.limits[min_tokens] = staleness_limits(self.con, min_tokens, self.max_staleness)
        return self.used.setdefault(run_id, self.limits[min_tokens][run_id])

    def verdict(self, check: Check, run_id: str, observed: dict) -> Verdict:
        """The verdict of a check on a run that has its figure (`observed`: the check's values over its
        own staleness range, by run, read once for every run)."""
        if not _needs_limit(check):
            baseline = observed.get(check.baseline_run) if check.baseline_run else None
            return judge(check, run_id, observed.get(run_id), baseline, staleness=check.staleness)
        limit = self.limit(check.min_tokens, run_id)
        if limit.value is None:
            why = f"no staleness of the run has min_tokens {check.min_tokens} tokens with prox_logp"
            return Verdict(check, run_id, insufficient(check), "insufficient_data", why)
        if limit.value < 1:
            why = (
                f"the trainer runs at staleness 0 only ({limit.source}): every estimate there is "
                "behave_logp, nothing to judge beyond the engine floor"
            )
            return Verdict(check, run_id, "pass", "ok", why, staleness=(1, 0))
        levels = list(range(1, limit.value + 1))
        if check.each_staleness:
            return judge_levels(check, run_id, observe_levels(self.con, check, run_id, levels), levels)
        pooled = observe(self.con, check, (1, limit.value)).get(run_id)
        return judge(check, run_id, pooled, staleness=(1, limit.value))


def evaluate(
    con: duckdb.DuckDBPyConnection,
    thresholds: Thresholds,
    only_run: str | None = None,
    max_staleness: int | None = None,
) -> tuple[list[Verdict], dict[str, StalenessLimit]]:
    """Every verdict of every check, in file order, runs sorted; and each judged run's S."""
    judging = _Judging(con, max_staleness)
    runs, verdicts, loss = judging.runs, [], stored_loss(con) or DEFAULT_LOSS
    for check in thresholds.checks:
        selected = _runs_to_judge(check, runs, only_run)
        if isinstance(selected, Verdict):
            verdicts.append(selected)
            continue
        if not selected:
            why = "the database holds no run to judge" + (
                f" other than the baseline {check.baseline_run!r}" if check.baseline_run else ""
            )
            verdicts.append(Verdict(check, None, failing(check), "missing_run", why))
            continue
        absent = _not_applicable(check, loss)
        if absent is not None:
            verdicts += [Verdict(check, run, "skip", "not_applicable", absent) for run in selected]
            continue
        if check.figure is not None and of_run(check.figure):
            observed = observe(con, check)
            present = {run for run, value in observed.items() if value.measured}
        else:
            metric = lookup(check.figure)[0].metric if check.figure else check.metric
            present = runs_with_metric(con, check.method, metric)
            observed = {} if _needs_limit(check) else observe(con, check, check.staleness)
        for run_id in selected:
            missing = _missing(check, run_id, runs, present)
            verdicts.append(missing or judging.verdict(check, run_id, observed))
    for run in sorted({v.run_id for v in verdicts if v.run_id in runs and v.verdict != "skip"}):
        judging.limit(DEFAULT_TOLERANCE.min_tokens, run)
    return verdicts, judging.used


def load_thresholds(path: str | Path) -> Thresholds:
    """The checks of a thresholds file: a regular file of at most 1 MiB (`InputFileError`), validated
    (a `ThresholdsError` naming the file, the check and the key)."""
    try:
        return parse_thresholds(read_text(path, "thresholds file"), source=str(path))
    except ThresholdsFormatError as error:
        raise ThresholdsError(str(error)) from None


def gate_on(
    con: duckdb.DuckDBPyConnection,
    thresholds: Thresholds,
    db: str = "",
    run: str | None = None,
    max_staleness: int | None = None,
) -> GateResult:
    """Every check of `thresholds` on the store of `con` (of `run` alone if given), each read query asked
    of the store once (`Memo`: `con` reads one snapshot)."""
    con = Memo.of(con)
    verdicts, limits = evaluate(con, thresholds, only_run=run, max_staleness=max_staleness)
    verdicts = explained(verdicts, runs_without_truth(con))
    return GateResult(str(db), thresholds.source, tuple(verdicts), limits)


def run_gate(
    db: str | Path, thresholds: str | Path, run: str | None = None, max_staleness: int | None = None
) -> GateResult:
    """Load the thresholds (ThresholdsError), open the store read-only (StoreError) and judge every check
    (of `run` alone if given: UsageError when the store does not hold it), judging the stalenesses 1 to
    `max_staleness` where a check looks at the staleness the trainer runs (None: what replay recorded from
    the trainer's config, else the log's largest with enough tokens).

    The thresholds are validated before the database is opened, so a bad file is reported first."""
    parsed = load_thresholds(thresholds)
    with open_store(db) as con:  # read-only; StoreError if missing, locked or not a proxaudit store
        require_run(con, run, db)  # an unknown --run is a usage error, not a failed verdict per check
        return gate_on(con, parsed, str(db), run, max_staleness)
