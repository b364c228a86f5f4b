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

Every parameter's range is here (`EPS_LOW`, `EPS_HIGH`, ...): the constructors raise a `ParameterError`
naming the field, which each entry path renames to the user's flag or config key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from evaluator.errors import ParameterError
from evaluator.inputs import FINITE, Range, shown

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
Statistic = Literal["ratio", "kl_k1", "kl_k2", "kl_k3", "kl_k3_reverse", "binary_kl", "mult_prob_error"]
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


AT_LEAST_ZERO = Range(0, low_open=False)
EPS_LOW: dict[str, Range] = {
    "ppo": Range(0, 1),
    "sapo": Range(0, 1),
    "cispo": Range(0, 1, high_open=False),
    "dppo_tv": AT_LEAST_ZERO,
    "dppo_kl": AT_LEAST_ZERO,
    "ipo": AT_LEAST_ZERO,
    "gmpo": Range(0),
    "pg": FINITE,
}
"""The ratio is clipped below at 1 - eps_low: PPO's clip needs 0 < eps_low < 1 (at 1 nothing is clipped
below); CISPO's weight may be clamped at 0 (AReaL's CISPO: eps_clip 1.0). DPPO's and IPO's bound a
probability change or a binary KL: >= 0 (prime-rl's DefaultLossConfig, IPOLossConfig: ge=0). GMPO's clips
a log-ratio: > 0. REINFORCE has no clip: any finite number, unused. `--eps-low` takes AT_LEAST_ZERO before
the policy is known."""
EPS_HIGH: dict[str, Range] = {
    **dict.fromkeys(("ppo", "sapo", "cispo", "gmpo"), Range(0)),
    **dict.fromkeys(("dppo_tv", "dppo_kl", "ipo"), AT_LEAST_ZERO),
    "pg": FINITE,
}
"""... and above at 1 + eps_high: > 0 (DPPO's and IPO's bounds >= 0, REINFORCE's unused)."""
M2PO_EPS = (Range(0, 1, low_open=False), AT_LEAST_ZERO)
"""PPO's (eps_low, eps_high) under M2PO, 0 allowed. AReaL's own M2PO example (cbff54d
`examples/math/gsm8k_m2po.yaml`) sets `eps_clip: 0.0`, which AReaL takes as it is (cli_args.py checks no
range): ppo_actor_loss_fn clamps the ratio to [1, 1], so a token keeps its gradient only while its ratio is
on the side against its advantage. With that example's one minibatch per step and prox recomputed, theta
is prox and nothing is clipped: M2PO's mask is the trust region; with an estimate of prox, the clip bites."""
DUAL_CLIP = Range(1)
"""The dual clip caps a negative advantage's loss at c |A|: c > 1 (at 1 it is the clip itself); DPPO's
truncation of its ratio at c likewise."""
DUAL_CLIPPED = ("ppo", "dppo_tv", "dppo_kl", "ipo")
"""The policies with a dual clip (PPO's) or a truncation of their ratio (DPPO's, IPO's)."""
SAPO_TAU = Range(0)
"""SAPO's gate temperatures."""
KL_PENALTY = Range(0, low_open=False)
PENALISED = ("dppo_tv", "dppo_kl", "ipo", "pg")
"""k of the `k (theta - prox)^2` term: >= 0, and nonzero only for the losses that have one (prime-rl's
kl_tau, verl DRO's dro_beta / 2)."""
TOKEN_LEVEL = ("cispo", "dppo_tv", "dppo_kl", "ipo", "pg")
"""The policies whose ratio is per token only (GMPO's is per sequence only)."""
SCREEN = Range(0)
"""M2PO's threshold on the mean (b - x)^2 and OPSM's delta on a sequence's mean x - theta: > 0 or absent."""
NONNEGATIVE = ("ratio", "kl_k2", "kl_k3", "kl_k3_reverse", "binary_kl")
"""The statistics that are never below 0; only `kl_k1` (d itself) takes any sign."""
UPPER = Range(0)
"""A rule's upper bound on a statistic of `NONNEGATIVE` (`--bound` too): > 0, as at 0 it rejects all."""
LOWER = Range(0, low_open=False)
"""... and its lower bound: >= 0 (a ratio's 0 is no bound at all)."""
AT_LEAST_ONE = (Range(1, low_open=False), Range(1))
"""The bounds on `mult_prob_error`, exp(|d|) >= 1: lower >= 1, upper > 1 (at 1 it rejects any error)."""


def eps_ranges(policy: str, m2po: bool = False) -> tuple[Range, Range]:
    """The ranges of (eps_low, eps_high) under `policy` (`m2po`: with M2PO's mask, `M2PO_EPS`)."""
    return M2PO_EPS if m2po and policy == "ppo" else (EPS_LOW[policy], EPS_HIGH[policy])


def _bounds(statistic: str) -> tuple[Range, Range]:
    """The ranges of a rule's (lower, upper) on `statistic`."""
    if statistic == "mult_prob_error":
        return AT_LEAST_ONE
    return (LOWER, UPPER) if statistic in NONNEGATIVE else (FINITE, FINITE)


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
        for name, allowed in zip(("lower", "upper"), _bounds(self.statistic), strict=True):
            if getattr(self, name) is not None:
                allowed.check(name, getattr(self, name))
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
        for key in ("m2_threshold", "opsm_delta"):
            if getattr(self, key) is not None:
                SCREEN.check(key, getattr(self, key))
        eps_low, eps_high = eps_ranges(self.policy, m2po=self.m2_threshold is not None)
        for key, allowed in (
            ("eps_low", eps_low),
            ("eps_high", eps_high),
            ("sapo_tau_pos", SAPO_TAU),
            ("sapo_tau_neg", SAPO_TAU),
            ("kl_penalty", KL_PENALTY),
        ):
            allowed.check(key, getattr(self, key))
        if self.kl_penalty and self.policy not in PENALISED:
            why = f"{self.policy} has no (theta - prox)^2 term: 0 unless the policy is {', '.join(PENALISED)}"
            raise ParameterError("kl_penalty", why)
        if self.dual_clip is not None:
            DUAL_CLIP.check("dual_clip", self.dual_clip)
            if self.policy not in DUAL_CLIPPED:
                why = f"the dual clip is PPO's (DPPO's truncation of its ratio): {self.policy} has none"
                raise ParameterError("dual_clip", why)
        if self.policy in TOKEN_LEVEL and self.ratio_level != "token":
            raise ParameterError("ratio_level", f"{self.policy} is token-level")
        if self.policy == "gmpo" and self.ratio_level != "sequence":
            raise ParameterError("ratio_level", "gmpo is sequence-level (ratio_level sequence)")
        if self.behave_weight == "none" and any(r.action == "clamp" for r in self.rules):
            raise ParameterError(
                "behave_weight", "a clamp rule truncates the behaviour weight: behave_weight must not be none"
            )
        if not isinstance(self.rules, tuple) or not all(isinstance(r, Rule) for r in self.rules):
            raise ParameterError("rules", "must be a tuple of Rule")

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
