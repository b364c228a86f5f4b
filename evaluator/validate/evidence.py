"""What the data-driven findings need of one file (`evaluator.validate.findings`): small aggregates per run,
computed by the validator after its rules, and pooled over the files of a call by adding them up.

- `cells`, per (run, step, minibatch, staleness), over every row: loss tokens, masked rows, tokens with
  `prox_logp`, the sums of |prox - behave| (drift), of its square and of behave - prox (signed), verl's
  |exp(prox) - exp(behave)|, NeMo-RL's exp|prox - behave|, |theta - prox|, |theta - behave|, how many
  tokens have behave exactly equal to prox or to theta, theta exactly equal to prox, prox exactly 0,
  behave exactly 0 (with prox, and where theta is below -0.1: a placeholder), a log-prob below -1000
  (per column), the step's n_minibatches (least and most), and an example token. Counts are sums of
  casts, sums over trained rows CASE expressions: cheaper in DuckDB than FILTER clauses.
- from a sample of whole blocks of consecutive responses (`block_sample`; a file under
  `MAX_SAMPLE_ROWS` rows whole): the shape of each response (`shapes`: loss mask, advantage, reward,
  movement), a response repeated in a later minibatch (`repeats`), each column's values (`columns`:
  precision, one value per response, the most frequent value, coverage; per run, `tokens`: placeholders,
  behave bit-equal to the trainer's, token ids), GRPO groups (`groups`) and the
  proximal_t segments (`segments`), each as counts and sums per run (or per run and column), and a few
  example tokens per kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl
import pyarrow as pa

from evaluator.duck import arrow_view, connect, literal
from evaluator.formulas.gradients import LOG_WEIGHT_MAX
from evaluator.validate import columns, groups, repeats, segments, shapes
from evaluator.validate.block_sample import BLOCK, BlockSample, load_block_sample
from evaluator.validate.columns import PLACEHOLDER_THETA, SENTINEL
from schemas.token_log import LOGP_COLUMNS

KEYS: dict[str, tuple[str, ...]] = {
    "cells": ("run_id", "step", "minibatch", "staleness"),
    "proximal_t": ("run_id", "k", "staleness"),
    "segment_pairs": ("run_id",),
    "refresh": ("run_id",),
    "mask": ("run_id",),
    "mask_hist": ("run_id", "kind", "value"),
    "advantage": ("run_id",),
    "movement": ("run_id", "kind", "sign"),
    "roll": ("run_id", "shift"),
    "repeats": ("run_id",),
    "groups": ("run_id", "size"),
    "columns": ("run_id", "name"),
    "tokens": ("run_id",),
}
"""Each table of the evidence and its key; the other columns add up over files (`examples`: kept)."""
_NOT_SUMMED = {
    "n_minibatches": "max(n_minibatches)",
    "n_minibatches_min": "min(n_minibatches_min)",
    "example_seq": "min(example_seq)",
    "example_pos": "arg_min(example_pos, example_seq)",
}


@dataclass
class Evidence:
    """One file's aggregates (Arrow tables with a run_id column), or several files' added up."""

    tables: dict[str, pa.Table]
    examples: pa.Table
    """run_id, kind, step, seq_id, minibatch, pos: a few example tokens per kind of signal."""


def _count(condition: str) -> str:
    """SQL: the rows of a group where `condition` holds (a sum of casts: cheaper in DuckDB than a FILTER)."""
    return f"coalesce(sum(({condition})::INTEGER), 0)::BIGINT"


def _trained_sum(expression: str) -> str:
    """SQL: the sum of `expression` over the trained rows of a group (0 where none has it)."""
    return f"coalesce(sum(CASE WHEN loss_mask THEN {expression} END), 0)"


def _cells(con: duckdb.DuckDBPyConnection, usable: frozenset[str]) -> pa.Table:
    prox = "prox_logp" if "prox_logp" in usable else "NULL::DOUBLE"
    sentinels = ", ".join(
        f"{_count(f'loss_mask AND {c} < {SENTINEL}') if c in usable else '0::BIGINT'} AS sentinel_{c}"
        for c in LOGP_COLUMNS
    )
    return con.sql(f"""
        SELECT run_id, step, minibatch, max(n_minibatches)::INTEGER AS n_minibatches,
               min(n_minibatches)::INTEGER AS n_minibatches_min,
               (step - behave_version)::BIGINT AS staleness,
               {_count("loss_mask")} AS n,
               {_count("NOT loss_mask")} AS n_masked,
               {_count(f"loss_mask AND {prox} IS NOT NULL")} AS n_prox,
               {_trained_sum(f"abs({prox} - behave_logp)")} AS drift,
               {_trained_sum(f"({prox} - behave_logp) ** 2")} AS drift_sq,
               {_trained_sum(f"behave_logp - {prox}")} AS signed_drift,
               {_trained_sum(f"abs(exp({prox}) - exp(behave_logp))")} AS prob_drift,
               {_trained_sum(f"exp(least(abs({prox} - behave_logp), {LOG_WEIGHT_MAX}))")} AS exp_abs_drift,
               {_trained_sum(f"abs(theta_logp - {prox})")} AS theta_gap,
               {_trained_sum(f"abs(theta_logp - behave_logp) * ({prox} IS NOT NULL)::INTEGER")}
                   AS theta_drift,
               {_count(f"loss_mask AND behave_logp = {prox}")} AS behave_is_prox,
               {_count("loss_mask AND behave_logp = theta_logp")} AS behave_is_theta,
               {_count(f"loss_mask AND theta_logp = {prox}")} AS theta_is_prox,
               {_count(f"loss_mask AND behave_logp = 0 AND theta_logp < {PLACEHOLDER_THETA}")} AS behave_zero,
               {_count(f"loss_mask AND {prox} = 0")} AS prox_is_zero,
               {_count(f"loss_mask AND {prox} IS NOT NULL AND behave_logp = 0")} AS behave_is_zero,
               {sentinels},
               min(seq_id) AS example_seq, arg_min(pos, seq_id) AS example_pos
        FROM src GROUP BY run_id, step, minibatch, staleness""").to_arrow_table()


def gather(con: duckdb.DuckDBPyConnection, usable: frozenset[str], n_rows: int) -> tuple[Evidence, list[str]]:
    """The file's evidence, from the view `src` (of `n_rows` rows), and a note when the shapes were read
    on a sample; call only on a file that broke no rule."""
    cells = _cells(con, usable)
    sample = load_block_sample(con, usable, n_rows)
    evidence = from_sample(sample)
    evidence.tables["cells"] = cells
    notes = []
    if sample.sampled:
        notes.append(
            f"findings on the shape of responses, groups and proximal_t segments read a deterministic "
            f"sample of whole blocks of {BLOCK} consecutive seq_ids: {len(sample.run):,} rows"
        )
    return evidence, notes


def from_sample(sample: BlockSample) -> Evidence:
    """Every table but the cells, from a sample of whole blocks of responses."""
    r = shapes.responses(sample)
    mask, mask_hist = shapes.mask_shape(sample, r)
    group_table, group_examples = groups.group_stats(sample, r)
    proximal_t, pairs, refresh, pt_examples = segments.proximal_t_tables(sample)
    repeat_table, repeat_examples = repeats.repeat_tables(sample, r)
    column_table, column_examples = columns.column_tables(sample)
    tables = {
        "proximal_t": proximal_t,
        "segment_pairs": pairs,
        "refresh": refresh,
        "mask": mask,
        "mask_hist": mask_hist,
        "advantage": shapes.advantage_shape(sample, r),
        "movement": shapes.movement(sample, r),
        "roll": shapes.roll(sample, r),
        "repeats": repeat_table,
        "groups": group_table,
        "columns": column_table,
        "tokens": columns.token_table(sample),
    }
    parts = [shapes.examples(sample, r), group_examples, pt_examples, repeat_examples, column_examples]
    examples = pa.concat_tables(parts)
    return Evidence(tables, examples)


def pooled(evidences: list[Evidence]) -> Evidence:
    """Several files' evidence added up per key (a few examples kept per run and kind)."""
    out = {}
    with connect() as con:
        for name, keys in KEYS.items():
            part = pa.concat_tables([e.tables[name] for e in evidences], promote_options="permissive")
            values = [c for c in part.column_names if c not in keys]
            kind = {f.name: "BIGINT" if pa.types.is_integer(f.type) else "DOUBLE" for f in part.schema}
            aggregate = ", ".join(f"{_NOT_SUMMED.get(c, f'sum({c})::{kind[c]}')} AS {c}" for c in values)
            with arrow_view(con, "part", part):
                out[name] = con.sql(
                    f"SELECT {', '.join(keys)}, {aggregate} FROM part GROUP BY ALL"
                ).to_arrow_table()
        with arrow_view(con, "part", pa.concat_tables([e.examples for e in evidences])):
            examples = con.sql(
                f"""SELECT * EXCLUDE (rank) FROM (
                SELECT *, row_number() OVER (
                    PARTITION BY run_id, kind ORDER BY step, seq_id, minibatch, pos) AS rank
                FROM part) WHERE rank <= {literal(shapes.EXAMPLES)} ORDER BY run_id, kind, rank"""
            ).to_arrow_table()
    return Evidence(out, examples)


@dataclass(frozen=True)
class RunEvidence:
    """One run's pooled evidence as polars frames."""

    run_id: str
    frames: dict[str, pl.DataFrame]
    examples: pl.DataFrame

    def __getattr__(self, name: str) -> pl.DataFrame:
        if name in KEYS:
            return self.frames[name]
        raise AttributeError(name)

    def drift_by_staleness(self) -> dict[int, tuple[int, float]]:
        """{staleness: (tokens with prox, mean |prox - behave|)}."""
        by = self.cells.group_by("staleness").agg(pl.col("n_prox").sum(), pl.col("drift").sum())
        return {
            r["staleness"]: (r["n_prox"], r["drift"] / r["n_prox"])
            for r in by.iter_rows(named=True)
            if r["n_prox"]
        }

    def example(self, *kinds: str) -> tuple[dict, ...]:
        """Up to 3 example tokens of the first kind that has any: {step, seq_id, minibatch, pos}."""
        for kind in kinds:
            rows = self.examples.filter(pl.col("kind") == kind).drop("run_id", "kind")
            if rows.height:
                return tuple(rows.head(shapes.EXAMPLES).iter_rows(named=True))
        return ()

    def cell_examples(self, where: pl.Expr) -> tuple[dict, ...]:
        """Up to 3 example tokens of the cells that pass `where` (by step)."""
        rows = self.cells.filter(where).sort("step", "minibatch").head(shapes.EXAMPLES)
        return tuple(
            {
                "step": r["step"],
                "seq_id": r["example_seq"],
                "minibatch": r["minibatch"],
                "pos": r["example_pos"],
            }
            for r in rows.iter_rows(named=True)
        )


def split_runs(evidence: Evidence) -> list[RunEvidence]:
    """The pooled evidence of each run, in run_id order."""
    frames = {name: pl.from_arrow(t) for name, t in evidence.tables.items()}
    examples = pl.from_arrow(evidence.examples)
    runs = sorted(set(frames["cells"]["run_id"].to_list()))
    return [
        RunEvidence(
            run,
            {name: f.filter(pl.col("run_id") == run) for name, f in frames.items()},
            examples.filter(pl.col("run_id") == run),
        )
        for run in runs
    ]
