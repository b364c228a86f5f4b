"""A watch look of several files hands the memory DuckDB frees back as it goes
(`evaluator.duck.memory_released_eagerly`): every connection its replay opens flushes DuckDB's allocator at
each bulk deallocation, so the look's peak is a one-file look's; a look of one file, and everything outside
a look, keeps DuckDB's default (faster)."""

from __future__ import annotations

import threading
from contextlib import closing
from pathlib import Path

from evaluator import duck
from evaluator.formulas.loss import DEFAULT_LOSS
from evaluator.logio import write_log_atomic
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from evaluator.watch import look as look_module
from evaluator.watch.completeness import Entry
from evaluator.watch.look import Look

FLUSH = "allocator_bulk_deallocation_flush_threshold"


def threshold() -> str:
    """The setting on a connection `connect` opens now."""
    with closing(duck.connect()) as con:
        return con.execute(f"SELECT current_setting('{FLUSH}')").fetchone()[0]


def test_connections_opened_inside_flush_at_every_bulk_deallocation_in_any_thread():
    default = threshold()
    assert default != "0 bytes"
    with duck.memory_released_eagerly():
        assert threshold() == "0 bytes"
        in_thread: list[str] = []
        worker = threading.Thread(target=lambda: in_thread.append(threshold()))
        worker.start()
        worker.join()
        assert in_thread == ["0 bytes"]  # replay's range threads and the store's opening thread
        with duck.memory_released_eagerly(False):  # nested: still eager
            assert threshold() == "0 bytes"
    assert threshold() == default
    with duck.memory_released_eagerly(False):
        assert threshold() == default


def entry(folder: Path, first_step: int) -> Entry:
    spec = SyntheticSpec(run_id="r", seed=5, tokens_per_step=512, mean_length=16)
    path = write_log_atomic(synthetic_steps(spec, first_step, 2), folder / f"r-{first_step:03d}.parquet")
    stat = path.stat()
    return Entry(path, stat.st_size, stat.st_mtime_ns)


def test_a_look_of_several_files_replays_them_releasing_memory_a_look_of_one_does_not(tmp_path, monkeypatch):
    default, seen = threshold(), []
    real = look_module.replay

    def replay(*args, **kwargs):
        seen.append(threshold())
        return real(*args, **kwargs)

    monkeypatch.setattr(look_module, "replay", replay)
    db = str(tmp_path / "store")
    looks = [(entry(tmp_path, 0), entry(tmp_path, 2)), (entry(tmp_path, 4),)]
    for entries in looks:
        result = Look(entries, db, None, DEFAULT_LOSS, None, None, 1.0, judge=True).run()
        assert result.error is None and len(result.ingested) == len(entries)
    assert seen == ["0 bytes", default]
    assert threshold() == default  # and not after the look
