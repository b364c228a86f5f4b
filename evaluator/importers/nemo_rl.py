"""NeMo-RL's `train_data_step{N}.jsonl` (GRPO, `nemo_rl/algorithms/grpo.py`, written by
`Logger.log_batched_dict_as_jsonl`): one JSON line per sample of the step's training batch.

Per line: `token_ids`, `token_loss_mask`, `generation_logprobs`, `prev_logprobs` and `advantages` over
the padded sequence (prompt and response), the log-prob of the token at each position (NeMo-RL prepends
0 for position 0); `sample_loss_mask`, `rewards`, `input_lengths` and `idx` per sample.

Mapping: behave = `generation_logprobs` (the inference engine), prox = `prev_logprobs` (the trainer's
log-prob before the step's update: the recompute), theta = prox (one update per step: minibatch 0 starts
from prox). `step = N - 1` (the file of step N trains from the weights of N - 1 updates),
`seq_id = N * 10^6 + idx`. The dump has no versions: `behave_version = step` is assumed
(docs/importers.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from evaluator.importers.rows import (
    ImportFormatError,
    ImportResult,
    LogWriter,
    dump_files,
    jsonl,
    response_rows,
)

NAME = re.compile(r"^train_data_step(\d+)\.jsonl$")
KEYS = ("token_ids", "token_loss_mask", "generation_logprobs", "prev_logprobs", "advantages")
SEQ_STRIDE = 10**6


def find(paths: Sequence[str | Path]) -> list[Path]:
    """`train_data_step*.jsonl` files, sorted by step; a folder is searched recursively."""
    return dump_files(paths, lambda folder: folder.rglob("train_data_step*.jsonl"), _step_number)


def _step_number(path: Path) -> int:
    match = NAME.match(path.name)
    if match is None:
        raise ImportFormatError(f"{path}: not a NeMo-RL train_data_step{{N}}.jsonl file name")
    return int(match.group(1))


def convert(path: Path, out_dir: Path, run_id: str) -> ImportResult:
    """One step's file to `{run_id}-train_data_step{N}.parquet` under `out_dir`."""
    n = _step_number(path)
    result = ImportResult(path, None)
    with LogWriter(out_dir / f"{run_id}-{path.stem}.parquet", source=f"nemo-rl:{path.name}") as writer:
        for line_no, sample in jsonl(path, KEYS, "NeMo-RL"):
            length = int(sample.get("input_lengths", len(sample["token_ids"])))
            arrays = {k: np.asarray(sample[k], dtype=float)[:length] for k in KEYS}
            keep = float(sample.get("sample_loss_mask", 1.0)) > 0
            response = response_rows(
                token_ids=arrays["token_ids"].astype(np.int64),
                token_mask=arrays["token_loss_mask"] > 0,
                loss_mask=(arrays["token_loss_mask"] > 0) & keep,
                behave_logp=arrays["generation_logprobs"],
                prox_logp=arrays["prev_logprobs"],
                advantage=arrays["advantages"],
            )
            if response is None:
                result.skip("without a generated token")
                continue
            idx = int(sample.get("idx", line_no - 1))
            writer.add(
                response, run_id=run_id, step=n - 1, minibatch=0, n_minibatches=1,
                seq_id=n * SEQ_STRIDE + idx, behave_version=n - 1,
                reward=float(sample.get("rewards", np.nan)),
            )  # fmt: skip
            result.count(response)
        result.out = writer.close()
    return result
