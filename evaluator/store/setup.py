"""A store's set-up, in the transaction of a writer's first commit: the tables on a new store (else the check
that it is a proxaudit store of this version), the views and metric definitions when they changed, and the
loss and sampling fraction the store's metrics are computed under (a store made under others is refused)."""

from __future__ import annotations

import hashlib
import json

import duckdb

from evaluator.duck import literal
from evaluator.errors import StoreError
from evaluator.formulas.loss import Loss
from evaluator.store.checks import check_store
from evaluator.store.lake import STORE, Location
from evaluator.store.reader import LOSS_KEY, SAMPLE_KEY, stored_loss, stored_sample
from evaluator.store.staging import record_name_maps
from schemas.store import METRIC_TABLE, STORE_SCHEMA_VERSION, TABLE_DDL, VIEWS_DDL

DDL_KEY = "ddl"
"""The `store_meta` key of the digest of the views and metric definitions the store carries."""


def _ddl_digest() -> str:
    definitions = json.dumps([list(vars(m).values()) for m in METRIC_TABLE])
    return hashlib.blake2b((VIEWS_DDL + definitions).encode(), digest_size=16).hexdigest()


def set_up(con: duckdb.DuckDBPyConnection, location: Location, loss: Loss, sample: float) -> bool:
    """Set up the store attached as `STORE` on `con` (current), inside the caller's transaction: whether
    anything changed."""
    changed = False
    fresh = not con.execute(
        f"SELECT 1 FROM duckdb_tables() WHERE database_name = {literal(STORE)} AND table_name = 'store_meta'"
    ).fetchall()
    if fresh:
        con.execute(TABLE_DDL)
        version = literal(STORE_SCHEMA_VERSION)
        con.execute(f"INSERT INTO store_meta VALUES ('store_schema_version', {version})")
        con.execute("INSERT INTO ingest_ticket VALUES (0)")
        changed = True
    else:
        check_store(con, location, STORE)  # a crafted store is refused before anything is written
    changed |= record_name_maps(con, fresh)
    digest = _ddl_digest()
    if con.execute(f"SELECT value FROM store_meta WHERE key = {literal(DDL_KEY)}").fetchall() != [(digest,)]:
        con.execute(VIEWS_DDL)
        con.execute("DELETE FROM metric_definition")
        rows = ", ".join(
            f"({', '.join(literal(v) for v in (m.name, m.formula, m.needs_truth, m.of, m.per, m.binary))})"
            for m in METRIC_TABLE
        )
        con.execute(f"INSERT INTO metric_definition VALUES {rows}")
        con.execute(f"DELETE FROM store_meta WHERE key = {literal(DDL_KEY)}")
        con.execute(f"INSERT INTO store_meta VALUES ({literal(DDL_KEY)}, {literal(digest)})")
        changed = True
    db = location.given
    changed |= _record(con, db, LOSS_KEY, stored_loss(con), loss, json.dumps(loss.to_dict()))
    changed |= _record(con, db, SAMPLE_KEY, stored_sample(con), sample, repr(sample))
    return changed


def _record(con: duckdb.DuckDBPyConnection, db: str, key: str, recorded, wanted, text: str) -> bool:
    """Record `wanted` under `key` on a store without one (True), or refuse a store made with another."""
    if recorded is None:
        con.execute(f"INSERT INTO store_meta VALUES ({literal(key)}, {literal(text)})")
        return True
    if recorded != wanted:
        what = {LOSS_KEY: "the loss", SAMPLE_KEY: "--sample-sequences"}[key]
        said = (recorded.describe(), wanted.describe()) if key == LOSS_KEY else (recorded, wanted)
        raise StoreError(
            f"{db} holds metrics computed under {what} {said[0]}; this replay asks for {said[1]}. "
            f"One store holds one {what.removeprefix('the ')}: replay under the same, or into another "
            "store"
        )
    return False
