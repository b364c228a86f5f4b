"""The `proxaudit` command line: each command parses options, calls one library function, and
maps the library's named exceptions to exit codes here and only here.

Exit codes: 0 clean / pass, 1 a file broke a rule or a check failed, 2 usage error or nothing usable.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps

import click

from evaluator import __version__
from evaluator.errors import ProxauditError

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def _library_errors(command: Callable) -> Callable:
    """Turn the library's named exceptions into a one-line error and exit code 2."""

    @wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ProxauditError as error:
            click.echo(f"proxaudit: error: {error}", err=True)
            sys.exit(EXIT_USAGE)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="proxaudit")
def cli() -> None:
    """Audit the proximal log-probability approximation of an asynchronous decoupled-PPO trainer."""


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
@click.option(
    "--junit", type=click.Path(dir_okay=False), help="Write JUnit XML here (one test case per check)."
)
@click.option(
    "--markdown", type=click.Path(dir_okay=False), help="Write Markdown here (e.g. $GITHUB_STEP_SUMMARY)."
)
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False), help="Write every verdict as JSON here."
)
@_library_errors
def gate(db, thresholds, run_id, junit, markdown, json_path) -> None:
    """Judge the metrics in DB against the checks of a thresholds file.

    Exit code 0 when every check passes (warnings allowed), 1 when any check fails (including a metric
    the database lacks or too few tokens), 2 for a bad thresholds file or a missing database.
    """
    from evaluator.gate import DEFAULT_THRESHOLDS, run_gate
    from evaluator.gate_report import render_table, write_reports

    result = run_gate(db, thresholds or DEFAULT_THRESHOLDS, run=run_id)
    click.echo(render_table(result))
    write_reports(result, junit=junit, markdown=markdown, json_path=json_path)
    sys.exit(result.exit_code)


def main() -> None:
    # click's own usage errors exit with 2 already, which matches our convention.
    cli(prog_name="proxaudit")


if __name__ == "__main__":
    main()
