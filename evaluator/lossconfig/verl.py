"""verl's and NeMo-RL's configs as a `Loss`.

verl b178a3cd: `algorithm.rollout_correction` (`verl/trainer/config/algorithm.py` RolloutCorrectionConfig:
rollout_is token|sequence with rollout_is_threshold, the truncation; rollout_rs, a comma-separated list of
token_k1..k3 / seq_{sum,mean,max}_k1..k3 with rollout_rs_threshold; bypass_mode) and
`actor_rollout_ref.actor` (`verl/workers/config/actor.py`: clip_ratio, clip_ratio_low, clip_ratio_high,
clip_ratio_c, policy_loss.loss_mode, tau_pos, tau_neg), read as `verl/trainer/ppo/rollout_corr_helper.py`
and `core_algos.py` compute_policy_loss_vanilla use them (the dual clip is always on for A < 0; verl's k1
statistic is b - x, its k3 exp(x - b) - 1 - (x - b)). The loss modes verl added since (`VERL_MODES`,
verl-project/verl, read at 1dda039): dppo_tv and dppo_kl (182383b; clip_ratio_low/high are their
thresholds, clip_ratio_c the truncation of their ratio) and dro with `policy_loss.dro_beta` (ddfbf4e).

NeMo-RL 7ea279a: `loss_fn` (`nemo_rl/algorithms/loss/loss_functions.py` ClippedPGLossConfig:
ratio_clip_min/max/c, use_importance_sampling_correction, truncated_importance_sampling_type tis|icepop|
seq-mask-tis with its ratio and ratio_min, sequence_level_importance_ratios, use_cispo,
force_on_policy_ratio), and `grpo.seq_logprob_error_threshold` (or `ppo.`; `nemo_rl/algorithms/grpo.py`
GRPOConfig since 14f9f38, a sequence mask applied before the loss).

Every key of the sections read (`actor_rollout_ref.actor` and `algorithm.rollout_correction` of verl, the
keys of `actor_rollout_ref` and `algorithm` themselves, NeMo-RL's `loss_fn`, `grpo` and `ppo`) must be one
of the trainer's own (`known`); a number must be in the range its loss parameter allows, as the trainer
itself requires (verl's thresholds > 0, `_parse_rollout_rs_thresholds`).
"""

from __future__ import annotations

from evaluator.errors import ParameterError
from evaluator.formulas.loss import DUAL_CLIP, SAPO_TAU, Loss, Rule, eps_ranges
from evaluator.inputs import Range, finite
from evaluator.lossconfig.keys import Reader
from evaluator.lossconfig.known import check_known, trainer_keys
from evaluator.lossconfig.presets import VERL_DUAL_CLIP, verl_k1

VERL_MODES = {
    "vanilla": "ppo", "gspo": "ppo", "sapo": "sapo", "cispo": "cispo", "geo_mean": "gmpo",
    "dppo_tv": "dppo_tv", "dppo_kl": "dppo_kl", "dro": "pg",
}  # fmt: skip
"""verl's policy_loss.loss_mode values proxaudit models, and the policy of each: vanilla, gspo, sapo, cispo
and geo_mean are registered at the commit its known keys were read at (b178a3c, `core_algos.py`
register_policy_loss); dppo_tv and dppo_kl since 182383b, dro since ddfbf4e (verl-project/verl)."""
VERL_EXTRA_KEYS = {"actor_rollout_ref.actor.policy_loss": ("dro_beta",)}
"""Keys verl added after b178a3c, known beside `trainer_keys/verl.json`'s: dro_beta (ddfbf4e, for dro)."""
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
POSITIVE = Range(0)
"""verl's thresholds, and NeMo-RL's truncation ratio: > 0."""
VERL_FIELDS = {
    "eps_low": "clip_ratio_low",
    "eps_high": "clip_ratio_high",
    "dual_clip": "clip_ratio_c",
    "policy": "policy_loss.loss_mode",
    "ratio_level": "policy_loss.loss_mode",
    "kl_penalty": "policy_loss.dro_beta",
}
"""The key of the actor behind each field of the loss, for a rule between keys the loss refuses."""
VERL_NOT_MODELLED = {
    "rollout_is_batch_normalize": "not modelled: verl rescales the IS weights to mean 1 over the batch, "
    "W is the weight before that",
}


def _thresholds(spec: object, options: list[str], rc: Reader) -> list[str]:
    """verl's rollout_rs_threshold: one entry for every option, or one each."""
    entries = [e.strip() for e in spec.split(",") if e.strip()] if isinstance(spec, str) else [str(spec)]
    if len(entries) not in (1, len(options)):
        raise rc.fail("rollout_rs_threshold", "give one threshold, or one per rollout_rs option")
    return entries * len(options) if len(entries) == 1 else entries


def _verl_rule(option: str, entry: str, rc: Reader) -> Rule:
    """The rule of one rollout_rs option and its threshold entry: a k1 option keeps b - x within
    [log low, log high] ("low_high", or one number U: [1/U, U]), the others their statistic <= U."""
    level, statistic, agg = VERL_RS[option]
    try:
        parts = entry.split("_") if statistic == "kl_k1" else [entry]
        if len(parts) > 2 or (statistic != "kl_k1" and "_" in entry):
            raise ParameterError(option, "a k1 option takes low_high or one number, the others one number")
        values = [POSITIVE.check(option, _number(p)) for p in parts]
        if statistic != "kl_k1":
            return Rule(level, statistic, agg, upper=values[0])
        low, high = values if len(values) == 2 else (finite(option, 1 / values[0]), values[0])
        if not low < high:  # verl keeps log(low) <= b - x <= log(high): nothing when low >= high
            raise ParameterError(option, f"keeps ratios in [{low:g}, {high:g}], which holds none")
        return verl_k1(low, high, level, agg)
    except ParameterError as error:
        raise rc.fail("rollout_rs_threshold", f"{entry!r} for {option}: {error.why}") from None


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _section(parent: Reader, key: str) -> Reader:
    """The mapping `key` of `parent` (absent or null: empty); anything else is a usage error naming it."""
    return parent.table(key) or Reader({}, parent.file, parent.path(key))


def verl_loss(config: dict, file: str) -> tuple[Loss, list[str], list[str], list[str]]:
    """(the loss, the keys used, the keys ignored, notes) of a verl trainer config."""
    check_known(config, trainer_keys("verl"), file, extra=VERL_EXTRA_KEYS)
    top = Reader(config, file)
    rc = _section(_section(top, "algorithm"), "rollout_correction")
    actor = _section(_section(top, "actor_rollout_ref"), "actor")
    if rc.flag("bypass_mode"):
        raise rc.fail(
            "bypass_mode", "true: verl's bypass mode uses no proximal policy, there is nothing to audit"
        )
    losses = _section(actor, "policy_loss")
    mode = losses.text("loss_mode", tuple(VERL_MODES), "vanilla")
    policy = VERL_MODES[mode]
    eps_low, eps_high = eps_ranges(policy)
    clip = actor.number("clip_ratio", 0.2, eps_low)
    keys: dict = {
        "policy": policy,
        "eps_low": actor.number("clip_ratio_low", clip, eps_low),
        "eps_high": actor.number("clip_ratio_high", clip, eps_high),
        "ratio_level": "sequence" if mode in ("gspo", "geo_mean") else "token",
    }
    truncates = mode in ("vanilla", "dppo_tv", "dppo_kl")  # PPO's dual clip; DPPO's truncation of its ratio
    keys["dual_clip"] = actor.number("clip_ratio_c", VERL_DUAL_CLIP, DUAL_CLIP) if truncates else None
    if mode == "dro":  # core_algos.py compute_policy_loss_dro: - (A log pi - beta / 2 (t - x)^2)
        if not losses.has("dro_beta"):
            raise losses.fail("dro_beta", "verl's dro needs it: a number > 0")
        keys["kl_penalty"] = losses.number("dro_beta", None, POSITIVE) / 2
    actor.used += losses.used
    keys["sapo_tau_pos"] = actor.number("tau_pos", 1.0, SAPO_TAU)
    keys["sapo_tau_neg"] = actor.number("tau_neg", 1.05, SAPO_TAU)
    level = rc.text("rollout_is", ("token", "sequence"))
    rules = []
    if level is None:
        keys["behave_weight"] = "none"
    else:
        keys["behave_weight"] = "token" if level == "token" else "sequence_product"
        agg = "mean" if level == "token" else "sum"
        upper = rc.number("rollout_is_threshold", 2.0, POSITIVE)
        rules.append(Rule(level, "ratio", agg, upper=upper, action="clamp"))
    if rc.has("rollout_rs"):
        spec = rc.value("rollout_rs", (str,), f"a comma-separated list of {', '.join(VERL_RS)}")
        options = [o.strip() for o in spec.split(",") if o.strip()]
        unknown = [o for o in options if o not in VERL_RS]
        if unknown:
            raise rc.fail("rollout_rs", f"{unknown[0]!r} is not one of {', '.join(VERL_RS)}")
        if not rc.has("rollout_rs_threshold"):
            raise rc.fail("rollout_rs_threshold", "verl needs it when rollout_rs is set")
        threshold = rc.value("rollout_rs_threshold", (str, int, float), "a number or a string of thresholds")
        entries = _thresholds(threshold, options, rc)
        rules += [_verl_rule(o, e, rc) for o, e in zip(options, entries, strict=True)]
    try:
        loss = Loss(**keys, rules=tuple(rules), name=f"verl config {file}")
    except ParameterError as error:
        raise actor.fail(VERL_FIELDS.get(error.key, error.key), error.why) from None
    ignored = rc.ignored(VERL_NOT_MODELLED) + actor.ignored()
    notes = ["verl removes rejected tokens from the loss's normaliser; W is per token, before normalisation"]
    return loss, rc.used + actor.used, ignored, notes


NEMO_RL_FIELDS = {
    "eps_low": "ratio_clip_min",
    "eps_high": "ratio_clip_max",
    "dual_clip": "ratio_clip_c",
    "ratio_level": "sequence_level_importance_ratios",
}
NEMO_RL_NOT_MODELLED = {
    "disable_ppo_ratio": "not modelled: REINFORCE/RLOO without the ratio, where the figures assume "
    "the clipped ratio",
}


def nemo_rl_loss(config: dict, file: str) -> tuple[Loss, list[str], list[str], list[str]]:
    """(the loss, the keys used, the keys ignored, notes) of a NeMo-RL config's `loss_fn`."""
    check_known(config, trainer_keys("nemo_rl"), file)
    fn = Reader(config["loss_fn"] or {}, file, "loss_fn")
    if fn.flag("force_on_policy_ratio"):
        raise fn.fail(
            "force_on_policy_ratio", "true: NeMo-RL replaces prox by theta, no estimate reaches the loss"
        )
    policy = "cispo" if fn.flag("use_cispo") else "ppo"
    eps_low, eps_high = eps_ranges(policy)
    keys: dict = {"policy": policy, "eps_low": fn.number("ratio_clip_min", 0.2, eps_low)}
    keys["eps_high"] = fn.number("ratio_clip_max", 0.2, eps_high)
    keys["dual_clip"] = fn.number("ratio_clip_c", None, DUAL_CLIP)
    keys["ratio_level"] = "sequence" if fn.flag("sequence_level_importance_ratios") else "token"
    corrected = fn.flag("use_importance_sampling_correction")
    kind = fn.text("truncated_importance_sampling_type", ("tis", "icepop", "seq-mask-tis"))
    upper = fn.number("truncated_importance_sampling_ratio", None, POSITIVE)
    lower = fn.number("truncated_importance_sampling_ratio_min", None, Range(0, low_open=False))
    rules: tuple[Rule, ...] = ()
    level, agg = ("sequence", "sum") if keys["ratio_level"] == "sequence" else ("token", "mean")
    if kind is not None and upper is None:
        raise fn.fail(
            "truncated_importance_sampling_ratio",
            f"NeMo-RL needs it with truncated_importance_sampling_type {kind}",
        )
    if kind in ("icepop", "seq-mask-tis") and lower is None:
        raise fn.fail("truncated_importance_sampling_ratio_min", f"NeMo-RL needs it with {kind}")
    try:
        if kind == "tis":  # under GSPO NeMo-RL truncates the sequence's weight
            rules = (Rule(level, "ratio", agg, lower=lower, upper=upper, action="clamp"),)
        elif kind == "icepop":
            rules = (Rule(level, "ratio", agg, lower=lower, upper=upper),)
        elif kind == "seq-mask-tis":
            rules = (Rule("sequence", "ratio", "mean", lower=lower, upper=upper),)
    except ParameterError as error:
        key = "truncated_importance_sampling_ratio" + ("_min" if error.key == "lower" else "")
        raise fn.fail(key, error.why) from None
    rules = rules if corrected else ()
    masks, masks_used = _seq_logprob_error_mask(Reader(config, file))
    weight = "token" if corrected else "none"
    if weight == "token" and keys["ratio_level"] == "sequence":
        weight = "sequence_product"  # NeMo-RL's GSPO weight: exp(sum of the sequence's d)
    try:
        loss = Loss(**keys, behave_weight=weight, rules=rules + masks, name=f"NeMo-RL config {file}")
    except ParameterError as error:
        raise fn.fail(NEMO_RL_FIELDS.get(error.key, error.key), error.why) from None
    notes = (
        []
        if corrected or kind is None
        else ["use_importance_sampling_correction is false: the truncation is computed for metrics only"]
    )
    return loss, fn.used + masks_used, fn.ignored(NEMO_RL_NOT_MODELLED), notes


def _seq_logprob_error_mask(top: Reader) -> tuple[tuple[Rule, ...], list[str]]:
    """NeMo-RL's `grpo.seq_logprob_error_threshold` (or `ppo.`; 14f9f38): a sequence whose mean
    exp(|generation_logprobs - prev_logprobs|) passes it is masked from the loss, whatever the correction
    (grpo.py compute_and_apply_seq_logprob_error_masking): (its rule on `mult_prob_error`, the key used)."""
    sections = [_section(top, name) for name in ("grpo", "ppo")]
    given = [s for s in sections if s.has("seq_logprob_error_threshold")]
    if len(given) > 1:
        raise given[1].fail("seq_logprob_error_threshold", "set in grpo and in ppo: give it in one")
    if not given:
        return (), []
    threshold = given[0].number("seq_logprob_error_threshold")
    try:
        return (Rule("sequence", "mult_prob_error", "mean", upper=threshold),), given[0].used
    except ParameterError as error:
        raise given[0].fail("seq_logprob_error_threshold", error.why) from None
