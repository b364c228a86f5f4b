"""`proxaudit store`: keeping a metrics store (compaction; converting a store of an earlier proxaudit)."""

from __future__ import annotations

import click

from evaluator.cli.common import library_errors, say


@click.group("store")
def store_group() -> None:
    """Keep a metrics store: merge its small data files, convert an old single-file store."""


@store_group.command("compact")
@click.argument("db")
@click.option(
    "--expire-older-than",
    "hours",
    type=click.FloatRange(min=0),
    default=None,
    metavar="HOURS",
    help="Also forget snapshots older than HOURS and delete the files only they used (time travel to them "
    "ends). Default: keep every snapshot.",
)
@library_errors
def compact_cmd(db: str, hours: float | None) -> None:
    """Merge the small Parquet files of store DB (one commit per ingested file makes many) and the rows its
    catalog inlined into larger files. Readers and writers may go on meanwhile: each step is one commit."""
    from evaluator.store.maintenance import compact

    say(f"{db}: {compact(db, hours).line()}")


@store_group.command("convert")
@click.argument("old", type=click.Path(exists=True, dir_okay=False))
@click.argument("new")
@click.option("--data-path", default=None, help="Where NEW's Parquet files go (default: NEW/data/).")
@library_errors
def convert_cmd(old: str, new: str, data_path: str | None) -> None:
    """Convert OLD, a single-file metrics database of proxaudit before stores were folders (store schema
    version 5 or 6), into the store NEW: every file's metrics, findings and checks (kept as they were:
    judging them again needs the token logs replayed)."""
    from evaluator.store.lake import require_local_or_uri
    from evaluator.store.maintenance import convert

    n_files = convert(old, new, require_local_or_uri(data_path))
    say(f"{old}: {n_files} files converted into {new}")
