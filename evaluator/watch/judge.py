"""A verdict per run, judged from the store's public views: the one function `watch` reads verdicts through
(`judge_runs`), and the small shape it needs of a verdict (`VerdictLike`).

The method is judged on its excess over the engine floor at each staleness `s` from 1 to `S` (the
trainer's maximum off-policyness, or the largest staleness with enough tokens), on the 95% intervals of
`decision_staleness_summary` (a bootstrap over steps), each staleness on its own: `pass` when the upper
bounds of the excess gradient mass error and clip flip rate are within the tolerance, `fail` when a lower
bound is beyond it, else `inconclusive`. Then the action, for the user's `S`:

- `ship`: every staleness 1..S passes (with the user's `S`: each has enough tokens, else `undecided`);
- `ship_up_to` (`max_staleness = k`): some staleness fails, and every one up to `k >= 1` passes;
- `do_not_ship`: some staleness fails and staleness 1 does not pass (keep the recompute);
- `undecided`: none fails, some straddle the tolerance (or nothing has enough tokens yet).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from evaluator.formulas.bootstrap import steps_to_decide
from evaluator.store import open_store
from evaluator.verdict import Floor, judged, percent
from schemas.store import DEFAULT_TOLERANCE, Tolerance

ACTIONS = ("ship", "ship_up_to", "do_not_ship", "undecided")
DEFAULT_METHOD = "loglinear_shipped"
"""What AReaL computes for `prox_logp_method: loglinear` (the default gate's method)."""
FIGURES = ("gradient_mass_error", "clip_flip_rate")
"""The excess figures judged at each staleness, each against its tolerance."""


class VerdictLike(Protocol):
    """What `watch` reads of a run's verdict (the decision's verdict object has these fields)."""

    run_id: str
    action: str
    """one of `ACTIONS`"""
    max_staleness: int | None
    """ship (up to) this staleness; the largest known safe for `undecided`; None when none is"""
    method: str
    reason: str


@dataclass(frozen=True)
class RunVerdict:
    run_id: str
    action: str
    max_staleness: int | None
    method: str
    reason: str
    steps_to_decide: int | None = None
    """`undecided`: about how many more steps with prox_logp would decide every straddling staleness"""


_LEVELS_SQL = """
    SELECT * FROM decision_staleness_summary
    WHERE method = ? AND staleness >= 1 AND n >= ? ORDER BY run_id, staleness"""


def judge_runs(
    db: str | os.PathLike,
    method: str = DEFAULT_METHOD,
    tolerance: Tolerance = DEFAULT_TOLERANCE,
    max_staleness: int | None = None,
) -> list[RunVerdict]:
    """The verdict of every run of the store at `db` (read-only) on `method`, sorted by run."""
    with open_store(db) as con:
        runs = [
            r for (r,) in con.execute("SELECT DISTINCT run_id FROM file_tokens ORDER BY run_id").fetchall()
        ]
        cursor = con.execute(_LEVELS_SQL, [method, tolerance.min_tokens])
        names = [d[0] for d in cursor.description]
        levels = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        floors = con.sql("SELECT * FROM engine_floor").to_arrow_table().to_pylist()
    by_floor = {row["run_id"]: Floor(row, tolerance) for row in floors}
    return [
        _verdict(run, [lv for lv in levels if lv["run_id"] == run], by_floor.get(run), method, tolerance,
                 max_staleness)
        for run in runs
    ]  # fmt: skip


def level_outcome(row: dict, tolerance: Tolerance) -> str:
    """`pass`, `fail`, `inconclusive` or `unmeasured`: the worst of the excess figures at one staleness."""
    found = {judged(*_excess(row, figure), _limit(tolerance, figure)) for figure in FIGURES} - {"unmeasured"}
    return next((v for v in ("fail", "inconclusive", "pass") if v in found), "unmeasured")


def _excess(row: dict, figure: str) -> tuple:
    name = f"excess_{figure}"
    return row[name], row[f"{name}_lower"], row[f"{name}_upper"]


def _limit(tolerance: Tolerance, figure: str) -> float:
    return (
        tolerance.max_gradient_mass_error if figure == "gradient_mass_error" else tolerance.max_clip_flip_rate
    )


def _verdict(
    run: str, levels: list[dict], floor: Floor | None, method: str, tolerance: Tolerance, user_max: int | None
) -> RunVerdict:
    """One run's verdict from its staleness levels with enough tokens (see the module docstring)."""
    judged_levels = [
        (lv["staleness"], level_outcome(lv, tolerance), lv)
        for lv in levels
        if user_max is None or lv["staleness"] <= user_max
    ]
    judged_levels = [(s, o, lv) for s, o, lv in judged_levels if o != "unmeasured"]
    floor_note = _floor_note(floor)
    if not judged_levels:
        up_to = "" if user_max is None else f" up to {user_max}"
        why = (
            f"no staleness from 1{up_to} has {tolerance.min_tokens} tokens with prox_logp yet "
            f"to judge {method} on{floor_note}"
        )
        return RunVerdict(run, "undecided", None, method, why)
    top = judged_levels[-1][0]
    safe = 0
    for s, outcome, _ in judged_levels:
        if outcome != "pass":
            break
        safe = s
    failing = [(s, lv) for s, o, lv in judged_levels if o == "fail"]
    straddling = [(s, lv) for s, o, lv in judged_levels if o == "inconclusive"]
    beyond = f"{method} beyond the engine floor"
    if not failing and not straddling:
        passes = f"{beyond} passes at every staleness 1-{top}"
        if user_max is not None and top < user_max:  # the trainer's stalest tokens are not judged yet
            why = (
                f"{passes}; staleness {top + 1}-{user_max} has fewer than {tolerance.min_tokens} tokens with "
            )
            return RunVerdict(run, "undecided", top, method, f"{why}prox_logp yet{floor_note}")
        return RunVerdict(run, "ship", top, method, f"{passes}{floor_note}")
    if failing:
        s, lv = failing[0]
        why = f"{beyond} fails at staleness {s}: {_figures(lv, tolerance)}"
        if safe >= 1:
            return RunVerdict(run, "ship_up_to", safe, method, f"{why}; passes up to {safe}{floor_note}")
        first, outcome, _ = judged_levels[0]
        if first < s:  # a failure further up, and the lowest staleness not passing either
            why += f"; staleness {first} is {outcome}: no staleness is known to be safe"
        return RunVerdict(run, "do_not_ship", None, method, why + floor_note)
    more = _steps([lv for _, lv in straddling], tolerance)
    s, lv = straddling[0]
    advice = f"; about {more} more step{'s' * (more != 1)} with prox_logp would decide it" if more else ""
    why = f"{beyond} is inconclusive at staleness {s}: {_figures(lv, tolerance)}{advice}{floor_note}"
    return RunVerdict(run, "undecided", safe or None, method, why, steps_to_decide=more)


def _figures(row: dict, tolerance: Tolerance) -> str:
    """The excess figures of one staleness with their intervals against the tolerance."""
    return ", ".join(
        f"excess {figure.replace('_', ' ')} {percent(*_excess(row, figure))} (tolerance "
        f"{percent(_limit(tolerance, figure))})"
        for figure in FIGURES
        if row[f"excess_{figure}"] is not None
    )


def _steps(rows: list[dict], tolerance: Tolerance) -> int | None:
    """About how many more steps decide the run: the fewest that make a figure fail whose point estimate is
    beyond its tolerance (one failing figure decides), else the most that make every straddling one pass."""
    over, under = [], []
    for row in rows:
        for figure in FIGURES:
            value, lower, upper = _excess(row, figure)
            limit = _limit(tolerance, figure)
            if None in (value, lower, upper) or not row["n_steps"] or not lower <= limit < upper:
                continue
            more = steps_to_decide(value, lower, upper, limit, row["n_steps"])
            if more is not None:
                (over if value > limit else under).append(more)
    return min(over) if over else max(under, default=None)


def _floor_note(floor: Floor | None) -> str:
    if floor is None or floor.verdict == "unmeasured":
        return ""
    moved = percent(floor.row["gradient_mass_error"], floor.row["gradient_mass_error_lower"],
                    floor.row["gradient_mass_error_upper"])  # fmt: skip
    return f" (the engine floor {floor.word}: {moved} of the gradient mass at staleness 0)"
