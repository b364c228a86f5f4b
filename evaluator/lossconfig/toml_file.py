"""proxaudit's own loss file (TOML): a `preset` to start from (optional) and the keys of
`evaluator.formulas.loss.Loss` to set, with `[[rule]]` tables for the behaviour weight's rules:

    preset = "areal-gspo"          # optional: start from a named preset
    eps_high = 0.28
    dual_clip = 3.0                # PPO's dual clip; DPPO's truncation of its ratio
    kl_penalty = 0.001             # k of k (theta - prox)^2 (dppo_*, ipo, pg)
    m2_threshold = 0.04            # AReaL M2PO; opsm_delta: slime OPSM
    behave_weight = "token"        # none | token | sequence_product | sequence_mean
    [[rule]]                       # any [[rule]] replaces the preset's rules
    level = "sequence"             # token | sequence
    statistic = "ratio"            # ratio | kl_k1 | kl_k2 | kl_k3 | kl_k3_reverse | binary_kl
                                   # | mult_prob_error
    agg = "mean"                   # sum | mean | max | min (sequence level)
    lower = 0.5
    upper = 2.0
    action = "mask"                # mask | clamp

The keys of earlier versions (`eps_low`, `eps_high`, `bound`, `bound_action`) still work: `bound` and
`bound_action` set one token-level ratio rule.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

from evaluator.errors import ParameterError, UsageError
from evaluator.formulas.loss import POLICIES, STATISTICS, Loss, Rule
from evaluator.inputs import read_text
from evaluator.lossconfig.keys import Reader
from evaluator.lossconfig.known import nearest
from evaluator.lossconfig.presets import PRESETS

RULE_KEYS = ("level", "statistic", "agg", "lower", "upper", "action")
NUMBERS = ("eps_low", "eps_high", "dual_clip", "sapo_tau_pos", "sapo_tau_neg", "kl_penalty", "m2_threshold",
           "opsm_delta")  # fmt: skip
CHOICES = {
    "policy": tuple(POLICIES),
    "ratio_level": ("token", "sequence"),
    "behave_weight": ("none", "token", "sequence_product", "sequence_mean"),
}


def bound_rule(bound: float, action: str) -> Rule:
    """The single token-level rule of `--bound U --bound-action mask|clamp`."""
    return Rule(upper=bound, action=action)


def _rule(table: object, r: Reader, index: int) -> Rule:
    where = f"rule {index}"
    if not isinstance(table, dict):
        raise r.fail(where, "must be a table of keys")
    rule = Reader(table, r.file, where)
    unknown = sorted(map(str, set(table) - set(RULE_KEYS)))
    if unknown:
        raise rule.fail(
            unknown[0], f"unknown key; a rule has {', '.join(RULE_KEYS)}{nearest(unknown[0], RULE_KEYS)}"
        )
    try:
        return Rule(
            rule.text("level", ("token", "sequence"), "token"),
            rule.text("statistic", tuple(STATISTICS), "ratio"),
            rule.text("agg", ("sum", "mean", "max", "min"), "mean"),
            lower=rule.number("lower"),
            upper=rule.number("upper"),
            action=rule.text("action", ("mask", "clamp"), "mask"),
        )
    except ParameterError as error:
        raise rule.fail(error.key, error.why) from None


def toml_loss(path: str | Path) -> Loss:
    """The loss a TOML file describes (module docstring); errors name the file and the key."""
    try:
        values = tomllib.loads(read_text(path, "loss file"))
    except (tomllib.TOMLDecodeError, ValueError) as error:
        raise UsageError(f"{path}: cannot read it as TOML: {error}") from None
    known = {"preset", "rule", "bound", "bound_action", *NUMBERS, *CHOICES}
    unknown = sorted(map(str, set(values) - known))
    if unknown:
        allowed = f"allowed: {', '.join(sorted(known))}{nearest(unknown[0], known)}"
        raise UsageError(f"{path}: {unknown[0]}: unknown key; {allowed}")
    r = Reader(values, str(path))
    preset = r.text("preset", tuple(PRESETS), "default")
    keys: dict = {k: r.number(k) for k in NUMBERS if r.has(k)}
    keys |= {k: r.text(k, allowed) for k, allowed in CHOICES.items() if r.has(k)}
    if r.has("rule"):
        tables = values["rule"] if isinstance(values["rule"], list) else [values["rule"]]
        keys["rules"] = tuple(_rule(t, r, i + 1) for i, t in enumerate(tables))
    if r.has("bound") or r.has("bound_action"):
        if r.has("rule"):
            raise r.fail("bound", "give either [[rule]] tables or bound and bound_action, not both")
        action = r.text("bound_action", ("mask", "clamp"), "mask")
        try:
            keys["rules"] = (bound_rule(r.number("bound", 5.0), action),)
        except ParameterError as error:
            raise r.fail("bound", error.why) from None
        keys.setdefault("behave_weight", "token")
    try:
        return replace(PRESETS[preset], **keys, name=str(path))
    except ParameterError as error:  # the keys are the loss's own fields
        raise r.fail(error.key, error.why) from None
