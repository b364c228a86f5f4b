"""prime-rl's and TRL's configs as a `Loss`.

prime-rl 559b447: the trainer config's `[loss]` table (or `[trainer.loss]` of an rl config; TOML),
`packages/prime-rl-configs/src/prime_rl/configs/trainer.py` DefaultLossConfig (dppo_mask_low/high 0.2,
adv_tau 1, kl_tau 1e-3) and IPOLossConfig (ipo_threshold 0.1), read as `src/prime_rl/trainer/rl/loss.py`
default_loss_fn and ipo_loss_fn use them. prime-rl's ratio and mask are on its inference log-probs, so the
estimate a prime-rl run uses is `rollout` (behave_logp); the loss is what prox would enter.

TRL f2cd577: GRPOConfig's keys at the top level of a YAML (`trl/trainer/grpo_config.py`: loss_type,
epsilon, epsilon_high, delta, importance_sampling_level, sapo_temperature_pos/neg, the
vllm_importance_sampling_* keys), read as `grpo_trainer.py` _compute_loss uses them: the vLLM importance
sampling weight exp(old - sampling) per token or per sequence product, truncated or masked to
[clip_min, clip_max] (on by default; it applies when TRL generates with vLLM).

Every key of the tables read must be the trainer's own (`known`: prime-rl's loss configs; every field of
the dataclasses `trl grpo` parses, TrainingArguments' included); a number must be in the range its loss
parameter allows (`evaluator.formulas.loss`), renamed to the trainer's key.
"""

from __future__ import annotations

from evaluator.errors import ParameterError, UsageError
from evaluator.formulas.loss import DUAL_CLIP, KL_PENALTY, SAPO_TAU, UPPER, Loss, Rule, eps_ranges
from evaluator.inputs import Range, shown
from evaluator.lossconfig.keys import Reader
from evaluator.lossconfig.known import check_known, trainer_keys

ADV_TAU = Range(0)
"""prime-rl's adv_tau: > 0, as the penalty proxaudit models is kl_tau / adv_tau (prime-rl allows 0: the KL
term alone, with no policy gradient)."""
PRIME_RL_FIELDS = {"kl_penalty": "kl_tau", "eps_low": "dppo_mask_low", "eps_high": "dppo_mask_high"}
"""The key of the loss table behind each field of the loss, for a rule between keys the loss refuses."""
TRL_KEYS = (
    "loss_type", "epsilon", "epsilon_high", "delta", "importance_sampling_level", "sapo_temperature_pos",
    "sapo_temperature_neg", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap",
)  # fmt: skip
TRL_PPO = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
TRL_NOT_PROX = {
    key: "compares theta with the sampling or reference log-probs, no estimate reaches it"
    for key in ("beta", "off_policy_mask_threshold", "use_bias_correction_kl")
}
"""TRL keys whose terms no estimate of prox reaches: listed as ignored with the reason."""
TRL_EXTRA = ("max_staleness",)
"""Known beside GRPOConfig's: the maximum off-policyness of TRL's AsyncGRPOConfig
(`trl/experimental/async_grpo/async_grpo_config.py` at f2cd577)."""
TRL_FIELDS = {
    "eps_low": "epsilon",
    "eps_high": "epsilon_high",
    "dual_clip": "delta",
    "ratio_level": "importance_sampling_level",
    "sapo_tau_pos": "sapo_temperature_pos",
    "sapo_tau_neg": "sapo_temperature_neg",
    "lower": "vllm_importance_sampling_clip_min",
    "upper": "vllm_importance_sampling_clip_max",
}
"""The GRPOConfig key behind each field of the loss and of its rule."""
CISPO_CLAMP = Range(1)
"""TRL's cispo clamps the ratio at epsilon_high itself, 1 + eps_high: > 1 (CISPO's eps_high > 0)."""
Read = tuple[Loss, list[str], list[str], list[str]]


def prime_rl_loss(config: dict, file: str) -> Read:
    """(the loss, the keys used, the keys ignored, notes) of a prime-rl trainer config (`[loss]`) or rl
    config (`[trainer.loss]`; without it, prime-rl's default loss, `DefaultLossConfig`)."""
    check_known(config, trainer_keys("prime_rl"), file)
    top, trainer = config.get("loss"), config.get("trainer")
    section = "loss" if top is not None or not isinstance(trainer, dict) else "trainer.loss"
    table = top if section == "loss" else trainer.get("loss")
    if table is not None and not isinstance(table, dict):
        raise UsageError(f"{file}: {section}: {shown(table)} must be a table of keys")
    loss = Reader(table or {}, file, section)
    kind = loss.text("type", ("default", "ipo", "custom"), "default")
    if kind == "custom":
        raise loss.fail("type", "'custom' imports a loss proxaudit cannot read: describe it in a TOML file")
    adv_tau, kl_tau = loss.number("adv_tau", 1.0, ADV_TAU), loss.number("kl_tau", 1e-3, KL_PENALTY)
    if kind == "ipo":
        threshold = loss.number("ipo_threshold", 0.1, eps_ranges("ipo")[1])
        keys = {"policy": "ipo", "eps_low": threshold, "eps_high": threshold}
    else:
        low, high = eps_ranges("dppo_tv")
        keys = {"policy": "dppo_tv", "eps_low": loss.number("dppo_mask_low", 0.2, low)}
        keys["eps_high"] = loss.number("dppo_mask_high", 0.2, high)
    try:  # W = adv_tau |A r valid - 2 (kl_tau / adv_tau) (t - x)|: a constant factor leaves every ratio as is
        out = Loss(
            **keys, kl_penalty=kl_tau / adv_tau, behave_weight="none", rules=(), name=f"prime-rl {file}"
        )
    except ParameterError as error:
        raise loss.fail(PRIME_RL_FIELDS.get(error.key, error.key), error.why) from None
    notes = ["prime-rl's ratio and mask are on the inference log-probs: its estimate of prox is `rollout`"]
    if table is None:
        notes.append(
            "no [trainer.loss]: prime-rl's default loss (DefaultLossConfig); a loss set elsewhere (another "
            "@ config, a --trainer.loss.* flag) is not seen here"
        )
    return out, loss.used, loss.ignored(), notes


def trl_loss(config: dict, file: str) -> Read:
    """(the loss, the keys used, the keys ignored, notes) of a TRL GRPOConfig YAML."""
    check_known(config, trainer_keys("trl"), file, extra={"": TRL_EXTRA})
    r = Reader(config, file)
    kind = r.text("loss_type", (*TRL_PPO, "cispo", "sapo"), "dapo")
    if kind == "cispo":  # TRL clamps the ratio above at epsilon_high (else epsilon) itself, never below
        clamp = r.number("epsilon_high" if r.has("epsilon_high") else "epsilon", None, CISPO_CLAMP)
        if clamp is None:
            raise r.fail("epsilon_high", "TRL's cispo clamps the ratio at it (else at epsilon, 0.2): give it")
        keys: dict = {"policy": "cispo", "eps_low": 1.0, "eps_high": clamp - 1}
    else:
        low, high = eps_ranges(kind if kind == "sapo" else "ppo")
        eps = r.number("epsilon", 0.2, low)
        keys = {"policy": kind if kind == "sapo" else "ppo", "eps_low": eps}
        keys["eps_high"] = r.number("epsilon_high", eps, high)
    keys["ratio_level"] = r.text("importance_sampling_level", ("token", "sequence"), "token")
    if kind == "sapo":
        keys["sapo_tau_pos"] = r.number("sapo_temperature_pos", 1.0, SAPO_TAU)
        keys["sapo_tau_neg"] = r.number("sapo_temperature_neg", 1.05, SAPO_TAU)
    elif kind != "cispo":  # A < 0 tokens whose ratio passes delta get no gradient
        keys["dual_clip"] = r.number("delta", None, DUAL_CLIP)
    keys["behave_weight"], keys["rules"] = "none", ()
    if r.flag("vllm_importance_sampling_correction", True):
        mode = r.text(
            "vllm_importance_sampling_mode",
            ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
            "sequence_mask",
        )
        cap = r.number("vllm_importance_sampling_cap", 3.0, UPPER)
        upper = r.number("vllm_importance_sampling_clip_max", cap, UPPER)
        lower = r.number("vllm_importance_sampling_clip_min")
        level, action = mode.split("_")
        keys["behave_weight"] = "token" if level == "token" else "sequence_product"
        agg, clamp = ("sum" if level == "sequence" else "mean"), action == "truncate"
        try:
            rule = Rule(level, "ratio", agg, lower=lower, upper=upper, action="clamp" if clamp else "mask")
        except ParameterError as error:
            raise r.fail(TRL_FIELDS.get(error.key, error.key), error.why) from None
        keys["rules"] = (rule,)
    try:
        loss = Loss(**keys, name=f"TRL GRPOConfig {file}")
    except ParameterError as error:
        raise r.fail(TRL_FIELDS.get(error.key, error.key), error.why) from None
    notes = ["TRL applies the vLLM importance sampling weight only when it generates with vLLM (use_vllm)"]
    return loss, r.used, r.ignored(TRL_NOT_PROX), notes
