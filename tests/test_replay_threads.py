"""A replay of a small input runs DuckDB on one thread (`evaluator.duck.one_thread`): every connection it
opens, the store's included, in any thread; a larger input, and everything after a replay, DuckDB's
default number of threads."""

from __future__ import annotations

from contextlib import closing

import pytest

from evaluator import duck
from evaluator.logio import write_log_atomic
from evaluator.replay import pipeline
from evaluator.replay.pipeline import replay
from evaluator.store import lake
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps


def threads(con) -> int:
    return int(con.execute("SELECT current_setting('threads')").fetchone()[0])


def test_a_small_replay_runs_duckdb_on_one_thread_a_larger_one_on_its_default(tmp_path, monkeypatch):
    with closing(duck.connect()) as con:
        default = threads(con)
    if default == 1:
        pytest.skip("DuckDB runs one thread on this machine whatever the input")
    seen: list[int] = []
    real = lake.connect

    def spy(*args, **kwargs):
        con = real(*args, **kwargs)
        seen.append(threads(con))
        return con

    monkeypatch.setattr(lake, "connect", spy)
    spec = SyntheticSpec(run_id="r", tokens_per_step=512, mean_length=16)
    log = write_log_atomic(synthetic_steps(spec, 0, 2), tmp_path / "r.parquet")
    replay([log], tmp_path / "small", progress=False)
    assert seen and set(seen) == {1}  # the store's connections, opened in its opening thread
    seen.clear()
    monkeypatch.setattr(pipeline, "SMALL_INPUT_ROWS", 0)  # the same file, counted as large
    replay([log], tmp_path / "large", progress=False)
    assert seen and set(seen) == {default}
    with closing(duck.connect()) as con:
        assert threads(con) == default  # after a replay
