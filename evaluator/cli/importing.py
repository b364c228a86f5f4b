"""`proxaudit import FORMAT`: other trainers' per-token dumps into token logs, one subcommand per format, each
with its own help (what it reads, which writer of the trainer wrote it, what the dump lacks). Registered on
the main group by `evaluator.cli`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import click

from evaluator.cli.common import EXIT_USAGE, say
from evaluator.text_table import printable

HELP = {
    "nemo-rl": (
        "NeMo-RL's train_data_step{N}.jsonl (GRPO's training batches).",
        "Import NeMo-RL's GRPO training dumps: train_data_step{N}.jsonl in the run's log_dir, one line per "
        "sample of step N's training batch, written by Logger.log_batched_dict_as_jsonl from grpo_train and "
        "async_grpo_train (NVIDIA-NeMo/RL at 7ea279a). behave_logp = generation_logprobs, prox_logp = "
        "theta_logp = prev_logprobs (the recompute before the step's update), advantages, the raw reward. "
        "The dump lacks versions (behave_version = step is assumed: every token at staleness 0, the engine "
        "mismatch), theta after an update and proximal_t; with force_on_policy_ratio its prev_logprobs are "
        "zeros (validate warns prox_logp_zero).",
    ),
    "prime-rl": (
        "prime-rl's token_exports/step_{N}/rank_{R}.jsonl.",
        "Import prime-rl's token exports: token_exports/step_{N}/rank_{R}.jsonl in the run's output_dir, "
        "one line per packed sequence a trainer rank trained on at step N, written by TokenExporter.export "
        "(src/prime_rl/trainer/rl/token_export.py, PrimeIntellect-ai/prime-rl at 559b447). behave_logp = "
        "inference_logprobs, prox_logp = theta_logp = trainer_logprobs, advantages. The export lacks "
        "versions (behave_version = step is assumed: every token at staleness 0), theta after the update, "
        "rewards (since 2026-06-27; read from an older export) and proximal_t.",
    ),
    "slime": (
        "slime's or Miles' --dump-details folder (train_data/, rollout_data/).",
        "Import slime's or Miles' --dump-details DIR (give DIR itself): DIR/train_data/{rollout_id}.pt "
        "(slime's save_debug_train_data, THUDM/slime at 624b824) or DIR/train_data/{rollout_id}_{rank}.pt "
        "(Miles' save_debug_train_data_for_rank, radixark/miles at 31f1ca9, and older slime), with "
        "DIR/rollout_data/{rollout_id}.pt for the weight versions; loaded with torch.load(weights_only=True) "
        "only. behave_logp = rollout_log_probs, prox_logp = theta_logp = log_probs, advantages, the raw "
        "reward; behave_version from slime's weight-push counter (give the run's --update-weights-interval "
        "and each restart's --resumed-at). The dump lacks theta after the rollout's updates and proximal_t; "
        "a response generated across several versions cannot be placed token by token (skipped, counted).",
    ),
    "skyrl": (
        "SkyRL's dumped_data/global_step_{N}_training_input.pkl (with --trust-pickle).",
        "Import SkyRL's batch dumps (trainer.dump_data_batch=true): "
        "dumped_data/global_step_{N}_training_input.pkl in the run's export_path, step N's pickled "
        "TrainingInputBatch written by RayPPOTrainer.dump_data (skyrl/train/trainer.py, NovaSky-AI/SkyRL at "
        "a956457), read only with --trust-pickle. behave_logp = rollout_logprobs, prox_logp = theta_logp = "
        "action_log_probs, advantages. The dump lacks versions (behave_version = step is assumed: every "
        "token at staleness 0), rewards (popped before the dump), theta after the update and proximal_t.",
    ),
}
"""Per format: the line `proxaudit import --help` lists, and the subcommand's help."""
DUMP_FORMATS = tuple(HELP)
COMMON_HELP = (
    "\n\nWrites one schema v1 Parquet file per dump file into --out (streamed, each whole or not at all); "
    "then `proxaudit validate` and `replay` it as any log. A folder is searched with its subfolders, and "
    "each folder the trainer wrote a dump into is one run, named after that folder (or --run-id, when the "
    "paths hold one run). docs/importers.md has every field."
)


@click.group("import")
def import_cmd() -> None:
    """Convert a trainer's per-token dump into token logs (schema v1 Parquet): nemo-rl, prime-rl, slime
    (and Miles), skyrl. `proxaudit import FORMAT --help` says what each reads, from which writer of the
    trainer, and what its dump lacks."""


def _with(command: Callable, *options: Callable) -> Callable:
    for option in reversed(options):
        command = option(command)
    return command


RUN_ID = click.option(
    "--run-id", default=None,
    help="run_id of the rows when PATHS hold one run [default: the name of the folder the trainer wrote the "
    "run's dump into].",
)  # fmt: skip


def trust_pickle(which: str = "") -> Callable:
    """SkyRL's --trust-pickle (`which`: the format named in its help, where several formats share it)."""
    return click.option(
        "--trust-pickle",
        is_flag=True,
        help=f"{which}Read the .pkl files (unpickling runs code named in the file).",
    )


def slime_versions(which: str = "") -> Callable:
    """slime's weight pushes: --update-weights-interval and --resumed-at."""
    return lambda command: _with(
        command,
        click.option(
            "--update-weights-interval", type=click.IntRange(min=1), default=1, show_default=True,
            help=f"{which}The run's --update-weights-interval (train_async.py; train.py pushes after every "
            "rollout).",
        ),
        click.option(
            "--resumed-at", type=click.IntRange(min=0), multiple=True, metavar="ROLLOUT",
            help=f"{which}The first rollout of a restart of the run (its --start-rollout-id); once per "
            "restart.",
        ),
    )  # fmt: skip


def dump_options(command: Callable) -> Callable:
    """Every format's options at once (`watch --import FORMAT`), each saying which format it is for."""
    return _with(command, RUN_ID, trust_pickle("skyrl: "), slime_versions("slime: "))


def _format(fmt: str) -> Callable[[Callable], click.Command]:
    """The subcommand `import FMT` with its help, PATHS, --out and --run-id."""

    def decorate(function: Callable) -> click.Command:
        function = _with(
            function,
            click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True)),
            click.option(
                "--out", required=True, type=click.Path(file_okay=False), help="Folder for the Parquet logs."
            ),
            RUN_ID,
        )
        short, text = HELP[fmt]
        return import_cmd.command(fmt, short_help=short, help=text + COMMON_HELP)(function)

    return decorate


@_format("nemo-rl")
def import_nemo_rl(paths: tuple[str, ...], out: str, run_id: str | None) -> None:
    _import("nemo-rl", paths, out, run_id)


@_format("prime-rl")
def import_prime_rl(paths: tuple[str, ...], out: str, run_id: str | None) -> None:
    _import("prime-rl", paths, out, run_id)


@_format("slime")
@slime_versions()
def import_slime(
    paths: tuple[str, ...],
    out: str,
    run_id: str | None,
    update_weights_interval: int,
    resumed_at: tuple[int, ...],
) -> None:
    from evaluator.importers import slime
    from evaluator.importers.slime_versions import Versions

    versions = Versions(update_weights_interval, resumed_at)
    _import("slime", paths, out, run_id, partial(slime.convert, versions=versions))


@_format("skyrl")
@trust_pickle()
def import_skyrl(paths: tuple[str, ...], out: str, run_id: str | None, trust_pickle: bool) -> None:
    from evaluator.importers import skyrl

    if not trust_pickle:
        say(
            f"proxaudit: error: skyrl dumps are pickles: give --trust-pickle ({skyrl.PICKLE_WARNING})",
            err=True,
        )
        sys.exit(EXIT_USAGE)
    say(f"warning: {skyrl.PICKLE_WARNING}", err=True)
    _import("skyrl", paths, out, run_id, partial(skyrl.convert, trust_pickle=True))


def _import(
    fmt: str, paths: tuple[str, ...], out: str, run_id: str | None, convert: Callable | None = None
) -> None:
    """Find the format's dump files under `paths`, say which runs they hold, and convert each file: one
    file's trouble stops nothing (exit 1); no file, or runs that cannot be told apart, is exit 2."""
    from evaluator.importers import FORMATS
    from evaluator.importers.rows import ImportFormatError
    from evaluator.importers.runs import dump_runs

    module = FORMATS[fmt]
    convert = convert or module.convert
    try:
        runs = dump_runs(fmt, module.find(paths), run_id)
    except ImportFormatError as error:
        say(f"proxaudit: error: {error}", err=True)
        sys.exit(EXIT_USAGE)
    if not runs:
        below = sorted({f"{p.parent.parent}/" for path in paths for p in Path(path).rglob("train_data/*.pt")})
        hint = (
            f"; the --dump-details folders below: {', '.join(below[:5])}" if fmt == "slime" and below else ""
        )
        say(
            f"proxaudit: error: no {fmt} dump files in {', '.join(paths)} (proxaudit import {fmt} --help: "
            f"what it reads){hint}",
            err=True,
        )
        sys.exit(EXIT_USAGE)
    say("\n".join(f"found run {printable(run.run_id)}: {printable(run.where())}" for run in runs))
    failed = total = 0
    for run in runs:
        for path in run.files:
            total += 1
            try:
                result = convert(path, Path(out), run.run_id)
            except (ImportFormatError, OSError) as error:  # one file's trouble stops nothing
                failed += 1
                say(f"{printable(str(path))}: failed: {printable(str(error).removeprefix(f'{path}: '))}")
                continue
            where = printable(str(result.out)) if result.out else "nothing written (no token in the loss)"
            skipped = "".join(f", {n:,} {why} skipped" for why, n in result.skipped.items())
            counts = f"{result.sequences:,} sequences, {result.rows:,} rows{skipped}"
            say(f"{printable(str(path))}: {counts} -> {where}")
            for note in sorted(result.notes):
                say(f"  note: {printable(note)}")
    out = printable(out)
    say(f"{total - failed} of {total} files imported into {out}; next: proxaudit validate {out}")
    sys.exit(1 if failed else 0)
