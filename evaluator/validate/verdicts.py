"""What every check of the findings shares: the thresholds several use, the check's verdict types, and
the helpers that turn figures into a `Finding` (`evaluator.validate.findings` runs the checks)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from evaluator.problems import Finding
from evaluator.validate.evidence import RunEvidence

MIN_TOKENS = 300
"""A finding needs at least this many tokens of the kind it looks at: fewer make a rate or a mean one
unlucky batch."""
MIN_RESPONSES = 100
"""... or this many responses (pairs, groups) where it judges responses: a rate of 50% over 100 responses
is 10 standard errors from a rate of 0."""
EXACT_SHARE = 0.95
"""Share of tokens with two log-probs exactly equal above which they come from one source: two policies
of different versions never agree to the last float32 bit on 95% of stale tokens."""
THETA_NOISE = 0.02
"""Mean |theta - prox| (nats) under which theta equals prox up to numerical noise (the same weights: an
fp32 recompute matches to 1e-6, a bf16 autocast forward to about 1e-2). Also the least movement of the
policy within a step that the checks reading it can tell from noise."""


@dataclass(frozen=True)
class Undecided:
    """The data cannot decide the check on this run: why (a column absent, one minibatch, too few)."""

    why: str


Verdict = Finding | Undecided | None
"""A check's verdict on a run: a finding, undecided (why), or None (passed)."""


@dataclass(frozen=True)
class Check:
    """One check of the findings: its name, the rules it can raise and the column it reads."""

    name: str
    rules: tuple[str, ...]
    judge: Callable[[RunEvidence, int | None], Verdict]


def too_few(n: float, what: str, least: int = MIN_TOKENS) -> Undecided | None:
    """Undecided when `n` (of `what`) is under `least`."""
    return Undecided(f"{int(n):,} {what}, fewer than {least:,}") if n < least else None


def welch_z(n1: float, s1: float, q1: float, n2: float, s2: float, q2: float) -> tuple[float, float]:
    """(mean1 - mean2, Welch's z) from counts, sums and sums of squares; z 0 where the spread is 0."""
    m1, m2 = s1 / n1, s2 / n2
    v1 = max(q1 / n1 - m1 * m1, 0.0) * n1 / max(n1 - 1, 1)
    v2 = max(q2 / n2 - m2 * m2, 0.0) * n2 / max(n2 - 1, 1)
    se = math.sqrt(v1 / n1 + v2 / n2)
    return m1 - m2, (m1 - m2) / se if se > 0 else 0.0


def correlation(sxy: float, sxx: float, syy: float) -> float:
    """Pearson's r from centred sums (0 where either spread is 0)."""
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


def movement_z(e: RunEvidence, kind: str) -> tuple[float, float, float, float] | None:
    """(positive minus negative mean movement, Welch's z, its standard error, responses) of `kind`."""
    rows = e.movement.filter(pl.col("kind") == kind).group_by("sign").agg(pl.col("n", "sum", "sum_sq").sum())
    by = {r["sign"]: r for r in rows.iter_rows(named=True)}
    if 1 not in by or -1 not in by or min(by[1]["n"], by[-1]["n"]) < MIN_RESPONSES / 2:
        return None
    p, q = by[1], by[-1]
    diff, z = welch_z(p["n"], p["sum"], p["sum_sq"], q["n"], q["sum"], q["sum_sq"])
    return diff, z, (diff / z if z else float("inf")), p["n"] + q["n"]
