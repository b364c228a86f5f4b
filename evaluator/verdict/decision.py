"""Each run's decision, from the gate's verdicts on it: `Decision`, the object every renderer says (the gate's
reports, `summary`, the demo, the dashboard's Overview) and later commands build on.

The gated method is the method of the thresholds' first blocking check. Its blocking checks judge the
stalenesses 1 to S the trainer runs; at each staleness a check passes, fails (the figure's whole interval is
beyond its bound) or is undecided (the interval straddles the bound, or too few tokens). The method is safe
up to `k`, the largest staleness such that every staleness 1..k passes every such check: ship (k = S), ship
up to k (a staleness beyond k fails), do not ship (k = 0 and one fails: keep the recompute), or cannot tell
yet (nothing fails, something is undecided)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from evaluator.formulas.loss import Loss
from evaluator.gate import GateResult, StalenessLimit, Verdict
from evaluator.gate.verdicts import WILL_NOT_DECIDE, MoreSteps
from evaluator.store.trainers import TrainerFigure
from evaluator.text_table import printable
from evaluator.verdict.floor import FloorVerdict
from evaluator.verdict.options import TrainerOption, option_of
from schemas.figures import Observed, Side

Action = Literal["ship", "ship_up_to", "do_not_ship", "undecided"]
ACTIONS: tuple[Action, ...] = ("do_not_ship", "undecided", "ship_up_to", "ship")
"""Worst first: the order the dashboard opens runs in (then the largest figure)."""
FAILED = ("threshold", "regression")
"""The outcomes of a check the approximation fails; the others that are not `ok` leave it undecided."""
UNDECIDED = ("inconclusive", "insufficient_data", "missing_metric", "missing_run", "missing_baseline")


@dataclass(frozen=True)
class Reason:
    """The figure a decision rests on: the first failing, else the first undecided, figure of the gated
    method's blocking checks (for `ship`: the one closest to its bound), with its interval."""

    check: str
    """the check's name: the requirement"""
    measure: str
    """what it judges: a figure (`excess_gradient_mass_error`) or a metric's statistic"""
    metric: str | None
    staleness: int | None
    """the staleness it was observed at (None: pooled over the check's range)"""
    where: str
    """where, in words: 'at staleness 1', 'over staleness 1-6', '' (every token)"""
    observed: Observed | None
    bound: float | None
    side: Side | None
    outcome: str
    """the check's outcome there: ok, threshold, regression, inconclusive, insufficient_data, missing_*"""
    text: str
    """the gate's reason"""


@dataclass(frozen=True)
class Alternative:
    """Another trainer option that this run's checks let ship further than the gated method."""

    option: TrainerOption
    action: Action
    max_staleness: int


@dataclass(frozen=True)
class Decision:
    """What to do with one run's approximation. `action`: ship, ship_up_to, do_not_ship or undecided (above);
    `method` (None: the thresholds gate no method) and the trainer `option` it is; `max_staleness`: k, the
    largest staleness up to which every blocking check of the method passes (what to set as the trainer's
    maximum staleness, `limit.key`; 0 for do_not_ship: keep the recompute; None without a method);
    `limit`: S, the staleness the trainer runs, judged 1..S, with its source; `reason`: the figure it rests
    on; `steps_to_decide`: for undecided, about how many more steps with prox_logp would decide it, or
    "will not decide" (more than 10x the steps recorded), else None; `floor`: the engine floor's own
    verdict; `checks`: the gate's verdicts on the run (file order); `alternatives`: trainer options the run
    can use (reuse_train_logp only with one minibatch) that ship further."""

    run_id: str
    action: Action
    method: str | None
    option: TrainerOption | None
    max_staleness: int | None
    limit: StalenessLimit
    reason: Reason | None
    steps_to_decide: MoreSteps
    floor: FloorVerdict
    checks: tuple[Verdict, ...]
    alternatives: tuple[Alternative, ...] = ()

    @property
    def gate_passed(self) -> bool:
        """No check fails on this run."""
        return not any(v.verdict == "fail" for v in self.checks)

    @property
    def rank(self) -> tuple[int, float]:
        """Worst first: by action (`ACTIONS`), then by the largest figure."""
        value = self.reason.observed.value if self.reason and self.reason.observed else None
        return ACTIONS.index(self.action), -(value if value is not None and value == value else 0.0)


@dataclass(frozen=True)
class Judgement:
    """A thresholds file on a store: the gate's result and each judged run's decision, runs sorted, with the
    loss the store's figures were computed under and each trainer's own mismatch figure on those runs."""

    result: GateResult
    decisions: tuple[Decision, ...]
    loss: Loss
    trainers: tuple[TrainerFigure, ...] = ()
    """the rows of `trainer_mismatch` of the judged runs (`evaluator.store.trainers`): what each trainer
    would log at staleness 0, against its published line"""

    def loss_line(self) -> str:
        """The loss the figures were computed under, and where it came from (a path: spelled out)."""
        return f"Under the loss {self.loss.describe()} ({printable(self.loss.name)}):"


def gated_method(checks: list[Verdict]) -> str | None:
    """The method of the first blocking check with a method (None: the checks gate none)."""
    return next((v.check.method for v in checks if v.check.method and not v.check.warn_only), None)


def _side(v: Verdict) -> tuple[float | None, Side | None]:
    """The bound a verdict's reason is about: the one failed or straddled, else the first."""
    pairs = [
        (bound, side) for side, bound in (("max", v.check.max), ("min", v.check.min)) if bound is not None
    ]
    if v.observed is not None and v.observed.measured:
        for bound, side in pairs:
            if v.observed.judge(bound, side) != "pass":
                return bound, side
    return pairs[0] if pairs else (None, None)


def reason_of(v: Verdict) -> Reason:
    level = next((lv.staleness for lv in v.levels if lv.observed is v.observed), None)
    if level is not None:
        where = f"at staleness {level}"
    elif v.staleness is not None and v.staleness[0] <= v.staleness[1]:
        lo, hi = v.staleness
        where = f"at staleness {lo}" if lo == hi else f"over staleness {lo}-{hi}"
    else:
        where = ""
    bound, side = _side(v)
    return Reason(
        v.check.name, v.check.measure, v.check.metric, level, where, v.observed, bound, side, v.outcome,
        v.reason,
    )  # fmt: skip


def _levels(checks: list[Verdict], top: int) -> dict[int, str]:
    """Each staleness 1..top: `pass`, `fail` or `undecided` over every check (a pooled check stands for
    each staleness of its range, a check over every token for each)."""
    status = dict.fromkeys(range(1, top + 1), "pass")

    def mark(s: int, outcome: str) -> None:
        word = "pass" if outcome == "ok" else "fail" if outcome in FAILED else "undecided"
        order = ("pass", "undecided", "fail")
        if s in status and order.index(word) > order.index(status[s]):
            status[s] = word

    for v in checks:
        if v.levels:
            for lv in v.levels:
                mark(lv.staleness, lv.outcome)
            continue
        lo, hi = v.staleness if v.staleness is not None else (1, top)
        for s in range(max(lo, 1), min(hi, top) + 1):
            mark(s, v.outcome)
    return status


def _first(checks: list[Verdict], outcomes: tuple[str, ...]) -> Verdict | None:
    """The check whose failing (or undecided) figure comes at the lowest staleness, in file order."""

    def at(v: Verdict) -> int:
        levels = [lv.staleness for lv in v.levels if lv.outcome in outcomes]
        return min(levels) if levels else (v.staleness[0] if v.staleness else 0)

    found = [v for v in checks if v.outcome in outcomes]
    return min(found, key=at) if found else None


def _most(counts: list[MoreSteps]) -> MoreSteps:
    if WILL_NOT_DECIDE in counts:
        return WILL_NOT_DECIDE
    numbers = [c for c in counts if isinstance(c, int)]
    return max(numbers) if numbers else None


def decide(run_id: str, checks: tuple[Verdict, ...], limit: StalenessLimit, floor: FloorVerdict) -> Decision:
    """A run's decision from the gate's verdicts on it (without alternatives); undecided, with no reason,
    when the checks gate no method or the run has no staleness with enough tokens."""
    method = gated_method(list(checks))
    if method is None:
        return Decision(run_id, "undecided", None, None, None, limit, None, None, floor, checks)
    blocking = [
        v for v in checks if v.check.method == method and not v.check.warn_only and v.verdict != "skip"
    ]
    top = limit.value or 0
    status = _levels(blocking, top)
    k = next((s - 1 for s in sorted(status) if status[s] != "pass"), top)
    failed, undecided = _first(blocking, FAILED), _first(blocking, UNDECIDED)
    if failed is not None:
        action: Action = "ship_up_to" if k >= 1 else "do_not_ship"
        reason, more = reason_of(failed), None
    elif undecided is not None or limit.value is None:
        action = "undecided"
        reason = reason_of(undecided) if undecided is not None else None
        more = _most([v.steps_to_decide for v in blocking if v.outcome == "inconclusive"])
    else:
        action, more = "ship", None
        closest = [v for v in blocking if v.observed is not None and v.observed.measured]
        reason = reason_of(closest[0]) if closest else None
    return Decision(run_id, action, method, option_of(method), k, limit, reason, more, floor, checks)
