"""verl's and NeMo-RL's configs as a `Loss`.

verl b178a3cd: `algorithm.rollout_correction` (`verl/trainer/config/algorithm.py` RolloutCorrectionConfig:
rollout_is token|sequence with rollout_is_threshold, the truncation; rollout_rs, a comma-separated list of
token_k1..k3 / seq_{sum,mean,max}_k1..k3 with rollout_rs_threshold; bypass_mode) and
`actor_rollout_ref.actor` (`verl/workers/config/actor.py`: clip_ratio, clip_ratio_low, clip_ratio_high,
clip_ratio_c, policy_loss.loss_mode, tau_pos, tau_neg), read as `verl/trainer/ppo/rollout_corr_helper.py`
and `core_algos.py` compute_policy_loss_vanilla use them (the dual clip is always on for A < 0; verl's k1
statistic is b - x, its k3 exp(x - b) - 1 - (x - b)).

NeMo-RL 7ea279a: `loss_fn` (`nemo_rl/algorithms/loss/loss_functions.py` ClippedPGLossConfig:
ratio_clip_min/max/c, use_importance_sampling_correction, truncated_importance_sampling_type tis|icepop|
seq-mask-tis with its ratio and ratio_min, sequence_level_importance_ratios, use_cispo,
force_on_policy_ratio).
"""

from __future__ import annotations

from evaluator.formulas.loss import Loss, Rule
from evaluator.lossconfig.keys import Reader
from evaluator.lossconfig.presets import VERL_DUAL_CLIP, verl_k1

VERL_MODES = {
    "vanilla": "ppo", "gspo": "ppo", "sapo": "sapo", "cispo": "cispo", "dppo_tv": "dppo_tv",
    "dppo_kl": "dppo_kl", "geo_mean": "gmpo", "dro": "pg",
}  # fmt: skip
"""verl's policy_loss.loss_mode values proxaudit models (verl 1dda039 core_algos.py) and their policy."""

VERL_RS = {
    "token_k1": ("token", "kl_k1", "mean"),
    "token_k2": ("token", "kl_k2", "mean"),
    "token_k3": ("token", "kl_k3_reverse", "mean"),
    **{
        f"seq_{agg}_{k}": ("sequence", stat, agg)
        for agg in ("sum", "mean", "max")
        for k, stat in (("k1", "kl_k1"), ("k2", "kl_k2"), ("k3", "kl_k3_reverse"))
        if (agg, k) != ("max", "k1")
    },
}


def _thresholds(spec: object, options: list[str], rc: Reader) -> list[str]:
    """verl's rollout_rs_threshold: one entry for every option, or one each."""
    entries = [e.strip() for e in str(spec).split(",")] if isinstance(spec, str) else [spec]
    if len(entries) not in (1, len(options)):
        raise rc.fail("rollout_rs_threshold", f"{spec!r}: give one threshold, or one per rollout_rs option")
    return entries * len(options) if len(entries) == 1 else entries


def _verl_rule(option: str, entry: object, rc: Reader) -> Rule:
    level, statistic, agg = VERL_RS[option]
    try:
        if statistic == "kl_k1":  # "low_high" ratio bounds on b - x, or one number U: [1/U, U]
            low, high = (
                (float(v) for v in str(entry).split("_"))
                if "_" in str(entry)
                else (1 / float(entry), float(entry))
            )
            return verl_k1(low, high, level, agg)
        return Rule(level, statistic, agg, upper=float(entry))
    except ValueError as error:
        raise rc.fail("rollout_rs_threshold", f"{entry!r} for {option}: {error}") from None


def verl_loss(config: dict, where: str) -> tuple[Loss, list[str], list[str], list[str]]:
    """(the loss, the keys used, the keys ignored, notes) of a verl trainer config."""
    algorithm = Reader(config.get("algorithm") or {}, f"{where} algorithm")
    rc = algorithm.table("rollout_correction") or Reader({}, f"{where} algorithm.rollout_correction")
    actor = Reader(
        ((config.get("actor_rollout_ref") or {}).get("actor")) or {}, f"{where} actor_rollout_ref.actor"
    )
    if rc.flag("bypass_mode"):
        raise rc.fail(
            "bypass_mode", "true: verl's bypass mode uses no proximal policy, there is nothing to audit"
        )
    clip = actor.number("clip_ratio", 0.2)
    keys: dict = {
        "eps_low": actor.number("clip_ratio_low", clip),
        "eps_high": actor.number("clip_ratio_high", clip),
    }
    policy_loss = actor.table("policy_loss") or Reader({}, where)
    mode = policy_loss.text("loss_mode", tuple(VERL_MODES), "vanilla")
    keys["policy"] = VERL_MODES[mode]
    keys["ratio_level"] = "sequence" if mode in ("gspo", "geo_mean") else "token"
    truncates = mode in ("vanilla", "dppo_tv", "dppo_kl")  # dual clip; DPPO's truncation of its ratio
    keys["dual_clip"] = actor.number("clip_ratio_c", VERL_DUAL_CLIP) if truncates else None
    if mode == "dro":
        beta = policy_loss.number("dro_beta")
        if beta is None or not beta > 0:
            raise policy_loss.fail("dro_beta", "verl's dro needs a positive dro_beta")
        keys["kl_penalty"] = beta / 2
    keys["sapo_tau_pos"], keys["sapo_tau_neg"] = actor.number("tau_pos", 1.0), actor.number("tau_neg", 1.05)
    level = rc.text("rollout_is", ("token", "sequence"))
    rules = []
    if level is None:
        keys["behave_weight"] = "none"
    else:
        keys["behave_weight"] = "token" if level == "token" else "sequence_product"
        agg = "mean" if level == "token" else "sum"
        rules.append(Rule(level, "ratio", agg, upper=rc.number("rollout_is_threshold", 2.0), action="clamp"))
    if rc.has("rollout_rs"):
        options = [o.strip() for o in str(rc._take("rollout_rs")).split(",") if o.strip()]
        unknown = [o for o in options if o not in VERL_RS]
        if unknown:
            raise rc.fail("rollout_rs", f"{unknown[0]!r} is not one of {', '.join(VERL_RS)}")
        if not rc.has("rollout_rs_threshold"):
            raise rc.fail("rollout_rs_threshold", "verl needs it when rollout_rs is set")
        entries = _thresholds(rc._take("rollout_rs_threshold"), options, rc)
        rules += [_verl_rule(o, e, rc) for o, e in zip(options, entries, strict=True)]
    try:
        loss = Loss(**keys, rules=tuple(rules), name=f"verl config {where}")
    except ValueError as error:
        raise actor.fail("policy_loss", str(error)) from None
    taken = {"rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold", "bypass_mode"}
    ignored = rc.ignored(taken) + actor.ignored(
        {
            "clip_ratio",
            "clip_ratio_low",
            "clip_ratio_high",
            "clip_ratio_c",
            "policy_loss",
            "tau_pos",
            "tau_neg",
        }
    )
    notes = ["verl removes rejected tokens from the loss's normaliser; W is per token, before normalisation"]
    return loss, rc.used + actor.used + policy_loss.used, ignored, notes


def nemo_rl_loss(config: dict, where: str) -> tuple[Loss, list[str], list[str], list[str]]:
    """(the loss, the keys used, the keys ignored, notes) of a NeMo-RL config's `loss_fn`."""
    fn = Reader(config["loss_fn"] or {}, f"{where} loss_fn")
    if fn.flag("force_on_policy_ratio"):
        raise fn.fail(
            "force_on_policy_ratio", "true: NeMo-RL replaces prox by theta, no estimate reaches the loss"
        )
    keys: dict = {"eps_low": fn.number("ratio_clip_min", 0.2), "eps_high": fn.number("ratio_clip_max", 0.2)}
    keys["dual_clip"] = fn.number("ratio_clip_c")
    keys["policy"] = "cispo" if fn.flag("use_cispo") else "ppo"
    keys["ratio_level"] = "sequence" if fn.flag("sequence_level_importance_ratios") else "token"
    corrected = fn.flag("use_importance_sampling_correction")
    kind = fn.text("truncated_importance_sampling_type", ("tis", "icepop", "seq-mask-tis"))
    upper = fn.number("truncated_importance_sampling_ratio")
    lower = fn.number("truncated_importance_sampling_ratio_min")
    rules: tuple[Rule, ...] = ()
    level, agg = ("sequence", "sum") if keys["ratio_level"] == "sequence" else ("token", "mean")
    if kind is not None and upper is None:
        raise fn.fail(
            "truncated_importance_sampling_ratio",
            f"NeMo-RL needs it with truncated_importance_sampling_type {kind}",
        )
    if kind in ("icepop", "seq-mask-tis") and lower is None:
        raise fn.fail("truncated_importance_sampling_ratio_min", f"NeMo-RL needs it with {kind}")
    if kind == "tis":  # under GSPO NeMo-RL truncates the sequence's weight
        rules = (Rule(level, "ratio", agg, lower=lower, upper=upper, action="clamp"),)
    elif kind == "icepop":
        rules = (Rule(level, "ratio", agg, lower=lower, upper=upper),)
    elif kind == "seq-mask-tis":
        rules = (Rule("sequence", "ratio", "mean", lower=lower, upper=upper),)
    corrected_rules = rules if corrected else ()
    threshold = _seq_logprob_error_threshold(config, where)
    if threshold is not None:  # a sample mask applied before the loss, whatever the correction
        corrected_rules = (*corrected_rules, Rule("sequence", "mult_prob_error", "mean", upper=threshold))
    weight = "token" if corrected else "none"
    if weight == "token" and keys["ratio_level"] == "sequence":
        weight = "sequence_product"  # NeMo-RL's GSPO weight: exp(sum of the sequence's d)
    try:
        loss = Loss(**keys, behave_weight=weight, rules=corrected_rules, name=f"NeMo-RL config {where}")
    except ValueError as error:
        raise fn.fail("loss_fn", str(error)) from None
    notes = (
        []
        if corrected or kind is None
        else ["use_importance_sampling_correction is false: the truncation is computed for metrics only"]
    )
    taken = {
        "ratio_clip_min",
        "ratio_clip_max",
        "ratio_clip_c",
        "use_cispo",
        "sequence_level_importance_ratios",
        "use_importance_sampling_correction",
        "truncated_importance_sampling_type",
        "truncated_importance_sampling_ratio",
        "truncated_importance_sampling_ratio_min",
        "force_on_policy_ratio",
    }
    return loss, fn.used, fn.ignored(taken), notes


def _seq_logprob_error_threshold(config: dict, where: str) -> float | None:
    """NeMo-RL 14f9f38's `grpo.seq_logprob_error_threshold` (or `ppo.`): a sequence whose mean
    exp(|generation_logprobs - prev_logprobs|) passes it is masked from the loss (grpo.py
    compute_and_apply_seq_logprob_error_masking)."""
    for section in ("grpo", "ppo"):
        if isinstance(config.get(section), dict):
            value = Reader(config[section], f"{where} {section}").number("seq_logprob_error_threshold")
            if value is not None:
                return value
    return None
