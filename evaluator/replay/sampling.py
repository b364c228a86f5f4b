"""`--sample-sequences F`: summarise a deterministic fraction F of the sequences.

A sequence is kept when a 64-bit hash of its identity, (run_id, seq_id), falls under F * 2^64: the same
sequences whichever file, batch, worker or machine reads them, so files and workers agree and a replay
again keeps the same ones. Whole sequences are kept (the per-sequence metrics stay whole). The hash is
BLAKE2b of the run_id (8 bytes) xor the seq_id, through SplitMix64's finaliser (which spreads consecutive
seq_ids uniformly).

The stored metrics are then those of the kept sequences: means, rates and quantiles estimate the whole
run's; counts (`n`) are the sample's. The 95% intervals stay a bootstrap over steps: each step's sums are
those of its sampled sequences, so the replicates vary with the sampling as well as with the steps, and
the interval widens as F shrinks (tests/test_sampling.py checks its coverage).
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_GOLDEN, _M1, _M2 = (
    np.uint64(0x9E3779B97F4A7C15),
    np.uint64(0xBF58476D1CE4E5B9),
    np.uint64(0x94D049BB133111EB),
)


@functools.lru_cache(maxsize=1024)
def _run_hash(run_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(run_id.encode(), digest_size=8).digest(), "little")


def sequence_hash(run_ids: pa.Array, seq_ids: pa.Array) -> np.ndarray:
    """`[rows]` uint64: the hash of each row's (run_id, seq_id)."""
    encoded = (
        pc.dictionary_encode(run_ids).combine_chunks()
        if isinstance(run_ids, pa.ChunkedArray)
        else (pc.dictionary_encode(run_ids))
    )
    salts = np.array([_run_hash(r) for r in encoded.dictionary.to_pylist()], dtype=np.uint64)
    x = np.asarray(seq_ids, dtype=np.int64).view(np.uint64) ^ salts[np.asarray(encoded.indices)]
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def kept(run_ids: pa.Array, seq_ids: pa.Array, fraction: float) -> np.ndarray:
    """`[rows]` bool: the rows of the sequences `fraction` keeps (all of them at 1)."""
    if fraction >= 1:
        return np.ones(len(seq_ids), dtype=bool)
    return sequence_hash(run_ids, seq_ids) < np.uint64(int(fraction * 2.0**64))


def sampled(batch: pa.RecordBatch, fraction: float) -> pa.RecordBatch:
    """The batch's rows of the kept sequences."""
    if fraction >= 1:
        return batch
    return batch.filter(pa.array(kept(batch["run_id"], batch["seq_id"], fraction)))
