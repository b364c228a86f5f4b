"""prime-rl's token exports (`src/prime_rl/trainer/rl/token_export.py`): `token_exports/step_{N}/
rank_{R}.jsonl`, one JSON line per packed sequence the trainer rank trained on at step N.

Per line: `step`, `rank`, `export_sequence_idx` (and `run_id` in multi-run exports), and per position
`token_ids`, `loss_mask`, `advantages`, `rewards`, `inference_logprobs`, `trainer_logprobs` (the
log-prob of the token at each position: prime-rl shifts its labels left and the log-probs back right;
non-finite values are written as null).

Mapping: behave = `inference_logprobs`, prox = theta = `trainer_logprobs` (the loss's own forward pass
at the step's one update, before it), `seq_id = N * 10^9 + R * 10^6 + export_sequence_idx`. The export has
no versions: `behave_version = step` is assumed (docs/importers.md).
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


def convert(path: Path, out_dir: Path, run_id: str) -> ImportResult:
    """One rank's file of one step to `{run_id}-step_{N}-rank_{R}.parquet` under `out_dir`."""
    step, rank = _step_rank(path)
    result = ImportResult(path, None)
    name = f"{run_id}-step_{step}-rank_{rank}.parquet"
    with LogWriter(out_dir / name, source=f"prime-rl:{path.parent.name}/{path.name}") as writer:
        for line_no, record in jsonl(path, KEYS, "prime-rl"):
            arrays = {k: np.asarray(record[k], dtype=float) for k in KEYS}  # null -> nan
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
            rewards = np.asarray(record.get("rewards") or [np.nan], dtype=float)
            seq = int(record.get("export_sequence_idx", line_no - 1))
            writer.add(
                response, run_id=record.get("run_id") or run_id, step=int(record.get("step", step)),
                minibatch=0, n_minibatches=1, seq_id=step * STEP_STRIDE + rank * RANK_STRIDE + seq,
                behave_version=int(record.get("step", step)),
                reward=float(np.nanmax(rewards)) if np.isfinite(rewards).any() else np.nan,
            )  # fmt: skip
            result.count(response)
        result.out = writer.close()
    return result
