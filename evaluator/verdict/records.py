"""Every field of a verdict and of a decision as plain values (JSON, JUnit properties), and the texts of a
check's threshold and staleness selection that every report shows."""

from __future__ import annotations

from evaluator.gate import Verdict
from evaluator.verdict.decision import Decision
from evaluator.verdict.words import sentence
from schemas.figures import FLOOR, Observed, bounds, shown


def observed_text(observed: Observed | None) -> str:
    return "-" if observed is None or not observed.measured else observed.format()


def threshold_text(v: Verdict) -> str:
    """The conditions of the check, with the baseline's limit once known: '<= 1%; <= 0.0412 (b +10%)'."""
    check, display = v.check, v.observed.display if v.observed is not None else "number"
    parts = [f"{sign} {shown(bound, display, True)}" for sign, bound in ((">=", check.min), ("<=", check.max))
             if bound is not None]  # fmt: skip
    if check.max_regression is not None:
        sign = "<=" if check.better == "lower" else ">="
        limit = f"{v.regression_limit:.6g}" if v.regression_limit is not None else "?"
        parts.append(
            f"{sign} {limit} ({check.baseline_run} {'+' if sign == '<=' else '-'}{check.max_regression:.0%})"
        )
    return "; ".join(parts)


def selection_text(v: Verdict) -> str:
    """The stalenesses judged: 'all', '2', '1-6', or '1-6 each'."""
    if v.check.figure is not None and v.check.figure.startswith(FLOOR):
        return "0"
    if v.staleness is None or v.staleness[0] > v.staleness[1]:
        return "all" if v.staleness is None else "none"
    lo, hi = v.staleness
    return (f"{lo}" if lo == hi else f"{lo}-{hi}") + (" each" if v.check.each_staleness else "")


def clean(x):
    return None if isinstance(x, float) and x != x else x


def observed_record(observed: Observed | None, prefix: str = "observed") -> dict:
    o = observed or Observed(None)
    return {
        prefix: clean(o.value),
        bounds(prefix)[0]: clean(o.lower),
        bounds(prefix)[1]: clean(o.upper),
        f"{prefix}_confidence": o.confidence if o.has_interval else None,
    }


def verdict_record(v: Verdict) -> dict:
    """Every field of one verdict, JSON-ready (NaN becomes null)."""
    check = v.check
    return {
        "check_index": check.index,
        "name": check.name,
        "run_id": v.run_id,
        "method": check.method,
        "metric": check.metric,
        "stat": check.stat,
        "figure": check.figure,
        "staleness": list(check.staleness) if check.staleness else None,
        "each_staleness": check.each_staleness,
        "judged_staleness": list(v.staleness) if v.staleness else None,
        "max": check.max,
        "min": check.min,
        "warn_only": check.warn_only,
        "min_tokens": check.min_tokens,
        "on_insufficient": check.on_insufficient,
        "on_inconclusive": check.on_inconclusive,
        "baseline_run": check.baseline_run,
        "max_regression": check.max_regression,
        "better": check.better if check.max_regression is not None else None,
        **observed_record(v.observed),
        "steps_to_decide": v.steps_to_decide,
        "tokens": v.tokens,
        "baseline_value": clean(v.baseline.value) if v.baseline else None,
        "baseline_tokens": v.baseline.n if v.baseline else None,
        "regression_limit": clean(v.regression_limit),
        "threshold": threshold_text(v),
        "verdict": v.verdict,
        "outcome": v.outcome,
        "reason": v.reason,
        "levels": [
            {
                "staleness": lv.staleness,
                **observed_record(lv.observed),
                "tokens": lv.observed.n if lv.observed else 0,
                "outcome": lv.outcome,
                "steps_to_decide": lv.steps_to_decide,
            }
            for lv in v.levels
        ]
        or None,
    }


def decision_record(d: Decision) -> dict:
    """Every field of one decision, JSON-ready, with its sentence."""
    r = d.reason
    reason = None
    if r is not None:
        reason = {
            "check": r.check,
            "measure": r.measure,
            "metric": r.metric,
            "staleness": r.staleness,
            **observed_record(r.observed),
            "tokens": r.observed.n if r.observed else 0,
            "bound": r.bound,
            "side": r.side,
            "outcome": r.outcome,
            "text": r.text,
        }
    floor = {name: observed_record(o, "value") for name, o in d.floor.figures.items()}
    return {
        "run_id": d.run_id,
        "action": d.action,
        "method": d.method,
        "option": str(d.option) if d.option else None,
        "max_staleness": d.max_staleness,
        "judged_up_to": d.limit.value,
        "staleness_source": d.limit.source,
        "setting": d.limit.key,
        "reason": reason,
        "steps_to_decide": d.steps_to_decide,
        "floor": {"outcome": d.floor.outcome, "bounds": d.floor.bounds, "figures": floor},
        "alternatives": [
            {
                "method": a.option.method,
                "option": str(a.option),
                "action": a.action,
                "max_staleness": a.max_staleness,
            }
            for a in d.alternatives
        ],
        "gate_passed": d.gate_passed,
        "sentence": sentence(d),
    }
