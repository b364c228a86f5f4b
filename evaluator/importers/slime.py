"""slime's `--dump-details DIR` (THUDM/slime at 624b824) and its fork Miles' (radixark/miles at 31f1ca9).

Train dumps, one per rollout, from `save_debug_train_data`:
- slime since 2026-08-12 (`slime/observability/train_data_utils.py`, `_build_dump_payload`):
  `DIR/train_data/{rollout_id}.pt`, `format_version` 2: `samples`, one dict per training sample of every
  data-parallel rank, in rollout order (`rollout_position`: its index in the rollout dump), with the
  per-sample `local_raw_reward`, and the whole batch's `raw_reward`;
- Miles (`miles/utils/train_dump_utils.py`) and slime before 2026-08-12: `DIR/train_data/{rollout_id}_
  {rank}.pt`, one per training rank: `rollout_data`, the rank's columns (a list per key, one entry per
  local sample), with `sample_indices` (`Sample.index`) and the batch's `raw_reward`; Miles adds
  `cp_rank`, `cp_size` (a context-parallel rank holds a shard of each sample: refused) and drops
  `partition`.
The rollout dump `DIR/rollout_data/{rollout_id}.pt` (`save_debug_rollout_data`: `{"rollout_id",
"samples": [Sample.to_dict()]}`, Miles adds `metadata`) gives each sample's `weight_versions`.

Every file is loaded with `torch.load(weights_only=True)` (tensors and plain types only): a file that
needs more is refused, never unpickled.

Per train sample: `tokens` (prompt + response), `response_lengths`, and over the response only
`rollout_log_probs` (behave), `log_probs` (the actor's log-prob before the rollout's updates: prox, and
theta at minibatch 0), `loss_masks`, `advantages`. reward = the raw reward (`local_raw_reward`, else
`raw_reward` at the sample's position, else the rollout dump's numeric `reward`), never `rewards` (slime's
group-normalised one). Versions: `evaluator.importers.slime_versions`; a response generated across
several versions cannot be placed token by token and is skipped, counted. Without the rollout dump,
`behave_version = step` is assumed and said so. `step = rollout_id`, `seq_id = rollout_id * 10^6 +
position in the rollout`.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from evaluator.importers.rows import (
    ImportFormatError,
    ImportResult,
    LogWriter,
    dump_file,
    dump_files,
    response_rows,
)
from evaluator.importers.slime_versions import RolloutDump, Versions, rollout_dump
from schemas.token_log import ASSUMED_ON_POLICY, RECORDED

NAME = re.compile(r"^(\d+)(?:_(\d+))?\.pt$")
KEYS = ("tokens", "response_lengths", "rollout_log_probs", "log_probs", "loss_masks", "advantages")
SEQ_STRIDE = 10**6


def find(paths: Sequence[str | Path]) -> list[Path]:
    """`train_data/{rollout_id}[_{rank}].pt` files, sorted by rollout id and rank; a folder is the
    `--dump-details` DIR."""
    return dump_files(paths, lambda folder: (folder / "train_data").glob("*.pt"), _rollout_rank)


def _rollout_rank(path: Path) -> tuple[int, int]:
    match = NAME.match(path.name)
    if match is None or path.parent.name != "train_data":
        raise ImportFormatError(
            f"{path}: not a slime train dump (DIR/train_data/{{rollout_id}}.pt or {{rollout_id}}_{{rank}}.pt)"
        )
    return int(match.group(1)), int(match.group(2) or -1)


def _load(path: Path) -> dict:
    with dump_file(path, "slime") as source:
        data = _torch_load(path, source)
    if not isinstance(data, dict):
        raise ImportFormatError(f"{path}: holds a {type(data).__name__}, not slime's dict")
    return data


def _torch_load(path: Path, source: BinaryIO) -> object:
    import torch

    try:
        return torch.load(source, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as error:
        raise ImportFormatError(
            f"{path}: refused: it needs more than tensors and plain types to load "
            f"(torch.load(weights_only=True) says: {str(error).splitlines()[0]}); proxaudit never unpickles "
            "code from a file"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise ImportFormatError(
            f"{path}: cannot be read as a torch.save file: truncated or corrupt ({error})"
        ) from None


def _train_samples(path: Path, data: dict) -> list[dict]:
    """The train dump's samples as dicts, from either layout."""
    if isinstance(data.get("samples"), list):
        return data["samples"]
    columns = data.get("rollout_data")
    if not isinstance(columns, dict) or "response_lengths" not in columns:
        raise ImportFormatError(f"{path}: neither `samples` (format 2) nor a rank's `rollout_data` columns")
    if data.get("cp_size", 1) != 1:
        raise ImportFormatError(
            f"{path}: a context-parallel rank (cp_size {data['cp_size']}) holds a shard of each sample"
        )
    n = len(columns["response_lengths"])
    per_sample = {k: v for k, v in columns.items() if hasattr(v, "__len__") and len(v) == n}
    samples = [{k: v[i] for k, v in per_sample.items()} for i in range(n)]
    for i, sample in enumerate(samples):
        if "partition" in columns:
            sample["rollout_position"] = columns["partition"][i]
        if "sample_indices" in columns:
            sample["sample_index"] = columns["sample_indices"][i]
    return samples


def _array(value, where: str, key: str) -> np.ndarray:
    try:
        array = value.float().numpy() if hasattr(value, "numpy") else np.asarray(value, dtype=float)
    except (TypeError, ValueError, RuntimeError):
        array = None
    if array is None or array.ndim != 1:
        raise ImportFormatError(f"{where}: {key} is not a flat list or tensor of numbers")
    return array


def _scalar(value) -> float | None:
    value = value.item() if hasattr(value, "item") else value
    return float(value) if isinstance(value, (int, float)) else None


def _position(sample: dict, i: int, rollout: RolloutDump | None) -> int | None:
    """The sample's index in the rollout: `rollout_position`, else its `Sample.index` looked up in the
    rollout dump, else its place in the file when there is no rollout dump."""
    if _scalar(sample.get("rollout_position")) is not None:
        return int(_scalar(sample["rollout_position"]))
    index = _scalar(sample.get("sample_index"))
    if rollout is not None:
        return rollout.index.get(int(index)) if index is not None else None
    return i


def _reward(sample: dict, position: int, data: dict, rollout: RolloutDump | None) -> float:
    """The raw reward: per sample, else the whole batch's at the position, else the rollout dump's."""
    if (local := _scalar(sample.get("local_raw_reward"))) is not None:
        return local
    raw = data.get("raw_reward", data.get("rollout_data", {}).get("raw_reward"))
    if isinstance(raw, (list, tuple)) and position < len(raw) and _scalar(raw[position]) is not None:
        return _scalar(raw[position])
    if rollout is not None and position < len(rollout.rewards) and rollout.rewards[position] is not None:
        return rollout.rewards[position]
    return np.nan


def out_name(path: Path, run_id: str) -> str:
    rollout_id, rank = _rollout_rank(path)
    return f"{run_id}-rollout{rollout_id:06d}" + (f"-rank{rank}" if rank >= 0 else "") + ".parquet"


def convert(path: Path, out_dir: Path, run_id: str, versions: Versions | None = None) -> ImportResult:
    """One rollout's train dump (with its rollout dump's versions) to `{run_id}-rollout{id}.parquet`
    (`-rank{R}` added for a rank's file)."""
    rollout_id, rank = _rollout_rank(path)
    data = _load(path)
    samples = _train_samples(path, data)
    versions = versions or Versions()
    rollout_path = path.parent.parent / "rollout_data" / f"{rollout_id}.pt"
    rollout = None
    if rollout_path.exists():
        rollout_data = _load(rollout_path)
        if not isinstance(rollout_data.get("samples"), list):
            raise ImportFormatError(f"{rollout_path}: no `samples` list (slime's rollout dumps have one)")
        rollout = rollout_dump(rollout_path, rollout_data["samples"], rollout_id, versions)
    result = ImportResult(path, None)
    with LogWriter(
        out_dir / out_name(path, run_id),
        source=f"slime:train_data/{path.name}",
        versions=ASSUMED_ON_POLICY if rollout is None else RECORDED,
    ) as writer:
        context = _Context(run_id, rollout_id, data, rollout, versions)
        for i, sample in enumerate(samples):
            _add_sample(writer, result, sample, f"{path}: sample {i}", i, context)
        result.out = writer.close()
    return result


def _check_first_push(result: ImportResult, context: _Context, position: int) -> None:
    """A process pushes once before its first rollout S, and that push generates rollouts S to S + k
    only: on a later rollout the run was restarted at a rollout the options do not name."""
    pushes, versions = context.rollout.pushes[position], context.versions
    start = versions.start(context.rollout_id)
    if pushes == {1} and context.rollout_id > start + versions.update_weights_interval:
        result.notes.add(
            f"rollout {context.rollout_id} was generated by the first weight push of a process, which "
            f"serves rollouts {start} to {start + versions.update_weights_interval} only: if the run was "
            "restarted, give its first rollout with --resumed-at (versions are off by the difference)"
        )


@dataclass(frozen=True)
class _Context:
    run_id: str
    rollout_id: int
    data: dict
    rollout: RolloutDump | None
    versions: Versions


def _add_sample(
    writer: LogWriter, result: ImportResult, sample: object, where: str, i: int, context: _Context
) -> None:
    """Check one train sample, place it in its rollout and hand its response to the writer."""
    rollout_id, rollout = context.rollout_id, context.rollout
    if not isinstance(sample, dict):
        raise ImportFormatError(f"{where}: a {type(sample).__name__}, not a dict")
    missing = [k for k in KEYS if k not in sample]
    if missing:
        raise ImportFormatError(f"{where}: missing {', '.join(missing)} (slime dumps them)")
    n = _scalar(sample["response_lengths"])
    if n is None or n != int(n) or n < 1:
        raise ImportFormatError(f"{where}: response_lengths {sample['response_lengths']!r} is not a length")
    n = int(n)
    arrays = {k: _array(sample[k], where, k) for k in KEYS if k != "response_lengths"}
    lengths = {k: len(arrays[k]) for k in KEYS[2:]}
    if set(lengths.values()) != {n} or len(arrays["tokens"]) < n:
        raise ImportFormatError(f"{where}: response arrays of {lengths}, not response_lengths {n}")
    position = _position(sample, i, rollout)
    if position is None or (rollout is not None and not 0 <= position < len(rollout.versions)):
        raise ImportFormatError(f"{where}: not in the rollout dump (no rollout_position, unknown index)")
    if rollout is None:
        version = rollout_id
    else:
        generated = rollout.versions[position]
        if len(generated) != 1:
            result.skip("generated across several weight versions")  # no per-token placement
            return
        (version,) = generated
        _check_first_push(result, context, position)
        if version > rollout_id:
            raise ImportFormatError(
                f"{where}: generated by weights of {version} optimizer steps, after those rollout "
                f"{rollout_id} trains from: give the run's --update-weights-interval and --resumed-at"
            )
    response = response_rows(
        token_ids=arrays["tokens"][-n:].astype(np.int64),
        token_mask=np.ones(n, bool),
        loss_mask=arrays["loss_masks"] > 0,
        behave_logp=arrays["rollout_log_probs"],
        prox_logp=arrays["log_probs"],
        advantage=arrays["advantages"],
    )
    writer.add(
        response, run_id=context.run_id, step=rollout_id, minibatch=0, n_minibatches=1,
        seq_id=rollout_id * SEQ_STRIDE + position, behave_version=version,
        reward=_reward(sample, position, context.data, rollout),
    )  # fmt: skip
    result.count(response)
