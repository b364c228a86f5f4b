"""Summaries of one record batch of a token log: every metric of every method, into accumulators.

For each Arrow record batch (numpy, float64): find each row's previous version (`evaluator.replay.pairing`),
keep `loss_mask` tokens, sort them once by
(run, step, staleness), compute every method's estimate (`evaluator.formulas.estimators`) and metric
(`evaluator.formulas.metrics`), then per series (method, metric):

- exact moments per (run, step, staleness): n and sum by `np.bincount`, min and max by `reduceat` over
  the sorted groups;
- sketch counts (`evaluator.formulas.sketch` buckets) per (run, step) and per (run, staleness): one
  compiled pass over the values (`evaluator.replay.kernels.histograms`) over the series' bucket range.

Both go into file-level dense accumulators (`evaluator.replay.accumulators`), so a step seen in many
batches costs one row of counts, not one per batch. `evaluator.replay.summarise` drives the batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from evaluator.formulas.decisions import DEFAULT_PARAMS, DecisionParams
from evaluator.formulas.estimators import estimates
from evaluator.formulas.metrics import Terms, Truth, metrics_for
from evaluator.formulas.sketch import bucket_code
from evaluator.replay.accumulators import Moments, SketchCounts
from evaluator.replay.pairing import previous_versions
from schemas.store import METHODS
from schemas.token_log import LOGP_COLUMNS

SERIES: tuple[tuple[str, str], ...] = tuple(
    (method, m.name) for method in METHODS for m in metrics_for(method)
)
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


@dataclass
class Groups:
    """Tokens of a batch grouped by (run, step, staleness): per-token ids and per-group labels."""

    group: np.ndarray  # (T,) group id, sorted ascending
    labels: dict[str, np.ndarray]  # run, step, staleness of each (run, step, staleness) group, (G,)
    step_labels: dict[str, np.ndarray]  # run, step of each (run, step) group
    stale_labels: dict[str, np.ndarray]  # run, staleness of each (run, staleness) group
    step_of_group: np.ndarray  # (G,) the (run, step) group of each (run, step, staleness) group
    stale_of_group: np.ndarray  # (G,) the (run, staleness) group of each (run, step, staleness) group

    def extents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids of the nonempty groups, their token counts, their first token), computed once."""
        if not hasattr(self, "_extents"):
            n = np.bincount(self.group, minlength=len(self.labels["step"]))  # (G,)
            present = np.flatnonzero(n)
            self._extents = present, n[present], (np.cumsum(n) - n)[present]
        return self._extents

    def subset(self, keep: np.ndarray | None) -> Groups:
        if keep is None:
            return self
        return replace(self, group=self.group[keep])


def _first_of_runs(sorted_key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(id of each element's run of equal values, index of each run's first element)."""
    new = np.empty(len(sorted_key), dtype=bool)
    new[:1] = True
    np.not_equal(sorted_key[1:], sorted_key[:-1], out=new[1:])
    return np.cumsum(new) - 1, np.flatnonzero(new)


def group_tokens(run: np.ndarray, step: np.ndarray, staleness: np.ndarray) -> tuple[np.ndarray, Groups]:
    """The permutation that sorts tokens by (run, step, staleness), and the groups in that order.

    One int64 key per token, run * steps * staleness values wide; when valid but far-apart steps would
    overflow it, the steps are first numbered densely (same order, same groups)."""
    stale0, n_stale = staleness.min(), int(staleness.max() - staleness.min()) + 1
    step_values = None
    if (int(run.max()) + 1) * (int(step.max()) - int(step.min()) + 1) * n_stale >= 1 << 62:
        step_values, step = np.unique(step, return_inverse=True)
    step0 = step.min()
    step_key = run * (int(step.max() - step0) + 1) + (step - step0)  # (T,)
    order = np.argsort(step_key * n_stale + (staleness - stale0), kind="stable")
    run, step, staleness, step_key = run[order], step[order], staleness[order], step_key[order]
    group, first = _first_of_runs(step_key * n_stale + (staleness - stale0))
    step_of_group, first_of_step = _first_of_runs(step_key[first])  # (G,), (G_step,) over the groups
    step_first = first[first_of_step]  # (G_step,) first token of each (run, step) group
    stale_key = run[first] * n_stale + (staleness[first] - stale0)  # (G,)
    stale_unique, stale_of_group = np.unique(stale_key, return_inverse=True)
    if step_values is not None:  # back from the dense numbers to the steps
        step = step_values[step]
    groups = Groups(
        group=group,
        labels={"run": run[first], "step": step[first], "staleness": staleness[first]},
        step_labels={"run": run[step_first], "step": step[step_first]},
        stale_labels={"run": stale_unique // n_stale, "staleness": stale_unique % n_stale + stale0},
        step_of_group=step_of_group,
        stale_of_group=stale_of_group,
    )
    return order, groups


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
    present, n, starts = groups.extents()
    mins, maxs = np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)  # (G,)
    sums, squares = np.add.reduceat(values, starts), np.add.reduceat(values * values, starts)
    acc.moments.add(series, rows.group[present], n, sums, squares, mins, maxs)
    if not sketch:
        return
    lo, hi = mins.min(), maxs.max()
    if np.isnan(lo) or np.isnan(hi):
        raise ValueError(f"{SERIES[series]} has a NaN value: no sketch bucket holds it")
    lo, hi = bucket_code(np.array([lo, hi]))  # buckets are ordered like values
    from evaluator.replay.kernels import histograms  # numba: imported on first use (or by load_kernels)

    by_step, by_stale = histograms(
        np.ascontiguousarray(values),  # the loop reads the floats' bits
        groups.group,
        groups.step_of_group,
        groups.stale_of_group,
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


def add_batch(
    acc: Summaries,
    batch: pa.RecordBatch,
    runs: dict[str, int],
    resumes: pl.DataFrame,
    params: DecisionParams = DEFAULT_PARAMS,
) -> int:
    """Summarise one record batch into `acc`; returns its number of loss tokens. `resumes` are the file's
    resumed-segment starts (`evaluator.replay.pairing`), `params` the loss's thresholds (DOMAIN.md 3b)."""
    kept = np.flatnonzero(batch.column("loss_mask").to_numpy(zero_copy_only=False))  # (T,) loss tokens
    if len(kept) == 0:
        return 0
    run = _run_codes(batch, runs)  # (rows,)
    prev_version = previous_versions(batch, run, resumes)  # (rows,) from every row, masked or not
    step = _column(batch, "step", np.int64)[kept]
    staleness = step - _column(batch, "behave_version", np.int64)[kept]
    order, groups = group_tokens(run[kept], step, staleness)
    kept = kept[order]  # the loss tokens' rows, sorted by group
    cols = {
        name: values[kept]
        for name in ("minibatch", "n_minibatches", *LOGP_COLUMNS, "advantage")
        if (values := _column(batch, name, np.float64)) is not None
    }
    b, t = cols["behave_logp"], cols["theta_logp"]
    g = cols.get("prox_logp", np.full(len(b), np.nan))
    has_truth = ~np.isnan(g)  # (T,)
    n_tokens = np.bincount(groups.group)
    n_prox = np.bincount(groups.group, weights=has_truth).astype(np.int64)
    rows = CellRows(
        acc.moments.cells.rows(groups.labels),
        acc.by_step.cells.rows(groups.step_labels),
        acc.by_staleness.cells.rows(groups.stale_labels),
    )
    acc.moments.add_tokens(rows.group, n_tokens, n_prox)
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
    truth = Truth(b=b, t=t, g=g, advantage=cols.get("advantage"), params=params)
    for method, a in per_method.items():
        covered = ~np.isnan(a)
        keep = None if covered.all() else covered
        terms = Terms(a, truth, keep)
        on_all = groups.subset(keep)
        on_truth = on_all.subset(None if terms.all_truth else terms.has_truth)
        for metric in metrics_for(method):
            values = metric.value(terms)
            on = on_truth if metric.needs_truth else on_all
            add_series(acc, SERIES_ID[method, metric.name], values, on, rows, metric.sketch)
    acc.by_step.maybe_flush()
    acc.by_staleness.maybe_flush()
    return int(len(order))
