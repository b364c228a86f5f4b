"""Values reach DuckDB as literals (`evaluator.duck.literal`) and Arrow tables as streams (`arrow_view`),
never as bound parameters or registered tables: DuckDB's Python client imports pandas for those (0.4 s and
55 MB a process). `literal` gives every value back exactly and nothing but the value; `replay`, `gate`,
`summary` and `watch`, run as a user runs them, never import pandas: not through DuckDB, nor through pyarrow
(`evaluator.duck.arrow_without_pandas`)."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO

from evaluator.duck import arrow_view, connect, literal

STRINGS = [
    "", "run-1", "it's", "''", "a\nb\tc\r\n", "back\\slash \\n \\x41 \\'", "'; DROP TABLE runs; --",
    "ünïcödé 日本語 🦆", "$1 ? :name {} %s", '"quoted"', "E'\\x41'", "\x00", "a\x00'b\x00",
]  # fmt: skip
FLOATS = [
    0.1, -2.5, 1 / 3, 1e-310, 5e-324, -0.0, 0.0, 1.7976931348623157e308, -1.7976931348623157e308, 1e16,
    math.nan, math.inf, -math.inf,
]  # fmt: skip
INTS = [0, 1, -1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63)]


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def back(value: object) -> object:
    """`value` through SQL and back: DuckDB's answer to `SELECT <literal>`."""
    with connect() as con:
        return con.execute(f"SELECT {literal(value)}").fetchone()[0]


@pytest.mark.parametrize("text", STRINGS, ids=repr)
def test_a_string_comes_back_as_it_was(text):
    assert back(text) == text
    with connect() as con:
        assert con.execute(f"SELECT typeof({literal(text)})").fetchone() == ("VARCHAR",)


@pytest.mark.parametrize("x", FLOATS, ids=repr)
def test_a_float_comes_back_bit_for_bit_as_a_double(x):
    assert bits(back(x)) == bits(x)
    with connect() as con:
        assert con.execute(f"SELECT typeof({literal(x)})").fetchone() == ("DOUBLE",)


@pytest.mark.parametrize("n", INTS)
def test_an_int_comes_back_as_it_was(n):
    assert back(n) == n and type(back(n)) is int


def test_none_bools_and_lists_come_back_as_they_were():
    assert back(None) is None
    assert back(True) is True and back(False) is False
    assert back(STRINGS) == STRINGS
    assert back(["a", None]) == ["a", None]
    assert back((3, -(2**63))) == [3, -(2**63)]
    assert [bits(x) for x in back(FLOATS)] == [bits(x) for x in FLOATS]
    assert back([[1, 2], []]) == [[1, 2], []]


def test_an_empty_list_matches_nothing_where_a_list_of_runs_goes():
    with connect() as con:
        con.execute("CREATE TABLE t AS SELECT 'a' AS run_id, 1::BIGINT AS file_id")
        assert con.execute(f"SELECT * FROM t WHERE run_id IN (SELECT unnest({literal([])}))").fetchall() == []
        assert con.execute(f"SELECT * FROM t WHERE list_contains({literal([])}, file_id)").fetchall() == []
        assert con.execute(f"SELECT * FROM t WHERE run_id IN (SELECT unnest({literal(['a'])}))").fetchone()


def test_a_hostile_string_is_only_a_value():
    with connect() as con:
        con.execute("CREATE TABLE runs AS SELECT 'a' AS run_id")
        for text in STRINGS:
            assert con.execute(f"SELECT count(*) FROM runs WHERE run_id = {literal(text)}").fetchone() == (0,)
        assert con.execute("SELECT run_id FROM runs").fetchall() == [("a",)]


@pytest.mark.parametrize(
    "value", [b"\x00", {"a": 1}, {1}, object(), Path("x")], ids=lambda v: type(v).__name__
)
def test_anything_else_has_no_literal(value):
    with pytest.raises(TypeError, match="no SQL literal"):
        literal(value)


def test_an_arrow_view_is_read_once():
    with connect() as con:
        table = con.sql("SELECT range AS i FROM range(3)").to_arrow_table()
        with arrow_view(con, "rows", table):
            assert con.execute("SELECT sum(i) FROM rows").fetchone() == (3,)
            with pytest.raises(Exception, match="already been consumed"):  # an error, never other rows
                con.execute("SELECT sum(i) FROM rows").fetchone()
        assert not con.execute("SELECT * FROM duckdb_views() WHERE view_name = 'rows'").fetchall()


# --- the commands ---------------------------------------------------------------------------------

REFUSE_PANDAS = '''"""tests/test_no_pandas.py: pandas cannot be imported in this process; each try is a JSON
line in $PANDAS_TRIES, with whether it came from inside a call into DuckDB's Python client."""
import importlib.abc, importlib.machinery, json, os, sys, threading, traceback

calls = threading.local()


def profile(frame, event, arg):
    if event in ("c_call", "c_return", "c_exception"):
        owner = getattr(arg, "__module__", None) or type(getattr(arg, "__self__", None)).__module__ or ""
        if owner.startswith(("_duckdb", "duckdb")):
            calls.depth = getattr(calls, "depth", 0) + (1 if event == "c_call" else -1)


class Refused(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        ours = [f for f in traceback.extract_stack() if f"{os.sep}evaluator{os.sep}" in f.filename]
        where = f"{ours[-1].filename}:{ours[-1].lineno}" if ours else "?"
        with open(os.environ["PANDAS_TRIES"], "a") as log:
            log.write(json.dumps({"duckdb": getattr(calls, "depth", 0) > 0, "where": where}) + "\\n")
        raise ImportError("pandas refused (tests/test_no_pandas.py)")


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, Refused()) if name == "pandas" else None


sys.meta_path.insert(0, Finder())
sys.setprofile(profile)
threading.setprofile(profile)
'''


@pytest.fixture
def proxaudit(tmp_path):
    """Run `proxaudit ARGS` (and every Python process it starts) where pandas cannot be imported: (exit code,
    the tries to import it: {"duckdb": inside a call into DuckDB?, "where": our innermost line})."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(REFUSE_PANDAS)
    tries = tmp_path / "pandas_tries.jsonl"
    path = os.pathsep.join(p for p in (str(hooks), str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PANDAS_TRIES": str(tries)}

    def run(*args: str) -> tuple[int, list[dict]]:
        tries.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-m", "evaluator.cli", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert "Traceback" not in done.stderr, done.stderr
        lines = tries.read_text().splitlines() if tries.exists() else []
        return done.returncode, [json.loads(line) for line in lines]

    return run


def test_the_commands_never_import_pandas(proxaudit, tmp_path):
    """A replay into a new store and one into that store, the gate and summary on it: nothing tries to
    import pandas, and nothing needs it (each runs where it cannot be imported)."""
    first, second = (str(p) for p in sorted(FIXTURES.glob("loglinear-*.parquet"))[:2])
    db = str(tmp_path / "store")
    for files in ([first], [second]):
        code, tries = proxaudit("replay", *files, "--db", db, "--no-progress")
        assert code == 0 and tries == [], tries
    reports = [f"--{kind}={tmp_path / f'gate.{kind}'}" for kind in ("junit", "markdown", "json")]
    code, tries = proxaudit("gate", "--db", db, *reports)
    assert code in (0, 1) and tries == [], tries  # 1: a check failed
    for by in ("run", "decision"):
        code, tries = proxaudit("summary", "--db", db, "--by", by)  # the terminal's table
        assert code == 0 and tries == [], tries


def test_watch_and_its_looks_never_import_pandas(proxaudit, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(sorted(FIXTURES.glob("loglinear-*.parquet"))[0], logs)
    args = ["--db", str(tmp_path / "store"), "--interval", "0.1", "--idle-after", "0", "--until-idle"]
    code, tries = proxaudit("watch", str(logs), *args)
    assert code == 0 and tries == [], tries
