"""Run verl's own rollout_corr functions against proxaudit's rollout_corr views, on the fixture runs: a check
by hand, outside the suite (verl and its import-time dependencies are not proxaudit's), in two steps.

    .venv/bin/python -m tests.verl_check dump OUT        # proxaudit: replay the fixtures, dump views + tokens
    VERL_PYTHON tests/verl_check.py compare OUT          # a Python with verl and torch (CPU) installed

`compare` calls verl's compute_rollout_correction_and_rejection_mask (every sequence-level rollout_rs option,
rollout_is token and sequence at threshold 2.0) and calculate_debug_metrics' helpers on each method's tokens
of each run and of each step as one padded verl batch, and compares every verl-named column of
`rollout_corr_summary` and `rollout_corr_over(by_step := true)` to 1e-8 relative (a standard deviation from
stored sums and sums of squares loses up to ~n eps var / mean^2 to cancellation: 2.5e-9 seen on the
fixtures); the fractions to 1e-6 (verl averages them as float32: `.float().mean()`); and to 2e-8 absolute,
as verl's masked_mean divides by the count + 1e-8 (a relative 1e-8 / count, proxaudit divides by the count:
on a deviation |mean - 1| the difference is absolute; standard deviations are compared as variances).
Only numpy, torch and verl are imported there."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

SKIP = ("run_id", "step", "method", "rollout_is", "n", "n_sequences", "seq_is_ess_fraction",
        "seq_geo_weight_mean", "seq_geo_ess_fraction", "rollout_rs_token_k1_seq_masked_fraction")  # fmt: skip


def dump(out: Path) -> None:
    from evaluator.replay.pipeline import replay
    from evaluator.store import open_store
    from tests.conftest import FIXTURES
    from tests.reference import estimates, loss_tokens

    out.mkdir(parents=True, exist_ok=True)
    files = sorted(FIXTURES.glob("*.parquet"))
    replay(files, out / "m", progress=False)
    with open_store(out / "m") as con:
        views = {
            "run": con.sql("SELECT * FROM rollout_corr_summary").df(),
            "step": con.sql("SELECT * EXCLUDE (staleness) FROM rollout_corr_over(by_step := true)").df(),
        }
    (out / "views.json").write_text(json.dumps({v: df.to_dict("records") for v, df in views.items()}))
    df = loss_tokens(files)
    key = df.groupby(["run_id", "seq_id", "minibatch"], sort=False).ngroup().to_numpy()
    arrays = {f"method:{m}": v for m, v in estimates(df).items()}
    np.savez(out / "tokens.npz", run=df["run_id"].to_numpy(str), key=key, step=df["step"].to_numpy(),
             behave=df["behave_logp"].to_numpy(np.float64), **arrays)  # fmt: skip


def verl_batch(values, behave, key, pos):
    import torch

    codes, rows = np.unique(key, return_inverse=True)
    shape = (len(codes), int(pos.max()) + 1)
    old, rollout, mask = (torch.zeros(shape, dtype=torch.float64) for _ in range(3))
    old[rows, pos], rollout[rows, pos], mask[rows, pos] = torch.tensor(values), torch.tensor(behave), 1.0
    return old, rollout, mask


def verl_values(old, rollout, mask, mode: str) -> dict[str, float]:
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
    from verl.utils.debug.metrics import calculate_log_prob_diff, pearson_correlation_coefficient

    options = [
        f"seq_{agg}_k{k}" for k in (1, 2, 3) for agg in ("sum", "mean", "max") if (k, agg) != (1, "max")
    ]
    thresholds = ",".join("0.5_2.0" if o.endswith("k1") else "1.0" for o in options)
    _, _, metrics = compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, rollout_is=mode, rollout_is_threshold=2.0, rollout_rs=",".join(options),
        rollout_rs_threshold=thresholds,
    )  # fmt: skip
    out = {k.removeprefix("rollout_corr/"): v for k, v in metrics.items()}
    diff = calculate_log_prob_diff(old.exp(), rollout.exp(), mask.bool())
    pearson = pearson_correlation_coefficient(old.exp(), rollout.exp(), mask.bool())
    out |= {
        "rollout_probs_diff_mean": diff.mean().item(),
        "rollout_probs_diff_max": diff.max().item(),
        "rollout_probs_diff_std": diff.std().item(),
        "rollout_actor_probs_pearson_corr": pearson,
    }
    out["rollout_is_batch_norm_factor"] = (
        out["rollout_is_mean"] if mode == "token" else out["rollout_is_seq_mean"]
    )  # what verl logs with rollout_is_batch_normalize (the mean it divides by)
    return out


def compare(out: Path) -> None:
    views = json.loads((out / "views.json").read_text())
    tokens = np.load(out / "tokens.npz")
    run, key, step, behave = (tokens[k] for k in ("run", "key", "step", "behave"))
    pos = np.zeros(len(key), dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    pos = np.arange(len(key)) - np.repeat(starts, np.diff(np.r_[starts, len(key)]))
    compared, worst = 0, 0.0
    for view, rows in views.items():
        for row in rows:
            values = tokens[f"method:{row['method']}"]
            select = run == row["run_id"]
            if view == "step":
                select &= step == row["step"]
            whole = select & ~np.isnan(values)
            if np.isnan(values[select]).any() or not whole.any():
                continue  # a method without an estimate on some tokens (proximal_t): another batch
            expected = verl_values(
                *verl_batch(values[whole], behave[whole], key[whole], pos[whole]), row["rollout_is"]
            )
            for column, value in row.items():
                if column in SKIP or value is None or (isinstance(value, float) and np.isnan(value)):
                    continue
                want = expected[column]
                if column.endswith("_std"):  # compare variances: sqrt turns verl's 1e-8 into ~1e-4 / sqrt(n)
                    value, want = value * value, want * want
                scale = max(abs(want), 1e-12)
                if abs(want) > 1e-6:
                    worst = max(worst, abs(value - want) / scale)
                rel = 1e-6 if "fraction" in column else 1e-8  # verl takes its fractions' means in float32
                where = (view, row["run_id"], row.get("step"), row["method"], row["rollout_is"], column)
                assert abs(value - want) <= rel * scale + 2e-8, (*where, value, want)
                compared += 1
    print(
        f"{compared} values equal verl's own; largest relative difference where |verl's| > 1e-6: {worst:.2e}"
    )


if __name__ == "__main__":
    {"dump": dump, "compare": compare}[sys.argv[1]](Path(sys.argv[2]))
