"""SkyRL's `trainer.dump_data_batch=true` files (NovaSky-AI/SkyRL): `{export_path}/dumped_data/
global_step_{N}_training_input.pkl`, written by `RayPPOTrainer.dump_data` (`skyrl/train/trainer.py`)
as `pickle.dump(TrainingInputBatch)` (`skyrl/backends/skyrl_train/training_batch.py`).

A pickle names the functions it calls on load, so reading one runs code from the file: only behind
`--trust-pickle`, and even then through an unpickler that resolves nothing but SkyRL's batch rebuild
(`_rebuild_tensor_batch` with `TrainingInputBatch`, replaced by stand-ins here: no SkyRL code runs) and
`torch.device`. The batch's own format keeps each tensor as numpy bytes (or `torch.save` bytes, read
with `weights_only=True`). A file that names anything else is refused.

The batch (every tensor padded on the left): `sequences` (B, prompt + response), and over the response
only `response_mask`, `loss_mask`, `rollout_logprobs` (behave; None unless the generator returned
log-probs), `action_log_probs` (the training forward pass before the step's update: prox, and theta at
minibatch 0), `advantages`. The trainer pops `rewards` before dumping (`RayPPOTrainer.train`): the
reward is read only from a dump that still has it (on the last token), else none. When the batch is not
a multiple of the data-parallel size, `pad_training_input_batch` appends `metadata["pad_size"]` copies
of row 0 (loss-masked): those last rows are dropped. `step = N - 1` (`global_step` starts at 1, from the
initial weights), `seq_id = N * 10^6 + row`. No versions: `behave_version = step` is assumed
(docs/importers.md). NovaSky-AI/SkyRL at a956457.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Sequence
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

NAME = re.compile(r"^global_step_(\d+)_training_input\.pkl$")
KEYS = ("sequences", "response_mask", "loss_mask", "rollout_logprobs", "action_log_probs", "advantages")
SEQ_STRIDE = 10**6
BATCH_MODULE = "skyrl.backends.skyrl_train.training_batch"
PICKLE_WARNING = (
    "unpickling runs code named in the file: import skyrl only for files you made yourself "
    "(proxaudit resolves nothing but SkyRL's batch rebuild and torch.device)"
)


def find(paths: Sequence[str | Path]) -> list[Path]:
    """`global_step_*_training_input.pkl` files, sorted by step; a folder is searched recursively."""
    return dump_files(paths, lambda folder: folder.rglob("global_step_*_training_input.pkl"), _step_number)


def _step_number(path: Path) -> int:
    match = NAME.match(path.name)
    if match is None:
        raise ImportFormatError(f"{path}: not a SkyRL dump (global_step_{{N}}_training_input.pkl)")
    return int(match.group(1))


class _Batch(dict):
    """Stand-in for SkyRL's `TrainingInputBatch`: the tensors by key, as numpy arrays, and its metadata."""

    metadata: dict


def _tensor(value: dict | None) -> np.ndarray | None:
    if value is None:
        return None
    if value.get("format") == "torch":
        import torch

        return torch.load(io.BytesIO(value["data"]), weights_only=True).float().numpy()
    if value.get("format") == "tensor_list":
        return None  # images of multimodal samples: nothing to audit
    return np.frombuffer(value["data"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])


def _rebuild(cls, state: dict) -> _Batch:
    """Stand-in for SkyRL's `_rebuild_tensor_batch`: decode `__getstate__`'s tensors, run nothing."""
    batch = _Batch({key: _tensor(value) for key, value in state["batch_dict"].items()})
    batch.metadata = state.get("metadata") or {}
    return batch


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == BATCH_MODULE and name == "_rebuild_tensor_batch":
            return _rebuild
        if module == BATCH_MODULE and name in ("TrainingInputBatch", "TensorBatch"):
            return _Batch
        if (module, name) == ("torch", "device"):
            import torch

            return torch.device
        raise pickle.UnpicklingError(f"refused: the file names {module}.{name}")


UNREADABLE = (pickle.UnpicklingError, EOFError, ValueError, KeyError, TypeError, AttributeError, RuntimeError)
"""What a truncated or foreign pickle raises on load (torch's bytes inside it too)."""


def _unpickled(path: Path, source: BinaryIO) -> object:
    try:
        return _Unpickler(source).load()
    except UNREADABLE as error:
        raise ImportFormatError(
            f"{path}: not SkyRL's TrainingInputBatch as its current `save` writes it ({error})"
        ) from None


def _load(path: Path) -> _Batch:
    with dump_file(path, "SkyRL") as f:
        batch = _unpickled(path, f)
    if not isinstance(batch, _Batch):
        raise ImportFormatError(f"{path}: holds a {type(batch).__name__}, not a TrainingInputBatch")
    missing = [k for k in KEYS if batch.get(k) is None]
    if missing:
        raise ImportFormatError(
            f"{path}: no {', '.join(missing)} (rollout_logprobs needs the generator to return log-probs)"
        )
    shapes = {k: batch[k].shape for k in KEYS[1:]}
    rows = shapes["response_mask"][:1]
    if len(set(shapes.values())) != 1 or len(rows) != 1 or batch["sequences"].shape[:1] != rows:
        raise ImportFormatError(f"{path}: response tensors of different shapes: {shapes}")
    return batch


def _pad_size(path: Path, batch: _Batch) -> int:
    """The rows `pad_training_input_batch` appended (0 in a dump written before SkyRL recorded it)."""
    pad = batch.metadata.get("pad_size", 0) if isinstance(batch.metadata, dict) else 0
    if not isinstance(pad, int) or not 0 <= pad < len(batch["sequences"]):
        raise ImportFormatError(f"{path}: metadata pad_size {pad!r} is not a count of padding rows")
    return pad


def out_name(path: Path, run_id: str) -> str:
    return f"{run_id}-global_step_{_step_number(path)}.parquet"


def convert(path: Path, out_dir: Path, run_id: str, trust_pickle: bool = False) -> ImportResult:
    """One step's batch to `{run_id}-global_step_{N}.parquet`; refused without `trust_pickle`."""
    n = _step_number(path)
    if not trust_pickle:
        raise ImportFormatError(f"{path}: a pickle; give --trust-pickle to read it ({PICKLE_WARNING})")
    batch = _load(path)
    real = len(batch["sequences"]) - _pad_size(path, batch)
    response = batch["response_mask"][:real]
    width = response.shape[1]
    tokens = batch["sequences"][:, -width:]
    rewards = batch.get("rewards")
    result = ImportResult(path, None)
    with LogWriter(out_dir / out_name(path, run_id), source=f"skyrl:{path.name}") as writer:
        for row in range(len(response)):
            generated = response[row] > 0
            rows = response_rows(
                token_ids=tokens[row].astype(np.int64),
                token_mask=generated,
                loss_mask=generated & (batch["loss_mask"][row] > 0),
                behave_logp=batch["rollout_logprobs"][row].astype(float),
                prox_logp=batch["action_log_probs"][row].astype(float),
                advantage=batch["advantages"][row].astype(float),
            )
            if rows is None:
                result.skip("without a generated token")
                continue
            reward = float(rewards[row][generated].sum()) if rewards is not None else np.nan  # older dumps
            writer.add(
                rows, run_id=run_id, step=n - 1, minibatch=0, n_minibatches=1, seq_id=n * SEQ_STRIDE + row,
                behave_version=n - 1, reward=reward,
            )  # fmt: skip
            result.count(rows)
        result.out = writer.close()
    return result
