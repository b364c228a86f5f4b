"""What the data-driven findings need of one file (`evaluator.validate.findings`): small aggregates per run,
computed by the validator in the same DuckDB pass as its rules, and pooled over the files of a call by
adding them up.

- `cells`, per (run, step, minibatch, staleness): loss tokens, masked rows, tokens with `prox_logp`, the
  sums of |prox - behave| (drift), verl's |exp(prox) - exp(behave)|, NeMo-RL's exp|prox - behave|,
  |theta - prox|, how many tokens have behave exactly equal to prox or to theta, and how many with prox
  have prox or behave exactly 0.
- `proximal_t`, per (run, k = step - proximal_t_version, staleness) of the tokens whose proximal_t claims
  the next version (a later segment follows): |proximal_t - prox| and |behave - prox| sums over the
  tokens with prox, and how many have proximal_t exactly equal to behave; and `segment_pairs`, per run:
  consecutive resumed segments of a sequence, and how often the earlier one's proximal_t is the closer
  to prox (it should be the farther).
- `edges`, per run: rows at the first and the last position of a response, and how many are masked.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl
import pyarrow as pa

from evaluator.duck import connect
from evaluator.formulas.gradients import LOG_WEIGHT_MAX


@dataclass
class Evidence:
    """One file's aggregates (Arrow tables keyed by run_id), or several files' added up."""

    cells: pa.Table
    proximal_t: pa.Table
    segment_pairs: pa.Table
    edges: pa.Table


def _cells(con: duckdb.DuckDBPyConnection, usable: frozenset[str]) -> pa.Table:
    prox = "prox_logp" if "prox_logp" in usable else "NULL::DOUBLE"
    return con.sql(f"""
        SELECT run_id, step, minibatch, max(n_minibatches)::INTEGER AS n_minibatches,
               (step - behave_version)::BIGINT AS staleness,
               count(*) FILTER (WHERE loss_mask) AS n,
               count(*) FILTER (WHERE NOT loss_mask) AS n_masked,
               count({prox}) FILTER (WHERE loss_mask) AS n_prox,
               coalesce(sum(abs({prox} - behave_logp)) FILTER (WHERE loss_mask), 0) AS drift,
               coalesce(sum(abs(exp({prox}) - exp(behave_logp))) FILTER (WHERE loss_mask), 0) AS prob_drift,
               coalesce(sum(exp(least(abs({prox} - behave_logp), {LOG_WEIGHT_MAX})))
                        FILTER (WHERE loss_mask), 0) AS exp_abs_drift,
               coalesce(sum(abs(theta_logp - {prox})) FILTER (WHERE loss_mask), 0) AS theta_gap,
               count(*) FILTER (WHERE loss_mask AND behave_logp = {prox}) AS behave_is_prox,
               count(*) FILTER (WHERE loss_mask AND behave_logp = theta_logp) AS behave_is_theta,
               count(*) FILTER (WHERE loss_mask AND {prox} = 0) AS prox_is_zero,
               count(*) FILTER (WHERE loss_mask AND {prox} IS NOT NULL AND behave_logp = 0) AS behave_is_zero
        FROM src GROUP BY run_id, step, minibatch, staleness""").to_arrow_table()


def _proximal_t(con: duckdb.DuckDBPyConnection, usable: frozenset[str]) -> pa.Table:
    empty = "SELECT NULL::VARCHAR AS run_id, 0::BIGINT AS k, 0::BIGINT AS staleness, 0::BIGINT AS n, "
    empty += "0::BIGINT AS n_prox, 0.0 AS error, 0.0 AS rollout_error, "
    empty += "0::BIGINT AS pt_is_behave LIMIT 0"
    if not {"proximal_t_logp", "proximal_t_version"} <= usable:
        return con.sql(empty).to_arrow_table()
    prox = "prox_logp" if "prox_logp" in usable else "NULL::DOUBLE"
    return con.sql(f"""
        SELECT run_id, (step - proximal_t_version)::BIGINT AS k, (step - behave_version)::BIGINT AS staleness,
               count(*) AS n, count({prox}) AS n_prox,
               coalesce(sum(abs(proximal_t_logp - {prox})), 0) AS error,
               coalesce(sum(abs(behave_logp - {prox})), 0) AS rollout_error,
               count(*) FILTER (WHERE proximal_t_logp = behave_logp) AS pt_is_behave
        FROM src WHERE loss_mask AND proximal_t_version = behave_version + 1
        GROUP BY ALL""").to_arrow_table()


def _segment_pairs(con: duckdb.DuckDBPyConnection, usable: frozenset[str]) -> pa.Table:
    """Per run: consecutive resumed segments of one sequence (both followed by a later one, so both carry
    proximal_t), and how often the earlier one's proximal_t sits closer to prox than the later one's."""
    if not {"proximal_t_logp", "proximal_t_version", "prox_logp"} <= usable:
        return con.sql(
            "SELECT NULL::VARCHAR AS run_id, 0::BIGINT AS pairs, 0::BIGINT AS earlier_closer LIMIT 0"
        ).to_arrow_table()
    return con.sql("""
        WITH segments AS (
            SELECT run_id, seq_id, minibatch, behave_version, avg(abs(proximal_t_logp - prox_logp)) AS error
            FROM src WHERE loss_mask AND proximal_t_version = behave_version + 1 AND prox_logp IS NOT NULL
            GROUP BY ALL
        ), pairs AS (
            SELECT run_id, error,
                   lead(error) OVER (PARTITION BY run_id, seq_id, minibatch ORDER BY behave_version) AS later
            FROM segments
        )
        SELECT run_id, count(later) AS pairs, count(*) FILTER (WHERE error < later) AS earlier_closer
        FROM pairs GROUP BY run_id""").to_arrow_table()


def _edges(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """First and last position of each response (the sequence table `seq` of the validator)."""
    return con.sql("""
        SELECT s.run_id,
               count(*) FILTER (WHERE s.pos = 0) AS n_first,
               count(*) FILTER (WHERE s.pos = 0 AND NOT s.loss_mask) AS masked_first,
               count(*) FILTER (WHERE s.pos = q.mx) AS n_last,
               count(*) FILTER (WHERE s.pos = q.mx AND NOT s.loss_mask) AS masked_last
        FROM src s JOIN seq q USING (run_id, seq_id, minibatch)
        WHERE s.pos = 0 OR s.pos = q.mx
        GROUP BY s.run_id""").to_arrow_table()


def gather(con: duckdb.DuckDBPyConnection, usable: frozenset[str]) -> Evidence:
    """The file's evidence, from the view `src` and the validator's sequence table; call only on a file
    that broke no rule."""
    return Evidence(_cells(con, usable), _proximal_t(con, usable), _segment_pairs(con, usable), _edges(con))


def pooled(evidences: list[Evidence]) -> Evidence:
    """Several files' evidence added up per key."""
    sums = {
        "cells": ("run_id", "step", "minibatch", "staleness"),
        "proximal_t": ("run_id", "k", "staleness"),
        "segment_pairs": ("run_id",),
        "edges": ("run_id",),
    }
    out = {}
    with connect() as con:
        for name, keys in sums.items():
            part = pa.concat_tables([getattr(e, name) for e in evidences], promote_options="permissive")
            con.register("part", part)
            values = [c for c in part.column_names if c not in keys]
            kind = {f.name: "BIGINT" if pa.types.is_integer(f.type) else "DOUBLE" for f in part.schema}
            aggregate = ", ".join(
                f"max({c}) AS {c}" if c == "n_minibatches" else f"sum({c})::{kind[c]} AS {c}" for c in values
            )
            out[name] = con.sql(
                f"SELECT {', '.join(keys)}, {aggregate} FROM part GROUP BY ALL"
            ).to_arrow_table()
            con.unregister("part")
    return Evidence(**out)


@dataclass(frozen=True)
class RunEvidence:
    """One run's pooled evidence as polars frames."""

    run_id: str
    cells: pl.DataFrame
    proximal_t: pl.DataFrame
    segment_pairs: pl.DataFrame
    edges: pl.DataFrame

    def drift_by_staleness(self) -> dict[int, tuple[int, float]]:
        """{staleness: (tokens with prox, mean |prox - behave|)}."""
        by = self.cells.group_by("staleness").agg(pl.col("n_prox").sum(), pl.col("drift").sum())
        return {
            r["staleness"]: (r["n_prox"], r["drift"] / r["n_prox"])
            for r in by.iter_rows(named=True)
            if r["n_prox"]
        }
