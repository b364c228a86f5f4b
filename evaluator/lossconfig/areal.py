"""AReaL's experiment YAML (its `actor:` section) as a `Loss`, at AReaL cbff54d: `areal/api/cli_args.py`
PPOActorConfig (eps_clip, eps_clip_higher, c_clip, importance_sampling_level, use_sapo_loss,
sapo_tau_pos/neg, use_cispo_loss, rejection_sampling, m2_threshold) and RejectionSamplingConfig (level,
action, metric, agg, upper, lower; `clamp` with no lower sets lower 0), read the way
`areal/utils/functional/functional.py` ppo_actor_loss_fn uses them: with `rejection_sampling` unset
there is no behaviour weight at all; a sequence-level `ratio` rule replaces the weight by the sequence's
geometric mean. The legacy
`behave_imp_weight_cap` / `behave_imp_weight_mode` (AReaL 2026-03 to 2026-04) are read too.
"""

from __future__ import annotations

from evaluator.formulas.loss import Loss, Rule
from evaluator.lossconfig.keys import Reader

USED = {
    "eps_clip", "eps_clip_higher", "c_clip", "importance_sampling_level", "use_sapo_loss", "sapo_tau_pos",
    "sapo_tau_neg", "use_cispo_loss", "rejection_sampling", "behave_imp_weight_cap", "behave_imp_weight_mode",
    "use_decoupled_loss", "prox_logp_method", "recompute_logprob", "ppo_n_minibatches", "m2_threshold",
}  # fmt: skip
LEGACY_MODES = ("disabled", "token_mask", "token_truncate", "sequence_mask", "sequence_truncate")


def _rejection(rs: Reader) -> tuple[str, Rule]:
    """(the behaviour weight, the rule) of a `rejection_sampling` table."""
    level = rs.text("level", ("token", "sequence"), "token")
    action = rs.text("action", ("mask", "clamp"), "mask")
    metric = rs.text("metric", ("ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl"), "ratio")
    agg = rs.text("agg", ("sum", "mean", "max"), "mean")
    upper = rs.number("upper", 5.0)
    lower = rs.number("lower", 0.0 if action == "clamp" else None)
    if metric == "binary_kl":
        rs.notes.append("metric binary_kl: AReaL cbff54d's RejectionSamplingConfig refuses it at load time")
    weight = "sequence_mean" if (level, metric) == ("sequence", "ratio") else "token"
    try:
        return weight, Rule(level, metric, agg, lower=lower, upper=upper, action=action)
    except ValueError as error:
        raise rs.fail("rejection_sampling", str(error)) from None


def _legacy(actor: Reader) -> tuple[str, tuple[Rule, ...]]:
    """`behave_imp_weight_cap` (default 5.0) and `behave_imp_weight_mode` (default token_mask)."""
    mode = actor.text("behave_imp_weight_mode", LEGACY_MODES, "token_mask")
    cap = actor.number("behave_imp_weight_cap", 5.0)
    if mode == "disabled":
        return "none", ()
    level, action = mode.split("_")
    action = "mask" if action == "mask" else "clamp"
    weight = "sequence_mean" if level == "sequence" else "token"
    return weight, (
        Rule(level, "ratio", "mean", lower=0.0 if action == "clamp" else None, upper=cap, action=action),
    )


def areal_loss(config: dict, where: str) -> tuple[Loss, list[str], list[str], list[str]]:
    """(the loss, the keys used, the keys ignored, notes) of an AReaL experiment config's `actor:`."""
    actor = Reader(config["actor"], f"{where} actor")
    eps = actor.number("eps_clip", 0.2)
    keys: dict = {"eps_low": eps, "eps_high": actor.number("eps_clip_higher", eps)}
    keys["dual_clip"] = actor.number("c_clip")
    keys["ratio_level"] = actor.text("importance_sampling_level", ("token", "sequence"), "token")
    sapo, cispo = actor.flag("use_sapo_loss"), actor.flag("use_cispo_loss")
    keys["policy"] = "sapo" if sapo else "cispo" if cispo else "ppo"
    keys["sapo_tau_pos"] = actor.number("sapo_tau_pos", 1.0)
    keys["sapo_tau_neg"] = actor.number("sapo_tau_neg", 1.05)
    keys["m2_threshold"] = actor.number("m2_threshold")  # M2PO, applied before the rejection (actor.py)
    rs = actor.table("rejection_sampling")
    if rs is not None:
        keys["behave_weight"], rule = _rejection(rs)
        keys["rules"] = (rule,)
        actor.used += [f"rejection_sampling.{u}" for u in rs.used]
        actor.notes += rs.notes
    elif actor.has("behave_imp_weight_cap") or actor.has("behave_imp_weight_mode"):
        keys["behave_weight"], keys["rules"] = _legacy(actor)
        actor.notes.append("behave_imp_weight_cap/mode: AReaL's legacy keys (replaced by rejection_sampling)")
    else:
        keys["behave_weight"], keys["rules"] = "none", ()
        actor.notes.append(
            "rejection_sampling is unset: AReaL multiplies in no behaviour weight, so the estimate of prox "
            "enters every unclipped token's gradient through exp(theta - prox)"
        )
    _notes(actor, sapo)
    try:
        loss = Loss(**keys, name=f"AReaL actor config {where}")
    except ValueError as error:
        raise actor.fail("actor", str(error)) from None
    return loss, actor.used, actor.ignored(USED), actor.notes


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
