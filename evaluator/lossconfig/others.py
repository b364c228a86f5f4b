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
"""

from __future__ import annotations

from evaluator.formulas.loss import Loss, Rule
from evaluator.lossconfig.keys import Reader

TRL_KEYS = (
    "loss_type", "epsilon", "epsilon_high", "delta", "importance_sampling_level", "sapo_temperature_pos",
    "sapo_temperature_neg", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap",
)  # fmt: skip
TRL_PPO = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
TRL_NOT_PROX = ("beta", "off_policy_mask_threshold", "use_bias_correction_kl")
"""TRL keys whose terms compare theta with the sampling or reference log-probs: no estimate reaches them."""
Read = tuple[Loss, list[str], list[str], list[str]]


def prime_rl_loss(config: dict, where: str) -> Read:
    """(the loss, the keys used, the keys ignored, notes) of a prime-rl trainer or rl config."""
    table = config.get("loss") if isinstance(config.get("loss"), dict) else config["trainer"]["loss"]
    loss = Reader(table, f"{where} loss")
    kind = loss.text("type", ("default", "ipo", "custom"), "default")
    if kind == "custom":
        raise loss.fail("type", "'custom' imports a loss proxaudit cannot read: describe it in a TOML file")
    adv_tau, kl_tau = loss.number("adv_tau", 1.0), loss.number("kl_tau", 1e-3)
    if not adv_tau > 0:
        raise loss.fail("adv_tau", "must be > 0 (proxaudit scales W by it)")
    if kind == "ipo":
        threshold = loss.number("ipo_threshold", 0.1)
        keys = {"policy": "ipo", "eps_low": threshold, "eps_high": threshold}
    else:
        keys = {"policy": "dppo_tv", "eps_low": loss.number("dppo_mask_low", 0.2)}
        keys["eps_high"] = loss.number("dppo_mask_high", 0.2)
    try:  # W = adv_tau |A r valid - 2 (kl_tau / adv_tau) (t - x)|: a constant factor leaves every ratio as is
        out = Loss(
            **keys, kl_penalty=kl_tau / adv_tau, behave_weight="none", rules=(), name=f"prime-rl {where}"
        )
    except ValueError as error:
        raise loss.fail("loss", str(error)) from None
    notes = ["prime-rl's ratio and mask are on the inference log-probs: its estimate of prox is `rollout`"]
    taken = {"type", "adv_tau", "kl_tau", "ipo_threshold", "dppo_mask_low", "dppo_mask_high"}
    return out, loss.used, loss.ignored(taken), notes


def trl_loss(config: dict, where: str) -> Read:
    """(the loss, the keys used, the keys ignored, notes) of a TRL GRPOConfig YAML."""
    r = Reader(config, where)
    kind = r.text("loss_type", (*TRL_PPO, "cispo", "sapo"), "dapo")
    eps = r.number("epsilon", 0.2)
    keys: dict = {"eps_low": eps, "eps_high": r.number("epsilon_high", eps)}
    keys["ratio_level"] = r.text("importance_sampling_level", ("token", "sequence"), "token")
    if kind == "cispo":  # TRL clamps the ratio above at epsilon_high itself, never below
        keys |= {"policy": "cispo", "eps_low": 1.0, "eps_high": keys["eps_high"] - 1}
    elif kind == "sapo":
        keys |= {"policy": "sapo", "sapo_tau_pos": r.number("sapo_temperature_pos", 1.0)}
        keys["sapo_tau_neg"] = r.number("sapo_temperature_neg", 1.05)
    else:
        keys["dual_clip"] = r.number("delta")  # A < 0 tokens whose ratio passes delta get no gradient
    keys["behave_weight"], keys["rules"] = "none", ()
    if r.flag("vllm_importance_sampling_correction", True):
        mode = r.text(
            "vllm_importance_sampling_mode",
            ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
            "sequence_mask",
        )
        upper = r.number("vllm_importance_sampling_clip_max", r.number("vllm_importance_sampling_cap", 3.0))
        lower = r.number("vllm_importance_sampling_clip_min")
        level, action = mode.split("_")
        keys["behave_weight"] = "token" if level == "token" else "sequence_product"
        agg, clamp = ("sum" if level == "sequence" else "mean"), action == "truncate"
        rule = Rule(level, "ratio", agg, lower=lower, upper=upper, action="clamp" if clamp else "mask")
        keys["rules"] = (rule,)
    try:
        loss = Loss(**keys, name=f"TRL GRPOConfig {where}")
    except ValueError as error:
        raise r.fail("loss_type", str(error)) from None
    notes = [
        "TRL applies the vLLM importance sampling weight only when it generates with vLLM (use_vllm)",
        *(f"{k}: compares theta with the sampling or reference log-probs, no estimate reaches it"
          for k in TRL_NOT_PROX if r.has(k)),
    ]  # fmt: skip
    return loss, r.used, r.ignored({*TRL_KEYS, *TRL_NOT_PROX}), notes
