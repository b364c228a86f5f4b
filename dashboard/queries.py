"""Named read-only queries of the metrics store for the dashboard: DuckDB in, pandas DataFrame out.

Every function opens the store read-only for one short batch of SQL through
`evaluator.store.open_store`, which checks it is a proxaudit store, switches off file access and runs
proxaudit's own views over its tables, on the last commit: a replay never holds a read up (a catalog
another program keeps locked is retried for `RETRY_SECONDS`, then `StoreBusy`). No estimator math and
no writes here: the numbers come from the public views (docs/metrics.md) and the tables `ingested_file`
and `file_tokens`.

Quantiles (p50/p90/p99) are stored per run, per staleness (over all steps) and per step (over all
staleness values). When a filter restricts the other axis (a step range on a by-staleness chart, a
staleness range on a by-step chart), the exact moments (n, mean, min, max) are re-aggregated from
`step_staleness_summary` over the filter and the quantile columns are null.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import duckdb
import pandas as pd

from evaluator.duck import literal
from evaluator.errors import StoreError
from evaluator.formulas.loss import DEFAULT_LOSS, Loss
from evaluator.store import open_store
from evaluator.store.figures import engine_floors, minibatches
from evaluator.store.reader import version_stamp, what_if_rows
from evaluator.store.trainers import trainer_figures
from evaluator.store.trainers import trainer_sentences as sentences_of
from evaluator.verdict import Judgement, judge_db
from evaluator.verdict.floor import FloorVerdict
from evaluator.verdict.judging import floor_bounds
from schemas.store import DEFAULT_TOLERANCE, METHODS, Tolerance
from schemas.thresholds import Thresholds

RETRY_SECONDS = 3.0
QUANTILE_STATS = ("p50", "p90", "p99")


@dataclass(frozen=True)
class Filters:
    """What the sidebar selects. Empty tuples and None mean "no restriction" (hashable for caching)."""

    runs: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    staleness: tuple[int, int] | None = None
    steps: tuple[int, int] | None = None

    def where(self, *, use_steps: bool = True, use_staleness: bool = True) -> tuple[str, list]:
        """A SQL predicate over the columns run_id, method, step, staleness, with its parameters."""
        clauses, params = ["TRUE"], []
        if self.runs:
            clauses.append(f"run_id IN ({', '.join('?' * len(self.runs))})")
            params += self.runs
        if self.methods:
            clauses.append(f"method IN ({', '.join('?' * len(self.methods))})")
            params += self.methods
        if use_staleness and self.staleness is not None:
            clauses.append("staleness BETWEEN ? AND ?")
            params += list(self.staleness)
        if use_steps and self.steps is not None:
            clauses.append("step BETWEEN ? AND ?")
            params += list(self.steps)
        return " AND ".join(clauses), params


def _frame(db: Path, sql: str, params: list | tuple = ()) -> pd.DataFrame:
    """One query's rows through `evaluator.store.open_store` (read-only, checked, proxaudit's own SQL)."""
    with open_store(db, lock_wait_s=RETRY_SECONDS) as con:
        try:
            return con.execute(sql, list(params)).df()
        except duckdb.Error as error:
            raise StoreError(f"{db}: cannot read the metrics store: {error}") from error


def data_version(db: Path) -> tuple[int, ...]:
    """A stamp that changes whenever a replay commits (a cache key); () for what is no store (reading it
    then says why)."""
    try:
        return version_stamp(db)
    except StoreError:
        return ()


def store_overview(db: Path) -> pd.DataFrame:
    """One row per run: files, tokens (loss_mask true), tokens with the ground truth, step and
    staleness extents, and when a file of it was last ingested. Empty for an empty store."""
    return _frame(
        db,
        """
        SELECT t.run_id,
               count(DISTINCT t.file_id)::BIGINT AS n_files,
               sum(t.n_tokens)::BIGINT AS n_tokens,
               sum(t.n_prox)::BIGINT AS n_prox,
               count(DISTINCT t.step)::BIGINT AS n_steps,
               min(t.step) AS first_step, max(t.step) AS last_step,
               min(t.staleness) AS min_staleness, max(t.staleness) AS max_staleness,
               max(f.ingested_at) AS last_ingested_at
        FROM file_tokens t JOIN ingested_file f USING (file_id)
        GROUP BY t.run_id ORDER BY t.run_id
        """,
    )


def tokens_by_staleness(db: Path, filters: Filters) -> pd.DataFrame:
    """Tokens (loss_mask true) and tokens with the ground truth per run and staleness."""
    where, params = Filters(filters.runs, (), filters.staleness, filters.steps).where()
    return _frame(
        db,
        f"""SELECT run_id, staleness, sum(n_tokens)::BIGINT AS n_tokens, sum(n_prox)::BIGINT AS n_prox
            FROM file_tokens WHERE {where} GROUP BY run_id, staleness ORDER BY run_id, staleness""",
        params,
    )


def methods_present(db: Path, runs: tuple[str, ...] = ()) -> list[str]:
    """The methods of proxaudit's vocabulary that have metric rows for these runs (all runs when empty),
    in its order; a name the store holds besides them is data, never shown as a method."""
    where, params = Filters(runs).where()
    sql = f"SELECT DISTINCT method FROM step_staleness_summary WHERE {where} AND metric = 'approx_logp'"
    present = set(_frame(db, sql, params)["method"])  # every method has approx_logp wherever it has one
    return [m for m in METHODS if m in present]


def _moments(db: Path, filters: Filters, metrics: tuple[str, ...], by: tuple[str, ...]) -> pd.DataFrame:
    """Exact n/mean/min/max re-aggregated over `filters` from step_staleness_summary, grouped by `by`;
    the quantile columns are null (they cannot be merged from moments)."""
    where, params = filters.where()
    keys = ", ".join(by)
    return _frame(
        db,
        f"""SELECT {keys}, sum(n)::BIGINT AS n, sum(n * mean) / sum(n) AS mean, min(min) AS min,
                   max(max) AS max, NULL::DOUBLE AS p50, NULL::DOUBLE AS p90, NULL::DOUBLE AS p99
            FROM step_staleness_summary
            WHERE {where} AND metric IN ({", ".join("?" * len(metrics))})
            GROUP BY {keys} ORDER BY {keys}""",
        params + list(metrics),
    )


def _summary(
    db: Path, view: str, filters: Filters, metrics: tuple[str, ...], by: tuple[str, ...]
) -> pd.DataFrame:
    """Rows of a quantile view, one UNION ALL arm per (run, metric), and per method too on the large
    `step_summary`: DuckDB pushes equality predicates into the views' window partitions but not IN
    lists (10x slower on a 1,000-step run)."""
    per_method = view == "step_summary"
    rest = Filters(
        methods=() if per_method else filters.methods,
        staleness=filters.staleness if view == "staleness_summary" else None,
        steps=filters.steps if per_method else None,
    )
    range_sql, range_params = rest.where()
    arms, params = [], []
    methods = (filters.methods or (None,)) if per_method else (None,)
    for run_id, method, metric in product(filters.runs or (None,), methods, metrics):
        keys = {"run_id": run_id, "method": method, "metric": metric}
        arms.append(" AND ".join([f"{k} = ?" for k, v in keys.items() if v is not None] + [range_sql]))
        params += [v for v in keys.values() if v is not None] + range_params
    select = f"SELECT {', '.join(by)}, n, mean, min, max, p50, p90, p99 FROM {view} WHERE "
    sql = " UNION ALL ".join(f"({select}{arm})" for arm in arms)
    return _frame(db, f"{sql} ORDER BY {', '.join(by)}", params)


def run_headline(db: Path, filters: Filters, metrics: tuple[str, ...]) -> pd.DataFrame:
    """Per run, method and metric: n, mean, min, max, p50, p90, p99 over the whole run (`run_summary`);
    moments only (quantiles null) when a step or staleness range is selected."""
    by = ("run_id", "method", "metric")
    if filters.steps is None and filters.staleness is None:
        return _summary(db, "run_summary", filters, metrics, by)
    return _moments(db, filters, metrics, by)


def by_staleness(db: Path, filters: Filters, metrics: tuple[str, ...]) -> pd.DataFrame:
    """Per run, staleness, method and metric (`staleness_summary`); moments only under a step range."""
    by = ("run_id", "method", "metric", "staleness")
    if filters.steps is None:
        return _summary(db, "staleness_summary", filters, metrics, by)
    return _moments(db, filters, metrics, by)


def by_step(db: Path, filters: Filters, metrics: tuple[str, ...], quantiles: bool = True) -> pd.DataFrame:
    """Per run, step, method and metric (`step_summary`); moments only under a staleness range or
    without `quantiles` (about 0.3 s per method and metric on a 1,000-step run against 0.02 s)."""
    by = ("run_id", "method", "metric", "step")
    if quantiles and filters.staleness is None:
        return _summary(db, "step_summary", filters, metrics, by)
    return _moments(db, filters, metrics, by)


def step_staleness(db: Path, filters: Filters, metric: str) -> pd.DataFrame:
    """Exact moments per run, step, staleness and method of one metric (for the heat map)."""
    where, params = filters.where()
    return _frame(
        db,
        f"""SELECT run_id, method, step, staleness, n, mean, min, max FROM step_staleness_summary
            WHERE {where} AND metric = ? ORDER BY run_id, method, step, staleness""",
        params + [metric],
    )


def decision(db: Path, filters: Filters, tolerance: Tolerance = DEFAULT_TOLERANCE) -> pd.DataFrame:
    """`decision_summary` of the selected runs and estimators (every figure with its 95% interval, and its
    excess over the engine floor), with each one's safe staleness at `tolerance` (`safe_staleness(...)`:
    the point, with 95% confidence (`_lower`), `_upper`, and the same beyond the floor). Under a staleness
    or step range, the figures over it (`decision_over(...)`): no intervals, they are kept per run and
    per staleness."""
    where, params = Filters(filters.runs, filters.methods).where()
    source, over = "decision_summary", []
    if filters.steps is not None or filters.staleness is not None:
        first_step, last_step = filters.steps or (None, None)
        lo, hi = filters.staleness or (None, None)
        source = """(SELECT * EXCLUDE (step, staleness) FROM decision_over(
            first_step := coalesce(?, -9223372036854775808), last_step := coalesce(?, 9223372036854775807),
            lo := coalesce(?, -2147483648), hi := coalesce(?, 2147483647)))"""
        over = [first_step, last_step, lo, hi]
    return _frame(
        db,
        f"""SELECT d.*, s.* EXCLUDE (run_id, method) FROM {source} d
            LEFT JOIN {Tolerance.SQL.format(*map(literal, tolerance.values()))} s
            USING (run_id, method) WHERE {where} ORDER BY run_id, method""",
        [*over, *params],
    )


def decision_by_staleness(db: Path, filters: Filters) -> pd.DataFrame:
    """`decision_staleness_summary` of the selected runs, estimators and staleness range (all steps)."""
    where, params = Filters(filters.runs, filters.methods, filters.staleness).where()
    sql = f"SELECT * FROM decision_staleness_summary WHERE {where} ORDER BY run_id, method, staleness"
    return _frame(db, sql, params)


def weights_by_staleness(db: Path, filters: Filters) -> pd.DataFrame:
    """`weight_staleness_summary` (ESS fraction, chi2, KL estimators) of the selected runs and methods."""
    where, params = Filters(filters.runs, filters.methods, filters.staleness).where()
    sql = f"SELECT * FROM weight_staleness_summary WHERE {where} ORDER BY run_id, method, staleness"
    return _frame(db, sql, params)


def mismatch(db: Path, run_id: str) -> pd.DataFrame:
    """`mismatch_summary` of one run: the engine mismatch floor (staleness 0) and its share of the drift."""
    return _frame(db, "SELECT * FROM mismatch_summary WHERE run_id = ? ORDER BY staleness", [run_id])


def engine_floor(db: Path, run_id: str) -> pd.DataFrame:
    """`engine_floor` of one run: `rollout`'s decision figures at staleness 0 (the inference engine against
    the trainer) and the drift there, each with its 95% interval; no row without a token at staleness 0."""
    return _frame(db, "SELECT * FROM engine_floor WHERE run_id = ?", [run_id])


def trainer_mismatch(db: Path, run_id: str) -> pd.DataFrame:
    """`trainer_mismatch` of one run: each trainer's own mismatch figure at staleness 0 and its line,
    proxaudit's engine floor first."""
    order = "ORDER BY trainer <> 'proxaudit', trainer, metric"
    return _frame(db, f"SELECT * FROM trainer_mismatch WHERE run_id = ? {order}", [run_id])


def trainer_sentences(db: Path, run_id: str) -> list[str]:
    """What each trainer would log on one run at staleness 0, one sentence each, the run's id left off
    (`evaluator.store.trainers.trainer_sentences`); none without a token at staleness 0 with prox_logp."""
    with open_store(db, lock_wait_s=RETRY_SECONDS) as con:
        return sentences_of(trainer_figures(con, run_id), runs=False)


def what_if(db: Path, run_id: str) -> pd.DataFrame:
    """The what-if table of one run (`evaluator.store.reader.what_if_rows`): its decision under each loss of
    `replay --loss a,b,c`, the store's own loss first; empty when no replay made one."""
    with open_store(db, lock_wait_s=RETRY_SECONDS) as con:
        return what_if_rows(con, run_id).to_pandas()


def steps_with_prox(db: Path, run_id: str) -> list[int]:
    """The steps of `run_id` that have tokens with `prox_logp` (the ground truth), in order."""
    sql = "SELECT step FROM file_tokens WHERE run_id = ? GROUP BY step HAVING sum(n_prox) > 0 ORDER BY step"
    return [int(step) for step in _frame(db, sql, [run_id])["step"]]


def store_loss(db: Path) -> Loss:
    """The loss the store's decision metrics were computed under (the default before the first replay)."""
    frame = _frame(db, "SELECT value FROM store_meta WHERE key = 'loss'")
    return Loss.from_dict(json.loads(frame["value"].iloc[0])) if len(frame) else DEFAULT_LOSS


def findings(db: Path, run_id: str) -> pd.DataFrame:
    """The data-driven warnings `replay` stored with one run, with their evidence (docs/validate.md)."""
    sql = "SELECT * EXCLUDE (run_id, found_at) FROM run_finding WHERE run_id = ? ORDER BY rule"
    return _frame(db, sql, [run_id])


def undecided_checks(db: Path, run_id: str) -> pd.DataFrame:
    """The checks of the findings the data could not decide on one run, and why."""
    sql = "SELECT check_name, why FROM run_check WHERE run_id = ? AND status = 'undecided' ORDER BY 1"
    return _frame(db, sql, [run_id])


def pairing(db: Path, run_id: str) -> pd.DataFrame:
    """`pairing_summary` of one run: each interpolation's mean abs_error with each token's own version and
    with AReaL's shipped pairing (the previous token's version)."""
    return _frame(db, "SELECT * FROM pairing_summary WHERE run_id = ? ORDER BY interpolation", [run_id])


def judgement(
    db: Path, thresholds: str, run_id: str | None = None, tolerance: Tolerance = DEFAULT_TOLERANCE
) -> Judgement:
    """The gate's verdicts and each run's decision under the thresholds file (`evaluator.verdict.judge_db`;
    of `run_id` alone if given; the engine floor judged at `tolerance` where the thresholds have no floor
    check), runs sorted. ThresholdsError on a bad file."""
    return judge_db(db, thresholds, run=run_id, tolerance=tolerance)


def floor_verdict(db: Path, run_id: str, tolerance: Tolerance = DEFAULT_TOLERANCE) -> FloorVerdict:
    """The engine floor of one run judged at `tolerance` (no figure: not measured)."""
    with open_store(db, lock_wait_s=RETRY_SECONDS) as con:
        figures = engine_floors(con).get(run_id, {})
    return FloorVerdict(figures, floor_bounds(Thresholds("", ()), tolerance))


def run_minibatches(db: Path) -> dict[str, int]:
    """Each run's PPO minibatches per step (`evaluator.store.figures.minibatches`)."""
    with open_store(db, lock_wait_s=RETRY_SECONDS) as con:
        return minibatches(con)
