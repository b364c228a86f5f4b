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


def main() -> None:
    # click's own usage errors exit with 2 already, which matches our convention.
    cli(prog_name="proxaudit")


if __name__ == "__main__":
    main()
