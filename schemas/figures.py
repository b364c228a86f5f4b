"""The decision figures, one typed entry each (`FIGURE_TABLE`, beside `schemas.store.METRIC_TABLE`), and the
value every reader of the store returns for one of them (`Observed`): its point, its 95% interval, the
tokens and steps it rests on, how it is judged against a bound and how it reads.

A decision figure is a ratio of exact sums over a selection of tokens (DOMAIN.md 3b): `numerator` /
`denominator`, each the sum or the count of one metric. A figure with `excess` is judged beyond the engine
floor too: `excess_<name>` is the figure minus the floor's (`rollout` at staleness 0, on the same bootstrap
draws) and `floor_<name>` the floor's own, a figure of the run. Imports nothing of ours."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Display = Literal["percent", "number", "level", "count"]
"""How a value reads: a share in %, a plain number, a staleness level, a count."""
Outcome = Literal["pass", "fail", "inconclusive", "unmeasured"]
Side = Literal["max", "min"]
Variant = Literal["", "excess", "floor"]
LEVEL = 0.95
"""The confidence of every interval, or of a family of them together (Bonferroni)."""


@dataclass(frozen=True)
class Sum:
    """One metric's per-step `sum` or `count` (`n`) in the store's moments."""

    metric: str
    stat: Literal["sum", "count"]


@dataclass(frozen=True)
class Figure:
    """One decision figure of the catalogue."""

    name: str
    formula: str
    says: str
    """how a sentence states the value `{}` of a method, e.g. 'moves {} of the gradient mass'"""
    numerator: Sum | None = None
    denominator: Sum | None = None
    interval: bool = False
    """it has a 95% interval (a bootstrap over steps, `evaluator.formulas.bootstrap`)"""
    excess: bool = False
    """it is judged beyond the engine floor too: `excess_<name>`, and `floor_<name>` for the run"""
    scope: Literal["method", "run"] = "method"
    """`method`: a figure of each method of a run; `run`: of the whole run"""
    display: Display = "percent"
    view: Literal["decision", "weight", "safe_staleness", "findings"] = "decision"
    """where the store has it: `decision_over`, `weight_over`, the `safe_staleness` macro, `run_finding`"""
    needs: str | None = None
    """the metric whose rows a run needs to have the figure (None: the numerator's)"""

    @property
    def metric(self) -> str | None:
        """The metric whose rows a run needs to have the figure."""
        return self.needs or (self.numerator.metric if self.numerator else None)


def _rate(name: str, metric: str, decisions: str, excess: bool = False) -> Figure:
    """A flip rate: the mean of a 0/1 metric."""
    return Figure(
        name, f"mean {metric}", f"flips {{}} of {decisions}", Sum(metric, "sum"), Sum(metric, "count"),
        interval=True, excess=excess,
    )  # fmt: skip


def _weight(name: str, formula: str) -> Figure:
    return Figure(
        name, formula, f"has {name} {{}}", display="number", view="weight", needs="behave_imp_weight"
    )


def _level(name: str, formula: str, says: str) -> Figure:
    """A safe staleness: its interval's ends are the level with 95% confidence and at most."""
    return Figure(name, formula, says, interval=True, display="level", view="safe_staleness",
                  needs="grad_weight_abs_error")  # fmt: skip


FIGURE_TABLE: tuple[Figure, ...] = (
    Figure(
        "gradient_mass_error",
        "sum grad_weight_abs_error / sum true_grad_weight (on the same tokens)",
        "moves {} of the gradient mass",
        Sum("grad_weight_abs_error", "sum"),
        Sum("true_grad_weight", "sum"),
        interval=True,
        excess=True,
    ),
    _rate("clip_flip_rate", "clip_flip", "PPO clip decisions", excess=True),
    _rate("bound_flip_rate", "bound_flip", "behaviour-weight bound decisions", excess=True),
    _rate("dual_clip_flip_rate", "dual_clip_flip", "dual-clip decisions"),
    _rate("bound_lower_flip_rate", "bound_lower_flip", "lower-bound decisions"),
    _rate("sequence_clip_flip_rate", "sequence_clip_flip", "sequence clip decisions (over sequences)"),
    _rate("sequence_bound_flip_rate", "sequence_bound_flip", "sequence bound decisions (over sequences)"),
    _weight("ess_fraction", "(sum w)^2 / (n sum w^2) of w = behave_imp_weight"),
    _weight("chi2", "n sum w^2 / (sum w)^2 - 1 of w = behave_imp_weight"),
    _weight("kl_k1", "mean -r of r = behave_approx_kl"),
    _weight("kl_k2", "mean r^2 / 2"),
    _weight("kl_k3", "mean exp(r) - 1 - r"),
    _level(
        "safe_staleness",
        "the largest staleness s such that every staleness <= s with enough tokens meets the tolerance",
        "is safe up to staleness {}",
    ),
    _level(
        "safe_staleness_beyond_floor",
        "the same, judging each staleness's excess over the engine floor",
        "is safe beyond the engine floor up to staleness {}",
    ),
    Figure(
        "warnings",
        "the number of data-driven warnings stored with the run (`run_findings`)",
        "has {} data-driven warnings",
        scope="run",
        display="count",
        view="findings",
    ),
)
FIGURES: dict[str, Figure] = {f.name: f for f in FIGURE_TABLE}
EXCESS = "excess_"
FLOOR = "floor_"
FLOOR_METHOD = "rollout"
"""The method whose figures at staleness 0 are the engine floor (every estimate there is `behave_logp`)."""
INTERVAL_FIGURES = tuple(f.name for f in FIGURE_TABLE if f.interval and f.view == "decision")
"""The decision figures with a 95% interval the store keeps (`decision_interval`)."""
EXCESS_FIGURES = tuple(f.name for f in FIGURE_TABLE if f.excess)
JUDGED: tuple[str, ...] = (
    *FIGURES,
    *(EXCESS + name for name in EXCESS_FIGURES),
    *(FLOOR + name for name in EXCESS_FIGURES),
)
"""Every name a check of the thresholds file may judge as `figure`."""


def lookup(name: str) -> tuple[Figure, Variant]:
    """The catalogue's entry of a judged name and its variant: `excess_clip_flip_rate` -> (clip_flip_rate,
    "excess"). A KeyError for a name outside `JUDGED`."""
    for prefix, variant in ((EXCESS, "excess"), (FLOOR, "floor")):
        if name.startswith(prefix) and name.removeprefix(prefix) in EXCESS_FIGURES:
            return FIGURES[name.removeprefix(prefix)], variant
    return FIGURES[name], ""


def of_run(name: str) -> bool:
    """Whether a judged name is a figure of the whole run (no method): the engine floor, the warnings."""
    figure, variant = lookup(name)
    return variant == "floor" or figure.scope == "run"


def bounds(name: str) -> tuple[str, str]:
    """The columns of a name's 95% interval in the views: (`<name>_lower`, `<name>_upper`)."""
    return f"{name}_lower", f"{name}_upper"


def with_bounds(name: str) -> tuple[str, str, str]:
    return (name, *bounds(name))


def shown(x: float, display: Display = "number", exact: bool = False) -> str:
    """One number as it reads: '2.63%', '0.0412', '5', '3'; `exact` for a bound as written ('1%')."""
    if display == "percent":
        return f"{100 * x:g}%" if exact else f"{100 * x:.2f}%"
    if display in ("level", "count") and float(x).is_integer():
        return str(int(x))
    return f"{x:g}" if exact else f"{x:.6g}"


@dataclass(frozen=True)
class Observed:
    """A figure, a metric's statistic or a level as the store gives it for one selection of one run: the
    point `value` (None: not measured), its interval `[lower, upper]` (None: it has none), the `n` tokens
    and `steps` steps it rests on. The interval is at 95% for the figure alone, or for `family` intervals
    judged together (each then at 1 - 0.05 / family: Bonferroni)."""

    value: float | None
    lower: float | None = None
    upper: float | None = None
    n: int = 0
    steps: int | None = None
    display: Display = "number"
    family: int = 1

    @property
    def measured(self) -> bool:
        return self.value is not None

    @property
    def has_interval(self) -> bool:
        return self.lower is not None and self.upper is not None

    def judge(self, bound: float, side: Side) -> Outcome:
        """`pass` when the whole interval is within the bound (`value <= bound` for `max`), `fail` when the
        whole interval is beyond it, `inconclusive` when it straddles it; without an interval, the point
        alone decides. `unmeasured` without a value; NaN never passes (it fails)."""
        if self.value is None:
            return "unmeasured"
        low, high = (self.lower, self.upper) if self.has_interval else (self.value, self.value)
        if side == "min":  # judged as a max of the negated values
            low, high, bound = -high, -low, -bound
        if math.isnan(self.value) or not low <= bound:
            return "fail"
        return "pass" if high <= bound else "inconclusive"

    @property
    def confidence(self) -> str:
        return f"{LEVEL:.0%}" if self.family == 1 else f"family-wise {LEVEL:.0%}"

    def format(self) -> str:
        """'2.63% (95%: 1.56-3.66%)', '-0.07% (95%: -0.72 to 0.42%)', '0.0412 (95%: 0.0388 to 0.0442)',
        '0 (family-wise 95%: 0 to 5)'; 'not measured' without a value."""
        if self.value is None:
            return "not measured"
        point = shown(self.value, self.display)
        if not self.has_interval:
            return point
        low, high = shown(self.lower, self.display), shown(self.upper, self.display)
        if self.display == "percent":
            low = low.removesuffix("%")
            joined = f"{low}-{high}" if self.lower >= 0 else f"{low} to {high}"
        else:
            joined = f"{low} to {high}"
        return f"{point} ({self.confidence}: {joined})"
