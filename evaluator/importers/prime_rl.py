"""prime-rl's token exports (`TokenExporter.export` in `src/prime_rl/trainer/rl/token_export.py`, called by
`train` in `src/prime_rl/trainer/rl/train.py`, PrimeIntellect-ai/prime-rl at 559b447):
`token_exports/step_{N}/rank_{R}.jsonl`, one JSON line per packed sequence the trainer rank trained on at
step N (prime-rl's `progress.step`, 1-based: step N starts from the policy of version N - 1).

Per line (record `schema_version` 1): `step`, `rank`, `micro_step`, `micro_sequence_idx`,
`export_sequence_idx`, `env_name`, and per position `token_ids`, `loss_mask`, `advantages`,
`inference_logprobs`, `trainer_logprobs` (the log-prob of the token at each position: prime-rl shifts its
labels left and the log-probs back right; non-finite values are written as null) and derived columns.
Exports of 2026-06-10 to 2026-08-08 (multi-run) add `run_id` and `export_step` (the run's own step, the
folder's N); exports before 2026-06-27 add per-position `rewards`.

Mapping: behave = `inference_logprobs`, prox = theta = `trainer_logprobs` (the loss's own forward pass
at the step's one update, before it), `step = N - 1` (schema v1's step starts from weights of version
`step`), `seq_id = N * 10^9 + R * 10^6 + export_sequence_idx`, reward = the largest of `rewards` where the
export has it, else none. The export has no versions: `behave_version = step` is assumed
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
    number,
    numbers,
    response_rows,
)

NAME = re.compile(r"^rank_(\d+)\.jsonl$")
STEP_DIR = re.compile(r"^step_(\d+)$")
KEYS = ("token_ids", "loss_mask", "advantages", "inference_logprobs", "trainer_logprobs")
STEP_STRIDE, RANK_STRIDE = 10**9, 10**6


def find(paths: Sequence[str | Path]) -> list[Path]:
    """`step_*/rank_*.jsonl` files, sorted by step and rank; a folder is searched recursively."""
    return dump_files(paths, lambda folder: folder.rglob("rank_*.jsonl"), _step_rank)


def _step_rank(path: Path) -> tuple[int, int]:
    name, folder = NAME.match(path.name), STEP_DIR.match(path.parent.name)
    if name is None or folder is None:
        raise ImportFormatError(f"{path}: not a prime-rl token export (token_exports/step_N/rank_R.jsonl)")
    return int(folder.group(1)), int(name.group(1))


def out_name(path: Path, run_id: str) -> str:
    step, rank = _step_rank(path)
    return f"{run_id}-step_{step}-rank_{rank}.parquet"


def convert(path: Path, out_dir: Path, run_id: str) -> ImportResult:
    """One rank's file of one step to `{run_id}-step_{N}-rank_{R}.parquet` under `out_dir`."""
    step, rank = _step_rank(path)
    result = ImportResult(path, None)
    with LogWriter(
        out_dir / out_name(path, run_id), source=f"prime-rl:{path.parent.name}/{path.name}"
    ) as writer:
        for line_no, record in jsonl(path, KEYS, "prime-rl"):
            where = f"{path}: line {line_no}"
            arrays = numbers(record, KEYS, where)  # null -> nan
            mask = np.nan_to_num(arrays["loss_mask"]) > 0
            response = response_rows(
                token_ids=arrays["token_ids"].astype(np.int64),
                token_mask=mask,
                loss_mask=mask,
                behave_logp=arrays["inference_logprobs"],
                prox_logp=arrays["trainer_logprobs"],
                advantage=arrays["advantages"],
            )
            if response is None:
                result.skip("without a generated token")
                continue
            rewards = numbers(record, ["rewards"], where)["rewards"] if record.get("rewards") else np.empty(0)
            own_step = int(number(record.get("export_step", record.get("step", step)), where, "step")) - 1
            seq = int(number(record.get("export_sequence_idx", line_no - 1), where, "export_sequence_idx"))
            writer.add(
                response, run_id=str(record.get("run_id") or run_id), step=own_step, minibatch=0,
                n_minibatches=1, seq_id=step * STEP_STRIDE + rank * RANK_STRIDE + seq,
                behave_version=own_step,
                reward=float(np.nanmax(rewards)) if np.isfinite(rewards).any() else np.nan,
            )  # fmt: skip
            result.count(response)
        result.out = writer.close()
    return result
