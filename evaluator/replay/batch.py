"""Summaries of one record batch of a token log: every metric of every method, into accumulators.

For each Arrow record batch (numpy, float64): find each row's previous version (`evaluator.replay.pairing`),
keep `loss_mask` tokens, sort them once by
(run, step, staleness), compute every method's estimate (`evaluator.formulas.estimators`) and metric
(`evaluator.formulas.metrics`), then per series (method, metric):

- exact moments per (run, step, staleness): n and sum by `np.bincount`, min and max by `reduceat` over
  the sorted groups;
- sketch counts (`evaluator.formulas.sketch` buckets) per (run, step) and per (run, staleness) over the
  series' bucket range (`evaluator.replay.histograms`: numpy for a small batch, a compiled pass for more).

Both go into file-level dense accumulators (`evaluator.replay.accumulators`), so a step seen in many
batches costs one row of counts, not one per batch. `evaluator.replay.summarise` drives the batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from evaluator.formulas.estimators import estimates
from evaluator.formulas.gradients import Sequences
from evaluator.formulas.loss import DEFAULT_LOSS, Loss
from evaluator.formulas.metrics import Coverage, coverage, method_metrics
from evaluator.formulas.sketch import bucket_code
from evaluator.formulas.terms import Tokens, prox_terms
from evaluator.replay.accumulators import Moments, SketchCounts
from evaluator.replay.histograms import histograms
from evaluator.replay.pairing import previous_versions
from schemas.store import METHODS, metrics_for
from schemas.token_log import LOGP_COLUMNS

SERIES: tuple[tuple[str, str], ...] = tuple(
    (method, m.name) for method in METHODS for m in metrics_for(method)
)
"""Every (method, metric) any loss has; a replay fills those of its loss."""
SERIES_ID: dict[tuple[str, str], int] = {s: i for i, s in enumerate(SERIES)}
INPUT_COLUMNS = (
    "run_id",
    "step",
    "minibatch",
    "n_minibatches",
    "seq_id",
    "pos",
    "loss_mask",
    "behave_logp",
    "behave_version",
    "prox_logp",
    "theta_logp",
    "proximal_t_logp",
    "advantage",
)


@dataclass(frozen=True)
class Cells:
    """The (run, step, staleness) cells of a batch's tokens, in sorted order, and how they roll up into
    (run, step) and (run, staleness) cells."""

    labels: dict[str, np.ndarray]  # run, step, staleness of each cell, (G,)
    step_labels: dict[str, np.ndarray]  # run, step of each (run, step) cell, (G_step,)
    stale_labels: dict[str, np.ndarray]  # run, staleness of each (run, staleness) cell, (G_stale,)
    step_of_group: np.ndarray  # (G,) the (run, step) cell of each cell
    stale_of_group: np.ndarray  # (G,) the (run, staleness) cell of each cell


@dataclass(frozen=True)
class Groups:
    """Tokens sorted by cell: each token's cell id (ascending) and the extent of each nonempty cell."""

    group: np.ndarray  # (T,) cell id of each token, sorted ascending
    cells: Cells
    present: np.ndarray = field(init=False)  # ids of the nonempty cells
    n: np.ndarray = field(init=False)  # their token counts
    starts: np.ndarray = field(init=False)  # their first token

    def __post_init__(self) -> None:
        n = np.bincount(self.group, minlength=len(self.cells.labels["step"]))  # (G,)
        present = np.flatnonzero(n)
        for name, value in (("present", present), ("n", n[present]), ("starts", (np.cumsum(n) - n)[present])):
            object.__setattr__(self, name, value)

    def subset(self, keep: np.ndarray | None) -> Groups:
        """The tokens where `keep` is true (all of them for None)."""
        return self if keep is None else Groups(self.group[keep], self.cells)


def first_of_runs(sorted_key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(id of each element's run of equal values, index of each run's first element)."""
    new = np.empty(len(sorted_key), dtype=bool)
    new[:1] = True
    np.not_equal(sorted_key[1:], sorted_key[:-1], out=new[1:])
    return np.cumsum(new) - 1, np.flatnonzero(new)


def dense_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(codes, value of each code, number of codes): small nonnegative integers in the order of `values`,
    `values - min` when their range is no wider than their count (the usual batch), else their rank among
    the distinct values (steps or staleness values far apart), so that packed keys never overflow."""
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < len(values):
        return values - lo, np.arange(lo, hi + 1, dtype=values.dtype), hi - lo + 1
    distinct, codes = np.unique(values, return_inverse=True)
    return codes, distinct, len(distinct)


def group_tokens(run: np.ndarray, step: np.ndarray, staleness: np.ndarray) -> tuple[np.ndarray, Groups]:
    """The permutation that sorts tokens by (run, step, staleness), and the groups in that order."""
    step_code, step_value, n_steps = dense_codes(step)
    stale_code, stale_value, n_stale = dense_codes(staleness)
    step_key = run * n_steps + step_code  # (T,) one per (run, step)
    key = step_key * n_stale + stale_code  # (T,) one per (run, step, staleness)
    order = np.argsort(key, kind="stable")
    key, step_key = key[order], step_key[order]
    group, first = first_of_runs(key)  # (T,), (G,)
    step_of_group, first_of_step = first_of_runs(step_key[first])  # (G,), (G_step,)
    run_of, step_of = np.divmod(step_key[first], n_steps)  # (G,) run and step code of each cell
    stale_of = key[first] % n_stale  # (G,) staleness code of each cell
    stale_unique, stale_of_group = np.unique(run_of * n_stale + stale_of, return_inverse=True)
    cells = Cells(
        labels={"run": run_of, "step": step_value[step_of], "staleness": stale_value[stale_of]},
        step_labels={"run": run_of[first_of_step], "step": step_value[step_of[first_of_step]]},
        stale_labels={"run": stale_unique // n_stale, "staleness": stale_value[stale_unique % n_stale]},
        step_of_group=step_of_group,
        stale_of_group=stale_of_group,
    )
    return order, Groups(group, cells)


@dataclass
class Summaries:
    """A file's summaries so far: moments and token counts per (run, step, staleness), sketch counts
    per (run, step) and per (run, staleness)."""

    moments: Moments = field(default_factory=lambda: Moments(len(SERIES)))
    by_step: SketchCounts = field(default_factory=lambda: SketchCounts(("run", "step")))
    by_staleness: SketchCounts = field(default_factory=lambda: SketchCounts(("run", "staleness")))


@dataclass
class CellRows:
    """File-level accumulator rows of a batch's (run, step, staleness), (run, step), (run, staleness)
    groups (indexed by the batch's group ids)."""

    group: np.ndarray  # (G,)
    step: np.ndarray  # (G_step,)
    staleness: np.ndarray  # (G_stale,)


def add_series(
    acc: Summaries, series: int, values: np.ndarray, groups: Groups, rows: CellRows, sketch: bool = True
) -> None:
    """Moments (and, if `sketch`, sketch counts) of one series over tokens sorted by group (`values` is
    (T,))."""
    if len(values) == 0:
        return
    present, n, starts = groups.present, groups.n, groups.starts
    mins, maxs = np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)  # (G,)
    sums, squares = np.add.reduceat(values, starts), np.add.reduceat(values * values, starts)
    acc.moments.add(series, rows.group[present], n, sums, squares, mins, maxs)
    if not sketch:
        return
    lo, hi = mins.min(), maxs.max()
    if np.isnan(lo) or np.isnan(hi):
        raise ValueError(f"{SERIES[series]} has a NaN value: no sketch bucket holds it")
    lo, hi = bucket_code(np.array([lo, hi]))  # buckets are ordered like values
    by_step, by_stale = histograms(
        np.ascontiguousarray(values),  # the loop reads the floats' bits
        groups.group,
        groups.cells.step_of_group,
        groups.cells.stale_of_group,
        int(lo),
        int(hi - lo) + 1,
        len(rows.step),
        len(rows.staleness),
    )
    acc.by_step.add(series, rows.step, int(lo), by_step)
    acc.by_staleness.add(series, rows.staleness, int(lo), by_stale)


def _column(batch: pa.RecordBatch, name: str, dtype: type) -> np.ndarray | None:
    if name not in batch.schema.names:
        return None
    return batch.column(name).to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _run_codes(batch: pa.RecordBatch, runs: dict[str, int]) -> np.ndarray:
    """File-wide integer codes of the batch's `run_id` values (new runs get the next code)."""
    encoded = pc.dictionary_encode(batch.column("run_id"))
    to_file = np.array(
        [runs.setdefault(r, len(runs)) for r in encoded.dictionary.to_pylist()], dtype=np.int64
    )
    return to_file[encoded.indices.to_numpy(zero_copy_only=False)]


def _cell_rows(acc: Summaries, groups: Groups) -> CellRows:
    """The accumulators' rows of the groups' cells (new cells get new rows)."""
    return CellRows(
        acc.moments.cells.rows(groups.cells.labels),
        acc.by_step.cells.rows(groups.cells.step_labels),
        acc.by_staleness.cells.rows(groups.cells.stale_labels),
    )


def sequences_of(
    batch: pa.RecordBatch, kept: np.ndarray, run: np.ndarray, step: np.ndarray, staleness: np.ndarray
) -> tuple[np.ndarray, Groups, np.ndarray]:
    """Each loss token's sequence code, the sequences' groups and each sequence's minibatch code (of its
    `(run, step, minibatch)`). `kept`: the loss tokens' rows in file order (a sequence's rows are
    contiguous: `evaluator.replay.reading`), `run`, `step`, `staleness` theirs. A sequence is counted at
    its step and the staleness of its stalest token; codes follow the groups' order, so per-sequence
    arrays are sorted by group."""
    seq, mb = (_column(batch, k, np.int64)[kept] for k in ("seq_id", "minibatch"))
    new = np.ones(len(kept), dtype=bool)
    new[1:] = (run[1:] != run[:-1]) | (seq[1:] != seq[:-1]) | (mb[1:] != mb[:-1])
    code = np.cumsum(new) - 1  # (T,) in file order
    first = np.flatnonzero(new)  # (S,)
    stalest = np.full(len(first), np.iinfo(np.int64).min)
    np.maximum.at(stalest, code, staleness)
    order, groups = group_tokens(run[first], step[first], stalest)
    rank = np.empty(len(first), dtype=np.int64)
    rank[order] = np.arange(len(first))
    keys = np.stack([run[first], step[first], mb[first]])  # (3, S)
    minibatch = np.unique(keys, axis=1, return_inverse=True)[1].reshape(-1)[order]  # (S,) in code order
    return rank[code], groups, minibatch


def add_batch(
    acc: Summaries,
    batch: pa.RecordBatch,
    runs: dict[str, int],
    resumes: pl.DataFrame,
    loss: Loss = DEFAULT_LOSS,
) -> int:
    """Summarise one record batch of whole sequences into `acc`; returns its number of loss tokens.
    `resumes` are the file's resumed-segment starts (`evaluator.replay.pairing`), `loss` the loss the
    decision metrics are computed under."""
    kept = np.flatnonzero(batch.column("loss_mask").to_numpy(zero_copy_only=False))  # (T,) loss tokens
    if len(kept) == 0:
        return 0
    run = _run_codes(batch, runs)  # (rows,)
    prev_version = previous_versions(batch, run, resumes)  # (rows,) from every row, masked or not
    step = _column(batch, "step", np.int64)[kept]
    staleness = step - _column(batch, "behave_version", np.int64)[kept]
    sequence, seq_groups, minibatch = sequences_of(batch, kept, run[kept], step, staleness)
    order, groups = group_tokens(run[kept], step, staleness)
    kept = kept[order]  # the loss tokens' rows, sorted by group
    cols = {
        name: values[kept]
        for name in ("minibatch", "n_minibatches", *LOGP_COLUMNS, "advantage")
        if (values := _column(batch, name, np.float64)) is not None
    }
    b, t = cols["behave_logp"], cols["theta_logp"]
    g = cols.get("prox_logp", np.full(len(b), np.nan))
    rows, seq_rows = _cell_rows(acc, groups), _cell_rows(acc, seq_groups)
    acc.moments.add_tokens(
        rows.group,
        np.bincount(groups.group),
        np.bincount(groups.group, weights=~np.isnan(g)).astype(np.int64),
    )
    per_method = estimates(
        behave_logp=b,
        theta_logp=t,
        prox_logp=g,
        step=step[order],
        behave_version=step[order] - staleness[order],
        minibatch=cols["minibatch"],
        n_minibatches=cols["n_minibatches"],
        prev_version=prev_version[kept],
        proximal_t_logp=cols.get("proximal_t_logp"),
    )
    sequences = Sequences(sequence[order], len(seq_groups.group), minibatch)
    tokens = Tokens(b=b, t=t, g=g, advantage=cols.get("advantage"), sequences=sequences)
    truth = prox_terms(g, tokens, loss)
    for method, a in per_method.items():
        on = coverage(method, a, tokens, loss)
        grouped = Coverage(
            groups.subset(on.estimated),
            groups.subset(on.judged),
            seq_groups.subset(on.estimated_sequences),
            seq_groups.subset(on.judged_sequences),
        )
        for metric, values in method_metrics(method, a, tokens, truth, loss, on):
            cells = seq_rows if metric.per == "sequence" else rows
            add_series(acc, SERIES_ID[method, metric.name], values, grouped.of(metric), cells, metric.sketch)
    acc.by_step.maybe_flush()
    acc.by_staleness.maybe_flush()
    return int(len(order))
