"""A reader's memo (`evaluator.store.memo.Memo`): the connection's own answers, each query asked once."""

from __future__ import annotations

import duckdb
import numpy as np

from evaluator.store.memo import Memo
from tests.recording import Recorder


def sql(n: int) -> str:
    return f"SELECT i AS step, i * 0.5 AS value FROM range({n}) t(i) ORDER BY i"


def test_answers_are_the_connection_s_own_in_every_form():
    con, memo = duckdb.connect(), Memo(duckdb.connect())
    assert memo.execute(sql(4)).fetchall() == con.execute(sql(4)).fetchall()
    assert memo.execute(sql(4)).fetchone() == (0, 0.0)
    assert memo.execute(sql(0)).fetchone() is None
    np.testing.assert_array_equal(memo.execute(sql(4)).fetchnumpy()["value"], [0, 0.5, 1, 1.5])


def test_a_repeated_query_runs_once_and_its_answer_cannot_be_changed_by_a_caller():
    counting = Recorder(duckdb.connect())
    memo = Memo(counting)
    first = memo.execute(sql(3)).fetchall()
    first.append("changed")
    memo.execute(sql(3)).fetchnumpy()["value"][:] = -1.0
    assert memo.execute(sql(3)).fetchall() == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert memo.execute(sql(3)).fetchnumpy()["value"].tolist() == [0.0, 0.5, 1.0]
    assert len(counting.queries) == 2  # one per form: fetchall, fetchnumpy
    memo.execute(sql(5)).fetchall()  # another query
    assert len(counting.queries) == 3
    assert Memo.of(memo) is memo and Memo.of(counting) is not memo  # a caller's memo serves its callees
