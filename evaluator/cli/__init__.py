"""The `proxaudit` command line, one stage on top of everything (it may import any stage below it; nothing
imports it): `main` (the group and the pipeline commands: validate, replay, gate), `reading` (summary,
query), `watch`, `tools` (bench, train-demo, dashboard, demo), `importing` and `exchange` (import,
export), `outputs` (the report files a command writes), `options` (option types and the options several
commands share), `serve` (the Streamlit child process) and `common` (exit codes, how the library's named
errors become them, printing)."""

from evaluator.cli.main import cli, main

__all__ = ["cli", "main"]
