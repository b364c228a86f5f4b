"""`--sample-sequences F`: which sequences are kept (a hash of (run_id, seq_id), the same everywhere), what
a sampled replay stores, and the coverage of the intervals of a sampled run (as tests/test_bootstrap.py
checks the bootstrap's)."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evaluator.errors import StoreError
from evaluator.formulas.bootstrap import percentile_interval, ratio_replicates, step_draws
from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import replay
from evaluator.replay.sampling import kept
from evaluator.store import open_store
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

MASK = (1 << 64) - 1


def reference_kept(run_id: str, seq_id: int, fraction: float) -> bool:
    """The documented rule, one sequence at a time with Python integers: BLAKE2b of the run_id (8 bytes,
    little-endian) xor the seq_id, SplitMix64's finaliser, kept under fraction * 2^64."""
    x = int.from_bytes(hashlib.blake2b(run_id.encode(), digest_size=8).digest(), "little") ^ (seq_id & MASK)
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return (x ^ (x >> 31)) < int(fraction * 2.0**64)


def test_the_kept_sequences_follow_the_rule_whatever_the_batch():
    runs = pa.array(["a"] * 500 + ["b"] * 500 + ["a"] * 200)
    seqs = pa.array(list(range(500)) + list(range(500)) + list(range(-100, 100)), pa.int64())
    whole = kept(runs, seqs, 0.3)
    assert whole.tolist() == [
        reference_kept(r, s, 0.3) for r, s in zip(runs.to_pylist(), seqs.to_pylist(), strict=True)
    ]
    pieces = np.concatenate([kept(runs[i : i + 77], seqs[i : i + 77], 0.3) for i in range(0, 1200, 77)])
    np.testing.assert_array_equal(pieces, whole)
    assert whole[:500].tolist() != whole[500:1000].tolist()  # another run, other sequences
    assert kept(runs, seqs, 1.0).all()


def test_the_kept_share_is_the_fraction():
    n = 200_000
    share = kept(pa.array(["run"] * n), pa.array(np.arange(n), pa.int64()), 0.1).mean()
    assert abs(share - 0.1) < 4 * np.sqrt(0.1 * 0.9 / n)  # a binomial's 4 sigma


def test_a_sampled_replay_stores_the_kept_sequences_metrics(tmp_path):
    spec = SyntheticSpec(run_id="s", tokens_per_step=2048, mean_length=16)
    log = write_log_atomic(synthetic_steps(spec, 0, 6), tmp_path / "s.parquet")
    report = replay([log], tmp_path / "m", progress=False, workers=1, sample=0.25)
    assert report.clean
    t = pq.read_table(log).to_pandas()
    keep = np.array([reference_kept(r, s, 0.25) for r, s in zip(t["run_id"], t["seq_id"], strict=True)])
    loss = t[keep & t["loss_mask"].to_numpy()]
    truth = loss[loss["prox_logp"].notna()]
    drift = np.abs(truth["prox_logp"].to_numpy(np.float64) - truth["behave_logp"].to_numpy(np.float64))
    with open_store(tmp_path / "m") as con:
        n_tokens, n_rows = con.execute("SELECT n_tokens, n_rows FROM ingested_file").fetchone()
        n, mean = con.execute(
            "SELECT n, mean FROM run_summary WHERE method = 'ground_truth' AND metric = 'drift'"
        ).fetchone()
    assert (n_rows, n_tokens) == (len(t), len(loss)) and 0.15 < len(loss) / t["loss_mask"].sum() < 0.35
    assert n == len(drift) and mean == pytest.approx(drift.mean(), rel=1e-9)
    with pytest.raises(StoreError, match="--sample-sequences 0.25; this replay asks for 0.5"):
        replay([log], tmp_path / "m", progress=False, workers=1, sample=0.5)


RUNS, STEPS, SEQUENCES = 200, 60, 64


def sampled_flip_run(rng: np.random.Generator, seed: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-step (flips, tokens) of the kept sequences: 64 sequences a step of 4-40 tokens, each step its
    own flip probability Beta(20, 980) (the true rate is 2 / 100); the sequences kept by the hash rule."""
    flips, tokens = np.zeros(STEPS), np.zeros(STEPS)
    for step in range(STEPS):
        lengths = rng.integers(4, 41, SEQUENCES)
        seq_ids = np.arange(SEQUENCES, dtype=np.int64) + step * SEQUENCES
        keep = kept(pa.array([f"run-{seed}"] * SEQUENCES), pa.array(seq_ids), fraction)
        flipped = rng.binomial(lengths, rng.beta(20, 980))
        flips[step], tokens[step] = flipped[keep].sum(), lengths[keep].sum()
    return flips, tokens


@pytest.mark.parametrize("fraction", [1.0, 0.25])
def test_intervals_of_a_sampled_run_cover_the_true_rate(fraction):
    """The bootstrap over steps of the kept sequences' per-step sums covers the true rate about 95% of the
    time, sampled or not; sampling widens the intervals (the replicates carry its noise)."""
    rng = np.random.default_rng(11)
    draws = step_draws(STEPS)
    covered, widths = 0, []
    for seed in range(RUNS):
        flips, tokens = sampled_flip_run(rng, seed, fraction)
        lower, upper = percentile_interval(ratio_replicates(flips[:, None], tokens[:, None], draws))
        covered += lower[0] <= 0.02 <= upper[0]
        widths.append(upper[0] - lower[0])
    assert 0.88 <= covered / RUNS <= 0.99, covered
    if fraction < 1:
        full = np.random.default_rng(11)
        full_widths = []
        for seed in range(RUNS):
            flips, tokens = sampled_flip_run(full, seed, 1.0)
            lower, upper = percentile_interval(ratio_replicates(flips[:, None], tokens[:, None], draws))
            full_widths.append(upper[0] - lower[0])
        assert np.median(widths) > 1.2 * np.median(full_widths)
