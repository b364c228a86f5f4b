"""`proxaudit watch`: follow a training run as it writes, re-judge it as data arrives, alert on each change.
Registered on the main group by `evaluator.cli`."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import duckdb

from evaluator.cli.common import EXIT_USAGE, library_errors, say
from evaluator.cli.importing import DUMP_FORMATS, dump_options
from evaluator.cli.loss import loss_choice, loss_options
from evaluator.duck import interrupted

EXIT_INTERRUPTED = 130


@click.command("watch")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--db", required=True,
    help="Metrics store: a folder (made if missing), or a catalog URL; other replays may write it at once.",
)  # fmt: skip
@click.option(
    "--alerts", type=click.Path(dir_okay=False, path_type=Path),
    help="Append each alert to this file as a JSON line (time, run_id, kind, state, previous, reason, ...).",
)  # fmt: skip
@click.option(
    "--webhook", metavar="URL",
    help="Also POST each alert here as JSON with a Slack-compatible `text` (a failed POST is reported).",
)  # fmt: skip
@click.option(
    "--exit-on", type=click.Choice(["fail", "trend"]), multiple=True,
    help="Exit 1 at the first do_not_ship verdict (fail) or drift found (trend); may be given twice.",
)  # fmt: skip
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
    help="Seconds between two looks at the folders.",
)  # fmt: skip
@click.option(
    "--idle-after", type=click.FloatRange(min=0), default=600.0, show_default=True,
    help="Seconds without a changed file after which the folders are idle (an alert) and the run ended.",
)  # fmt: skip
@click.option(
    "--until-idle", is_flag=True, help="Exit 0 once the folders are idle and their last files are in."
)
@click.option(
    "--thresholds", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="The gate's thresholds file (TOML) each run is judged by, as `proxaudit gate` judges it. Default: "
    "the bundled schemas/default_thresholds.toml (loglinear_shipped beyond the engine floor, 1%).",
)  # fmt: skip
@click.option(
    "--max-staleness", type=click.IntRange(min=0), default=None,
    help="S, the trainer's maximum off-policyness (AReaL max_head_offpolicyness): judged at staleness 1..S "
    "and recorded with the store [default: what replay recorded, else the log's largest with enough "
    "tokens]; staler tokens are an error.",
)  # fmt: skip
@click.option(
    "--import", "import_fmt", type=click.Choice(DUMP_FORMATS),
    help="PATHS hold this trainer's dumps (as `proxaudit import`): each complete file is imported to --out, "
    "each run folder as its own run.",
)  # fmt: skip
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), help="--import: folder for the logs."
)
@click.option(
    "--tensorboard", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
    help="Write each run's steps, once final, as `proxaudit export --to tensorboard DIR` writes them, and "
    "the decision state (watch/action, watch/max_staleness, watch/drifting).",
)  # fmt: skip
@click.option(
    "--wandb", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
    help="The same as offline W&B runs in DIR (`wandb sync` uploads them).",
)  # fmt: skip
@dump_options
@loss_options
@library_errors
def watch_cmd(
    paths, db, alerts, webhook, exit_on, interval, idle_after, until_idle, thresholds, max_staleness,
    import_fmt, out, tensorboard, wandb, run_id, trust_pickle, update_weights_interval, resumed_at,
    **loss_keys,
) -> None:  # fmt: skip
    """Follow a training run: the token logs the hook writes into PATHS (or, with --import, a trainer's
    dumps), each file replayed into DB once complete; after each, the run is judged again (the decision
    `proxaudit gate` makes under --thresholds: the gated method beyond the engine floor at each staleness
    1..S; and the trend of the gradient mass error over steps), and each change of state is an alert: a
    line on stdout, in --alerts, to --webhook. A progress line on stderr says what watch waits for.
    Restarting it ingests nothing twice and repeats no alert. With --tensorboard or --wandb each run's
    steps go to your dashboards once final (each rank's folder holds a later step, or the run ended), each
    step once.

    Exit code 1 at the first do_not_ship (or drift) with --exit-on, 0 once idle with --until-idle, 2 for a
    usage error or a DB of another loss, 130 on Ctrl-C.
    """
    from evaluator.gate import load_thresholds
    from evaluator.importers.slime_versions import Versions
    from evaluator.watch.dumps import DumpImporter
    from evaluator.watch.loop import WatchOptions, watch

    importer = None
    if import_fmt is None:
        given = [name for name, value in (("--out", out), ("--run-id", run_id)) if value is not None]
        if given or trust_pickle or resumed_at:
            _usage(f"{', '.join(given) or 'the import options'} only with --import FORMAT")
    else:
        if out is None:
            _usage(f"--import {import_fmt} needs --out DIR for the token logs it writes")
        if import_fmt == "skyrl" and not trust_pickle:
            _usage("skyrl dumps are pickles: give --trust-pickle (unpickling runs code named in the file)")
        versions = Versions(update_weights_interval, tuple(resumed_at))
        importer = DumpImporter(import_fmt, out, run_id, trust_pickle=trust_pickle, versions=versions)
    choice = loss_choice(**loss_keys)
    say("\n".join(choice.lines()))
    options = WatchOptions(
        paths=tuple(paths), db=db, importer=importer, alerts=alerts, webhook=webhook,
        exit_on=frozenset(exit_on), interval=interval, idle_after=idle_after, until_idle=until_idle,
        thresholds=load_thresholds(thresholds) if thresholds else None, max_staleness=max_staleness,
        loss=choice.loss, tensorboard=tensorboard, wandb=wandb,
    )  # fmt: skip
    try:
        code = watch(options)
    except (KeyboardInterrupt, RuntimeError, duckdb.Error) as error:  # Ctrl-C, whatever was running
        if not interrupted(error):
            raise
        say("proxaudit watch: stopped", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code)


def _usage(why: str) -> None:
    say(f"proxaudit: error: {why}", err=True)
    sys.exit(EXIT_USAGE)
