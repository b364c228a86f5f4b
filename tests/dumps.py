"""Per-token dumps built exactly as other trainers write them (test data for the importers), from a
schema v1 table: each response gets a prompt in front, the log-prob of the token at each position
(position 0 of the prompt has none: 0), and the batch's padding. `shift` rolls the behaviour log-probs by
one position inside each sequence: the adapter bug the alignment audit must catch after import."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

PROMPT = 5


def _sequences(table: pa.Table):
    """(step, seq_id, columns of the response sorted by pos) per sequence."""
    frame = table.to_pandas().sort_values(["step", "seq_id", "pos"])
    for (step, seq_id), rows in frame.groupby(["step", "seq_id"], sort=True):
        yield int(step), int(seq_id), rows


def _full(rows, column: str, fill: float, shift: int = 0) -> list[float]:
    """Prompt positions then the response's values; `shift` rolls the whole sequence's values."""
    values = np.r_[np.full(PROMPT, fill), rows[column].to_numpy(dtype=float)]
    return np.roll(values, shift).tolist() if shift else values.tolist()


def nemo_rl_dump(table: pa.Table, folder: Path, shift: int = 0) -> list[Path]:
    """`train_data_step{N}.jsonl` per step (N = step + 1), one line per sample, arrays padded to the
    batch's longest sequence, as NeMo-RL's GRPO loop logs its training batch."""
    by_step: dict[int, list[dict]] = {}
    for step, _, rows in _sequences(table):
        n = len(rows)
        by_step.setdefault(step, []).append(
            {
                "content": [[{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]],
                "rewards": float(rows["reward"].iloc[0]),
                "input_lengths": PROMPT + n,
                "token_ids": [1] * PROMPT + rows["token_id"].astype(int).tolist(),
                "token_loss_mask": [0] * PROMPT + rows["loss_mask"].astype(int).tolist(),
                "sample_loss_mask": 1.0,
                "advantages": _full(rows, "advantage", 0.0),
                "generation_logprobs": _full(rows, "behave_logp", 0.0, shift),
                "prev_logprobs": _full(rows, "prox_logp", 0.0),
            }
        )
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    for step, samples in by_step.items():
        width = max(s["input_lengths"] for s in samples)
        path = folder / f"train_data_step{step + 1}.jsonl"
        with path.open("w") as f:
            for idx, s in enumerate(samples):
                for key in (
                    "token_ids",
                    "token_loss_mask",
                    "advantages",
                    "generation_logprobs",
                    "prev_logprobs",
                ):
                    s[key] = s[key] + [0] * (width - len(s[key]))
                f.write(json.dumps({**s, "idx": idx}) + "\n")
        written.append(path)
    return written


def prime_rl_dump(table: pa.Table, folder: Path, ranks: int = 2, shift: int = 0) -> list[Path]:
    """`token_exports/step_{N}/rank_{R}.jsonl` (N = step + 1: prime-rl counts from 1): each sequence on
    one rank, prompt and response, padding trimmed, the record fields of exports before 2026-06-27
    (with `rewards`)."""
    files: dict[tuple[int, int], list[dict]] = {}
    for i, (step, _, rows) in enumerate(_sequences(table)):
        rank = i % ranks
        records = files.setdefault((step, rank), [])
        n = PROMPT + len(rows)
        records.append(
            {
                "schema_version": 1, "step": step + 1, "rank": rank, "micro_step": 0,
                "micro_sequence_idx": len(records), "export_sequence_idx": len(records), "env_name": "math",
                "training_mode": "rl",
                "token_ids": [1] * PROMPT + rows["token_id"].astype(int).tolist(),
                "position_ids": list(range(n)),
                "loss_mask": [False] * PROMPT + rows["loss_mask"].astype(bool).tolist(),
                "advantages": _full(rows, "advantage", 0.0),
                "rewards": [float(rows["reward"].iloc[0])] * n,
                "inference_logprobs": _full(rows, "behave_logp", 0.0, shift),
                "trainer_logprobs": _full(rows, "prox_logp", 0.0),
                "entropy": [0.5] * n,
            }
        )  # fmt: skip
    written = []
    for (step, rank), records in sorted(files.items()):
        path = folder / "token_exports" / f"step_{step + 1}" / f"rank_{rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
        written.append(path)
    return written


def slime_dump(table: pa.Table, folder: Path, shift: int = 0, resumed: int = 0) -> list[Path]:
    """`--dump-details` as slime writes it: `rollout_data/{id}.pt` (`{"rollout_id", "samples":
    [Sample.to_dict()]}`, response-only log-probs and masks, one weight version per generate call as
    slime counts pushes: `behave_version + 1`, train.py's) and `train_data/{id}.pt` (`format_version` 2,
    one dict per sample with tensors over the response). The first `resumed` samples of each rollout
    list two versions (generated across a weight update)."""
    import torch

    written = []
    by_step: dict[int, list] = {}
    for step, _, rows in _sequences(table):
        by_step.setdefault(step, []).append(rows)
    for step, samples in by_step.items():
        rollout, train = [], []
        for i, rows in enumerate(samples):
            n = len(rows)
            tokens = [1] * PROMPT + rows["token_id"].astype(int).tolist()
            behave = (
                np.roll(rows["behave_logp"].to_numpy(float), shift)
                if shift
                else rows["behave_logp"].to_numpy(float)
            )
            versions = sorted({str(v + 1) for v in rows["behave_version"]})
            if i < resumed:
                versions = [versions[0], str(int(versions[0]) + 1)]
            rollout.append({
                "group_index": i // 4, "index": i, "rollout_id": None, "prompt": "...", "tokens": tokens,
                "response": "...", "response_length": n, "label": None,
                "reward": float(rows["reward"].iloc[0]),
                "loss_mask": rows["loss_mask"].astype(int).tolist(), "weight_versions": versions,
                "rollout_log_probs": behave.tolist(), "status": "completed", "metadata": {},
                "spec_info": {"spec_accept_token_num": 0}, "prefix_cache_info": {"cached_tokens": 0},
            })  # fmt: skip
            train.append({
                "data_parallel_rank": 0, "sample_index": i, "rollout_position": i,
                "tokens": torch.tensor(tokens), "response_lengths": n, "total_lengths": PROMPT + n,
                "rollout_log_probs": torch.tensor(behave, dtype=torch.float32),
                "log_probs": torch.tensor(rows["prox_logp"].to_numpy(float), dtype=torch.float32),
                "loss_masks": torch.tensor(rows["loss_mask"].astype(int).to_numpy()),
                "advantages": torch.tensor(rows["advantage"].to_numpy(float), dtype=torch.float32),
                "rewards": float(rows["reward"].iloc[0]),
            })  # fmt: skip
        for kind, payload in (
            ("rollout_data", {"rollout_id": step, "samples": rollout}),
            ("train_data", {"format_version": 2, "rollout_id": step, "rank": 0, "samples": train,
                            "dp_shards": [{"rank": 0, "data_parallel_rank": 0}], "raw_reward": []}),
        ):  # fmt: skip
            path = folder / kind / f"{step}.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(payload, path)
            written.append(path)
    return written


SKYRL_MODULE = "skyrl.backends.skyrl_train.training_batch"


def _skyrl_classes():
    """SkyRL's batch classes as its `training_batch` module defines them for pickling: a dict subclass
    whose `__reduce__` calls the module-level `_rebuild_tensor_batch` with `__getstate__`'s numpy bytes."""
    import sys
    import types

    import torch

    def _rebuild_tensor_batch(cls, state):
        raise AssertionError("proxaudit must not call SkyRL's code")

    class TensorBatch(dict):
        def __reduce__(self):
            batch_dict = {
                k: None if v is None else
                {"format": "numpy", "data": v.tobytes(), "shape": v.shape, "dtype": str(v.dtype)}
                for k, v in self.items()
            }  # fmt: skip
            state = {"batch_dict": batch_dict, "batch_size": len(self["sequences"]),
                     "device": torch.device("cpu"), "metadata": {"global_step": self.step}}  # fmt: skip
            return (_rebuild_tensor_batch, (type(self), state))

    class TrainingInputBatch(TensorBatch):
        pass

    parts = SKYRL_MODULE.split(".")
    modules = {
        ".".join(parts[: i + 1]): types.ModuleType(".".join(parts[: i + 1])) for i in range(len(parts))
    }
    leaf = modules[SKYRL_MODULE]
    for obj in (_rebuild_tensor_batch, TensorBatch, TrainingInputBatch):
        obj.__module__, obj.__qualname__ = SKYRL_MODULE, obj.__name__
        setattr(leaf, obj.__name__, obj)
    return modules, TrainingInputBatch, sys.modules


def skyrl_dump(table: pa.Table, folder: Path, shift: int = 0) -> list[Path]:
    """`dumped_data/global_step_{N}_training_input.pkl` (N = step + 1), `pickle.dump(TrainingInputBatch)`
    as SkyRL's `dump_data` writes it: tensors padded on the left, response-only ones over the longest
    response."""
    import pickle

    modules, batch_class, sys_modules = _skyrl_classes()
    by_step: dict[int, list] = {}
    for step, _, rows in _sequences(table):
        by_step.setdefault(step, []).append(rows)
    written = []
    sys_modules.update(modules)
    try:
        for step, samples in by_step.items():
            width = max(len(r) for r in samples)
            B = len(samples)
            keys = ("loss_mask", "rollout_logprobs", "action_log_probs", "advantages", "rewards")
            arrays = {k: np.zeros((B, width), np.float32) for k in keys}
            response_mask = np.zeros((B, width), np.int64)
            sequences = np.zeros((B, PROMPT + width), np.int64)
            for b, rows in enumerate(samples):
                n = len(rows)
                behave = rows["behave_logp"].to_numpy(float)
                arrays["rollout_logprobs"][b, -n:] = np.roll(behave, shift) if shift else behave
                arrays["action_log_probs"][b, -n:] = rows["prox_logp"].to_numpy(float)
                arrays["advantages"][b, -n:] = rows["advantage"].to_numpy(float)
                arrays["loss_mask"][b, -n:] = rows["loss_mask"].to_numpy(float)
                arrays["rewards"][b, -1] = float(rows["reward"].iloc[0])
                response_mask[b, -n:] = 1
                sequences[b, -(n + PROMPT) :] = [1] * PROMPT + rows["token_id"].astype(int).tolist()
            batch = batch_class(sequences=sequences, response_mask=response_mask, values=None, **arrays)
            batch.step = step + 1
            path = folder / "dumped_data" / f"global_step_{step + 1}_training_input.pkl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(pickle.dumps(batch))
            written.append(path)
    finally:
        for name in modules:
            sys_modules.pop(name, None)
    return written
