"""What the gate says: a `Verdict` per check and run (with a `Level` per staleness for a check judged at each
staleness), the staleness each run is judged up to, and the `GateResult` of a thresholds file on a store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.figures import Observed
from schemas.thresholds import Check

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
    "not_applicable",  # the store's loss has no such decision (no behaviour-weight bound, no clip, ...)
)
WILL_NOT_DECIDE = "will not decide"
ABSURD_STEPS = 10
"""More steps than this many times the steps recorded would decide an interval: more steps will not decide
it (the figure sits on its bound, or the run is far too short to say)."""
MoreSteps = int | Literal["will not decide"] | None


@dataclass(frozen=True)
class Level:
    """One staleness of a check judged at each staleness: its figure (None: no token there with the ground
    truth), its outcome (`ok`, `threshold`, `inconclusive`, `insufficient_data`, `missing_metric`) and, when
    inconclusive, about how many more steps with prox_logp would decide it."""

    staleness: int
    observed: Observed | None
    outcome: str
    steps_to_decide: MoreSteps = None


@dataclass(frozen=True)
class Verdict:
    """The judgement of one check on one run (`run_id` None when the database holds no run at all)."""

    check: Check
    run_id: str | None
    verdict: str
    outcome: str
    reason: str
    observed: Observed | None = None
    """what was judged: the figure or statistic with its 95% interval where it has one (for a check at each
    staleness, the level the reason names: the first failing or undecided one, else the highest)"""
    baseline: Observed | None = None
    regression_limit: float | None = None
    steps_to_decide: MoreSteps = None
    """an inconclusive verdict: about how many more steps with prox_logp would decide it"""
    staleness: tuple[int, int] | None = None
    """the staleness range judged (None: every token)"""
    levels: tuple[Level, ...] = ()
    """a check at each staleness: every staleness of the range, in order"""

    @property
    def tokens(self) -> int:
        return self.observed.n if self.observed is not None else 0

    @property
    def value(self) -> float | None:
        return self.observed.value if self.observed is not None else None


@dataclass(frozen=True)
class StalenessLimit:
    """The largest staleness a run is judged at, S (None: no staleness has enough tokens), where it comes
    from (`--max-staleness`, the trainer's config recorded by replay, or the log), and the trainer's config
    key that sets it."""

    value: int | None
    source: str
    key: str = "max_head_offpolicyness"


@dataclass(frozen=True)
class GateResult:
    db: str
    thresholds: str
    verdicts: tuple[Verdict, ...]
    limits: dict[str, StalenessLimit]
    """each judged run's S (for the default `min_tokens` of the thresholds' checks at each staleness)"""

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

    def of_run(self, run_id: str) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.run_id == run_id)
