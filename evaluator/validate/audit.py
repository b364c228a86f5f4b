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

Each check first extracts its evidence (`evaluator.validate.audit_sample`: the per-token comparisons at
every shift), then `judge_evidence` decides. Evidence of several files of one run pools by
concatenation (`pool`), so a shift that one short file cannot show is decided on the run
(`evaluator.validate.call`). When
`behave_logp` and `theta_logp` both fit `prox_logp` better at the same shift, `prox_logp` is the shifted
one and is reported as such.
"""

from __future__ import annotations

import duckdb
import numpy as np

from evaluator.problems import Problem
from evaluator.validate.audit_sample import (
    MIN_TOKENS,
    SHIFTS,
    Evidence,
    LogpEvidence,
    MismatchEvidence,
    ShiftFit,
    audit_evidence,
    behave_strata,
    load_sample,
    logp_fit,
    mismatch_fit,
    theta_strata,
)

MIN_WIN_RATE = 0.65
"""... and be closer on at least this fraction of the compared tokens (a correct log with staleness up
to 8 and a fast-moving policy stays under 0.35; a shifted one is at 0.68-1.0)."""
MAX_KEPT_ANCHORS = 20_000
"""Comparisons a file keeps per check for pooling (an even stride over them beyond)."""


CHECKS = ("behave_logp", "theta_logp", "version_equality", "version_proximal_t")


def audit_alignment(
    con: duckdb.DuckDBPyConnection, usable: frozenset[str], n_rows: int
) -> tuple[list[Problem], list[str], dict[str, Evidence]]:
    """Run every check on the view `src`; returns (misalignment problems, notes, the evidence)."""
    if not {"seq_id", "pos"} <= usable:
        return [], ["alignment audit skipped: needs seq_id and pos"], {}
    sample, notes = load_sample(con, usable, n_rows)
    evidence = audit_evidence(sample)
    problems, verdicts = judge_evidence(evidence)
    return problems, notes + verdicts, {k: _kept(e) for k, e in evidence.items()}


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
        return logp_fit(evidence, behave_strata if check == "behave_logp" else theta_strata)
    return mismatch_fit(evidence)


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
