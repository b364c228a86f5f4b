"""The `proxaudit` command line: each command parses options, calls one library function, and
maps the library's named exceptions to exit codes here and only here.

Exit codes: 0 clean / pass, 1 a file broke a rule or a check failed, 2 usage error or nothing usable.
"""

from __future__ import annotations

import sys

import click

from evaluator import __version__
from evaluator.cli.common import EXIT_FINDINGS, EXIT_OK, library_errors, say, terminal_width
from evaluator.cli.exchange import export_cmd
from evaluator.cli.importing import import_cmd
from evaluator.cli.loss import loss_choices, loss_command, loss_options
from evaluator.cli.options import db_option, judged_staleness_option, thresholds_option
from evaluator.cli.outputs import ReportFile
from evaluator.cli.reading import query, summary
from evaluator.cli.store_cmd import store_group
from evaluator.cli.tools import bench, dashboard, demo, train_demo
from evaluator.cli.watch import watch_cmd
from evaluator.duck import arrow_without_pandas

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
@db_option
@thresholds_option
@click.option(
    "--run", "run_id", default=None, help="Judge only this run (default: every run in the database)."
)
@judged_staleness_option
@click.option("--junit", type=ReportFile(), help="Write JUnit XML here (one test case per check).")
@click.option(
    "--markdown", type=ReportFile(), help="Write Markdown here (e.g. $GITHUB_STEP_SUMMARY on GitHub Actions)."
)
@click.option("--json", "json_path", type=ReportFile(), help="Write every verdict as JSON here.")
@library_errors
def gate(db, thresholds, run_id, max_staleness, junit, markdown, json_path) -> None:
    """Judge the metrics in DB against the checks of a thresholds file, and say the decision on each run
    first: ship, ship up to a staleness, do not ship (keep the recompute), or cannot tell yet.

    Exit code 0 when every check passes (warnings allowed), 1 when any check fails (including a metric
    the database lacks or too few tokens), 2 for a bad thresholds file, a missing database, a --run it
    does not hold, or a report path that cannot take a file (empty, a folder: checked first).
    """
    from evaluator.gate import DEFAULT_THRESHOLDS
    from evaluator.verdict import judge_db
    from evaluator.verdict.report import render_table, write_reports

    judgement = judge_db(db, thresholds or DEFAULT_THRESHOLDS, run=run_id, max_staleness=max_staleness)
    say(render_table(judgement, terminal_width()))
    write_reports(judgement, junit=junit, markdown=markdown, json_path=json_path)
    sys.exit(judgement.result.exit_code)


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--db", required=True, help="Metrics store: a folder (made if missing), or a catalog URL.")
@click.option(
    "--data-path",
    default=None,
    help="Where a new store's Parquet files go: a folder or s3://bucket/prefix/ (default: DB/data/).",
)
@click.option(
    "--sample-sequences",
    "sample",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=1.0,
    show_default=True,
    help="Summarise this fraction of the sequences, chosen by a hash of (run_id, seq_id); a store keeps "
    "one fraction.",
)
@click.option(
    "--progress/--no-progress", default=None, help="Progress bar on stderr (default: when a terminal)."
)
@loss_options
@_max_staleness
@click.option(
    "--thresholds",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --loss a,b,c: the thresholds file the what-if table's decisions are judged by. Default: the "
    "bundled schemas/default_thresholds.toml.",
)
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
def replay(
    paths, db, data_path, sample, progress, max_staleness, thresholds, ray_address, **loss_keys
) -> None:
    """Validate the token logs in PATHS (files, folders, or object-storage URIs such as s3://bucket/prefix/,
    copied to a temporary folder first), replay them through every estimator and store
    their metric summaries in DB. Files already in DB (same bytes) are skipped; each file is ingested in
    one commit, which readers see whole; several replays may write one DB at once. The decision metrics
    (clip and bound flips, gradient mass error) are computed under
    the loss given here (`proxaudit loss` lists the presets); a DB keeps one loss. The data-driven
    findings are judged on the files of this call: an error skips the run's files, a warning is printed
    and stored with the run. With `--loss a,b,c` (a what-if), DB keeps the loss a; the files are replayed
    again under b and c into scratch stores, and each run's decision under every loss (judged as `gate`
    judges, at the same staleness) is stored in DB's what-if table (`summary --by what-if`).

    Exit code 0 when every file was ingested or already there, 1 when a file broke a validation rule (it
    is skipped, the others are ingested), 2 for a usage error, a DB of other thresholds, or when no file
    could be read.
    """
    from evaluator.errors import UsageError
    from evaluator.replay.pipeline import replay as replay_paths
    from evaluator.store.lake import require_local_or_uri
    from evaluator.validate.found import found_lines
    from evaluator.validate.report import findings_lines

    choices = loss_choices(**loss_keys)
    choice = choices[0][1]
    say("\n".join(choice.lines()))
    if len(choices) > 1:  # a what-if: the gate and the verdicts are imported for it alone
        from evaluator.gate import DEFAULT_THRESHOLDS, load_thresholds
        from evaluator.text_table import wrapped
        from evaluator.verdict.summary import what_if_lines
        from evaluator.verdict.what_if import what_if

        load_thresholds(thresholds or DEFAULT_THRESHOLDS)  # a bad file before any work
        say(f"what-if: {', '.join(name for name, _ in choices[1:])}, judged beside it")
    elif thresholds is not None:
        raise UsageError("--thresholds judges the what-if table: give it with a list, --loss a,b,c")
    echo = lambda outcome: say(outcome.line())  # noqa: E731
    limit = choice.max_staleness
    if max_staleness is not None:
        limit = (max_staleness, f"--max-staleness {max_staleness} given to replay", "max_head_offpolicyness")
    report = replay_paths(
        paths,
        db,
        on_file=echo,
        on_found=lambda folders: say("\n".join(found_lines(folders))),
        progress=progress,
        loss=choice.loss,
        max_staleness=max_staleness,
        staleness_limit=limit,
        ray=ray_address,
        sample=sample,
        data_path=require_local_or_uri(data_path),
    )
    warnings = [f for f in report.findings if f.severity == "warning"]
    if warnings:
        say("\n".join(findings_lines(warnings)))
    say(f"{report.n_ingested} of {len(report.outcomes)} files ingested into {db}")
    if len(choices) > 1:
        table = what_if(
            paths, db, [(name, c.loss) for name, c in choices], max_staleness=max_staleness,
            staleness_limit=limit, thresholds=thresholds or DEFAULT_THRESHOLDS, ray=ray_address,
            sample=sample, on_loss=lambda name: say(f"what-if: replaying under {name}"),
        )  # fmt: skip
        say("\n" + wrapped("\n".join(what_if_lines(table)), terminal_width()))
    sys.exit(EXIT_OK if report.clean else EXIT_FINDINGS)


cli.add_command(import_cmd)
cli.add_command(summary)
cli.add_command(query)
cli.add_command(loss_command)
cli.add_command(export_cmd)
cli.add_command(store_group)
cli.add_command(watch_cmd)
for command in (bench, train_demo, dashboard, demo):
    cli.add_command(command)


def main() -> None:
    arrow_without_pandas()
    # click's own usage errors exit with 2 already, which matches our convention.
    cli(prog_name="proxaudit")
