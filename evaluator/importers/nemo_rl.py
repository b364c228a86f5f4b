"""NeMo-RL's `train_data_step{N}.jsonl` (GRPO: `grpo_train` and `async_grpo_train` in
`nemo_rl/algorithms/grpo.py`, written by `Logger.log_batched_dict_as_jsonl` in `nemo_rl/utils/logger.py`,
NVIDIA-NeMo/RL at 7ea279a): one JSON line per sample of the step's training batch.

The logger writes each line from `make_microbatch_iterator(1)`, a slice of one sample, so every value
but `idx` is a one-element list: `"token_ids": [[...]]`, `"input_lengths": [L]`, `"rewards": [r]`.
Older dumps (and hand-written ones) hold the bare values; both are read.

Per sample: `token_ids`, `token_loss_mask`, `generation_logprobs`, `prev_logprobs` and `advantages` over
the padded sequence (prompt and response), the log-prob of the token at each position (NeMo-RL prepends
0 for position 0); `sample_loss_mask`, `rewards` (the raw reward), `input_lengths` and `idx`.

Mapping: behave = `generation_logprobs` (the inference engine), prox = `prev_logprobs` (the trainer's
log-prob before the step's update: the recompute), theta = prox (one update per step: minibatch 0 starts
from prox). `step = N - 1` (the file of step N trains from the weights of N - 1 updates),
`seq_id = N * 10^6 + idx`. The dump has no versions: `behave_version = step` is assumed. With
`force_on_policy_ratio` NeMo-RL skips the recompute and dumps `prev_logprobs` as zeros: imported as they
are, and `validate` warns (`prox_logp_zero`). docs/importers.md.
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
    number,
    numbers,
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


def out_name(path: Path, run_id: str) -> str:
    return f"{run_id}-{path.stem}.parquet"


def unwrap(record: dict, where: str) -> dict:
    """Undo `make_microbatch_iterator(1)`: a record whose `token_ids` is a list holding one list has every
    value (but `idx`) as a one-element list; a record of bare values is returned as it is."""
    tokens = record["token_ids"]
    if not (isinstance(tokens, list) and len(tokens) == 1 and isinstance(tokens[0], list)):
        return record
    out = {"idx": record["idx"]} if "idx" in record else {}
    for key, value in record.items():
        if key == "idx":
            continue
        if not (isinstance(value, list) and len(value) == 1):
            raise ImportFormatError(
                f"{where}: {key} is not a one-element list as make_microbatch_iterator(1) writes "
                f"every value of a line whose token_ids is [[...]]"
            )
        out[key] = value[0]
    return out


def convert(path: Path, out_dir: Path, run_id: str) -> ImportResult:
    """One step's file to `{run_id}-train_data_step{N}.parquet` under `out_dir`."""
    n = _step_number(path)
    result = ImportResult(path, None)
    with LogWriter(out_dir / out_name(path, run_id), source=f"nemo-rl:{path.name}") as writer:
        for line_no, sample in jsonl(path, KEYS, "NeMo-RL", unwrap):
            where = f"{path}: line {line_no}"
            arrays = numbers(sample, KEYS, where)
            width = len(arrays["token_ids"])
            length = int(number(sample.get("input_lengths", width), where, "input_lengths"))
            if not 0 <= length <= width:
                raise ImportFormatError(f"{where}: input_lengths {length} beyond the line's {width} tokens")
            arrays = {k: v[:length] for k, v in arrays.items()}
            keep = number(sample.get("sample_loss_mask", 1.0), where, "sample_loss_mask") > 0
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
            idx = int(number(sample.get("idx", line_no - 1), where, "idx"))
            reward = sample.get("rewards")
            writer.add(
                response, run_id=run_id, step=n - 1, minibatch=0, n_minibatches=1,
                seq_id=n * SEQ_STRIDE + idx, behave_version=n - 1,
                reward=np.nan if reward is None else number(reward, where, "rewards"),
            )  # fmt: skip
            result.count(response)
        result.out = writer.close()
    return result
