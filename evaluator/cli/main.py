"""The `proxaudit` command line: each command parses options, calls one library function, and
maps the library's named exceptions to exit codes here and only here.

Exit codes: 0 clean / pass, 1 a file broke a rule or a check failed, 2 usage error or nothing usable.
"""

from __future__ import annotations

import sys

import click

from evaluator import __version__
from evaluator.cli.common import EXIT_FINDINGS, EXIT_OK, library_errors, say
from evaluator.cli.exchange import export_cmd
from evaluator.cli.importing import import_cmd
from evaluator.cli.loss import loss_choice, loss_command, loss_options
from evaluator.cli.outputs import ReportFile
from evaluator.cli.tools import bench, dashboard, demo, train_demo
from evaluator.inputs import Range
from evaluator.options import Number

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


_max_staleness = click.option(
    "--max-staleness",
    type=click.IntRange(min=0),
    default=None,
    help="The trainer's maximum off-policyness (AReaL max_head_offpolicyness): staler tokens are an error.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="proxaudit")
def cli() -> None:
    """Audit the proximal log-probability approximation of an asynchronous decoupled-PPO trainer."""


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="A readable table, or JSON (per file: path, n_rows, ok, readable, problems, notes; per run: "
    "findings with their evidence, and every check's outcome).",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Table: also show notes (what the alignment audit compared) and the checks that passed.",
)
@_max_staleness
@library_errors
def validate(paths, fmt, verbose, max_staleness) -> None:
    """Check the token logs in PATHS (files, folders searched for *.parquet, or object-storage URIs such
    as s3://bucket/prefix/) against schema v1:
    columns, types and schema version, log-prob and version values, duplicate rows and pos gaps,
    proximal_t, the alignment audit (columns shifted by one token); then across the files of each run:
    a token in two files, and the data-driven findings (errors fail the run's files, warnings inform).

    Exit code 0 when every file is clean (warnings allowed), 1 when some file broke a rule, 2 when a path
    does not exist or no file could be read.
    """
    from evaluator.validate import require_readable, validate_paths
    from evaluator.validate.found import found_lines
    from evaluator.validate.report import render_json, render_table

    checked = validate_paths(paths, max_staleness)
    reports, findings, checks = checked.reports, checked.findings, checked.checks
    if fmt == "table":
        say("\n".join(found_lines(checked.folders)))
    text = (
        render_json(reports, findings, checks)
        if fmt == "json"
        else render_table(reports, findings, checks, verbose=verbose)
    )
    say(text, fmt)
    require_readable(reports)
    sys.exit(EXIT_OK if all(r.ok for r in reports) else EXIT_FINDINGS)


@cli.command()
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="Metrics database from `replay`.")
@click.option(
    "--thresholds",
    type=click.Path(dir_okay=False),
    default=None,
    help="Thresholds file (TOML). Default: the bundled schemas/default_thresholds.toml.",
)
@click.option(
    "--run", "run_id", default=None, help="Judge only this run (default: every run in the database)."
)
@click.option("--junit", type=ReportFile(), help="Write JUnit XML here (one test case per check).")
@click.option(
    "--markdown", type=ReportFile(), help="Write Markdown here (e.g. $GITHUB_STEP_SUMMARY on GitHub Actions)."
)
@click.option("--json", "json_path", type=ReportFile(), help="Write every verdict as JSON here.")
@library_errors
def gate(db, thresholds, run_id, junit, markdown, json_path) -> None:
    """Judge the metrics in DB against the checks of a thresholds file.

    Exit code 0 when every check passes (warnings allowed), 1 when any check fails (including a metric
    the database lacks or too few tokens), 2 for a bad thresholds file, a missing database, a --run it
    does not hold, or a report path that cannot take a file (empty, a folder: checked first).
    """
    from evaluator.gate.judge import DEFAULT_THRESHOLDS, run_gate
    from evaluator.gate.report import render_table, write_reports
    from evaluator.summary import gate_verdict_text

    result = run_gate(db, thresholds or DEFAULT_THRESHOLDS, run=run_id)
    say(render_table(result))
    say("\n" + gate_verdict_text(result))
    write_reports(result, junit=junit, markdown=markdown, json_path=json_path)
    sys.exit(result.exit_code)


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option(
    "--db", required=True, type=click.Path(dir_okay=False), help="Metrics database (created if missing)."
)
@click.option(
    "--progress/--no-progress", default=None, help="Progress bar on stderr (default: when a terminal)."
)
@loss_options
@_max_staleness
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="local",
    default=None,
    metavar="[ADDRESS]",
    help="Check and summarise files as Ray tasks: alone, a local Ray on this machine's cores; with an "
    "address, that cluster (needs proxaudit[ray]; workers must reach the files by the same paths, so "
    "object-storage URIs only with a local Ray).",
)
@library_errors
def replay(paths, db, progress, max_staleness, ray_address, **loss_keys) -> None:
    """Validate the token logs in PATHS (files, folders, or object-storage URIs such as s3://bucket/prefix/,
    copied to a temporary folder first), replay them through every estimator and store
    their metric summaries in DB. Files already in DB (same bytes) are skipped; each file is ingested in
    one transaction. The decision metrics (clip and bound flips, gradient mass error) are computed under
    the loss given here (`proxaudit loss` lists the presets); a DB keeps one loss. The data-driven
    findings are judged on the files of this call: an error skips the run's files, a warning is printed
    and stored with the run.

    Exit code 0 when every file was ingested or already there, 1 when a file broke a validation rule (it
    is skipped, the others are ingested), 2 for a usage error, a DB of other thresholds, or when no file
    could be read.
    """
    from evaluator.replay.pipeline import replay as replay_paths
    from evaluator.validate.found import found_lines
    from evaluator.validate.report import findings_lines

    choice = loss_choice(**loss_keys)
    say("\n".join(choice.lines()))
    echo = lambda outcome: say(outcome.line())  # noqa: E731
    report = replay_paths(
        paths,
        db,
        on_file=echo,
        on_found=lambda folders: say("\n".join(found_lines(folders))),
        progress=progress,
        loss=choice.loss,
        max_staleness=max_staleness,
        ray=ray_address,
    )
    warnings = [f for f in report.findings if f.severity == "warning"]
    if warnings:
        say("\n".join(findings_lines(warnings)))
    say(f"{report.n_ingested} of {len(report.outcomes)} files ingested into {db}")
    sys.exit(EXIT_OK if report.clean else EXIT_FINDINGS)


@cli.command()
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="Metrics database from `replay`.")
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
@library_errors
def summary(
    db, run_id, by, method, metric, fmt, max_gradient_mass_error, max_clip_flip_rate, min_tokens
) -> None:
    """Print the public views of DB: n, mean, min, max, p50, p90, p99 of every metric (--by run,
    staleness or step), or the derived figures: AReaL's shipped pairing, the decision figures with each
    method's safe staleness, the weight diagnostics, the engine mismatch floor.

    A run none of whose tokens has prox_logp (the ground truth) has no error or decision figure: a line
    says so (on stderr for json and csv). Exit code 0, or 2 for a missing database, an unknown run,
    method or metric, and when such runs leave nothing to show.
    """
    from evaluator.summary import (
        NOTES,
        compact,
        render,
        require_rows,
        summary_table,
        trainers_text,
        truth_notes,
        verdict_text,
    )
    from schemas.store import Tolerance

    tolerance = Tolerance(max_gradient_mass_error, max_clip_flip_rate, min_tokens)
    table = summary_table(db, by=by, run=run_id, method=method, metric=metric, tolerance=tolerance)
    notes = truth_notes(db, run_id)
    require_rows(table, notes)
    say(render(compact(table, by) if fmt == "table" else table, fmt), fmt)
    if fmt == "table" and by == "decision":
        say("\n" + verdict_text(db, tolerance, run_id, method))
    if fmt == "table" and by == "trainers":
        say("\n" + trainers_text(db, run_id))
    if by in NOTES and fmt == "table":
        click.echo(f"\n{NOTES[by]}")
    if notes:
        say("\n" + "\n".join(notes), err=fmt != "table")


@cli.command()
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="Metrics database from `replay`.")
@click.argument("sql")
@_table_format
@library_errors
def query(db, sql, fmt) -> None:
    """Run one SQL query on DB, opened read-only, and print its rows: the public views (run_summary,
    decision_summary, safe_staleness(...), ...) with DuckDB's SQL, no other tool needed. One statement
    that reads: SELECT (WITH, FROM, VALUES, TABLE, DESCRIBE, SHOW and SUMMARIZE too); any other (DROP,
    CREATE, INSERT, SET, ...) is refused, exit 2."""
    from evaluator.summary import query_table, render

    say(render(query_table(db, sql), fmt), fmt)


cli.add_command(import_cmd)
cli.add_command(loss_command)
cli.add_command(export_cmd)
for command in (bench, train_demo, dashboard, demo):
    cli.add_command(command)


def main() -> None:
    # click's own usage errors exit with 2 already, which matches our convention.
    cli(prog_name="proxaudit")
