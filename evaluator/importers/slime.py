"""slime's `--dump-details DIR` (THUDM/slime): `DIR/train_data/{rollout_id}.pt` from
`slime/observability/train_data_utils.py` (`format_version` 2: `samples`, one dict per training sample
in rollout order) and `DIR/rollout_data/{rollout_id}.pt` from `rollout_data_utils.py`
(`{"rollout_id", "samples": [Sample.to_dict()]}`).

Both are loaded with `torch.load(weights_only=True)` (tensors and plain types only): a file that needs
more is refused, never unpickled.

Per train sample: `tokens` (prompt + response), `response_lengths`, and over the response only
`rollout_log_probs` (behave), `log_probs` (the actor's log-prob before the step's updates: prox, and theta
at minibatch 0), `loss_masks`, `advantages`; `rewards`; `rollout_position` (its index in the rollout
dump). The rollout dump's `weight_versions` holds one version per generate call ("default" is the engine's
initial weights, version 0): a response with one version maps exactly (`behave_version`); one generated
across several versions cannot be placed token by token and is skipped, counted. Without the rollout
dump, `behave_version = step` is assumed and said so (docs/importers.md). `step = rollout_id`,
`seq_id = rollout_id * 10^6 + rollout_position`.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from evaluator.importers.rows import ImportFormatError, ImportResult, LogWriter, dump_files, response_rows
from schemas.token_log import ASSUMED_ON_POLICY, RECORDED

KEYS = ("tokens", "response_lengths", "rollout_log_probs", "log_probs", "loss_masks", "advantages")
SEQ_STRIDE = 10**6


def find(paths: Sequence[str | Path]) -> list[Path]:
    """`train_data/{rollout_id}.pt` files, sorted by rollout id; a folder is the `--dump-details` DIR."""
    return dump_files(paths, lambda folder: (folder / "train_data").glob("*.pt"), _rollout_id)


def _rollout_id(path: Path) -> int:
    if not (path.stem.isdigit() and path.parent.name == "train_data" and path.suffix == ".pt"):
        raise ImportFormatError(f"{path}: not a slime train dump (DIR/train_data/{{rollout_id}}.pt)")
    return int(path.stem)


def _load(path: Path) -> dict:
    import torch

    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as error:
        raise ImportFormatError(
            f"{path}: refused: it needs more than tensors and plain types to load "
            f"(torch.load(weights_only=True) says: {str(error).splitlines()[0]}); proxaudit never unpickles "
            "code from a file"
        ) from None
    except (RuntimeError, EOFError, OSError) as error:
        raise ImportFormatError(f"{path}: not a readable torch file ({error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise ImportFormatError(f"{path}: no `samples` list (slime's dumps are dicts with one)")
    return data


def _versions(path: Path, rollout_id: int) -> list[set[int]] | None:
    """Per rollout sample, the set of weight versions that generated it; None without a rollout dump."""
    rollout = path.parent.parent / "rollout_data" / f"{rollout_id}.pt"
    if not rollout.exists():
        return None
    out = []
    for i, sample in enumerate(_load(rollout)["samples"]):
        try:
            out.append({0 if v == "default" else int(v) for v in sample.get("weight_versions") or []})
        except (TypeError, ValueError):
            raise ImportFormatError(f"{rollout}: sample {i}: weight_versions not integers") from None
    return out


def _array(value) -> np.ndarray:
    return value.float().numpy() if hasattr(value, "numpy") else np.asarray(value, dtype=float)


def convert(path: Path, out_dir: Path, run_id: str) -> ImportResult:
    """One rollout's train dump (with its rollout dump's versions) to `{run_id}-rollout{id}.parquet`."""
    rollout_id = _rollout_id(path)
    data, versions = _load(path), _versions(path, rollout_id)
    result = ImportResult(path, None)
    with LogWriter(
        out_dir / f"{run_id}-rollout{rollout_id:06d}.parquet",
        source=f"slime:train_data/{path.name}",
        versions=ASSUMED_ON_POLICY if versions is None else RECORDED,
    ) as writer:
        for i, sample in enumerate(data["samples"]):
            missing = [k for k in KEYS if k not in sample]
            if missing:
                raise ImportFormatError(
                    f"{path}: sample {i}: missing {', '.join(missing)} (slime dumps them)"
                )
            n = int(sample["response_lengths"])
            arrays = {k: _array(sample[k]) for k in KEYS if k not in ("response_lengths",)}
            lengths = {k: len(arrays[k]) for k in KEYS[2:]}
            if set(lengths.values()) != {n} or len(arrays["tokens"]) < n:
                raise ImportFormatError(f"{path}: sample {i}: response arrays of {lengths}, not {n}")
            position = int(sample.get("rollout_position", i))
            if versions is None:
                version = rollout_id
            else:
                generated = versions[position] if position < len(versions) else set()
                if len(generated) != 1:
                    result.skip("generated across several weight versions")  # no per-token placement
                    continue
                (version,) = generated
            mask = arrays["loss_masks"] > 0
            response = response_rows(
                token_ids=arrays["tokens"][-n:].astype(np.int64),
                token_mask=np.ones(n, bool),
                loss_mask=mask,
                behave_logp=arrays["rollout_log_probs"],
                prox_logp=arrays["log_probs"],
                advantage=arrays["advantages"],
            )
            writer.add(
                response, run_id=run_id, step=rollout_id, minibatch=0, n_minibatches=1,
                seq_id=rollout_id * SEQ_STRIDE + position, behave_version=version,
                reward=float(sample.get("rewards", np.nan)),
            )  # fmt: skip
            result.count(response)
        result.out = writer.close()
    return result
