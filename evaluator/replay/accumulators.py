"""File-level accumulators of replay's summaries, filled batch by batch (`evaluator.replay.summarise`).

Each table is kept dense while a file is read, so a step or staleness value seen in many record batches
costs one row of counts, not one row per batch:

- `CellIndex`: the file-level row of each cell, e.g. (run, step, staleness), in order of first sight;
- `Moments`: n, sum, sum of squares, min, max per (cell, series), plus `n_tokens` and `n_prox` per cell.
  Sums are folded
  left to right in batch order (`((sum_1 + sum_2) + sum_3) + ...` of the per-batch sums), a fixed order
  that does not depend on memory bounds (before, the last bit of a sum depended on when polars merged
  the per-batch rows);
- `SketchCounts`: bucket counts per (cell, bucket) of each series over the series' bucket range so far,
  handed out as sparse rows when the dense arrays pass `DENSE_BUDGET` elements (bounded memory on a long
  file of small steps). The store sums the counts of rows that repeat (exact: integers).
"""

from __future__ import annotations

import numpy as np

DENSE_BUDGET = 1 << 23
"""Elements (int64) the dense sketch counts of one table may hold before they are flushed: 64 MiB."""


class CellIndex:
    """The file-level row of each cell (a tuple of labels), numbered in order of first sight."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self._row: dict[tuple, int] = {}

    def __len__(self) -> int:
        return len(self._row)

    def rows(self, labels: dict[str, np.ndarray]) -> np.ndarray:
        """Rows of the given cells (one per label tuple; new cells get new rows). A Python loop over
        cells, which are few per batch (steps x staleness values), never over tokens."""
        keys = zip(*(labels[n].tolist() for n in self.names), strict=True)
        return np.array([self._row.setdefault(k, len(self._row)) for k in keys], dtype=np.int64)

    def labels(self) -> dict[str, np.ndarray]:
        """The labels of every row, in row order."""
        cells = np.array(list(self._row), dtype=np.int64).reshape(len(self._row), len(self.names))
        return {n: cells[:, i] for i, n in enumerate(self.names)}


def _grown(array: np.ndarray, rows: int, fill) -> np.ndarray:
    """`array` with at least `rows` rows (doubling), new rows set to `fill`."""
    if rows <= len(array):
        return array
    out = np.full((max(rows, 2 * len(array)), *array.shape[1:]), fill, dtype=array.dtype)
    out[: len(array)] = array
    return out


class Moments:
    """Exact moments per (cell, series) and token counts per cell, cells (run, step, staleness)."""

    def __init__(self, n_series: int) -> None:
        self.cells = CellIndex(("run", "step", "staleness"))
        self.tokens = np.zeros((0, 2), dtype=np.int64)  # (cells, 2) n_tokens, n_prox
        self.n = np.zeros((0, n_series), dtype=np.int64)  # (cells, S)
        self.sum = np.zeros((0, n_series))
        self.sum_sq = np.zeros((0, n_series))
        self.min = np.zeros((0, n_series))
        self.max = np.zeros((0, n_series))

    def add_tokens(self, rows: np.ndarray, n_tokens: np.ndarray, n_prox: np.ndarray) -> None:
        need = len(self.cells)
        self.tokens = _grown(self.tokens, need, 0)
        self.n = _grown(self.n, need, 0)
        self.sum, self.sum_sq, self.min, self.max = (
            _grown(a, need, 0.0) for a in (self.sum, self.sum_sq, self.min, self.max)
        )
        self.tokens[rows] += np.stack([n_tokens, n_prox], axis=1)

    def add(self, series: int | np.ndarray, rows: np.ndarray, n, sums, squares, mins, maxs) -> None:
        """Fold one batch's moments of `series` on the cells `rows` into the totals ((row, series) pairs
        unique)."""
        seen = self.n[rows, series] > 0  # a first sum is taken as is (keeps a -0.0)
        self.sum[rows, series] = np.where(seen, self.sum[rows, series] + sums, sums)
        self.sum_sq[rows, series] = np.where(seen, self.sum_sq[rows, series] + squares, squares)
        self.min[rows, series] = np.where(seen, np.minimum(self.min[rows, series], mins), mins)
        self.max[rows, series] = np.where(seen, np.maximum(self.max[rows, series], maxs), maxs)
        self.n[rows, series] += n

    def fold(self, tokens: dict[str, np.ndarray], moments: dict[str, np.ndarray]) -> None:
        """Fold one batch's `token_rows()` and `moment_rows()` (of another accumulator) into these."""
        self.add_tokens(self.cells.rows(tokens), tokens["n_tokens"], tokens["n_prox"])
        rows = self.cells.rows(moments)
        m = moments
        self.add(m["series"], rows, m["n"], m["sum"], m["sum_sq"], m["min"], m["max"])

    def token_rows(self) -> dict[str, np.ndarray]:
        """Rows of `file_tokens`: run, step, staleness, n_tokens, n_prox."""
        k = len(self.cells)
        return {**self.cells.labels(), "n_tokens": self.tokens[:k, 0], "n_prox": self.tokens[:k, 1]}

    def moment_rows(self) -> dict[str, np.ndarray]:
        """Rows of `metric_moments` for every (cell, series) with tokens: labels, series, n, sum, sum_sq,
        min, max."""
        k = len(self.cells)
        cell, series = np.nonzero(self.n[:k])
        labels = self.cells.labels()
        return {
            **{name: v[cell] for name, v in labels.items()},
            "series": series,
            **{
                name: a[cell, series]
                for name, a in (("n", self.n), ("sum", self.sum), ("sum_sq", self.sum_sq))
            },
            **{name: a[cell, series] for name, a in (("min", self.min), ("max", self.max))},
        }


class SketchCounts:
    """Sketch bucket counts per (cell, bucket) of each series, dense over the series' bucket range."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.cells = CellIndex(names)
        self.dense: dict[int, tuple[int, np.ndarray]] = {}  # series -> (lowest bucket, counts (cells, B))
        self.sparse: list[dict[str, np.ndarray]] = []

    def add(self, series: int, rows: np.ndarray, lo: int, counts: np.ndarray) -> None:
        """Add `counts` (len(rows), span), the histograms of buckets lo.. on the cells `rows` (unique)."""
        span = counts.shape[1]
        first, table = self.dense.get(series, (lo, np.zeros((0, span), dtype=np.int64)))
        new_first, new_end = min(first, lo), max(first + table.shape[1], lo + span)
        if (new_first, new_end) != (first, first + table.shape[1]):  # widen the bucket range
            wider = np.zeros((len(table), new_end - new_first), dtype=np.int64)
            wider[:, first - new_first : first - new_first + table.shape[1]] = table
            first, table = new_first, wider
        table = _grown(table, len(self.cells), 0)
        table[rows, lo - first : lo - first + span] += counts
        self.dense[series] = first, table
        if self.size() > DENSE_BUDGET:  # within a batch too: many cells x a wide range of buckets
            self._spill()

    def size(self) -> int:
        return sum(table.size for _, table in self.dense.values())

    def _spill(self) -> None:
        """Move the dense counts to sparse rows (nonzero cells only), keeping the cells' rows."""
        labels = self.cells.labels()
        for series, (first, table) in self.dense.items():
            cell, offset = np.nonzero(table[: len(self.cells)])
            self.sparse.append(
                {
                    **{name: v[cell] for name, v in labels.items()},
                    "series": np.full(len(cell), series),
                    "bucket": offset + first,
                    "count": table[cell, offset],
                }
            )
        self.dense = {}

    def flush(self) -> None:
        """Move the dense counts to sparse rows and start afresh (between batches: new cells' rows)."""
        self._spill()
        self.cells = CellIndex(self.names)

    def maybe_flush(self) -> None:
        """Flush when the dense counts pass `DENSE_BUDGET` elements (call between batches only)."""
        if self.size() > DENSE_BUDGET:
            self.flush()

    def rows(self) -> list[dict[str, np.ndarray]]:
        """Every count as sparse rows: labels, series, bucket, count."""
        self.flush()
        return self.sparse
