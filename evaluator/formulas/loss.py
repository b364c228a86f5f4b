"""The loss a trainer runs, as far as the proximal log-prob reaches it (DOMAIN.md 3c): a plain description,
recorded with the store, that `evaluator.formulas.gradients` turns into decisions and gradient weights.

A loss is a **policy loss** on the ratio `exp(theta - prox)` (PPO's clip, with a dual clip; SAPO's soft
gate; CISPO's clipped, stop-gradient weight), taken per token or per sequence (GSPO: the geometric mean of a
sequence's token ratios), times a **behaviour weight** built from `d = prox - behave` (none; each token's
`exp(d)`; the sequence's product `exp(sum d)` or geometric mean `exp(mean d)`), which **rules** then
reject (mask) or truncate (clamp) by a statistic of `d` per token or per sequence. Every trainer's option
is one of these (`evaluator.lossconfig` reads them from the trainer's own config).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from evaluator.errors import ParameterError
from evaluator.inputs import FINITE, Range, shown

PolicyLoss = Literal["ppo", "sapo", "cispo"]
Level = Literal["token", "sequence"]
BehaveWeight = Literal["none", "token", "sequence_product", "sequence_mean"]
Statistic = Literal["ratio", "kl_k1", "kl_k2", "kl_k3", "kl_k3_reverse", "binary_kl"]
Agg = Literal["sum", "mean", "max", "min"]
Action = Literal["mask", "clamp"]

STATISTICS: dict[str, str] = {
    "ratio": "exp(d): the behaviour weight (a sequence's: exp of the agg of d, so sum is the product)",
    "kl_k1": "d",
    "kl_k2": "d^2 / 2",
    "kl_k3": "exp(-d) - 1 + d (AReaL's code: exp(b - x) - 1 - (b - x))",
    "kl_k3_reverse": "exp(d) - 1 - d (verl's k3, and AReaL's help text)",
    "binary_kl": "max(KL(p||q), KL(q||p)) of Bernoulli p = exp(x), q = exp(b), clamped to [1e-8, 1 - 1e-8]",
}
"""Each statistic of `d = x - b` (x the log pi_prox used, b `behave_logp`) a rule bounds."""


EPS_LOW: dict[str, Range] = {
    "ppo": Range(0, 1),
    "sapo": Range(0, 1),
    "cispo": Range(0, 1, high_open=False),
}
"""The ratio is clipped below at 1 - eps_low: PPO's clip needs 0 < eps_low < 1 (at 1 nothing is clipped
below); CISPO's weight may be clamped at 0 (AReaL's CISPO: eps_clip 1.0)."""
EPS_HIGH = Range(0)
"""... and above at 1 + eps_high."""
DUAL_CLIP = Range(1)
"""The dual clip caps a negative advantage's loss at c |A|: c > 1 (at 1 it is the clip itself)."""
SAPO_TAU = Range(0)
"""SAPO's gate temperatures."""
NONNEGATIVE = ("ratio", "kl_k2", "kl_k3", "kl_k3_reverse", "binary_kl")
"""The statistics that are never below 0; only `kl_k1` (d itself) takes any sign."""
UPPER = Range(0)
"""A rule's upper bound on a statistic of `NONNEGATIVE` (`--bound` too): > 0, as at 0 it rejects all."""
LOWER = Range(0, low_open=False)
"""... and its lower bound: >= 0 (a ratio's 0 is no bound at all)."""


def _one_of(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ParameterError(key, f"{shown(value)} must be one of {', '.join(allowed)}")


@dataclass(frozen=True)
class Rule:
    """A rejection (`mask`) or truncation (`clamp`) of the behaviour weight: a token (or every token of a
    sequence) is inside when `lower <= statistic <= upper` (inclusive; None: unbounded). Outside, `mask`
    removes it from the loss; `clamp` clamps its behaviour weight to [lower, upper] (ratio only)."""

    level: Level = "token"
    statistic: Statistic = "ratio"
    agg: Agg = "mean"
    """how a sequence's tokens combine (sequence level): for `ratio` in log space (sum: the product of the
    token ratios, mean: their geometric mean, max/min: the largest/smallest token ratio), for the others
    arithmetically"""
    lower: float | None = None
    upper: float | None = None
    action: Action = "mask"

    def __post_init__(self) -> None:
        _one_of("level", self.level, ("token", "sequence"))
        _one_of("statistic", self.statistic, tuple(STATISTICS))
        _one_of("agg", self.agg, ("sum", "mean", "max", "min"))
        _one_of("action", self.action, ("mask", "clamp"))
        nonnegative = self.statistic in NONNEGATIVE
        for name, allowed in (("lower", LOWER), ("upper", UPPER)):
            if getattr(self, name) is not None:
                (allowed if nonnegative else FINITE).check(name, getattr(self, name))
        if self.statistic == "ratio" and self.lower == 0:
            object.__setattr__(self, "lower", None)  # a ratio is never below 0: no lower bound
        if self.lower is None and self.upper is None:
            raise ParameterError("upper", "a rule needs a lower or an upper bound (or both)")
        if self.lower is not None and self.upper is not None and not self.lower < self.upper:
            raise ParameterError("lower", f"{self.lower:g} must be below upper {self.upper:g}")
        if self.action == "clamp" and self.statistic != "ratio":
            why = f"clamp truncates the behaviour weight: it needs statistic ratio, not {self.statistic}"
            raise ParameterError("action", why)

    def describe(self) -> str:
        bounds = " and ".join(
            f"{'>=' if side == 'lower' else '<='} {value:g}"
            for side, value in (("lower", self.lower), ("upper", self.upper))
            if value is not None
        )
        agg = f" ({self.agg} over the sequence)" if self.level == "sequence" else ""
        verb = "keep" if self.action == "mask" else "clamp the weight to"
        return f"{self.level} {self.statistic}{agg}: {verb} {bounds}"


@dataclass(frozen=True)
class Loss:
    """The loss's parameters that the estimate of prox can reach (defaults: token-level PPO with clip 0.2
    and AReaL's examples' `rejection_sampling {level: token, action: mask, metric: ratio, upper: 5.0}`)."""

    policy: PolicyLoss = "ppo"
    ratio_level: Level = "token"
    """`sequence`: GSPO (AReaL `importance_sampling_level: sequence`)"""
    eps_low: float = 0.2
    """the ratio is clipped below at 1 - eps_low (CISPO: its weight is clamped there)"""
    eps_high: float = 0.2
    """... and above at 1 + eps_high"""
    dual_clip: float | None = None
    """c: for A < 0 the loss is capped at c |A| (PPO only; AReaL `c_clip`)"""
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    behave_weight: BehaveWeight = "token"
    """the behaviour weight that multiplies the loss: none (AReaL with `rejection_sampling` unset),
    exp(d) per token, or per sequence exp(sum d) or exp(mean d)"""
    rules: tuple[Rule, ...] = (Rule(upper=5.0),)
    name: str = field(default="", compare=False)
    """where it came from (a preset, a config file): shown, not compared"""

    def __post_init__(self) -> None:
        _one_of("policy", self.policy, ("ppo", "sapo", "cispo"))
        _one_of("ratio_level", self.ratio_level, ("token", "sequence"))
        _one_of("behave_weight", self.behave_weight, ("none", "token", "sequence_product", "sequence_mean"))
        for key, allowed in (
            ("eps_low", EPS_LOW[self.policy]),
            ("eps_high", EPS_HIGH),
            ("sapo_tau_pos", SAPO_TAU),
            ("sapo_tau_neg", SAPO_TAU),
        ):
            allowed.check(key, getattr(self, key))
        if self.dual_clip is not None:
            DUAL_CLIP.check("dual_clip", self.dual_clip)
            if self.policy != "ppo":
                raise ParameterError("dual_clip", f"the dual clip is PPO's: {self.policy} has none")
        if self.policy == "cispo" and self.ratio_level != "token":
            raise ParameterError("ratio_level", "CISPO is token-level")
        if self.behave_weight == "none" and any(r.action == "clamp" for r in self.rules):
            raise ParameterError(
                "behave_weight", "a clamp rule truncates the behaviour weight: behave_weight must not be none"
            )
        if not isinstance(self.rules, tuple) or not all(isinstance(r, Rule) for r in self.rules):
            raise ParameterError("rules", "must be a tuple of Rule")

    @property
    def has_clip(self) -> bool:
        """A clip decision exists (PPO's, or CISPO's clamp of its weight); SAPO has none."""
        return self.policy != "sapo"

    @property
    def has_dual_clip(self) -> bool:
        return self.dual_clip is not None

    @property
    def has_rules(self) -> bool:
        return bool(self.rules)

    @property
    def has_sequence_clip(self) -> bool:
        return self.ratio_level == "sequence" and self.has_clip

    @property
    def has_lower_bound(self) -> bool:
        return any(r.lower is not None for r in self.rules)

    @property
    def sequence_rules(self) -> bool:
        return any(r.level == "sequence" for r in self.rules)

    @property
    def needs_sequences(self) -> bool:
        """Some decision or weight of a token depends on the other tokens of its sequence."""
        sequence_weight = self.behave_weight.startswith("sequence")
        return self.ratio_level == "sequence" or sequence_weight or self.sequence_rules

    def to_dict(self) -> dict:
        """The description as plain values (JSON), `name` included."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> Loss:
        values = dict(values)
        values["rules"] = tuple(Rule(**r) for r in values.get("rules", ()))
        return cls(**values)

    def describe(self) -> str:
        """One line: the policy loss, its clip, the behaviour weight and its rules."""
        policy = {"ppo": "PPO", "sapo": "SAPO", "cispo": "CISPO"}[self.policy]
        if self.ratio_level == "sequence":
            policy = "GSPO" if self.policy == "ppo" else f"{policy} (sequence ratio)"
        if self.policy == "sapo":
            clip = f"tau {self.sapo_tau_pos:g}/{self.sapo_tau_neg:g}"
        else:
            clip = f"clip [{1 - self.eps_low:g}, {1 + self.eps_high:g}]"
        if self.dual_clip is not None:
            clip += f", dual clip {self.dual_clip:g}"
        weight = {
            "none": "no behaviour weight",
            "token": "behaviour weight per token",
            "sequence_product": "behaviour weight per sequence (product)",
            "sequence_mean": "behaviour weight per sequence (geometric mean)",
        }[self.behave_weight]
        rules = "; ".join(r.describe() for r in self.rules)
        return f"{policy}, {clip}, {weight}" + (f"; {rules}" if rules else "")


DEFAULT_LOSS = Loss(name="proxaudit default: token PPO, clip 0.2, behaviour weight masked above 5")
