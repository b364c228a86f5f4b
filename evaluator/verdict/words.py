"""A decision in one sentence a person acts on: what to do, in the trainer's own config terms, then why (the
figure with its interval and the tolerance), e.g. "Do not ship loglinear_shipped (AReaL
actor.prox_logp_method: loglinear) beyond staleness 0 on run recompute: at staleness 1 it moves 2.63%
(family-wise 95%: 1.29-4.10%) of the gradient mass beyond the engine floor (tolerance 1%). Keep the
recompute (AReaL actor.prox_logp_method: recompute), or set max_head_offpolicyness: 0."

Values from the data (run ids, check names, file names, config keys) go through `quote`: `printable` for the
terminal (control characters and line breaks spelled out), `markdown_code` for Markdown, the dashboard's
`plain`."""

from __future__ import annotations

from collections.abc import Callable

from evaluator.gate.verdicts import WILL_NOT_DECIDE
from evaluator.text_table import printable
from evaluator.verdict.decision import Decision, Reason
from evaluator.verdict.options import RECOMPUTE
from schemas.figures import lookup, shown

Quote = Callable[[str], str]


def says(reason: Reason) -> str:
    """What the reason's figure says of the method: 'moves 2.63% (95%: ...) of the gradient mass beyond
    the engine floor', or a metric's statistic: 'has a mean abs_error of 0.0415 (95%: ...)'."""
    observed = reason.observed.format() if reason.observed is not None else "not measured"
    try:
        figure, variant = lookup(reason.measure)
    except KeyError:
        return f"has a {reason.measure} {reason.metric} of {observed}"
    text = figure.says.format(observed)
    return text + " beyond the engine floor" if variant == "excess" else text


def _bound(reason: Reason) -> str:
    if reason.bound is None:
        return ""
    display = reason.observed.display if reason.observed is not None else "number"
    limit = shown(reason.bound, display, exact=True)
    return f" (tolerance {limit})" if reason.side == "max" else f" (at least {limit})"


def why(reason: Reason) -> str:
    """'at staleness 1 it moves 2.63% (...) of the gradient mass beyond the engine floor (tolerance 1%)'."""
    where = f"{reason.where} " if reason.where else ""
    return f"{where}it {says(reason)}{_bound(reason)}"


def _steps(d: Decision) -> str:
    if d.steps_to_decide == WILL_NOT_DECIDE:
        return " More steps will not decide this."
    if d.steps_to_decide:
        return f" About {d.steps_to_decide:,} more steps with prox_logp would decide it."
    return ""


def _undecided(d: Decision, method: str, run: str, quote: Quote) -> str:
    S, r = d.limit.value, d.reason
    upto = f" up to staleness {S}" if S else ""
    head = f"Cannot tell yet whether to ship {method} on run {run}{upto}"
    if r is not None and r.outcome == "inconclusive":
        where = f"{r.where} " if r.where else ""
        limit = _bound(r).removeprefix(" (").removesuffix(")")
        text = f"{head}: {where}it {says(r)}, an interval that straddles the {limit}.{_steps(d)}"
    elif r is not None:  # too few tokens, or no figure at all (a run without prox_logp): the gate's words
        text = f"{head}: {quote(r.text)}."
    elif S is None:
        return f"{head}: no staleness has enough tokens with prox_logp to judge ({quote(d.limit.source)})."
    else:
        return f"{head}."
    if d.max_staleness:
        k = d.max_staleness
        text += f" Meanwhile it is safe up to staleness {k} ({quote(d.limit.key)}: {k})."
    return text


def sentence(d: Decision, quote: Quote = printable) -> str:
    """The decision in one sentence (then its reason, alternatives and what to set)."""
    run = quote(d.run_id)
    if d.method is None:
        state = "passes" if d.gate_passed else "fails"
        return (
            f"Run {run}: these thresholds gate no method, only figures of the whole run (the gate {state})."
        )
    method = f"{d.method} ({d.option})" if d.option else d.method
    S, k, key, r = d.limit.value, d.max_staleness, quote(d.limit.key), d.reason
    if d.action == "ship" and not S:
        text = (
            f"Ship {method} on run {run} with {key}: 0: at staleness 0 every estimate is behave_logp, so the "
            "approximation changes nothing (the engine floor is judged on its own)."
        )
    elif d.action == "ship":
        closest = f"; the closest: {why(r)}" if r is not None else ""
        text = f"Ship {method} on run {run} with {key} up to {S}: every staleness 1-{S} passes{closest}."
    elif d.action == "ship_up_to":
        text = f"Ship {method} on run {run} only with {key} <= {k}, not {S}: {why(r)}."
    elif d.action == "do_not_ship":
        text = (
            f"Do not ship {method} beyond staleness 0 on run {run}: {why(r)}. Keep the recompute "
            f"({RECOMPUTE}), or set {key}: 0."
        )
    else:
        text = _undecided(d, method, run, quote)
    for alt in d.alternatives:
        reach = (
            f"up to staleness {alt.max_staleness}" if alt.action != "ship" else f"at every staleness 1-{S}"
        )
        text += f" {alt.option.method} ({alt.option}) passes {reach} on this run."
    return text


def run_line(d: Decision, quote: Quote = printable) -> str:
    """One line per run: the decision, then the engine floor's own verdict."""
    return f"{sentence(d, quote)} {d.floor.sentence(quote(d.run_id))}"
