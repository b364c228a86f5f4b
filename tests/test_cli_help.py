"""Every command of `proxaudit` has working `--help`, and every command and option is documented in the
README or the pages of `docs/`."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from tests.conftest import REPO


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command under `group`, nested groups included, as argument tuples."""
    paths = []
    for name, command in sorted(group.commands.items()):
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths += command_paths(command, (*prefix, name))
    return paths


COMMANDS = command_paths(cli)


def test_there_are_commands():
    assert ("validate",) in COMMANDS


def test_top_level_help_lists_every_command():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name, *_rest in COMMANDS:
        assert name in result.output


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help_works_and_describes_the_command(path):
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage:") and " ".join(path) in result.output.splitlines()[0]
    command = cli
    for name in path:
        command = command.commands[name]
    assert (command.help or command.short_help or "").strip(), f"{path} has no help text"


def documentation() -> str:
    return "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_command_and_its_options_are_documented(path):
    docs = documentation()
    assert f"proxaudit {' '.join(path)}" in docs, f"no page shows `proxaudit {' '.join(path)}`"
    command = cli
    for name in path:
        command = command.commands[name]
    ctx = click.Context(command)
    for param in command.get_params(ctx):
        for option in (o for o in param.opts if o.startswith("--") and o != "--help"):
            assert f"{option}" in docs, f"`proxaudit {' '.join(path)} {option}` is documented nowhere"
