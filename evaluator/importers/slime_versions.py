"""slime's weight versions -> schema v1 versions, and the rollout dump that records them.

slime (THUDM/slime at 624b824, and its fork Miles) counts weight *pushes* to the inference engine, not
optimizer steps: each updater (`update_weight_from_tensor.py`, `..._from_distributed.py`,
`..._from_disk.py`) starts `weight_version` at 0 (`update_weight_start_version`, 0 in a new process) and
adds 1 before every push, and every generate call appends the engine's version to
`Sample.weight_versions` (`"default"`: the engine's own initial load, before any push). `train.py` and
`train_async.py` push once before the first rollout, then `train.py` after every rollout and
`train_async.py` after rollout `r` when `(r + 1) % update_weights_interval == 0`. A run that starts at
rollout `S` (`--start-rollout-id`, or resumed from a checkpoint of rollout `S - 1`) counts again from 1.

So with interval `k`, push 1 carries the actor's weights after `S` optimizer steps and push `j >= 2` those
after `(S // k + j - 1) * k` steps: schema v1's version (step `s` trains from version `s`, one optimizer
step per rollout). `train.py` is the case `k = 1`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evaluator.importers.rows import ImportFormatError


@dataclass(frozen=True)
class Versions:
    """How the run that wrote the dumps pushed weights (the `proxaudit import slime` options)."""

    update_weights_interval: int = 1
    """`--update-weights-interval` of `train_async.py` (`train.py` pushes after every rollout: 1)."""
    resumed_at: tuple[int, ...] = ()
    """The first rollout of each restart of the run (its `--start-rollout-id`); 0 is the first start."""

    def start(self, rollout_id: int) -> int:
        """The first rollout of the process that trained `rollout_id`."""
        return max([0, *(s for s in self.resumed_at if s <= rollout_id)])

    def version(self, weight_version: object, rollout_id: int) -> int:
        """Schema version of slime's `weight_version` (a string) on a sample of `rollout_id`."""
        if weight_version == "default":
            return 0
        pushes = int(str(weight_version))  # ValueError on anything but an integer
        if pushes < 1:
            raise ValueError(f"weight version {weight_version!r} before the first push")
        start, k = self.start(rollout_id), self.update_weights_interval
        return start if pushes == 1 else (start // k + pushes - 1) * k


@dataclass
class RolloutDump:
    """`DIR/rollout_data/{rollout_id}.pt`: per sample of the rollout (in rollout order), its schema
    versions, its `index` (`Sample.index`) and its raw reward where it is a number."""

    path: Path
    versions: list[set[int]]
    index: dict[int, int]
    """`Sample.index` -> position in the rollout."""
    rewards: list[float | None]
    pushes: list[set[int]]
    """slime's own push counts per sample ("default": 0)."""


def rollout_dump(path: Path, samples: Sequence[object], rollout_id: int, versions: Versions) -> RolloutDump:
    """The rollout dump's samples (`Sample.to_dict()`), checked: a sample that is not a dict or has
    versions that are not slime's is an `ImportFormatError` naming the file and the sample."""
    out = RolloutDump(path, [], {}, [], [])
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise ImportFormatError(f"{path}: sample {i} is a {type(sample).__name__}, not Sample.to_dict()")
        try:
            pushed = sample.get("weight_versions") or []
            out.versions.append({versions.version(v, rollout_id) for v in pushed})
            out.pushes.append({0 if v == "default" else int(str(v)) for v in pushed})
        except (TypeError, ValueError):
            raise ImportFormatError(
                f"{path}: sample {i}: weight_versions {sample.get('weight_versions')!r} are not slime's "
                '("default" or push counts from 1)'
            ) from None
        if isinstance(sample.get("index"), int):
            out.index[sample["index"]] = i
        reward = sample.get("reward")
        out.rewards.append(float(reward) if isinstance(reward, (int, float)) else None)
    return out
