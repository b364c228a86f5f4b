"""Merging a run's staleness sketch over its files (`evaluator.store.derived.merge_sketches`): one row per
bucket with the files' counts added, in the order a file's rows are staged, one method's buckets
aggregated at a time (what the merge holds is then a method's buckets, not the run's)."""

import pandas as pd

from evaluator.store import StoreWriter, derived
from tests.recording import Recorder

KEYS = ["run_id", "method", "metric", "staleness", "bucket"]
ROWS = """
    INSERT INTO sketch_by_staleness
    SELECT f AS file_id, r AS run_id, s AS staleness, 'm' || m AS method, t AS metric, b AS bucket,
           1 + hash(f, r, s, m, t, b) % 1000 AS count
    FROM range(0, 4) _(f), (VALUES ('b'), ('a')) _(r), range(0, 4) _(s), range(0, 10) _(m),
         (VALUES ('abs_error'), ('drift')) _(t), range(0, 2000) _(b)
    WHERE CASE WHEN f = 0 THEN r = 'a' ELSE hash(f, r, b) % 3 != 0 END
    ORDER BY f, r, m, t, s, b"""
"""Runs `b` and `a` (named against their order of insertion), three files each, run `a` with merged rows
(file 0) already, every file with about two thirds of the buckets: 320k merged rows, more than two of
DuckDB's row groups, so rows written on two threads would come back out of order."""


def test_merged_sketch_adds_each_bucket_s_counts_in_staged_order_one_method_at_a_time(tmp_path):
    with StoreWriter(tmp_path / "store") as writer:
        con = writer.con
        con.execute(ROWS)
        before = con.execute("SELECT * FROM sketch_by_staleness").df()
        con.execute("SET threads = 2")
        recorder = Recorder(con)
        con.execute("BEGIN")
        rows = derived.merge_sketches(recorder, ["a", "b"])
        con.execute("COMMIT")
        after = con.execute("SELECT * FROM sketch_by_staleness").df()
    want = before.groupby(KEYS, as_index=False)["count"].sum()
    assert rows == len(want) == len(after) > 2 * 122_880
    assert (after["file_id"] == 0).all()
    pd.testing.assert_frame_equal(after[[*KEYS, "count"]], want, check_dtype=False)  # the staged order
    summing = [sql for sql in recorder.queries if "sum(count)" in sql]
    assert len(summing) == 2 * 10
    assert all(sql.count("method = '") == 1 for sql in summing)
