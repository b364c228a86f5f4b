"""`proxaudit export`: the store's series out to TensorBoard and W&B (`proxaudit import`, the other way in:
`evaluator.cli.importing`). Registered on the main group by `evaluator.cli`."""

from __future__ import annotations

import sys

import click

from evaluator.cli.common import EXIT_USAGE, library_errors, say
from evaluator.text_table import printable


@click.command("export")
@click.option("--db", required=True, help="Metrics store from `replay` (a folder, or a catalog URL).")
@click.option(
    "--to", "target", required=True, type=(click.Choice(["tensorboard", "wandb"]), click.Path()),
    metavar="tensorboard DIR | wandb DIR",
    help="TensorBoard event files under DIR/RUN_ID, or W&B runs in DIR (offline: `wandb sync` uploads them).",
)  # fmt: skip
@click.option("--project", default="proxaudit", show_default=True, help="W&B project.")
@click.option("--online", is_flag=True, help="W&B: log to the server now instead of offline.")
@click.option("--run", "run_id", default=None, help="Only this run (default: every run).")
@library_errors
def export_cmd(db: str, target: tuple[str, str], project: str, online: bool, run_id: str | None) -> None:
    """Every method x metric per step (`{method}/{metric}/avg|min|max`, AReaL's key style) and the
    decision figures per step (`{method}/decision/...`) as scalar series, one TensorBoard or W&B run per
    proxaudit run, so they line up with the trainer's own charts."""
    from evaluator.export import run_series, to_tensorboard, to_wandb

    kind, directory = target
    runs = run_series(db, run_id)
    if not runs:
        which = f"run {printable(run_id)}" if run_id else "runs"
        say(f"proxaudit: error: {printable(db)} has no {which} to export", err=True)
        sys.exit(EXIT_USAGE)
    if kind == "tensorboard":
        for folder in to_tensorboard(runs, directory):
            say(f"wrote {printable(str(folder))} (tensorboard --logdir {printable(directory)})")
    else:
        ids = to_wandb(runs, project, directory, mode="online" if online else "offline")
        say(
            f"wrote W&B runs {', '.join(map(printable, ids))} under {printable(directory)}"
            + ("" if online else " (wandb sync)")
        )
    scalars = sum(len(xs) for r in runs for xs, _ in r.series.values())
    say(f"{len(runs)} runs, {scalars:,} scalars")
