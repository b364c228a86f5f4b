"""The CI gate: a judge over the metrics store. It reads summary statistics from DuckDB and applies the
conditions of a thresholds file (`schemas.thresholds`); it never calls the estimators.

Each (check, run) pair gets one verdict: pass, warn, fail or skip. A metric the database does not hold
for a run, or too few tokens in the selection, is never a pass (see `judge`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb

from evaluator.errors import ThresholdsError
from evaluator.formulas.bootstrap import steps_to_decide
from evaluator.gate.figures import FIGURE_METRIC, figure_stats, runs_with_metric, selection_stats
from evaluator.gate.ground_truth import explained
from evaluator.inputs import read_text
from evaluator.store import open_store
from evaluator.store.reader import require_run, runs_without_truth
from schemas.store import RUN_FIGURES
from schemas.thresholds import DEFAULT_THRESHOLDS, Check, Thresholds, ThresholdsFormatError, parse_thresholds

__all__ = ["DEFAULT_THRESHOLDS", "GateResult", "Verdict", "judge", "run_gate", "selection_stats"]

VERDICTS = ("pass", "warn", "fail", "skip")
"""An `inconclusive` outcome (the 95% interval straddles the bound) is a warn, or a fail where the check
asks (`on_inconclusive`)."""
# Why a verdict is what it is (the JSON report's `outcome`).
OUTCOMES = (
    "ok",  # every condition holds (with 95% confidence where the figure has an interval)
    "threshold",  # an absolute max/min does not hold (with 95% confidence where it has an interval)
    "inconclusive",  # the figure's 95% interval straddles the bound
    "regression",  # worse than the baseline by more than max_regression
    "insufficient_data",  # fewer than min_tokens tokens in the selection (of the run or of the baseline)
    "missing_metric",  # the run has no rows at all for this method and metric
    "missing_baseline",  # the baseline run has no rows for this method and metric
    "missing_run",  # the run the check pins is not in the database, or it holds no run
    "not_selected",  # pinned to another run than --run, or --run selects the check's baseline
)


@dataclass(frozen=True)
class Verdict:
    """The judgement of one check on one run (`run_id` None when the database holds no run at all)."""

    check: Check
    run_id: str | None
    verdict: str
    outcome: str
    reason: str
    observed: float | None = None
    tokens: int = 0
    baseline_value: float | None = None
    baseline_tokens: int | None = None
    regression_limit: float | None = None
    lower: float | None = None
    """the observed figure's 95% interval (a bootstrap over steps), where it has one"""
    upper: float | None = None
    steps_to_decide: int | None = None
    """an inconclusive verdict: about how many more steps with prox_logp would decide it"""


@dataclass(frozen=True)
class GateResult:
    db: str
    thresholds: str
    verdicts: tuple[Verdict, ...]

    def count(self, verdict: str) -> int:
        return sum(v.verdict == verdict for v in self.verdicts)

    @property
    def judged(self) -> int:
        """Verdicts that judged data (not skipped)."""
        return len(self.verdicts) - self.count("skip")

    @property
    def passed(self) -> bool:
        """True when no verdict is a failure (warnings and skips allowed) and something was judged:
        a gate whose every check was skipped proves nothing."""
        return self.count("fail") == 0 and self.judged > 0

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def regression_limit(baseline: float, max_regression: float, better: str) -> float:
    """The worst value allowed: baseline moved by max_regression * |baseline| in the worse direction.

    For a positive baseline and better = "lower" this is (1 + max_regression) * baseline; for
    better = "higher" it is (1 - max_regression) * baseline. Using |baseline| keeps "worse" meaning
    worse for negative statistics (e.g. the mean of approx_logp).
    """
    step = max_regression * abs(baseline)
    return baseline + step if better == "lower" else baseline - step


def _failing(check: Check) -> str:
    return "warn" if check.warn_only else "fail"


def _insufficient(check: Check, run_id: str, why: str, **fields) -> Verdict:
    verdict = "warn" if check.warn_only else check.on_insufficient
    return Verdict(check, run_id, verdict, "insufficient_data", why, **fields)


def _regression_failure(check: Check, observed: float, base_value: float, limit: float) -> str | None:
    """The failure text when `observed` is worse than `limit`, else None (NaN is always worse)."""
    lower = check.better == "lower"
    if (not observed <= limit) if lower else (not observed >= limit):
        sign, move = (">", "+") if lower else ("<", "-")
        allowed = f"baseline {base_value:.6g} {move}{check.max_regression:.0%}"
        return f"{check.measure} {observed:.6g} {sign} {limit:.6g} ({allowed})"
    return None


def judge(check: Check, run_id: str, stats: dict | None, baseline: dict | None = None) -> Verdict:
    """Judge one run's statistics on the check's selection; pure, no database access.

    `stats` None: no token of the run falls in the selection. `baseline`: the baseline run's statistics
    on the same selection (None: no token), used only when the check has `baseline_run`. A statistic
    that is NaN, or unavailable (None), fails.
    """
    n = int(stats["n"]) if stats else 0
    if n == 0 or n < check.min_tokens:
        return _insufficient(
            check, run_id, f"{n} tokens in the selection < min_tokens {check.min_tokens}", tokens=n
        )
    if stats[check.measure] is None:
        why = (
            f"no {check.measure} for {check.method}: the ground truth has no gradient mass here"
            if check.figure
            else f"no {check.stat} for {check.method}/{check.metric}: a 0/1 metric keeps no quantile sketch"
        )
        return Verdict(check, run_id, _failing(check), "missing_metric", why, tokens=n)
    observed = float(stats[check.measure])
    lower, upper = stats.get(f"{check.measure}_lower"), stats.get(f"{check.measure}_upper")
    fields: dict = dict(observed=observed, tokens=n, lower=lower, upper=upper)
    failures, straddled = _bounds(check, observed, lower, upper)
    if check.baseline_run is not None:
        base_n = int(baseline["n"]) if baseline else 0
        fields["baseline_tokens"] = base_n
        if base_n == 0 or base_n < check.min_tokens:
            why = f"baseline {check.baseline_run!r}: {base_n} tokens < min_tokens {check.min_tokens}"
            return _insufficient(check, run_id, why, **fields)
        base_value = baseline[check.measure]
        limit = (
            None if base_value is None else regression_limit(base_value, check.max_regression, check.better)
        )
        fields.update(baseline_value=base_value, regression_limit=limit)
        text = (
            "baseline statistic unavailable"
            if limit is None
            else _regression_failure(check, observed, base_value, limit)
        )
        if text:
            failures.append(("regression", text))
    if failures:
        reason = "; ".join(text for _, text in failures)
        return Verdict(check, run_id, _failing(check), failures[0][0], reason, **fields)
    shown = _shown(observed, lower, upper)
    if straddled is not None:
        steps = stats.get("steps")
        more = steps_to_decide(observed, lower, upper, straddled, steps) if steps else None
        advice = f": about {more} more steps with prox_logp would decide it" if more else ""
        verdict = "warn" if check.warn_only or check.on_inconclusive == "warn" else "fail"
        reason = f"{check.measure} {shown} straddles {straddled:g}{advice}"
        return Verdict(check, run_id, verdict, "inconclusive", reason, steps_to_decide=more, **fields)
    return Verdict(check, run_id, "pass", "ok", f"{check.measure} {shown} within limits", **fields)


def _shown(observed: float, lower: float | None, upper: float | None) -> str:
    interval = "" if lower is None or upper is None else f" (95%: {lower:.6g} to {upper:.6g})"
    return f"{observed:.6g}{interval}"


def _bounds(
    check: Check, observed: float, lower: float | None, upper: float | None
) -> tuple[list[tuple[str, str]], float | None]:
    """(failures, the bound an interval straddles) of `max` and `min`: with an interval, a bound fails
    only when the whole interval is beyond it and is undecided when the interval straddles it; without
    one, on the point (written as `not ok` so that NaN fails)."""
    failures, straddled = [], None
    high = observed if upper is None or lower is None else upper
    low = observed if upper is None or lower is None else lower
    shown = _shown(observed, lower, upper)
    if check.max is not None and not high <= check.max:
        if not low <= check.max:
            failures.append(("threshold", f"{check.measure} {shown} > max {check.max:g}"))
        else:
            straddled = check.max
    if check.min is not None and not low >= check.min:
        if not high >= check.min:
            failures.append(("threshold", f"{check.measure} {shown} < min {check.min:g}"))
        else:
            straddled = check.min
    return failures, straddled


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
        return Verdict(check, run_id, _failing(check), "missing_run", why)
    subject = "/".join(filter(None, (check.method, check.figure or check.metric)))
    if run_id not in present:
        why = f"run {run_id!r} has no {subject} rows"
        return Verdict(check, run_id, _failing(check), "missing_metric", why)
    if check.baseline_run is not None and check.baseline_run not in present:
        where = "is not in the database" if check.baseline_run not in runs else "has no such rows"
        why = f"baseline run {check.baseline_run!r} {where} ({subject})"
        return Verdict(check, run_id, _failing(check), "missing_baseline", why)
    return None


def evaluate(
    con: duckdb.DuckDBPyConnection, thresholds: Thresholds, only_run: str | None = None
) -> list[Verdict]:
    """Every verdict of every check, in file order, runs sorted."""
    runs = sorted(r[0] for r in con.execute("SELECT DISTINCT run_id FROM file_tokens").fetchall())
    verdicts: list[Verdict] = []
    for check in thresholds.checks:
        selected = _runs_to_judge(check, runs, only_run)
        if isinstance(selected, Verdict):
            verdicts.append(selected)
            continue
        if not selected:
            why = "the database holds no run to judge" + (
                f" other than the baseline {check.baseline_run!r}" if check.baseline_run else ""
            )
            verdicts.append(Verdict(check, None, _failing(check), "missing_run", why))
            continue
        if check.figure in RUN_FIGURES:
            stats = figure_stats(con, check)
            present = {run for run, values in stats.items() if values[check.figure] is not None}
        elif check.figure:
            present = runs_with_metric(con, check.method, FIGURE_METRIC[check.figure])
            stats = figure_stats(con, check)
        else:
            present = runs_with_metric(con, check.method, check.metric)
            stats = selection_stats(con, check.method, check.metric, check.staleness)
        for run_id in selected:
            missing = _missing(check, run_id, runs, present)
            baseline = stats.get(check.baseline_run) if check.baseline_run else None
            verdicts.append(missing or judge(check, run_id, stats.get(run_id), baseline))
    return verdicts


def load_thresholds(path: str | Path) -> Thresholds:
    """The checks of a thresholds file: a regular file of at most 1 MiB (`InputFileError`), validated
    (`ThresholdsError`)."""
    try:
        return parse_thresholds(read_text(path, "thresholds file"), source=str(path))
    except ThresholdsFormatError as error:
        raise ThresholdsError(str(error)) from None


def run_gate(db: str | Path, thresholds: str | Path, run: str | None = None) -> GateResult:
    """Load the thresholds (ThresholdsError), open the store read-only (StoreError) and judge every check
    (of `run` alone if given: UsageError when the store does not hold it).

    The thresholds are validated before the database is opened, so a bad file is reported first."""
    parsed = load_thresholds(thresholds)
    with open_store(db) as con:  # read-only; StoreError if missing, locked or not a proxaudit store
        require_run(con, run, db)  # an unknown --run is a usage error, not a failed verdict per check
        verdicts = explained(evaluate(con, parsed, only_run=run), runs_without_truth(con))
    return GateResult(db=str(db), thresholds=str(thresholds), verdicts=tuple(verdicts))
