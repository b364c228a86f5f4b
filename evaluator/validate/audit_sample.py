"""The alignment audit's evidence (`evaluator.validate.audit` judges it): a sample of whole sequences
from the file, and per check the comparisons of X at pos i+s with the reference at pos i for each shift
s, reduced to the statistics a verdict reads (`ShiftFit`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import numpy as np

SHIFTS = (-1, 0, 1)
MAX_AUDIT_TOKENS = 300_000
"""Audit at most about this many tokens of a file (a sample of whole sequences beyond it)."""
HASH_BUCKETS = 1 << 16
MIN_TOKENS = 50
"""Fewest compared tokens (anchors or boundary tokens) for a verdict."""
RATIO = 4.0
"""Versions: the best shift's mismatch rate must beat shift 0's by this factor."""
LOGP_RATIO = 1.5
"""Log-probs: the best shift's median abs diff must beat shift 0's by this factor ..."""
DISTINCT = 0.5
"""An anchor's prox_logp differs from both neighbours' by at least this (nats)."""
LOGP_FLOOR = 0.1
"""Median abs diff at shift 0 below this is never called misaligned (nats)."""
RATE_FLOOR = 0.15
"""Version mismatch rate at shift 0 below this is never called misaligned."""

_SAMPLE_COLUMNS = (
    "step",
    "minibatch",
    "behave_version",
    "prox_logp",
    "behave_logp",
    "theta_logp",
    "proximal_t_logp",
    "proximal_t_version",
)


@dataclass(frozen=True)
class ShiftFit:
    """How well X at pos i+s matches R at pos i, for each shift s."""

    x: str
    reference: str
    stat: dict[int, float]
    """Median abs diff (log-probs) or mismatch rate (versions) per shift."""
    n: int
    """Tokens compared (the fewest over the shifts)."""
    stat_name: str
    floor: float
    ratio: float
    """How many times better than shift 0 the best shift must be."""
    scope: str = ""
    """Which tokens were compared, e.g. `staleness <= 1`."""
    wins: dict[int, float] | None = None
    """Log-probs: the fraction of compared tokens on which shift s is strictly closer than shift 0."""


@dataclass
class LogpEvidence:
    """|X at pos i+s - prox_logp at pos i| over anchor tokens i, for s in SHIFTS, with their strata."""

    x: str
    error: np.ndarray  # (3, n) one row per shift
    staleness: np.ndarray  # (n,)
    minibatch: np.ndarray  # (n,)


@dataclass
class MismatchEvidence:
    """Whether X at pos i+s differs from R at pos i, near segment boundaries (NaN: not compared)."""

    names: tuple[str, str]
    mismatch: np.ndarray  # (3, n) one row per shift: 1.0 differs, 0.0 equal, NaN not compared


Evidence = LogpEvidence | MismatchEvidence | str  # a str says why the check has none


def audit_evidence(sample: dict[str, np.ndarray]) -> dict[str, Evidence]:
    """Each check's comparisons on a sample of whole sequences."""
    return {
        "behave_logp": _logp_evidence(sample, "behave_logp"),
        "theta_logp": _logp_evidence(sample, "theta_logp"),
        "version_equality": _version_equality_evidence(sample),
        "version_proximal_t": _version_proximal_t_evidence(sample),
    }


def load_sample(
    con: duckdb.DuckDBPyConnection, usable: frozenset[str], n_rows: int
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Rows of whole sequences sorted by sequence and pos; `g` numbers the sequences 0, 1, ..."""
    keys = ", ".join(k for k in ("run_id", "seq_id", "minibatch") if k in usable)
    selected = ", ".join(
        f"{c}::DOUBLE AS {c}" if c in usable else f"NULL::DOUBLE AS {c}" for c in _SAMPLE_COLUMNS
    )
    where, notes = "seq_id IS NOT NULL AND pos IS NOT NULL", []
    if n_rows > MAX_AUDIT_TOKENS:
        buckets = max(1, HASH_BUCKETS * MAX_AUDIT_TOKENS // n_rows)
        where += f" AND hash(seq_id) % {HASH_BUCKETS} < {buckets}"
    result = con.execute(f"""SELECT dense_rank() OVER (ORDER BY {keys}) - 1 AS g, pos::BIGINT AS pos,
        {selected} FROM src WHERE {where} ORDER BY g, pos""").fetchnumpy()
    sample = {k: np.ma.filled(np.ma.asarray(v).astype(np.float64), np.nan) for k, v in result.items()}
    if n_rows > MAX_AUDIT_TOKENS:
        notes.append(
            f"alignment audit on a deterministic sample of whole sequences (hash of seq_id): "
            f"{len(sample['pos']):,} of {n_rows:,} tokens"
        )
    return sample, notes


def shifted(x: np.ndarray, nxt: np.ndarray, s: int) -> np.ndarray:
    """`x` at the token `s` positions later in the same sequence (NaN where there is none)."""
    out = np.full_like(x, np.nan)
    if s == 0:
        return x
    if s == 1:
        out[:-1] = np.where(nxt[:-1], x[1:], np.nan)
    else:
        out[1:] = np.where(nxt[:-1], x[:-1], np.nan)
    return out


def _next_in_sequence(sample: dict[str, np.ndarray]) -> np.ndarray:
    """True where the next row is the next position of the same sequence."""
    g, pos = sample["g"], sample["pos"]
    nxt = np.zeros(len(g), dtype=bool)
    nxt[:-1] = (g[1:] == g[:-1]) & (pos[1:] == pos[:-1] + 1)
    return nxt


# --- log-prob checks ----------------------------------------------------------------------------------


def _logp_evidence(sample: dict[str, np.ndarray], x_name: str) -> LogpEvidence | str:
    """|X at pos i+s - prox_logp at pos i| over anchor tokens i (prox differs from both neighbours)."""
    x, prox = sample[x_name], sample["prox_logp"]
    if np.isnan(prox).all():
        return f"{x_name} vs prox_logp inconclusive: no prox_logp on any sequence"
    nxt = _next_in_sequence(sample)
    x_at = {s: shifted(x, nxt, s) for s in SHIFTS}
    gaps = [np.abs(prox - shifted(prox, nxt, s)) for s in (-1, 1)]
    anchor = np.minimum(*gaps) >= DISTINCT  # NaN (no neighbour, no prox) compares False
    anchor &= np.isfinite(np.stack(list(x_at.values()))).all(axis=0)
    error = np.stack([np.abs(x_at[s][anchor] - prox[anchor]) for s in SHIFTS])  # (3, n)
    staleness = (sample["step"] - sample["behave_version"])[anchor]
    return LogpEvidence(x_name, error, staleness, sample["minibatch"][anchor])


def logp_fit(evidence: LogpEvidence, strata: Callable[[LogpEvidence], tuple]) -> ShiftFit:
    """Median abs diff of X at pos i+s against prox_logp at pos i, over the chosen anchors."""
    chosen, scope = strata(evidence)
    error = {s: evidence.error[k][chosen] for k, s in enumerate(SHIFTS)}
    stat = {s: float(np.median(e)) if len(e) else np.nan for s, e in error.items()}
    wins = {s: float(np.mean(e < error[0])) if len(e) else np.nan for s, e in error.items()}
    n = int(chosen.sum())
    return ShiftFit(evidence.x, "prox_logp", stat, n, "median abs diff", LOGP_FLOOR, LOGP_RATIO, scope, wins)


def behave_strata(evidence: LogpEvidence) -> tuple[np.ndarray, str]:
    """behave_logp on the freshest tokens: the lowest staleness cut with MIN_TOKENS anchors."""
    staleness = evidence.staleness
    for level in np.unique(staleness[np.isfinite(staleness)]):
        chosen = staleness <= level
        if chosen.sum() >= MIN_TOKENS:
            return chosen, f"staleness <= {level:g}"
    return np.ones(len(staleness), dtype=bool), "all staleness"


def theta_strata(evidence: LogpEvidence) -> tuple[np.ndarray, str]:
    """theta_logp at minibatch 0 (where theta == prox) when it has MIN_TOKENS anchors."""
    first = evidence.minibatch == 0
    return (
        (first, "minibatch 0")
        if first.sum() >= MIN_TOKENS
        else (np.ones(len(first), bool), "all minibatches")
    )


# --- version checks -----------------------------------------------------------------------------------


def _last_segment(sample: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(token is in its sequence's last segment, sequence has several segments), per row."""
    g, bv = sample["g"].astype(np.int64), sample["behave_version"]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.array([], dtype=np.int64)
    group = np.cumsum(np.r_[False, g[1:] != g[:-1]]) if len(g) else g
    top = np.fmax.reduceat(bv, starts)[group] if len(g) else bv
    low = np.fmin.reduceat(bv, starts)[group] if len(g) else bv
    return bv == top, low < top


def _mismatch_evidence(
    sample: dict[str, np.ndarray], x: np.ndarray, ref: np.ndarray, valid: np.ndarray, names: tuple[str, str]
) -> MismatchEvidence:
    """Whether X at pos i+s differs from R at pos i, over tokens next to a change of X or R."""
    nxt = _next_in_sequence(sample)
    x = np.where(valid, x, np.nan)
    ref = np.where(valid, ref, np.nan)
    near = np.zeros(len(x), dtype=bool)
    for series in (x, ref):
        for s in (-1, 1):
            other = shifted(series, nxt, s)
            near |= np.isfinite(other) & np.isfinite(series) & (other != series)
    rows = []
    for s in SHIFTS:
        xs = shifted(x, nxt, s)[near]
        compared = np.isfinite(xs) & np.isfinite(ref[near])
        rows.append(np.where(compared, (xs != ref[near]).astype(float), np.nan))
    return MismatchEvidence(names, np.stack(rows))


def mismatch_fit(evidence: MismatchEvidence) -> ShiftFit:
    """Mismatch rate of X at pos i+s against R at pos i per shift."""
    stat, counts = {}, []
    for row, s in zip(evidence.mismatch, SHIFTS, strict=True):
        compared = ~np.isnan(row)
        counts.append(int(compared.sum()))
        stat[s] = float(np.mean(row[compared])) if compared.any() else np.nan
    scope = "tokens next to a segment boundary"
    x, ref = evidence.names
    return ShiftFit(x, ref, stat, min(counts), "mismatch rate", RATE_FLOOR, RATIO, scope)


def _version_equality_evidence(sample: dict[str, np.ndarray]) -> MismatchEvidence | str:
    """The last segment of behave_version vs where proximal_t_logp equals behave_logp exactly."""
    name = "behave_version (last segment) vs proximal_t_logp == behave_logp"
    last, multi = _last_segment(sample)
    pt, behave = sample["proximal_t_logp"], sample["behave_logp"]
    valid = multi & np.isfinite(pt) & np.isfinite(behave)
    if not valid.any():
        return f"{name} inconclusive: no proximal_t_logp on multi-segment sequences"
    equal = pt == behave
    if equal[valid & last].mean() < 0.5 or equal[valid & ~last].mean() > 0.5:
        return f"{name} inconclusive: proximal_t_logp does not equal behave_logp in last segments only"
    names = ("behave_version", "proximal_t_logp == behave_logp")
    return _mismatch_evidence(sample, last.astype(float), equal.astype(float), valid, names)


def _version_proximal_t_evidence(sample: dict[str, np.ndarray]) -> MismatchEvidence | str:
    """behave_version (+1 where a later segment follows) vs proximal_t_version."""
    last, multi = _last_segment(sample)
    bv, ptv = sample["behave_version"], sample["proximal_t_version"]
    valid = multi & np.isfinite(bv) & np.isfinite(ptv)
    if not valid.any():
        return "behave_version vs proximal_t_version inconclusive: no proximal_t on multi-segment sequences"
    expected = bv + np.where(last, 0.0, 1.0)
    names = ("behave_version (+1 before the last segment)", "proximal_t_version")
    return _mismatch_evidence(sample, expected, ptv, valid, names)
