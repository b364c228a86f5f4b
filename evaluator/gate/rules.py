"""The judge's rules, pure: one check on one run's observed value (`judge`), or at each staleness of a range
(`judge_levels`). A value is judged by `Observed.judge`: pass when its whole 95% interval is within the
bound, fail when the whole interval is beyond it, inconclusive when it straddles it. A statistic the store
lacks, too few tokens, or NaN is never a pass."""

from __future__ import annotations

from evaluator.formulas.bootstrap import steps_to_decide
from evaluator.gate.verdicts import ABSURD_STEPS, WILL_NOT_DECIDE, Level, MoreSteps, Verdict
from schemas.figures import Observed, Side, shown
from schemas.thresholds import Check


def failing(check: Check) -> str:
    return "warn" if check.warn_only else "fail"


def insufficient(check: Check) -> str:
    return "warn" if check.warn_only else check.on_insufficient


def _undecided(check: Check) -> str:
    return "warn" if check.warn_only or check.on_inconclusive == "warn" else "fail"


def regression_limit(baseline: float, max_regression: float, better: str) -> float:
    """The worst value allowed: baseline moved by max_regression * |baseline| in the worse direction.

    For a positive baseline and better = "lower" this is (1 + max_regression) * baseline; for
    better = "higher" it is (1 - max_regression) * baseline. Using |baseline| keeps "worse" meaning
    worse for negative statistics (e.g. the mean of approx_logp).
    """
    step = max_regression * abs(baseline)
    return baseline + step if better == "lower" else baseline - step


def more_steps(observed: Observed, bound: float) -> MoreSteps:
    """About how many more steps with prox_logp would decide an interval that straddles `bound`, or
    `will not decide` past `ABSURD_STEPS` times the steps recorded (None without steps to scale)."""
    if not observed.steps or not observed.has_interval:
        return None
    more = steps_to_decide(observed.value, observed.lower, observed.upper, bound, observed.steps)
    return WILL_NOT_DECIDE if more is None or more > ABSURD_STEPS * observed.steps else more


def advice(more: MoreSteps) -> str:
    """What a number of more steps means, as the end of a reason."""
    if more == WILL_NOT_DECIDE:
        return ": more steps will not decide this"
    return f": about {more} more steps with prox_logp would decide it" if more else ""


def conditions(check: Check) -> list[tuple[Side, float]]:
    return [(side, bound) for side, bound in (("max", check.max), ("min", check.min)) if bound is not None]


def _bounds(check: Check, observed: Observed) -> tuple[list[str], float | None]:
    """(failures, the bound an interval straddles) of `max` and `min`."""
    failures, straddled = [], None
    for side, bound in conditions(check):
        outcome = observed.judge(bound, side)
        if outcome == "fail":
            sign = ">" if side == "max" else "<"
            failures.append(
                f"{check.measure} {observed.format()} {sign} {side} {shown(bound, observed.display, True)}"
            )
        elif outcome == "inconclusive":
            straddled = bound
    return failures, straddled


def _regression(check: Check, observed: Observed, baseline: Observed) -> tuple[float | None, str | None]:
    """(the limit, the failure text when `observed` is worse than it; NaN is always worse)."""
    if baseline.value is None:
        return None, "baseline statistic unavailable"
    limit = regression_limit(baseline.value, check.max_regression, check.better)
    lower = check.better == "lower"
    if (not observed.value <= limit) if lower else (not observed.value >= limit):
        sign, move = (">", "+") if lower else ("<", "-")
        allowed = f"baseline {baseline.value:.6g} {move}{check.max_regression:.0%}"
        return limit, f"{check.measure} {observed.value:.6g} {sign} {limit:.6g} ({allowed})"
    return limit, None


def _straddles(check: Check, observed: Observed, bound: float) -> str:
    return f"{check.measure} {observed.format()} straddles {shown(bound, observed.display, True)}"


def judge(
    check: Check, run_id: str, observed: Observed | None, baseline: Observed | None = None, **fields
) -> Verdict:
    """Judge one run's observed value of the check's selection; pure, no database access.

    `observed` None: no token of the run falls in the selection. `baseline`: the baseline run's value on
    the same selection (None: no token), used only when the check has `baseline_run`. `fields`: more of the
    verdict (the staleness range judged)."""
    n = observed.n if observed is not None else 0
    if n == 0 or n < check.min_tokens:
        why = f"{n} tokens in the selection < min_tokens {check.min_tokens}"
        return Verdict(check, run_id, insufficient(check), "insufficient_data", why, observed, **fields)
    if observed.value is None:
        why = (
            f"no {check.measure} for {check.method}: the ground truth has no gradient mass here"
            if check.figure
            else f"no {check.stat} for {check.method}/{check.metric}: a 0/1 metric keeps no quantile sketch"
        )
        return Verdict(check, run_id, failing(check), "missing_metric", why, observed, **fields)
    failures, straddled = _bounds(check, observed)
    outcome = "threshold" if failures else "regression"
    if check.baseline_run is not None:
        base_n = baseline.n if baseline is not None else 0
        fields["baseline"] = baseline
        if base_n == 0 or base_n < check.min_tokens:
            why = f"baseline {check.baseline_run!r}: {base_n} tokens < min_tokens {check.min_tokens}"
            return Verdict(check, run_id, insufficient(check), "insufficient_data", why, observed, **fields)
        fields["regression_limit"], text = _regression(check, observed, baseline)
        if text:
            failures.append(text)
    if failures:
        return Verdict(check, run_id, failing(check), outcome, "; ".join(failures), observed, **fields)
    if straddled is not None:
        more = more_steps(observed, straddled)
        reason = _straddles(check, observed, straddled)
        return Verdict(
            check, run_id, _undecided(check), "inconclusive", reason + advice(more), observed,
            steps_to_decide=more, **fields,
        )  # fmt: skip
    reason = f"{check.measure} {observed.format()} within limits"
    return Verdict(check, run_id, "pass", "ok", reason, observed, **fields)


def _level(check: Check, staleness: int, observed: Observed | None) -> Level:
    """One staleness of a check judged at each staleness."""
    one = judge(check, "", observed)
    return Level(staleness, observed, one.outcome, one.steps_to_decide)


def _span(levels: list[int]) -> str:
    return f"{levels[0]}" if len(levels) == 1 else f"{levels[0]}-{levels[-1]}"


def judge_levels(check: Check, run_id: str, observed: dict[int, Observed], levels: list[int]) -> Verdict:
    """Judge a check at each staleness of `levels` (`observed`: the run's figure at each, family-wise
    intervals; a staleness without tokens absent): fail when one fails, else insufficient data when one has
    fewer than `min_tokens` tokens, else inconclusive when one straddles a bound, else pass. The reason
    names the first staleness that decides it; a pass names the highest."""
    judged = [_level(check, s, observed.get(s)) for s in levels]
    fields = dict(staleness=(levels[0], levels[-1]), levels=tuple(judged))
    failed = [lv for lv in judged if lv.outcome in ("threshold", "missing_metric")]
    if failed:
        first = failed[0]
        one = judge(check, run_id, first.observed)
        reason = f"at staleness {first.staleness}: {one.reason}"
        return Verdict(check, run_id, failing(check), first.outcome, reason, first.observed, **fields)
    thin = [lv for lv in judged if lv.outcome == "insufficient_data"]
    if thin:
        counts = ", ".join(f"{lv.staleness}: {lv.observed.n if lv.observed else 0}" for lv in thin)
        reason = f"fewer than min_tokens {check.min_tokens} tokens at staleness {counts}"
        return Verdict(
            check, run_id, insufficient(check), "insufficient_data", reason, thin[0].observed, **fields
        )
    undecided = [lv for lv in judged if lv.outcome == "inconclusive"]
    if undecided:
        first = undecided[0]
        more = _most(lv.steps_to_decide for lv in undecided)
        straddled = _bounds(check, first.observed)[1]
        reason = f"at staleness {first.staleness}: {_straddles(check, first.observed, straddled)}"
        return Verdict(
            check, run_id, _undecided(check), "inconclusive", reason + advice(more), first.observed,
            steps_to_decide=more, **fields,
        )  # fmt: skip
    top = max(judged, key=lambda lv: lv.observed.upper if lv.observed.has_interval else lv.observed.value)
    highest = f"highest: {top.observed.format()} at staleness {top.staleness}"
    reason = f"{check.measure} at every staleness {_span(levels)} within limits ({highest})"
    return Verdict(check, run_id, "pass", "ok", reason, top.observed, **fields)


def _most(counts) -> MoreSteps:
    """The steps that decide every undecided level: `will not decide` if one will not, else the most."""
    counts = list(counts)
    if WILL_NOT_DECIDE in counts:
        return WILL_NOT_DECIDE
    numbers = [c for c in counts if c is not None]
    return max(numbers) if numbers else None
