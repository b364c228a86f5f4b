"""The loss a trainer runs, as far as the proximal log-prob reaches it (DOMAIN.md 3c): a plain description,
recorded with the store, that `evaluator.formulas.gradients` turns into decisions and gradient weights.

A loss is a **policy loss** on the ratio `exp(theta - prox)` (PPO's clip, with a dual clip; SAPO's soft
gate; CISPO's clipped, stop-gradient weight; DPPO's mask on the probability change, binary TV or binary KL,
and IPO's symmetric one; GMPO's geometric mean of clipped token ratios; plain REINFORCE on the log-prob),
taken per token or per sequence (GSPO: the geometric mean of a sequence's token ratios), plus an optional
`(theta - prox)^2` penalty, times a **behaviour weight** built from `d = prox - behave` (none; each token's
`exp(d)`; the sequence's product `exp(sum d)` or geometric mean `exp(mean d)`), which **rules** then
reject (mask) or truncate (clamp) by a statistic of `d` per token or per sequence; two **screens** remove
tokens by the estimate too (AReaL's M2PO per minibatch, slime's OPSM per sequence). Every trainer's option
is one of these (`evaluator.lossconfig` reads them from the trainer's own config).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

PolicyLoss = Literal["ppo", "sapo", "cispo", "dppo_tv", "dppo_kl", "ipo", "gmpo", "pg"]
POLICIES: dict[str, str] = {
    "ppo": "PPO's clipped ratio (AReaL ppo_actor_loss_fn, verl vanilla)",
    "sapo": "SAPO's soft gate on the ratio",
    "cispo": "CISPO: the clipped ratio as a stop-gradient weight on log pi_theta",
    "dppo_tv": "DPPO-Binary-TV: mask by the sign of A on exp(t) - exp(x) (verl dppo_tv, prime-rl default)",
    "dppo_kl": "DPPO-Binary-KL: mask by the sign of A on the Bernoulli KL of exp(x), exp(t) (verl dppo_kl)",
    "ipo": "IPO: mask where |exp(t) - exp(x)| > eps_high, either sign (prime-rl ipo)",
    "gmpo": "GMPO: the geometric mean of sign-clipped token ratios per sequence (verl geo_mean)",
    "pg": "REINFORCE on log pi_theta, no ratio (verl dro, with its penalty)",
}
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
    "mult_prob_error": "exp(|d|) (NeMo-RL's multiplicative probability error)",
}
"""Each statistic of `d = x - b` (x the log pi_prox used, b `behave_logp`) a rule bounds."""


def _one_of(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key} must be one of {', '.join(allowed)}, not {value!r}")


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
        for name in ("lower", "upper"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"rule {name} must be a number or absent, got {value!r}")
            if value is not None and math.isnan(value):
                raise ValueError(f"rule {name} is NaN")
        if self.statistic == "ratio" and self.lower is not None and self.lower <= 0:
            object.__setattr__(self, "lower", None)  # a ratio is never below 0: no lower bound
        if self.lower is None and self.upper is None:
            raise ValueError("a rule needs a lower or an upper bound (or both)")
        if self.lower is not None and self.upper is not None and self.lower > self.upper:
            raise ValueError(f"rule lower {self.lower} > upper {self.upper}")
        if self.action == "clamp" and self.statistic != "ratio":
            raise ValueError(
                f"clamp truncates the behaviour weight: it needs statistic ratio, not {self.statistic!r}"
            )

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
    """c: PPO: for A < 0 the loss is capped at c |A| (AReaL `c_clip`); DPPO: the stop-gradient ratio is
    truncated at c, its log first clamped to [-20, 20] (verl `clip_ratio_c`)"""
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    behave_weight: BehaveWeight = "token"
    """the behaviour weight that multiplies the loss: none (AReaL with `rejection_sampling` unset),
    exp(d) per token, or per sequence exp(sum d) or exp(mean d)"""
    rules: tuple[Rule, ...] = (Rule(upper=5.0),)
    kl_penalty: float = 0.0
    """k of a `k (theta - x)^2` term on every kept token (prime-rl `kl_tau`; verl DRO `dro_beta / 2`)"""
    m2_threshold: float | None = None
    """AReaL M2PO: in each minibatch, drop the tokens of largest `(b - x)^2` until the mean of the rest is
    below it"""
    opsm_delta: float | None = None
    """slime OPSM: drop the tokens with A < 0 of a sequence whose mean `x - theta` passes delta"""
    name: str = field(default="", compare=False)
    """where it came from (a preset, a config file): shown, not compared"""

    def __post_init__(self) -> None:
        _one_of("policy", self.policy, tuple(POLICIES))
        _one_of("ratio_level", self.ratio_level, ("token", "sequence"))
        _one_of("behave_weight", self.behave_weight, ("none", "token", "sequence_product", "sequence_mean"))
        for key in ("eps_low", "eps_high", "sapo_tau_pos", "sapo_tau_neg", "kl_penalty"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
                raise ValueError(f"{key} must be a number, got {value!r}")
        for key in ("m2_threshold", "opsm_delta"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            ):
                raise ValueError(f"{key} must be a number > 0 (or absent), got {value!r}")
        if not (0 <= self.eps_low <= 1 and self.eps_high >= 0):
            raise ValueError(f"need 0 <= eps_low <= 1 and eps_high >= 0, got {self.eps_low}, {self.eps_high}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 (or absent), got {self.dual_clip}")
        if self.dual_clip is not None and self.policy not in ("ppo", "dppo_tv", "dppo_kl", "ipo"):
            raise ValueError(f"the dual clip is PPO's (DPPO's truncation): {self.policy} has none")
        if self.policy in ("cispo", "dppo_tv", "dppo_kl", "ipo", "pg") and self.ratio_level != "token":
            raise ValueError(f"{self.policy} is token-level")
        if self.policy == "gmpo" and self.ratio_level != "sequence":
            raise ValueError("gmpo is sequence-level (ratio_level sequence)")
        if self.kl_penalty < 0 or (
            self.kl_penalty and self.policy not in ("dppo_tv", "dppo_kl", "ipo", "pg")
        ):
            raise ValueError("kl_penalty must be >= 0, and 0 unless the policy is dppo_*, ipo or pg")
        if self.behave_weight == "none" and any(r.action == "clamp" for r in self.rules):
            raise ValueError("a clamp rule truncates the behaviour weight: behave_weight must not be none")
        if not (self.sapo_tau_pos > 0 and self.sapo_tau_neg > 0):
            raise ValueError("sapo_tau_pos and sapo_tau_neg must be > 0")
        if not isinstance(self.rules, tuple) or not all(isinstance(r, Rule) for r in self.rules):
            raise ValueError("rules must be a tuple of Rule")

    @property
    def has_clip(self) -> bool:
        """A clip decision exists (PPO's, CISPO's clamp of its weight, DPPO's and IPO's mask, GMPO's token
        clip); SAPO and REINFORCE have none."""
        return self.policy not in ("sapo", "pg")

    @property
    def has_dual_clip(self) -> bool:
        return self.dual_clip is not None

    @property
    def has_rules(self) -> bool:
        """Some decision removes or truncates tokens by the estimate: a rule, or a screen (M2PO, OPSM)."""
        return bool(self.rules) or self.m2_threshold is not None or self.opsm_delta is not None

    @property
    def has_sequence_clip(self) -> bool:
        return self.ratio_level == "sequence" and self.policy == "ppo"

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
        screens = self.m2_threshold is not None or self.opsm_delta is not None
        return self.ratio_level == "sequence" or sequence_weight or self.sequence_rules or screens

    def to_dict(self) -> dict:
        """The description as plain values (JSON), `name` included."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> Loss:
        """The loss of `to_dict` (a store written before a key existed gets its default)."""
        values = dict(values)
        values["rules"] = tuple(Rule(**r) for r in values.get("rules", ()))
        return cls(**values)

    def describe(self) -> str:
        """One line: the policy loss, its clip, the behaviour weight and its rules."""
        policy = {
            "ppo": "PPO", "sapo": "SAPO", "cispo": "CISPO", "dppo_tv": "DPPO-Binary-TV",
            "dppo_kl": "DPPO-Binary-KL", "ipo": "IPO", "gmpo": "GMPO", "pg": "REINFORCE",
        }[self.policy]  # fmt: skip
        if self.ratio_level == "sequence" and self.policy in ("ppo", "sapo"):
            policy = "GSPO" if self.policy == "ppo" else f"{policy} (sequence ratio)"
        if self.policy == "sapo":
            clip = f"tau {self.sapo_tau_pos:g}/{self.sapo_tau_neg:g}"
        elif self.policy in ("dppo_tv", "dppo_kl"):
            clip = f"mask -{self.eps_low:g}/+{self.eps_high:g}"
        elif self.policy == "ipo":
            clip = f"mask |change| > {self.eps_high:g}"
        elif self.policy == "pg":
            clip = "no clip"
        else:
            clip = f"clip [{1 - self.eps_low:g}, {1 + self.eps_high:g}]"
        if self.dual_clip is not None:
            clip += f", {'dual clip' if self.policy == 'ppo' else 'ratio truncated at'} {self.dual_clip:g}"
        if self.kl_penalty:
            clip += f", penalty {self.kl_penalty:g} (theta - prox)^2"
        if self.m2_threshold is not None:
            clip += f", M2PO {self.m2_threshold:g}"
        if self.opsm_delta is not None:
            clip += f", OPSM {self.opsm_delta:g}"
        weight = {
            "none": "no behaviour weight",
            "token": "behaviour weight per token",
            "sequence_product": "behaviour weight per sequence (product)",
            "sequence_mean": "behaviour weight per sequence (geometric mean)",
        }[self.behave_weight]
        rules = "; ".join(r.describe() for r in self.rules)
        return f"{policy}, {clip}, {weight}" + (f"; {rules}" if rules else "")


DEFAULT_LOSS = Loss(name="proxaudit default: token PPO, clip 0.2, behaviour weight masked above 5")
