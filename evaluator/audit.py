"""The alignment audit (DOMAIN.md section 5): is a column shifted by one token against the others?

Trainers hold log-probs rolled for next-token prediction; mixing a rolled tensor with an unrolled one
shifts values by one token without any error (seeds/000, bug 2). Each check compares a column X with a
reference R along each sequence `(run_id, seq_id, minibatch)` at shifts s in {-1, 0, +1}: X at pos i+s
against R at pos i. Shift s = +1 means X looks like `torch.roll(X_aligned, shifts=1)`.

| X | R | compared tokens | statistic |
| --- | --- | --- | --- |
| `behave_logp` | `prox_logp` | the lowest staleness with enough | median abs diff |
| `theta_logp` | `prox_logp` | minibatch 0 (theta == prox) if enough | median abs diff |
| `behave_version` is the last segment | `proximal_t_logp == behave_logp` | near boundaries | mismatch rate |
| `behave_version` (+1 before the last segment) | `proximal_t_version` | near boundaries | mismatch rate |

Log-prob checks compare only "anchor" tokens whose `prox_logp` differs from both neighbours' by at
least `DISTINCT`, so confident runs of near-zero log-probs cannot pass for a match at a wrong shift.
A shift is reported only when at least `MIN_TOKENS` tokens were compared, shift 0 is worse than an
absolute floor, and the shift beats shift 0 by a ratio (for log-probs also token by token on most of
them); anything short of that is a quiet "inconclusive" note.
Large files are audited on a deterministic sample of whole sequences (hash of `seq_id`), said in a note.

Each check first extracts its evidence (`audit_evidence`: the per-token comparisons at every shift), then
`judge_evidence` decides. Evidence of several files of one run pools by concatenation (`pool`), so a
shift that one short file cannot show is decided on the run (`evaluator.findings`). When `behave_logp`
and `theta_logp` both fit `prox_logp` better at the same shift, `prox_logp` is the shifted one and is
reported as such.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import numpy as np

from evaluator.problems import Problem

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
MIN_WIN_RATE = 0.65
"""... and be closer on at least this fraction of the compared tokens (a correct log with staleness up
to 8 and a fast-moving policy stays under 0.35; a shifted one is at 0.68-1.0)."""
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


MAX_KEPT_ANCHORS = 20_000
"""Comparisons a file keeps per check for pooling (an even stride over them beyond)."""


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
CHECKS = ("behave_logp", "theta_logp", "version_equality", "version_proximal_t")


def audit_alignment(
    con: duckdb.DuckDBPyConnection, usable: frozenset[str], n_rows: int
) -> tuple[list[Problem], list[str], dict[str, Evidence]]:
    """Run every check on the view `src`; returns (misalignment problems, notes, the evidence)."""
    if not {"seq_id", "pos"} <= usable:
        return [], ["alignment audit skipped: needs seq_id and pos"], {}
    sample, notes = _load_sample(con, usable, n_rows)
    evidence = audit_evidence(sample)
    problems, verdicts = judge_evidence(evidence)
    return problems, notes + verdicts, {k: _kept(e) for k, e in evidence.items()}


def audit_evidence(sample: dict[str, np.ndarray]) -> dict[str, Evidence]:
    """Each check's comparisons on a sample of whole sequences."""
    return {
        "behave_logp": _logp_evidence(sample, "behave_logp"),
        "theta_logp": _logp_evidence(sample, "theta_logp"),
        "version_equality": _version_equality_evidence(sample),
        "version_proximal_t": _version_proximal_t_evidence(sample),
    }


def _kept(evidence: Evidence) -> Evidence:
    """At most MAX_KEPT_ANCHORS comparisons (an even stride), what a file hands on for pooling."""
    if isinstance(evidence, str):
        return evidence
    n = (evidence.error if isinstance(evidence, LogpEvidence) else evidence.mismatch).shape[1]
    if n <= MAX_KEPT_ANCHORS:
        return evidence
    take = np.linspace(0, n - 1, MAX_KEPT_ANCHORS).astype(np.int64)
    if isinstance(evidence, LogpEvidence):
        return LogpEvidence(
            evidence.x, evidence.error[:, take], evidence.staleness[take], evidence.minibatch[take]
        )
    return MismatchEvidence(evidence.names, evidence.mismatch[:, take])


def pool(evidences: list[Evidence]) -> Evidence:
    """The evidence of several files of one run as one (concatenated); a str when none has any."""
    found = [e for e in evidences if not isinstance(e, str)]
    if not found:
        return evidences[0] if evidences else "no evidence"
    first = found[0]
    if isinstance(first, LogpEvidence):
        return LogpEvidence(
            first.x,
            np.concatenate([e.error for e in found], axis=1),
            np.concatenate([e.staleness for e in found]),
            np.concatenate([e.minibatch for e in found]),
        )
    return MismatchEvidence(first.names, np.concatenate([e.mismatch for e in found], axis=1))


def fit_of(check: str, evidence: Evidence) -> ShiftFit | str:
    """The statistics one check judges, from its evidence (a str: inconclusive, and why)."""
    if isinstance(evidence, str):
        return evidence
    if isinstance(evidence, LogpEvidence):
        return _logp_fit(evidence, _behave_strata if check == "behave_logp" else _theta_strata)
    return _mismatch_fit(evidence)


def judge_evidence(evidence: dict[str, Evidence]) -> tuple[list[Problem], list[str]]:
    """(misalignment problems, notes) of a file's or a run's pooled evidence. `behave_logp` and
    `theta_logp` shifted the same way against `prox_logp` are one problem: `prox_logp` is shifted."""
    problems, notes, shifted = [], [], {}
    for check, found in evidence.items():
        fit = fit_of(check, found)
        if isinstance(fit, str):
            notes.append(f"alignment: {fit}")
            continue
        finding, note = judge(fit)
        if not finding:
            notes.append(f"alignment: {note}")
        elif check in ("behave_logp", "theta_logp"):
            shifted[check] = (best_shift(fit), note)
        else:
            problems.append(Problem("misaligned_version", "behave_version", 0, note))
    if len(shifted) == 2 and shifted["behave_logp"][0] == shifted["theta_logp"][0]:
        s = -shifted["behave_logp"][0]
        message = (
            f"prox_logp fits behave_logp and theta_logp better shifted by {s:+d} token (both fit it at "
            f"{-s:+d}: {shifted['behave_logp'][1]}): prox_logp at pos i{s:+d} belongs to the token at pos i, "
            f"as after torch.roll(shifts={s:+d}); check how the recomputed log-probs are rolled"
        )
        problems.insert(0, Problem("misaligned_logp", "prox_logp", 0, message))
    else:
        problems[:0] = [Problem("misaligned_logp", check, 0, note) for check, (_, note) in shifted.items()]
    return problems, notes


def inconclusive(evidence: dict[str, Evidence]) -> dict[str, Evidence]:
    """The checks of a file's evidence that have comparisons but too few to decide: what pooling the
    run's files may settle."""
    out = {}
    for check, found in evidence.items():
        fit = fit_of(check, found)
        if not isinstance(fit, str) and not judge(fit)[0] and "inconclusive" in judge(fit)[1]:
            out[check] = found
    return out


def best_shift(fit: ShiftFit) -> int:
    return min(SHIFTS, key=lambda s: (fit.stat[s], s != 0))


def _beats(fit: ShiftFit, s: int, t: int) -> bool:
    """Shift s fits clearly better than shift t (one of them 0): by `fit.ratio` and, for log-probs, on
    at least `MIN_WIN_RATE` of the tokens."""
    if fit.stat[t] < max(fit.floor, fit.ratio * fit.stat[s]):
        return False
    if fit.wins is None:
        return True
    win_rate = fit.wins[s] if t == 0 else 1.0 - fit.wins[t]
    return win_rate >= MIN_WIN_RATE


def judge(fit: ShiftFit) -> tuple[bool, str]:
    """(misaligned?, explanation). Misaligned when a non-zero shift fits clearly better than shift 0."""
    if fit.n < MIN_TOKENS:
        return False, f"{fit.x} vs {fit.reference} inconclusive: only {fit.n} tokens to compare"
    s0 = fit.stat[0]
    best = best_shift(fit)
    shown = ", ".join(f"{fit.stat[s]:.3g} at {s:+d}" for s in SHIFTS if s != 0)
    where = f"{fit.n:,} tokens" + (f", {fit.scope}" if fit.scope else "")
    if best != 0 and _beats(fit, best, 0):
        closer = f", closer on {fit.wins[best]:.0%} of them" if fit.wins else ""
        return True, (
            f"{fit.x} fits {fit.reference} better shifted by {best:+d} token ({fit.stat_name} "
            f"{fit.stat[best]:.3g} vs {s0:.3g} at shift 0; {where}{closer}): {fit.x} at pos i{best:+d} "
            f"matches {fit.reference} at pos i, as after torch.roll(shifts={best:+d}); check the roll "
            "alignment"
        )
    if best == 0 and all(_beats(fit, 0, s) for s in SHIFTS if s != 0):
        return (
            False,
            f"{fit.x} vs {fit.reference} aligned ({fit.stat_name} {s0:.3g} at shift 0 vs {shown}; {where})",
        )
    return (
        False,
        f"{fit.x} vs {fit.reference} inconclusive ({fit.stat_name} {s0:.3g} at shift 0 vs {shown}; {where})",
    )


# --- the sample -------------------------------------------------------------------------------------


def _load_sample(
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


def _shifted(x: np.ndarray, nxt: np.ndarray, s: int) -> np.ndarray:
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
    x_at = {s: _shifted(x, nxt, s) for s in SHIFTS}
    gaps = [np.abs(prox - _shifted(prox, nxt, s)) for s in (-1, 1)]
    anchor = np.minimum(*gaps) >= DISTINCT  # NaN (no neighbour, no prox) compares False
    anchor &= np.isfinite(np.stack(list(x_at.values()))).all(axis=0)
    error = np.stack([np.abs(x_at[s][anchor] - prox[anchor]) for s in SHIFTS])  # (3, n)
    staleness = (sample["step"] - sample["behave_version"])[anchor]
    return LogpEvidence(x_name, error, staleness, sample["minibatch"][anchor])


def _logp_fit(evidence: LogpEvidence, strata: Callable[[LogpEvidence], tuple]) -> ShiftFit:
    """Median abs diff of X at pos i+s against prox_logp at pos i, over the chosen anchors."""
    chosen, scope = strata(evidence)
    error = {s: evidence.error[k][chosen] for k, s in enumerate(SHIFTS)}
    stat = {s: float(np.median(e)) if len(e) else np.nan for s, e in error.items()}
    wins = {s: float(np.mean(e < error[0])) if len(e) else np.nan for s, e in error.items()}
    n = int(chosen.sum())
    return ShiftFit(evidence.x, "prox_logp", stat, n, "median abs diff", LOGP_FLOOR, LOGP_RATIO, scope, wins)


def _behave_strata(evidence: LogpEvidence) -> tuple[np.ndarray, str]:
    """behave_logp on the freshest tokens: the lowest staleness cut with MIN_TOKENS anchors."""
    staleness = evidence.staleness
    for level in np.unique(staleness[np.isfinite(staleness)]):
        chosen = staleness <= level
        if chosen.sum() >= MIN_TOKENS:
            return chosen, f"staleness <= {level:g}"
    return np.ones(len(staleness), dtype=bool), "all staleness"


def _theta_strata(evidence: LogpEvidence) -> tuple[np.ndarray, str]:
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
            other = _shifted(series, nxt, s)
            near |= np.isfinite(other) & np.isfinite(series) & (other != series)
    rows = []
    for s in SHIFTS:
        xs = _shifted(x, nxt, s)[near]
        compared = np.isfinite(xs) & np.isfinite(ref[near])
        rows.append(np.where(compared, (xs != ref[near]).astype(float), np.nan))
    return MismatchEvidence(names, np.stack(rows))


def _mismatch_fit(evidence: MismatchEvidence) -> ShiftFit:
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
