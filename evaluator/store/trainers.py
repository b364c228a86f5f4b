"""Each trainer's own mismatch figure on the user's log (the view `trainer_mismatch`): the rows, and one
sentence per trainer that says what that trainer would log and whether its published line would hold,
for `summary --by trainers`, the gate's report and the dashboard.

    "your NeMo-RL would log token_mult_prob_error 1.037 (its line 1.05: within it) and gen_kl_error ..."
    "slime's --ci-test would pass at 0.1 (train_rollout_logprob_abs_diff 0.0085)"
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import groupby

import duckdb

from evaluator.duck import literal
from evaluator.text_table import printable

CHECKS = {
    ("slime", "train_rollout_logprob_abs_diff"): "slime's --ci-test",
    ("Miles", "rollout/log_probs - rollout/rollout_log_probs"): "Miles' --ci-test check",
}
"""The figures a trainer asserts in its CI: said as a check that would pass or fail."""


@dataclass(frozen=True)
class TrainerFigure:
    """One row of `trainer_mismatch`: a trainer's figure on one run at staleness 0, and its line."""

    run_id: str
    trainer: str
    metric: str
    value: float | None
    line: float | None
    within_line: bool | None
    n: int
    definition: str
    source: str

    def value_text(self) -> str:
        """The figure to 4 significant digits, or `unmeasured`."""
        return "unmeasured" if self.value is None or math.isnan(self.value) else f"{self.value:.4g}"

    def side(self) -> str:
        """`within` or `beyond` its line; empty without a line or a figure."""
        if self.line is None or self.within_line is None:
            return ""
        return "within" if self.within_line else "beyond"

    def phrase(self) -> str:
        """The figure and its line, e.g. `token_mult_prob_error 1.037 (its line 1.05: within it)`."""
        value = self.value_text()
        if (self.trainer, self.metric) in CHECKS:
            verdict = "would pass" if self.within_line else "would fail"
            return f"{CHECKS[self.trainer, self.metric]} {verdict} at {self.line:g} ({self.metric} {value})"
        if self.line is None:
            return f"{self.metric} {value}"
        side = f": {self.side()} it" if self.side() else ""
        return f"{self.metric} {value} (its line {self.line:g}{side})"


def trainer_figures(con: duckdb.DuckDBPyConnection, run: str | None = None) -> list[TrainerFigure]:
    """The rows of `trainer_mismatch` (of `run`, or every run): per run the floor, then each trainer."""
    where = f"WHERE run_id = {literal(run)}" if run is not None else ""
    order = "ORDER BY run_id, trainer <> 'proxaudit', trainer, metric"
    rows = con.sql(f"SELECT * FROM trainer_mismatch {where} {order}").to_arrow_table().to_pylist()
    return [TrainerFigure(**row) for row in rows]


def trainer_sentences(
    figures: list[TrainerFigure], quote: Callable[[str], str] = printable, runs: bool = True
) -> list[str]:
    """One sentence per (run, trainer): what that trainer would log on the run at staleness 0, after the run
    (`runs`); the run through `quote` (`printable` for the terminal, Markdown's or the page's)."""
    out = []
    for (run, trainer), group in groupby(figures, key=lambda f: (f.run_id, f.trainer)):
        group = list(group)
        plain = [f.phrase() for f in group if (f.trainer, f.metric) not in CHECKS]
        checks = [f.phrase() for f in group if (f.trainer, f.metric) in CHECKS]
        if trainer == "proxaudit":
            sentence = (
                f"proxaudit's engine floor (the inference engine against the trainer): {' and '.join(plain)}"
            )
        else:
            parts = ([f"your {trainer} would log {' and '.join(plain)}"] if plain else []) + checks
            sentence = "; ".join(parts)
        sentence = f"{sentence} (at staleness 0, {group[0].n:,} tokens)"
        out.append(f"{quote(run)}: {sentence}" if runs else sentence)
    return out


def trainer_report(
    con: duckdb.DuckDBPyConnection, run: str | None = None
) -> tuple[list[TrainerFigure], list[str]]:
    """The table's rows and one sentence per trainer: what the gate's report and the Overview show."""
    figures = trainer_figures(con, run)
    return figures, trainer_sentences(figures)
