"""A connection that keeps the text of each query asked of it, for tests of what a reader reads."""

from __future__ import annotations


class Recorder:
    """`con` that keeps the text of each query it runs (`execute`, `sql`) in `queries`; every other
    attribute is the connection's own."""

    def __init__(self, con) -> None:
        self.con, self.queries = con, []

    def execute(self, sql: str):
        self.queries.append(sql)
        return self.con.execute(sql)

    def sql(self, sql: str):
        self.queries.append(sql)
        return self.con.sql(sql)

    def __getattr__(self, name):
        return getattr(self.con, name)
