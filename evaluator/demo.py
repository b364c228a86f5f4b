"""`proxaudit demo`: the main job end to end on bundled data.

    token logs (bundled fixtures, or a fresh reference-trainer run)
      -> validate -> replay into DuckDB -> summary -> gate -> (dashboard)

Each stage is the library function its own command calls; this module only strings them together.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from evaluator.errors import UsageError
from evaluator.gate import DEFAULT_THRESHOLDS, GateResult
from evaluator.replay.pipeline import ReplayReport, replay
from evaluator.validate import validate_paths
from evaluator.validate.report import render_table as render_validation
from evaluator.verdict import Judgement, judge_db
from evaluator.verdict.report import render_decisions
from evaluator.verdict.report import render_table as render_gate
from evaluator.verdict.summary import NOTES, compact, render, summary_table
from schemas.store import METHODS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DB_NAME = "store"
HEADLINE_METHODS = tuple(m for m in METHODS if m != "ground_truth")


@dataclass
class DemoResult:
    db: Path
    sources: list[Path]
    files_clean: bool
    replay: ReplayReport
    judgement: Judgement

    @property
    def gate(self) -> GateResult:
        return self.judgement.result

    @property
    def ran_clean(self) -> bool:
        """Every file validated and was ingested: the pipeline itself worked (whatever the gate says)."""
        return self.files_clean and self.replay.clean


def _banner(echo: Callable[[str], None], text: str) -> None:
    echo(f"\n== {text} " + "=" * max(0, 72 - len(text)))


def _described(sources: list[Path]) -> str:
    """The demo's inputs in one short line: its folders, and its files counted by folder (the validation
    table below names each file)."""
    folders = [str(p) for p in sources if not p.is_file()]
    by_folder: dict[Path, int] = {}
    for path in (p for p in sources if p.is_file()):
        by_folder[path.parent] = by_folder.get(path.parent, 0) + 1
    files = [f"{n} file{'s' * (n != 1)} in {folder}" for folder, n in by_folder.items()]
    return ", ".join(folders + files)


def _train_logs(out: Path, echo: Callable[[str], None]) -> Path:
    """A fresh short run of the reference trainer (about a minute on 2 cores)."""
    from evaluator.trainer.results import report
    from evaluator.trainer.train import Args, train

    logs = out / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    args = Args(run_id="demo", out_dir=str(logs))
    echo(report(train(args, echo=echo), args))
    return logs


def run_demo(
    out: Path,
    *,
    train: bool = False,
    echo: Callable[[str], None] = print,
    max_staleness: int | None = None,
    width: int | None = None,
) -> DemoResult:
    """Run the pipeline into the store `out/store` (made afresh) and print each stage's result, tables
    within `width` characters; the approximation is judged at each staleness 1 to `max_staleness`, recorded
    with the store (None: the log's largest with enough tokens)."""
    out.mkdir(parents=True, exist_ok=True)
    db = out / DB_NAME
    shutil.rmtree(db, ignore_errors=True)
    if train:
        _banner(echo, "train: the reference asynchronous decoupled-PPO trainer, recorded by the hook")
        sources = [_train_logs(out, echo)]
    else:
        if not any(FIXTURES.glob("*.parquet")):
            raise UsageError(f"no bundled fixtures in {FIXTURES}; run `proxaudit demo --train` instead")
        sources = sorted(FIXTURES.glob("*.parquet"))  # the SmolLM2 runs (fixtures/toy: the tiny model)
    _banner(echo, f"validate: {_described(sources)}")
    validation = validate_paths(sources)
    reports = validation.reports
    echo(render_validation(reports, validation.findings, validation.checks))
    _banner(echo, f"replay into {db}")
    given = f"--max-staleness {max_staleness} given to demo"
    limit = None if max_staleness is None else (max_staleness, given, "max_head_offpolicyness")
    replayed = replay(
        sources, db, on_file=lambda outcome: echo(outcome.line()), progress=None, staleness_limit=limit
    )
    judgement = judge_db(db, DEFAULT_THRESHOLDS)  # S recorded with the store: the dashboard's too
    _banner(echo, "the decision: may the approximation be shipped, and up to which staleness?")
    echo("\n".join([judgement.loss_line(), *(f"- {line}" for line in render_decisions(judgement))]))
    _banner(echo, "summary: does the error change the update? (decision figures per method)")
    decisions = summary_table(db, by="decision")
    columns = ["run_id", "method", "n", "gradient_mass_error", "clip_flip_rate", "excess_gradient_mass_error"]
    echo(render(compact(decisions, "decision").select(columns), "table", width) + f"\n{NOTES['decision']}")
    _banner(echo, "summary: the engine mismatch floor (staleness 0) and its share of the drift")
    echo(render(summary_table(db, by="mismatch"), "table", width) + f"\n{NOTES['mismatch']}")
    _banner(echo, "summary: abs_error of each estimator against the recomputed prox_logp, per run")
    errors = summary_table(db, by="run", metric="abs_error")
    errors = errors.filter(pc.is_in(errors["method"], value_set=pa.array(HEADLINE_METHODS)))
    echo(render(compact(errors, "run"), "table", width))
    _banner(echo, "summary: AReaL's shipped version pairing against each token's own version")
    echo(render(summary_table(db, by="pairing"), "table", width) + f"\n{NOTES['pairing']}")
    _banner(echo, f"gate: {DEFAULT_THRESHOLDS.name} (each staleness 1 to S blocks, AReaL's nats warn)")
    echo(render_gate(judgement, width))
    return DemoResult(db, sources, all(r.ok for r in reports), replayed, judgement)
