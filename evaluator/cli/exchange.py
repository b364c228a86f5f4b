"""`proxaudit import` and `proxaudit export`: other trainers' dumps in, the store's series out to
TensorBoard and W&B. Registered on the main group by `evaluator.cli`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import click

from evaluator.cli.common import EXIT_USAGE, library_errors, say

DUMP_FORMATS = ("nemo-rl", "prime-rl", "slime", "skyrl")


def dump_options(command: Callable) -> Callable:
    """What reading a trainer's dumps takes (`import`, `watch --import`): the run_id, SkyRL's pickles,
    slime's weight pushes."""
    options = [
        click.option(
            "--run-id", default=None, help="run_id of the rows [default: the name of the first PATH].",
        ),
        click.option(
            "--trust-pickle", is_flag=True,
            help="skyrl: read its .pkl files (unpickling runs code named in the file).",
        ),
        click.option(
            "--update-weights-interval", type=click.IntRange(min=1), default=1, show_default=True,
            help="slime: the run's --update-weights-interval (train_async.py; train.py pushes after every "
            "rollout).",
        ),
        click.option(
            "--resumed-at", type=click.IntRange(min=0), multiple=True, metavar="ROLLOUT",
            help="slime: the first rollout of a restart of the run (its --start-rollout-id); once per "
            "restart.",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


@click.command("import")
@click.argument("fmt", metavar="FORMAT", type=click.Choice(DUMP_FORMATS))
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder for the Parquet logs.")
@dump_options
def import_cmd(
    fmt: str,
    paths: tuple[str, ...],
    out: str,
    run_id: str | None,
    trust_pickle: bool,
    update_weights_interval: int,
    resumed_at: tuple[int, ...],
) -> None:
    """Convert a trainer's per-token dump to schema v1 Parquet (one file per dump file, streamed), then
    `validate` and `replay` it as any log. FORMAT: nemo-rl (train_data_step{N}.jsonl), prime-rl
    (token_exports/step_{N}/rank_{R}.jsonl), slime (the --dump-details folder: train_data/{id}.pt with
    rollout_data/{id}.pt, loaded with weights_only; Miles' too), skyrl
    (dumped_data/global_step_{N}_training_input.pkl, only with --trust-pickle). docs/importers.md says
    what each dump lacks."""
    from evaluator.importers import FORMATS
    from evaluator.importers.rows import ImportFormatError

    module = FORMATS[fmt]
    convert = module.convert
    if fmt == "skyrl":
        if not trust_pickle:
            say(
                f"proxaudit: error: skyrl dumps are pickles: give --trust-pickle ({module.PICKLE_WARNING})",
                err=True,
            )
            sys.exit(EXIT_USAGE)
        say(f"warning: {module.PICKLE_WARNING}", err=True)
        convert = partial(module.convert, trust_pickle=True)
    if fmt == "slime":
        from evaluator.importers.slime_versions import Versions

        convert = partial(module.convert, versions=Versions(update_weights_interval, resumed_at))
    run_id = run_id or Path(paths[0]).resolve().name
    try:
        files = module.find(paths)
    except ImportFormatError as error:
        say(f"proxaudit: error: {error}", err=True)
        sys.exit(EXIT_USAGE)
    if not files:
        say(f"proxaudit: error: no {fmt} dump files in {', '.join(paths)}", err=True)
        sys.exit(EXIT_USAGE)
    failed, names = 0, {}
    for path in files:
        first = names.setdefault(module.out_name(path, run_id), path)
        if first != path:  # two runs' dumps under one folder
            failed += 1
            say(f"{path}: failed: its log would replace that of {first}: import them with two --run-id")
            continue
        try:
            result = convert(path, Path(out), run_id)
        except (ImportFormatError, OSError) as error:  # one file's trouble stops nothing
            failed += 1
            say(f"{path}: failed: {str(error).removeprefix(f'{path}: ')}")
            continue
        where = result.out or "nothing written (no token in the loss)"
        skipped = "".join(f", {n:,} {why} skipped" for why, n in result.skipped.items())
        say(f"{path}: {result.sequences:,} sequences, {result.rows:,} rows{skipped} -> {where}")
        for note in sorted(result.notes):
            say(f"  note: {note}")
    say(f"{len(files) - failed} of {len(files)} files imported into {out}; next: proxaudit validate {out}")
    sys.exit(1 if failed else 0)


@click.command("export")
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="Metrics database from `replay`.")
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
        say(f"proxaudit: error: {db} has no {'run ' + run_id if run_id else 'runs'} to export", err=True)
        sys.exit(EXIT_USAGE)
    if kind == "tensorboard":
        for folder in to_tensorboard(runs, directory):
            say(f"wrote {folder} (tensorboard --logdir {directory})")
    else:
        ids = to_wandb(runs, project, directory, mode="online" if online else "offline")
        say(f"wrote W&B runs {', '.join(ids)} under {directory}" + ("" if online else " (wandb sync)"))
    scalars = sum(len(xs) for r in runs for xs, _ in r.series.values())
    say(f"{len(runs)} runs, {scalars:,} scalars")
