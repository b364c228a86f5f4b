"""Staging a file's rows (`evaluator.store.staging.Stager`): its COPYs run on one DuckDB thread (in order on
several, DuckDB holds the rows one thread wrote ahead: on a busy machine a late file of watch's benchmark
took 400 MiB more), and the writer's connection gets its threads back, after an error too."""

import pyarrow.parquet as pq
import pytest

from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import check_and_summarise
from evaluator.store import StoreWriter
from evaluator.store.staging import Stager
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps


def _threads(con) -> int:
    (threads,) = con.execute("SELECT current_setting('threads')").fetchone()
    return threads


def test_a_file_is_staged_on_one_thread_and_the_writer_keeps_its_threads(tmp_path, monkeypatch):
    log = write_log_atomic(
        synthetic_steps(SyntheticSpec(run_id="r", tokens_per_step=512), 0, 2), tmp_path / "l"
    )
    done = check_and_summarise(log)
    seen: list[tuple[str, int]] = []
    copy = Stager._copy

    def watched(self, select, table, file_id):
        seen.append((table, _threads(self.con)))
        if table == "sketch_by_staleness" and file_id == 2:
            raise OSError("disk full")
        return copy(self, select, table, file_id)

    monkeypatch.setattr(Stager, "_copy", watched)
    with StoreWriter(tmp_path / "store") as writer:
        writer.con.execute("SET threads = 2")
        seen.clear()  # the empty files of a new store's set-up
        stager = Stager(writer.con)
        staged = stager.stage(1, done.summary, done.checked.facts.sequences)
        assert seen == [(table, 1) for table in staged]
        assert len(staged) == 5 and _threads(writer.con) == 2
        rows = pq.read_table(staged["sketch_by_staleness"])
        assert rows.num_rows == done.summary.sketch_by_staleness.num_rows
        with pytest.raises(OSError, match="disk full"):
            stager.stage(2, done.summary, done.checked.facts.sequences)
        assert _threads(writer.con) == 2
        stager.discard(staged)
        stager.close()
