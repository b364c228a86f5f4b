"""The trainer's maximum staleness in its own config: the largest staleness it trains on, hence the staleness
the gate judges the approximation up to (`replay` records it with the loss). The keys, each read at a pinned
commit of the trainer:

- AReaL (cbff54d, `areal/api/cli_args.py` InferenceEngineConfig.max_head_offpolicyness, default 0):
  `rollout.max_head_offpolicyness`;
- prime-rl (559b447, `packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py`
  OrchestratorConfig.max_off_policy_steps, default 8): `orchestrator.max_off_policy_steps`, or at the top
  level of an orchestrator's own config;
- TRL (f2cd577, `trl/experimental/async_grpo/async_grpo_config.py` AsyncGRPOConfig.max_staleness, default
  4): `max_staleness` at the top level.

A config without the key says nothing (its trainer's default is not assumed): the log's largest staleness is
judged then."""

from __future__ import annotations

from evaluator.errors import UsageError

KEYS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("rollout", "max_head_offpolicyness"), "AReaL"),
    (("orchestrator", "max_off_policy_steps"), "prime-rl"),
    (("max_off_policy_steps",), "prime-rl"),
    (("max_staleness",), "TRL"),
)
"""(the key's path in the config, the trainer), in the order they are looked for."""
DOTTED_KEYS = frozenset(".".join(path) for path, _ in KEYS)
"""The keys read here, dotted: a loss reader that meets one lists it as read, never as ignored."""


def max_staleness(config: dict, where: str, of: str | None = None) -> tuple[int, str, str] | None:
    """(the maximum staleness, where it was read, the key to set) of a trainer's config mapping, from the
    first of `KEYS` it holds (of the trainer `of` alone where given); None when it holds none. A value that
    is not an integer >= 0 is a `UsageError` naming the file and the key."""
    for path, trainer in KEYS:
        if of is not None and trainer != of:
            continue
        node: object = config
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            continue
        key = ".".join(path)
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise UsageError(
                f"{where}: {key}: {node!r} must be an integer >= 0 (the {trainer} maximum staleness)"
            )
        return node, f"{key} = {node} in {where} ({trainer})", path[-1]
    return None
