"""`proxaudit summary` and `proxaudit query`: the store's public views as tables, and one read-only SQL
query. Registered on the main group by `evaluator.cli.main`."""

from __future__ import annotations

import sys

import click

from evaluator.cli.common import EXIT_FINDINGS, library_errors, say, terminal_width
from evaluator.cli.options import Number, db_option, judged_staleness_option, thresholds_option
from evaluator.inputs import Range

SUMMARY_VIEWS = {
    "run": "every metric per run",
    "staleness": "... per staleness",
    "step": "... per step",
    "pairing": "AReaL's shipped version pairing against each token's own",
    "decision": "gradient mass error, flip rates and safe staleness per method",
    "decision-staleness": "the decision figures per staleness",
    "weights": "ESS, chi2 and KL estimators of the behaviour weights",
    "weights-staleness": "... per staleness",
    "rollout-corr": "verl's rollout_corr diagnostics of each method's weights, by verl's names",
    "rollout-corr-staleness": "... per staleness",
    "mismatch": "the engine mismatch floor and its share of each staleness's drift",
    "trainers": "each trainer's own mismatch figure at staleness 0, against its published line",
    "what-if": "each run's decision under each loss of replay --loss a,b,c",
}

TOLERANCE = Range(0, low_open=False)
"""A tolerance on a rate or a share: a finite number >= 0."""

_table_format = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
    help="Output format.",
)


@click.command()
@db_option
@click.option("--run", "run_id", default=None, help="Only this run (default: every run).")
@click.option(
    "--by",
    type=click.Choice(list(SUMMARY_VIEWS)),
    default="run",
    show_default=True,
    help="What to summarise: " + "; ".join(f"{k}: {v}" for k, v in SUMMARY_VIEWS.items()) + ".",
)
@click.option("--method", default=None, help="Only this method (loglinear, linear, ..., ground_truth).")
@click.option("--metric", default=None, help="Only this metric (abs_error, importance_weight, ...).")
@_table_format
@click.option(
    "--max-gradient-mass-error",
    type=Number(TOLERANCE),
    default=0.01,
    show_default=True,
    help="--by decision: the safe staleness's tolerance on the gradient mass error.",
)
@click.option(
    "--max-clip-flip-rate",
    type=Number(TOLERANCE),
    default=0.01,
    show_default=True,
    help="--by decision: the safe staleness's tolerance on the clip flip rate.",
)
@click.option(
    "--min-tokens",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="--by decision: a staleness with fewer tokens is not judged for the safe staleness.",
)
@thresholds_option
@judged_staleness_option
@library_errors
def summary(
    db, run_id, by, method, metric, fmt, max_gradient_mass_error, max_clip_flip_rate, min_tokens, thresholds,
    max_staleness,
) -> None:  # fmt: skip
    """Print the public views of DB: n, mean, min, max, p50, p90, p99 of every metric (--by run,
    staleness or step), or the derived figures: AReaL's shipped pairing, the decision figures with each
    method's safe staleness, the weight diagnostics, the engine mismatch floor. `--by decision` first says
    the decision on each run, one line each, as `proxaudit gate` makes it (--thresholds, --max-staleness).
    Tables fit the terminal's width (COLUMNS): columns that do not fit are left out, and said.

    A run none of whose tokens has prox_logp (the ground truth) has no error or decision figure: a line
    says so (on stderr for json and csv). Exit code 0; 1 for a store that holds no run yet; 2 for a missing
    database, an unknown run, method or metric, and when such runs leave nothing to show.
    """
    from evaluator.gate import DEFAULT_THRESHOLDS
    from evaluator.text_table import wrapped
    from evaluator.verdict.summary import (
        NOTES,
        compact,
        decision_lines,
        render,
        require_rows,
        stored_runs,
        summary_table,
        trainers_text,
        truth_notes,
        what_if_lines,
    )
    from schemas.store import Tolerance

    if not stored_runs(db):
        say(
            f"no run in {db} yet: replay token logs into it first (proxaudit replay LOGS --db {db})", err=True
        )
        sys.exit(EXIT_FINDINGS)
    tolerance = Tolerance(max_gradient_mass_error, max_clip_flip_rate, min_tokens)
    table = summary_table(db, by=by, run=run_id, method=method, metric=metric, tolerance=tolerance)
    notes = truth_notes(db, run_id)
    require_rows(table, notes)
    if by == "what-if" and not table.num_rows:
        say(f"no what-if in {db}: replay with a list of losses (--loss a,b,c) to make it", err=True)
        sys.exit(EXIT_FINDINGS)
    width = terminal_width() if fmt == "table" else None
    if fmt == "table" and by == "decision":
        lines = decision_lines(db, thresholds or DEFAULT_THRESHOLDS, run_id, max_staleness, tolerance)
        say(wrapped("\n".join(lines), width) + "\n")
    say(render(compact(table, by) if fmt == "table" else table, fmt, width), fmt)
    if fmt == "table" and by == "trainers":
        say("\n" + wrapped(trainers_text(db, run_id), width))
    if fmt == "table" and by == "what-if":
        say("\n" + wrapped("\n".join(what_if_lines(table)), width))
    if by in NOTES and fmt == "table":
        click.echo("\n" + wrapped(NOTES[by], width))
    if notes:
        say("\n" + wrapped("\n".join(notes), width), err=fmt != "table")


@click.command()
@db_option
@click.argument("sql")
@_table_format
@library_errors
def query(db, sql, fmt) -> None:
    """Run one SQL query on DB, opened read-only, and print its rows: the public views (run_summary,
    decision_summary, safe_staleness(...), ...) with DuckDB's SQL, no other tool needed. One statement
    that reads: SELECT (WITH, FROM, VALUES, TABLE, DESCRIBE, SHOW and SUMMARIZE too); any other (DROP,
    CREATE, INSERT, SET, ...) is refused, exit 2."""
    from evaluator.verdict.query import query_table
    from evaluator.verdict.summary import render

    say(render(query_table(db, sql), fmt, terminal_width() if fmt == "table" else None), fmt)
