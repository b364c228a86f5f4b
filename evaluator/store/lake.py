"""Where a store is and how a connection attaches it: a DuckLake (a catalog database plus immutable Parquet
data files; every transaction one snapshot).

`--db` takes a folder (`catalog.sqlite`, an embedded SQLite catalog in WAL mode so that readers never
block a writer, and `data/` of Parquet files: `Location`), or a catalog URL for several machines
(`postgres:dbname=... host=...`), with the data path chosen when the store is made (`--data-path`: a
folder or `s3://bucket/prefix/`; DuckLake records it in the catalog). DuckDB's extensions are loaded from
the pinned pip packages by path, never downloaded: every connection proxaudit opens has extension
auto-install and auto-load off (`evaluator.duck.connect`), and DuckDB checks each extension file's
signature the first time a process loads it (`load`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import duckdb

from evaluator.duck import connect, literal
from evaluator.errors import StoreError, UsageError

STORE = "store"
"""The name a connection attaches the store under."""
CATALOG_FILE = "catalog.sqlite"
DATA_FOLDER = "data"
CATALOG_SCHEMES = ("postgres:", "postgresql:")
DUCKDB_MAGIC = b"DUCK"  # bytes 8..12 of a DuckDB database file


def extension_path(name: str) -> Path:
    """The extension binary shipped by the pip package `duckdb-extension-<name>` for this DuckDB."""
    spec = find_spec(f"duckdb_extension_{name}")
    folder = Path(spec.origin).parent if spec and spec.origin else None
    binary = folder / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension" if folder else None
    if binary is None or not binary.is_file():
        raise StoreError(
            f"the DuckDB extension {name} for DuckDB {duckdb.__version__} is not installed: "
            f"pip install 'duckdb-extension-{name.replace('_', '-')}=={duckdb.__version__}'"
        )
    return binary


_SIGNATURE_CHECKED: dict[Path, tuple[int, ...]] = {}
"""The extension files whose signature DuckDB checked in this process, each with its identity then."""


def _identity(path: Path) -> tuple[int, ...]:
    """A file's device, inode, size, and modification and change times: any write or swap changes it."""
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def check_signature(path: Path) -> None:
    """Have DuckDB check the signature of the extension file `path` (by loading it on a connection of its
    own), once in this process while the file is unchanged; a file without DuckDB's signature is a
    `duckdb.Error`."""
    before = _identity(path)
    if _SIGNATURE_CHECKED.get(path) == before:
        return
    with contextlib.closing(connect()) as checking:
        checking.execute(f"LOAD {literal(str(path))}")
    if _identity(path) == before:
        _SIGNATURE_CHECKED[path] = before


def load(con: duckdb.DuckDBPyConnection, *names: str) -> None:
    """LOAD each extension from its pip package's file into `con`, a connection that does not check
    signatures (`connect(checked_extensions=True)`): each file's signature is checked by DuckDB once per
    process instead (`check_signature`), where DuckDB checked it on every new connection, 0.2-0.3 s for
    the two a store needs."""
    for name in names:
        path = extension_path(name)
        check_signature(path)
        con.execute(f"LOAD {literal(str(path))}")


@dataclass(frozen=True)
class Location:
    """A store: its catalog (`sqlite:PATH` or `postgres:...`) and, for a folder store, the folder; the
    data path given when it is made (None: the folder's `data/`, or what the catalog recorded)."""

    given: str
    catalog: str
    folder: Path | None = None
    data_path: str | None = None

    @property
    def extensions(self) -> tuple[str, ...]:
        """The extensions attaching it needs."""
        catalog = "sqlite_scanner" if self.folder is not None else "postgres_scanner"
        remote = ("httpfs",) if (self.data_path or "").startswith(("s3://", "gs://")) else ()
        return (catalog, *remote, "ducklake")

    def exists(self) -> bool:
        """A folder store exists once its catalog does; a catalog URL is assumed to hold one."""
        return self.folder is None or (self.folder / CATALOG_FILE).is_file()

    def attach_sql(self, read_only: bool, version: int | None = None, own_data: bool = False) -> str:
        """The ATTACH statement of the store as `STORE`; `own_data`: the folder's `data/` whatever local
        path the catalog records (a folder store moved or copied whole reads and writes its own files)."""
        options = []
        if self.data_path:  # a store being made; an existing one's catalog records its data path
            options.append(f"DATA_PATH {literal(self.data_path)}")
        elif own_data:
            own = str(self.folder / DATA_FOLDER) + os.sep
            options += [f"DATA_PATH {literal(own)}", "OVERRIDE_DATA_PATH true"]
        if read_only:
            options.append("READ_ONLY")
        if version is not None:
            options.append(f"SNAPSHOT_VERSION {int(version)}")
        listed = f" ({', '.join(options)})" if options else ""
        return f"ATTACH {literal('ducklake:' + self.catalog)} AS {STORE}{listed}"

    def __str__(self) -> str:
        return self.given


def locate(db: str | os.PathLike, data_path: str | None = None) -> Location:
    """The store `--db` names, or a `StoreError` for what cannot hold one: `:memory:`, a single-file store
    of an earlier proxaudit (with the command that converts it), a Parquet or other file."""
    text = str(db)
    if not text or text.startswith(":memory:"):
        raise StoreError(f"--db {text!r}: an in-memory database keeps nothing; give a folder")
    if text.startswith(CATALOG_SCHEMES):
        return Location(text, "postgres:" + text.split(":", 1)[1], None, data_path)
    if text.startswith("ducklake:"):
        raise StoreError(f"--db {text}: give the folder, or the catalog URL without the `ducklake:` prefix")
    path = Path(text).absolute()
    if data_path is not None and "://" not in data_path and Path(data_path).absolute() != path / DATA_FOLDER:
        raise StoreError(
            f"--data-path {data_path}: a folder store keeps its Parquet files in its own data/ folder; give "
            "an s3:// prefix, or a PostgreSQL catalog (--db postgres:...) for a data folder elsewhere"
        )
    if path.exists() and not path.is_dir():
        with open(path, "rb") as source:
            head = source.read(16)
        if head[8:12] == DUCKDB_MAGIC:
            raise StoreError(
                f"--db {text}: a DuckDB database file, not a store folder. A metrics database of an earlier "
                f"proxaudit converts once into a store: proxaudit store convert {text} NEW_FOLDER"
            )
        kind = "a Parquet file" if head[:4] == b"PAR1" else "a file, not a store folder"
        raise StoreError(f"--db {text}: {kind}; give the folder of a proxaudit metrics store")
    return Location(text, f"sqlite:{path / CATALOG_FILE}", path, data_path)


def attach(
    location: Location, read_only: bool, version: int | None = None, create: bool = False
) -> duckdb.DuckDBPyConnection:
    """A connection with the store attached as `STORE` (its extensions loaded by path). A folder store is
    made when `create` (its SQLite catalog in WAL mode: readers never block the writer); else a missing one
    is a `StoreError`."""
    if not location.exists():
        if not create:
            raise StoreError(
                f"no metrics store at {location}: run `proxaudit replay LOGS --db {location}` first"
            )
        _make_folder(location)
    con = connect(checked_extensions=True)
    try:
        try:
            load(con, *location.extensions)
        except duckdb.Error as error:
            raise StoreError(f"cannot open the metrics store {location}: {error}") from None
        attach_on(con, location, read_only, version)
    except BaseException:
        con.close()
        raise
    return con


def attach_on(
    con: duckdb.DuckDBPyConnection, location: Location, read_only: bool, version: int | None = None
) -> None:
    """Attach the existing store `location` as `STORE` on `con`, which has its extensions loaded (a
    connection that `detach`ed another store of the same kind keeps them)."""
    try:
        recorded = location.data_path or _recorded_data_path(con, location)
        if recorded.startswith("s3://"):
            if "httpfs" not in location.extensions:
                load(con, "httpfs")
            s3_secret(con)
        own_data = location.folder is not None and recorded != "" and "://" not in recorded
        con.execute(location.attach_sql(read_only, version, own_data))
    except duckdb.Error as error:
        raise StoreError(f"cannot open the metrics store {location}: {error}") from None


def detach(con: duckdb.DuckDBPyConnection) -> None:
    """Detach `STORE` from `con`: no handle of this process stays on its catalog (DuckDB's SQLite opens
    it per transaction, and DETACH drops the catalog), and `con` keeps its extensions for `attach_on`."""
    con.execute("USE memory")
    con.execute(f"DETACH {STORE}")


@contextmanager
def made_whole(location: Location) -> Iterator[Location]:
    """A new folder store made beside `location` (`.NAME.new-PID`, its data inside it unless a data path is
    given) and then renamed into place, so that no reader ever finds a store half made and two writers
    making it at once never touch each other's files. When another writer made the store meanwhile, the
    staged one is dropped."""
    if location.folder.is_dir() and any(location.folder.iterdir()):
        raise StoreError(f"--db {location}: a folder of other files, not a store: give a new or empty folder")
    for stale in location.folder.parent.glob(f".{location.folder.name}.new-*"):  # of killed writers
        if not _alive(stale.name.rsplit("-", 1)[-1]):
            shutil.rmtree(stale, ignore_errors=True)
    staged = location.folder.with_name(f".{location.folder.name}.new-{os.getpid()}")
    shutil.rmtree(staged, ignore_errors=True)
    data = location.data_path or str(staged / DATA_FOLDER) + os.sep
    try:
        yield Location(location.given, f"sqlite:{staged / CATALOG_FILE}", staged, data)
        try:
            if location.data_path is None:  # its data moves with it (file paths are relative to this)
                _set_data_path(staged / CATALOG_FILE, str(location.folder / DATA_FOLDER) + os.sep)
            os.rename(staged, location.folder)  # fails if another writer's store is there
        except (OSError, sqlite3.Error) as error:
            if not location.exists():
                raise StoreError(f"--db {location}: cannot write a store there: {error}") from None
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def catalog_inode(location: Location) -> int:
    """The inode of a folder store's catalog: a store made anew at the same path is another store."""
    return os.stat(location.folder / CATALOG_FILE).st_ino


def store_key(location: Location) -> str:
    """A store's identity (what this process and its cache remember of a store are keyed by): its catalog,
    a folder store's with the catalog file's inode (a store made anew at the same path is another store)."""
    if location.folder is None:
        return location.catalog
    return f"{location.catalog}:{catalog_inode(location)}"


def _set_data_path(catalog: Path, data_path: str) -> None:
    """Record `data_path` in a staged store's catalog, which no connection of this process holds open any
    more (closed, or `detach`ed: `_recorded_data_path` says why that matters)."""
    with contextlib.closing(sqlite3.connect(catalog)) as con, con:
        con.execute("UPDATE ducklake_metadata SET value = ? WHERE key = 'data_path'", [data_path])


def _recorded_data_path(con: duckdb.DuckDBPyConnection, location: Location) -> str:
    """The data path a folder store's catalog records, read before attaching it (a store whose data is on
    object storage needs httpfs to attach); "" for a catalog URL or a new store. Read through the SQLite
    of the `sqlite_scanner` that `con` loaded, never Python's `sqlite3`: a second copy of SQLite in one
    process that closes its handle drops the POSIX locks the first holds on the catalog, and a writer then
    resets the WAL index under this process's readers (a bus error, or a wrong read)."""
    if location.folder is None or not location.exists():
        return ""
    catalog = literal(str(location.folder / CATALOG_FILE))
    sql = f"SELECT value FROM sqlite_scan({catalog}, 'ducklake_metadata') WHERE key = 'data_path'"
    try:
        rows = con.execute(sql).fetchall()
    except duckdb.Error:
        return ""  # not a DuckLake catalog yet: attaching says so
    return rows[0][0] if rows else ""


def _alive(pid: str) -> bool:
    """Is there a process `pid` (a writer that may still be making its staged store)?"""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _make_folder(location: Location) -> None:
    """The folder, its data folder, and an empty SQLite catalog in WAL mode (DuckLake fills it)."""
    try:
        (location.folder / DATA_FOLDER).mkdir(parents=True, exist_ok=True)
        # closed here, before any DuckDB connection opens it (`_recorded_data_path` says why)
        with contextlib.closing(sqlite3.connect(location.folder / CATALOG_FILE)) as catalog:
            catalog.execute("PRAGMA journal_mode=WAL")
    except (OSError, sqlite3.Error) as error:
        raise StoreError(f"--db {location}: cannot write a store there: {error}") from None


def s3_secret(con: duckdb.DuckDBPyConnection) -> None:
    """An S3 secret from the usual environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL` for an S3-compatible server)."""
    env = os.environ
    endpoint = env.get("AWS_ENDPOINT_URL", "")
    fields = {
        "KEY_ID": env.get("AWS_ACCESS_KEY_ID"),
        "SECRET": env.get("AWS_SECRET_ACCESS_KEY"),
        "REGION": env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION"),
        "ENDPOINT": endpoint.split("://", 1)[-1] or None,
    }
    options = [f"{k} {literal(v)}" for k, v in fields.items() if v]
    if endpoint:
        options += ["URL_STYLE 'path'", f"USE_SSL {str(endpoint.startswith('https')).lower()}"]
    con.execute(f"CREATE OR REPLACE SECRET proxaudit_s3 (TYPE s3, {', '.join(options)})")


def stored_data_path(con: duckdb.DuckDBPyConnection) -> str:
    """The data path the attached store reads and writes its Parquet files at (its catalog's, or a folder
    store's own `data/`), with a separator."""
    rows = con.execute(f"SELECT data_path FROM ducklake_settings('{STORE}')").fetchall()
    path = rows[0][0] if rows else ""
    return path if path.endswith(("/", os.sep)) else path + "/"


def require_local_or_uri(data_path: str | None) -> str | None:
    """`--data-path`: a folder (made absolute) or an `s3://` prefix, ending in a separator."""
    if data_path is None:
        return None
    if data_path.startswith("s3://"):
        return data_path.rstrip("/") + "/"
    if "://" in data_path:
        raise UsageError(f"--data-path {data_path}: a folder or an s3:// prefix")
    return str(Path(data_path).absolute()) + os.sep
