"""Click options built from a CleanRL-style `Args` dataclass (a docstring under every field is its help),
and `Number`, the option type of a finite number within its parameter's range.

`DataclassCommand` builds them on first use, so listing commands never imports the dataclass's module
(the reference trainer imports torch, which takes seconds).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
import typing
from collections.abc import Callable

import click

from evaluator.errors import ParameterError
from evaluator.inputs import FINITE, Range


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, read from its source."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for stmt, after in zip(body, body[1:], strict=False):
        is_doc = isinstance(after, ast.Expr) and isinstance(getattr(after, "value", None), ast.Constant)
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and is_doc:
            docs[stmt.target.id] = " ".join(str(after.value.value).split())
    return docs


def click_options(cls: type) -> list[click.Option]:
    """One `--field-name` option per dataclass field, with its type, default and docstring."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    options = []
    for f in dataclasses.fields(cls):
        flag, hint = "--" + f.name.replace("_", "-"), hints[f.name]
        if typing.get_origin(hint) is typing.Literal:
            kind = dict(type=click.Choice(typing.get_args(hint)))
        elif hint is bool:
            flag, kind = f"{flag}/--no-{flag[2:]}", {}
        elif hint is float:
            kind = dict(type=Number())
        else:
            kind = dict(type=hint)
        options.append(
            click.Option([flag, f.name], default=f.default, show_default=True, help=docs.get(f.name), **kind)
        )
    return options


def options_table(cls: type) -> str:
    """The options of `click_options(cls)` as a Markdown table (option, default, meaning), for the docs."""
    docs = field_docs(cls)
    lines = ["| option | default | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            flag = f"{flag} / --no-{flag[2:]}"
        lines.append(f"| `{flag}` | `{f.default}` | {docs.get(f.name, '')} |")
    return "\n".join(lines)


class DataclassCommand(click.Command):
    """A command whose options mirror the dataclass named by `dataclass_path` (`module:Name`)."""

    def __init__(self, *args, dataclass_path: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dataclass_path = dataclass_path
        self._loaded = False

    def dataclass(self) -> type:
        module, name = self.dataclass_path.split(":")
        return getattr(importlib.import_module(module), name)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not self._loaded:
            self.params = click_options(self.dataclass()) + self.params
            self._loaded = True
        return super().get_params(ctx)


class Number(click.ParamType):
    """A finite float within `allowed` (the parameter's range, or a function that returns it, called
    when a value is parsed): NaN, an infinity or a value outside the range is a usage error naming the
    option, when the command line is parsed."""

    name = "float"

    def __init__(self, allowed: Range | Callable[[], Range] = FINITE) -> None:
        self.allowed = allowed

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        allowed = self.allowed if isinstance(self.allowed, Range) else self.allowed()
        try:
            return allowed.check(param.name if param else "value", number)
        except ParameterError as error:
            self.fail(error.why, param, ctx)


db_option = click.option(
    "--db", required=True, help="Metrics store from `replay` (a folder, or a catalog URL)."
)
judged_staleness_option = click.option(
    "--max-staleness",
    type=click.IntRange(min=0),
    default=None,
    help="S, the trainer's maximum staleness (AReaL max_head_offpolicyness): the approximation is judged at "
    "each staleness 1 to S. Default: what replay recorded from the trainer's config (--loss-from) or its "
    "own --max-staleness, else the log's largest staleness with enough tokens with prox_logp.",
)
thresholds_option = click.option(
    "--thresholds",
    type=click.Path(dir_okay=False),
    default=None,
    help="Thresholds file (TOML). Default: the bundled schemas/default_thresholds.toml.",
)
