"""AReaL's experiment YAML (its `actor:` section) as a `Loss`, at AReaL cbff54d (areal-project/AReaL):
`areal/api/cli_args.py` PPOActorConfig (eps_clip, eps_clip_higher, c_clip, importance_sampling_level,
use_sapo_loss, sapo_tau_pos/neg, use_cispo_loss, rejection_sampling, m2_threshold) and
RejectionSamplingConfig (level, action, metric, agg, upper, lower; `clamp` with no lower sets lower 0),
read the way `areal/utils/functional/functional.py` ppo_actor_loss_fn uses them: with `rejection_sampling`
unset there is no behaviour weight at all; a sequence-level `ratio` rule replaces the weight by the
sequence's geometric mean; M2PO's mask (`areal/trainer/ppo/actor.py` _apply_m2po_masking) comes before the
rejection, and with it PPO's eps_clip may be 0 (`evaluator.formulas.loss.M2PO_EPS`). Every key of
`actor:` must be one of PPOActorConfig's (`known`), at any depth.

Older AReaL's keys are read as AReaL's own migration maps them (`LEGACY`): `behave_imp_weight_cap` and
`behave_imp_weight_mode` (03d71153a to bc9f00988), which cbff54d refuses with the mapping of
`_LEGACY_MIGRATION_MESSAGE` (`_migrate_legacy_rejection_sampling`, areal/api/cli_args.py), and
`behav_imp_weight_cap` (before 03d71153a, which renamed it `behave_imp_weight_cap` in every example).
"""

from __future__ import annotations

from evaluator.errors import ParameterError
from evaluator.formulas.loss import DUAL_CLIP, SAPO_TAU, SCREEN, Loss, Rule, eps_ranges
from evaluator.inputs import FINITE, Range
from evaluator.lossconfig.keys import Reader
from evaluator.lossconfig.known import check_known, trainer_keys

LEGACY = {
    "behave_imp_weight_cap": "the cap of the legacy mode (AReaL 03d71153a: default 5.0, > 1)",
    "behave_imp_weight_mode": "token_mask, token_truncate, sequence_mask, sequence_truncate or disabled",
    "behav_imp_weight_cap": "AReaL before 03d71153a: mask tokens whose weight exceeds it (null: no cap)",
}
"""The keys of older AReaL that `actor:` may hold (AReaL's migration maps them to rejection_sampling)."""
LEGACY_MODES = ("disabled", "token_mask", "token_truncate", "sequence_mask", "sequence_truncate")
UPPER = {"ratio": Range(1), "kl_k2": Range(0), "kl_k3": Range(0)}
LOWER = {"ratio": Range(0)}
"""RejectionSamplingConfig.__post_init__'s own rules: a ratio's upper > 1 and lower > 0, a k2 or k3
upper > 0 (k1 takes any sign)."""


def _rejection(rs: Reader) -> tuple[str, Rule]:
    """(the behaviour weight, the rule) of a `rejection_sampling` table."""
    level = rs.text("level", ("token", "sequence"), "token")
    action = rs.text("action", ("mask", "clamp"), "mask")
    metric = rs.text("metric", ("ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl"), "ratio")
    agg = rs.text("agg", ("sum", "mean", "max"), "mean")
    upper = rs.number("upper", 5.0, UPPER.get(metric, FINITE))
    lower = rs.number("lower", 0.0 if action == "clamp" else None, LOWER.get(metric, FINITE))
    if metric == "binary_kl":
        rs.notes.append("metric binary_kl: AReaL cbff54d's RejectionSamplingConfig refuses it at load time")
    weight = "sequence_mean" if (level, metric) == ("sequence", "ratio") else "token"
    try:
        return weight, Rule(level, metric, agg, lower=lower, upper=upper, action=action)
    except ParameterError as error:
        raise rs.fail(error.key, error.why) from None


def _legacy(actor: Reader) -> tuple[str, tuple[Rule, ...]]:
    """The weight and rules of AReaL's older keys, as its migration maps them to rejection_sampling."""
    if "behav_imp_weight_cap" in actor.values:
        if any(k in actor.values for k in ("behave_imp_weight_cap", "behave_imp_weight_mode")):
            raise actor.fail(
                "behav_imp_weight_cap", "give it or behave_imp_weight_cap (its new name), not both"
            )
        cap = actor.number("behav_imp_weight_cap", None, Range(1))
        mapped = (
            "" if cap is None else f" (mode token_mask): rejection_sampling: {_mapping('token', 'mask', cap)}"
        )
        actor.notes.append(
            "behav_imp_weight_cap: AReaL's key before 03d71153a, which renamed it behave_imp_weight_cap; "
            + (f"read as AReaL's migration maps it{mapped}" if cap is not None else "null: the behaviour "
               "weight multiplied in with no cap, as ppo_actor_loss_fn did before 03d71153a")
        )  # fmt: skip
        return "token", () if cap is None else (Rule(upper=cap),)
    mode = actor.text("behave_imp_weight_mode", LEGACY_MODES, "token_mask")
    if mode == "disabled" and actor.has("behave_imp_weight_cap"):
        raise actor.fail("behave_imp_weight_cap", "AReaL 03d71153a refuses a cap with mode disabled")
    cap = actor.number("behave_imp_weight_cap", 5.0, Range(1))
    if mode == "disabled":
        mapped, weight, rules = "null", "none", ()
    else:
        level, action = mode.replace("truncate", "clamp").split("_")
        mapped, weight = _mapping(level, action, cap), "sequence_mean" if level == "sequence" else "token"
        lower = 0.0 if action == "clamp" else None
        rules = (Rule(level, "ratio", "mean", lower=lower, upper=cap, action=action),)
    actor.notes.append(
        "behave_imp_weight_cap/mode: AReaL's keys of 03d71153a, refused since bc9f00988; read as its "
        f"migration (_migrate_legacy_rejection_sampling) maps them: rejection_sampling: {mapped}"
    )
    return weight, rules


def _mapping(level: str, action: str, cap: float) -> str:
    """A rejection_sampling table as AReaL's migration message writes it (a sequence mode maps alike:
    RejectionSamplingConfig's sequence-level ratio is the old modes' geometric mean)."""
    return f"{{level: {level}, action: {action}, metric: ratio, upper: {cap:g}}}"


def _weight(actor: Reader) -> tuple[str, tuple[Rule, ...]]:
    """The behaviour weight and its rules: `rejection_sampling`, else the legacy keys, else none."""
    legacy = [k for k in LEGACY if k in actor.values]
    rs = actor.table("rejection_sampling")
    if rs is not None and legacy:
        raise actor.fail(legacy[0], "an older AReaL's key beside rejection_sampling: give one or the other")
    if rs is not None:
        weight, rule = _rejection(rs)
        actor.used += rs.used
        actor.notes += rs.notes
        return weight, (rule,)
    if legacy:
        return _legacy(actor)
    actor.notes.append(
        "rejection_sampling is unset: AReaL multiplies in no behaviour weight, so the estimate of prox "
        "enters every unclipped token's gradient through exp(theta - prox)"
    )
    return "none", ()


FIELDS = {
    "eps_low": "eps_clip",
    "eps_high": "eps_clip_higher",
    "dual_clip": "c_clip",
    "ratio_level": "importance_sampling_level",
    "behave_weight": "rejection_sampling",
}
"""The key of `actor:` behind each field of the loss, for a rule between keys the loss refuses."""


def areal_loss(config: dict, file: str) -> tuple[Loss, list[str], list[str], list[str]]:
    """(the loss, the keys used, the keys ignored, notes) of an AReaL experiment config's `actor:`."""
    check_known(config, trainer_keys("areal"), file, extra={"actor": tuple(LEGACY)})
    actor = Reader(config["actor"], file, "actor")
    sapo, cispo = actor.flag("use_sapo_loss"), actor.flag("use_cispo_loss")
    policy = "sapo" if sapo else "cispo" if cispo else "ppo"
    m2_threshold = actor.number("m2_threshold", None, SCREEN)
    eps_low, eps_high = eps_ranges(policy, m2po=m2_threshold is not None)
    eps = actor.number("eps_clip", 0.2, eps_low)
    keys: dict = {
        "policy": policy,
        "eps_low": eps,
        "eps_high": actor.number("eps_clip_higher", eps, eps_high),
        "m2_threshold": m2_threshold,
    }
    keys["dual_clip"] = actor.number("c_clip", None, DUAL_CLIP)
    keys["ratio_level"] = actor.text("importance_sampling_level", ("token", "sequence"), "token")
    keys["sapo_tau_pos"] = actor.number("sapo_tau_pos", 1.0, SAPO_TAU)
    keys["sapo_tau_neg"] = actor.number("sapo_tau_neg", 1.05, SAPO_TAU)
    keys["behave_weight"], keys["rules"] = _weight(actor)
    _notes(actor, sapo)
    try:
        loss = Loss(**keys, name=f"AReaL actor config {file}")
    except ParameterError as error:
        raise actor.fail(FIELDS.get(error.key, error.key), error.why) from None
    if m2_threshold is not None and not (loss.eps_low and loss.eps_high):
        actor.notes.append(
            "M2PO with an eps of 0: AReaL clamps the ratio to [1, 1] on that side (ppo_actor_loss_fn), so an "
            "unclipped token is one whose ratio is on the side against its advantage; with prox recomputed "
            "and one minibatch the ratio is 1 and M2PO's mask is the trust region, with an estimate it bites"
        )
    return loss, actor.used, actor.ignored(), actor.notes


def _notes(actor: Reader, sapo: bool) -> None:
    """What the config says about where prox comes from."""
    decoupled = actor.flag("use_decoupled_loss")
    method = actor.text(
        "prox_logp_method", ("recompute", "loglinear", "metrics", "reuse_train_logp"), "recompute"
    )
    actor.flag("recompute_logprob")
    actor.number("ppo_n_minibatches")
    if sapo or not decoupled:
        actor.notes.append(
            "use_decoupled_loss is false: the loss's old log-prob is the recompute (recompute_logprob) or "
            "behave_logp; no estimate but `rollout` can reach it, so judge `rollout` against the truth"
        )
    elif method == "reuse_train_logp":
        actor.notes.append(
            "prox_logp_method reuse_train_logp: judge the method reuse_train_logp (AReaL forces 1 minibatch)"
        )
    elif method == "loglinear":
        actor.notes.append("prox_logp_method loglinear: AReaL computes loglinear_shipped; gate that method")
