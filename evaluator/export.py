"""The store's per-step series as scalars for the trainer's own dashboards: TensorBoard event files and
W&B runs (offline by default), one per run, named like AReaL's stats keys so the charts line up:
`{method}/{metric}/avg|min|max` for every method x metric of `step_summary`, and
`{method}/decision/{figure}` for the decision figures of DOMAIN.md 3b per step (where the ground truth
exists). The x-axis is the trainer step."""

from __future__ import annotations

import bisect
import hashlib
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from evaluator.duck import literal
from evaluator.store import open_store

STAT_SUFFIX = {"mean": "avg", "min": "min", "max": "max"}
DECISION_FIGURES = ("gradient_mass_error", "clip_flip_rate", "bound_flip_rate")


@dataclass(frozen=True)
class RunSeries:
    """One run's scalars: tag -> (steps, values), each sorted by step."""

    run_id: str
    series: dict[str, tuple[list[int], list[float]]]

    def by_step(self) -> Iterator[tuple[int, dict[str, float]]]:
        """{tag: value} per step, in step order (what `wandb.log` takes)."""
        steps: dict[int, dict[str, float]] = {}
        for tag, (xs, ys) in self.series.items():
            for x, y in zip(xs, ys, strict=True):
                steps.setdefault(x, {})[tag] = y
        yield from sorted(steps.items())

    def last_step(self) -> int:
        return max(xs[-1] for xs, _ in self.series.values())

    def between(self, after: int, upto: int) -> RunSeries:
        """The scalars of the steps in `(after, upto]` (tags left without a step dropped)."""
        cut = {}
        for tag, (xs, ys) in self.series.items():
            lo, hi = bisect.bisect_right(xs, after), bisect.bisect_right(xs, upto)
            if lo < hi:
                cut[tag] = (xs[lo:hi], ys[lo:hi])
        return RunSeries(self.run_id, cut)


def _long(con, sql: str, stats: dict[str, str], prefix) -> pa.Table:
    """Rows (run_id, tag, step, value) of a wide query, one per stat column that is not null."""
    wide = con.sql(sql).to_arrow_table()
    parts = []
    for column, suffix in stats.items():
        kept = wide.filter(pc.is_valid(wide[column]))
        tags = pc.binary_join_element_wise(*prefix(kept), pa.scalar(suffix), "/")
        parts.append(pa.table({"run_id": kept["run_id"], "tag": tags, "step": kept["step"],
                               "value": pc.cast(kept[column], pa.float64())}))  # fmt: skip
    return pa.concat_tables(parts)


def run_series(db: str | Path, run_id: str | None = None, from_step: int = 0) -> list[RunSeries]:
    """Every run's (or one run's) scalars from the store, of the steps from `from_step` on."""
    where = "TRUE" if run_id is None else f"run_id = {literal(run_id)}"
    with open_store(db) as con:
        metrics = _long(
            con,
            "SELECT run_id, step, method, metric, mean, min, max FROM step_summary "
            f"WHERE {where} AND step >= {literal(from_step)}",
            STAT_SUFFIX,
            lambda t: (t["method"], t["metric"]),
        )
        decisions = _long(
            con,
            "SELECT * EXCLUDE (staleness) FROM decision_over(by_step := true, first_step := "
            f"{int(from_step)}) WHERE {where}",
            dict(zip(DECISION_FIGURES, DECISION_FIGURES, strict=True)),
            lambda t: (t["method"], pa.array(["decision"] * t.num_rows, pa.string())),
        )
    rows = pa.concat_tables([metrics, decisions]).sort_by([("run_id", "ascending"), ("tag", "ascending"),
                                                           ("step", "ascending")])  # fmt: skip
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for run, tag, step, value in zip(*(rows[c].to_pylist() for c in rows.column_names), strict=True):
        xs, ys = out.setdefault(run, {}).setdefault(tag, ([], []))
        xs.append(step)
        ys.append(value)
    return [RunSeries(run, series) for run, series in out.items()]


def run_folder(run_id: str) -> str:
    """The name of a run's folder: the run_id with every character but letters, digits and `-_.=+`
    percent-encoded, and a leading dot too, so that a run_id from the data never names another place
    (`../x`, `/etc/x`), a hidden file or the export folder itself (`.`, the empty run_id: `%`); a long one
    keeps a digest of itself (file names end at 255 bytes)."""
    name = re.sub(r"^\.", "%2E", urllib.parse.quote(run_id, safe="-_.=+")) or "%"
    if len(name) > 200:
        name = f"{name[:180]}~{hashlib.blake2b(run_id.encode(), digest_size=8).hexdigest()}"
    return name


def to_tensorboard(runs: list[RunSeries], log_dir: str | Path) -> list[Path]:
    """One event-file folder per run under `log_dir` (`log_dir/{run_folder(run_id)}`: the run_id itself
    for a plain name), through TensorBoard's own writer (`tensorboard.summary.Writer`)."""
    from tensorboard.summary import Writer

    written = []
    for run in runs:
        folder = Path(log_dir) / run_folder(run.run_id)
        writer = Writer(str(folder))
        add_scalars(writer, run)
        writer.close()
        written.append(folder)
    return written


def to_wandb(runs: list[RunSeries], project: str, directory: str | Path, mode: str = "offline") -> list[str]:
    """One W&B run per proxaudit run (offline by default: a local run folder under `directory` that
    `wandb sync` uploads), the scalars logged per step with the step as W&B's step."""
    import wandb

    ids = []
    for run in runs:
        with wandb.init(project=project, name=run.run_id, dir=str(directory), mode=mode,
                        config={"proxaudit_run_id": run.run_id}, reinit="create_new") as wb:  # fmt: skip
            log_steps(wb, run)
            ids.append(wb.id)
    return ids


def add_scalars(writer, run: RunSeries) -> None:
    """Every scalar of `run` to a `tensorboard.summary.Writer`."""
    for tag, (xs, ys) in run.series.items():
        for x, y in zip(xs, ys, strict=True):
            writer.add_scalar(tag, y, x)


def log_steps(wb, run: RunSeries) -> None:
    """Every step of `run` to a W&B run, the trainer step as W&B's step."""
    for step, values in run.by_step():
        wb.log(values, step=step)
