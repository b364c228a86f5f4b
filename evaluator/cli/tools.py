"""`proxaudit bench`, `train-demo`, `dashboard` and `demo`: the commands around the pipeline (benchmarks,
the reference trainer, serving the dashboard, the end-to-end demo). Registered on the main group by
`evaluator.cli`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from evaluator.cli.common import EXIT_FINDINGS, library_errors, say, terminal_width
from evaluator.cli.options import DataclassCommand

PORT = click.IntRange(1, 65535)


@click.command()
@click.option(
    "--tokens",
    type=click.IntRange(min=1),
    default=20_000_000,
    show_default=True,
    help="Tokens in the synthetic log.",
)
@click.option(
    "--tokens-per-step", type=click.IntRange(min=1), default=1 << 20, show_default=True,
    help="Tokens per trainer step of the log.",
)  # fmt: skip
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Keep the log and DB here.")
@library_errors
def bench(tokens, tokens_per_step, out) -> None:
    """Time a full replay against a bare DuckDB scan of the log's three log-prob columns, and report
    peak memory of the replay and the database size against the log size."""
    from evaluator.bench.replay import run_bench

    click.echo(run_bench(tokens, tokens_per_step=tokens_per_step, out=out).render())


@click.command(
    "train-demo",
    cls=DataclassCommand,
    dataclass_path="evaluator.trainer.train:Args",
    short_help="Train the reference asynchronous decoupled-PPO trainer and log its tokens.",
)
@click.option("--bench-hook", is_flag=True, help="Instead: time steps with the hook on and off in one run.")
@library_errors
def train_demo(bench_hook: bool, **options) -> None:
    """Train the reference trainer (a tiny transformer learning to reverse digits, asynchronously, with
    abort-resume and a bf16 inference engine) and record every minibatch with the hook."""
    from evaluator.trainer.results import report
    from evaluator.trainer.train import Args, train

    args = Args(**options)
    if bench_hook:
        from evaluator.bench.hook import bench_hook as run_bench_hook

        click.echo(run_bench_hook(args).render())
        return
    click.echo(report(train(args, echo=click.echo), args))


@click.command()
@click.option("--db", required=True, help="Metrics store (a folder, or a catalog URL).")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (local only by default)."
)
@click.option("--port", default=8501, show_default=True, type=PORT, help="TCP port.")
@click.option(
    "--thresholds",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Gate thresholds file (TOML): the Overview shows the gate's verdict.",
)
@click.option(
    "--alerts",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The alerts file `proxaudit watch --alerts` writes: the Live audit page shows them (it may not "
    "exist yet).",
)
@library_errors
def dashboard(db, host, port, thresholds, alerts) -> None:
    """Serve the dashboard (Streamlit) on DB in the foreground until Ctrl-C: drift and importance weights
    by staleness, error over training, run comparison, token inspector, and the live audit (the decision
    over the store's commits, watch's alerts). The app opens DB read-only and never writes; `proxaudit
    replay` and `proxaudit watch` may keep filling it meanwhile. A missing DB is an error (exit 2).
    """
    from evaluator.cli.serve import serve

    sys.exit(serve(db, host, port, thresholds, alerts))


@click.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-out"),
    show_default=True,
    help="Working folder: the metrics database (made afresh) and, with --train, the logs.",
)
@click.option(
    "--train/--fixtures",
    default=False,
    help="Train the reference trainer for about a minute, or use the bundled fixtures (default).",
)
@click.option("--serve/--no-serve", default=True, help="End by serving the dashboard (Ctrl-C stops it).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Dashboard address.")
@click.option("--port", default=8501, show_default=True, type=PORT, help="Dashboard TCP port.")
@click.option(
    "--max-staleness",
    type=click.IntRange(min=0),
    default=None,
    help="S, the trainer's maximum staleness: the approximation is judged at each staleness 1 to S "
    "(default: the log's largest staleness with enough tokens with prox_logp).",
)
@library_errors
def demo(out, train, serve, host, port, max_staleness) -> None:
    """Run the main job end to end: token logs -> validate -> replay into DuckDB -> summary -> gate ->
    dashboard. The gate's verdict is shown, not turned into the exit code: exit 0 when the pipeline ran
    (every file clean and ingested), 1 otherwise.
    """
    from evaluator.cli.serve import require_free_port
    from evaluator.demo import run_demo

    if serve:
        require_free_port(host, port)  # before the pipeline: not a minute of work, then a busy port
    result = run_demo(out, train=train, echo=say, max_staleness=max_staleness, width=terminal_width())
    if not result.ran_clean:
        click.echo("demo: some files broke validation rules (see above)", err=True)
        sys.exit(EXIT_FINDINGS)
    if serve:
        from evaluator.cli.serve import serve as serve_dashboard
        from evaluator.gate import DEFAULT_THRESHOLDS

        sys.exit(serve_dashboard(result.db, host, port, DEFAULT_THRESHOLDS))
