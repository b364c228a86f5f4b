"""`replay --ray`: files checked and summarised as Ray tasks on a local Ray (2 CPUs, one per test
session), ingested here in order: the store is bit for bit that of a local replay, and a task that fails
fails its file only."""

from __future__ import annotations

import pytest

from evaluator.errors import FileFailed
from evaluator.formulas.loss import DEFAULT_LOSS
from evaluator.replay.ray_runner import RayRunner
from evaluator.replay.tasks import Check, Summarise
from tests.test_replay_parallel import (  # noqa: F401
    BATCH_ROWS,
    assert_same_store,
    folder,
    lines,
    sequential,
    stored,
)

ray = pytest.importorskip("ray", reason="needs proxaudit[ray] (make install has it)")


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for this module's tests (its start costs seconds); RayRunner joins it and leaves it up.
    Shut down after them: an idle local Ray still takes about 6% of a core."""
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def test_ray_store_is_bit_identical_to_local(folder, sequential, tmp_path, local_ray):  # noqa: F811
    expected_lines, expected = sequential
    got = lines(folder, tmp_path / "ray", ray="local")
    assert got == expected_lines  # same outcomes, same order (the range-sized file went to Ray too)
    assert_same_store(stored(tmp_path / "ray"), expected)
    assert ray.is_initialized()  # a Ray it did not start is left running


def test_a_failing_task_fails_its_file_only(folder, local_ray):  # noqa: F811
    good = next(folder.glob("a-000.parquet"))
    tasks = [Check(good), Summarise(folder / "gone.parquet", None, DEFAULT_LOSS), Check(good)]
    with RayRunner() as runner:
        results = list(runner.map(tasks))
    assert results[0].report.ok and results[2].report.ok
    assert (
        isinstance(results[1], FileFailed)
        and "gone.parquet" in str(results[1])
        and "on Ray" in str(results[1])
    )


def test_a_long_file_is_summarised_as_range_tasks_on_ray(
    folder,  # noqa: F811
    sequential,  # noqa: F811
    tmp_path,
    local_ray,
    monkeypatch,
):
    """A file long enough for ranges goes to the cluster as one task per range (here 2), merged here in
    file order: the store is still bit for bit a local replay's. Every task reads record batches of the
    replay's `batch_rows`."""
    import duckdb

    from evaluator.replay import pipeline

    long_rows = int(duckdb.sql(f"SELECT count(*) FROM '{folder / 'a-006.parquet'}'").fetchall()[0][0])
    monkeypatch.setattr(pipeline, "default_workers", lambda n_rows, **_: 2 if n_rows == long_rows else 1)
    kinds, batch_rows = [], set()
    original = RayRunner.map

    def recording(self, tasks):
        tasks = list(tasks)
        kinds.extend((task.kind, task.path.name) for task in tasks)
        batch_rows.update(task.batch_rows for task in tasks if task.kind != "check")
        return original(self, tasks)

    monkeypatch.setattr(RayRunner, "map", recording)
    assert lines(folder, tmp_path / "ray", ray="local") == sequential[0]
    assert kinds.count(("summarise_range", "a-006.parquet")) == 2
    assert ("summarise", "a-006.parquet") not in kinds
    assert batch_rows == {BATCH_ROWS}
    assert_same_store(stored(tmp_path / "ray"), sequential[1])
