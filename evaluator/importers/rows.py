"""From a trainer's per-sequence arrays to schema v1 rows, streamed into Parquet.

A dump holds, per sequence, arrays over its positions (prompt and response) with the log-prob of the
token *at* each position (position 0 has none). `response_rows` keeps the response: from the first
position in the loss to the last, `pos` counted from there; masked positions inside it stay as rows with
`loss_mask` false. `LogWriter` buffers such rows and writes them a record batch at a time, so a dump of
millions of tokens is never held whole.

Without versions in the dump the importer writes `behave_version = step` and records the assumption in
the file's key-value metadata (`proxaudit.versions = assumed_on_policy`, docs/importers.md): the log then
answers the engine mismatch question (staleness 0), and `validate` says so on every such file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from evaluator.errors import InputFileError
from evaluator.inputs import bounded_lines, open_regular
from evaluator.logio import readable_mode
from schemas.token_log import ASSUMED_ON_POLICY, SOURCE_KEY, VERSIONS_KEY, arrow_schema

COLUMNS = (
    "run_id", "step", "minibatch", "n_minibatches", "seq_id", "pos", "token_id", "loss_mask",
    "behave_logp", "behave_version", "prox_logp", "theta_logp", "advantage", "reward",
)  # fmt: skip
BATCH_ROWS = 1 << 18


class ImportFormatError(ValueError):
    """A dump that is not what its trainer writes: names the file, the record and what is wrong."""


@dataclass
class ImportResult:
    source: Path
    out: Path | None
    sequences: int = 0
    rows: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    """Records left out, by why (e.g. "without a generated token": nothing to audit)."""
    notes: set[str] = field(default_factory=set)
    """What the user should check (an assumption the dump contradicts)."""

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def count(self, response: dict[str, np.ndarray]) -> None:
        self.sequences += 1
        self.rows += len(response["pos"])


def dump_files(
    paths: Sequence[str | Path], in_folder: Callable[[Path], Iterable[Path]], order: Callable[[Path], object]
) -> list[Path]:
    """A format's dump files: each path that is a file, and `in_folder(p)` of each folder, sorted by
    `order` (which raises `ImportFormatError` on a name its trainer does not write), then by path."""
    found = []
    for p in map(Path, paths):
        found += list(in_folder(p)) if p.is_dir() else [p]
    return sorted(found, key=lambda f: (order(f), str(f)))


def jsonl(
    path: Path, keys: tuple[str, ...], trainer: str, unwrap: Callable[[dict, str], dict] | None = None
) -> Iterator[tuple[int, dict]]:
    """(line number, record) of each non-blank line, read one at a time from a regular file, each line
    at most `LINE_BYTES` (`evaluator.inputs.bounded_lines`: a longer one is never held whole); a line that
    is not UTF-8, not a JSON object, lacks one of `keys` or has per-token arrays that are not flat lists of
    one length is an `ImportFormatError`. `unwrap(record, where)` first undoes a trainer's wrapping."""
    with dump_file(path, trainer) as source:
        try:
            for line_no, data in bounded_lines(source, path):
                if data.strip():
                    yield line_no, _record(data, f"{path}: line {line_no}", keys, trainer, unwrap)
        except InputFileError as error:  # a line past the bound
            raise ImportFormatError(str(error)) from None


@contextmanager
def dump_file(path: Path, trainer: str) -> Iterator[BinaryIO]:
    """`path` opened for reading when it is a regular file (`evaluator.inputs.open_regular`); a FIFO, a
    device or a folder is an `ImportFormatError`, at once."""
    try:
        source = open_regular(path, f"{trainer} dump")
    except InputFileError as error:
        raise ImportFormatError(str(error)) from None
    with source:
        yield source


def _record(
    data: bytes, where: str, keys: tuple[str, ...], trainer: str, unwrap: Callable[[dict, str], dict] | None
) -> dict:
    try:
        record = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ImportFormatError(f"{where}: not a text file of JSON lines ({error})") from None
    except (json.JSONDecodeError, RecursionError) as error:
        raise ImportFormatError(f"{where}: not JSON ({error})") from None
    if not isinstance(record, dict):
        raise ImportFormatError(f"{where}: a JSON {type(record).__name__}, not an object")
    missing = [k for k in keys if k not in record]
    if missing:
        raise ImportFormatError(f"{where}: missing {', '.join(missing)} ({trainer} writes them)")
    if unwrap is not None:
        record = unwrap(record, where)
    lengths = {k: len(record[k]) if isinstance(record[k], list) else None for k in keys}
    if None in lengths.values() or len(set(lengths.values())) != 1:
        raise ImportFormatError(f"{where}: per-token arrays are not lists of one length: {lengths}")
    return record


def numbers(record: dict, keys: Sequence[str], where: str) -> dict[str, np.ndarray]:
    """`record[k]` as a flat float64 array for each of `keys` (JSON null -> nan); a value that is not a
    flat list of numbers is an `ImportFormatError` naming `where` and the key."""
    out = {}
    for key in keys:
        try:
            array = np.asarray(record[key], dtype=float)
        except (TypeError, ValueError):
            array = None
        if array is None or array.ndim != 1:
            raise ImportFormatError(f"{where}: {key} is not a flat list of numbers")
        out[key] = array
    return out


def number(value: object, where: str, key: str) -> float:
    """One number (a bool or int counts); anything else is an `ImportFormatError`."""
    if isinstance(value, (int, float)) and not isinstance(value, complex):
        return float(value)
    raise ImportFormatError(f"{where}: {key} is {value!r}, not a number")


def response_rows(
    *,
    token_ids: np.ndarray,
    token_mask: np.ndarray,
    loss_mask: np.ndarray,
    behave_logp: np.ndarray,
    prox_logp: np.ndarray,
    advantage: np.ndarray,
) -> dict[str, np.ndarray] | None:
    """The response of one sequence (first to last position of `token_mask`, the generated tokens) as
    column arrays, or None when it has none; `loss_mask` may be narrower (a sample left out of the
    loss). The log-prob arrays hold the token at each position (not the next one)."""
    in_loss = np.flatnonzero(token_mask)
    if in_loss.size == 0:
        return None
    first, last = int(in_loss[0]), int(in_loss[-1]) + 1
    span = slice(first, last)
    return {
        "pos": np.arange(last - first, dtype=np.int32),
        "token_id": token_ids[span],
        "loss_mask": loss_mask[span].astype(bool),
        "behave_logp": behave_logp[span],
        "prox_logp": prox_logp[span],
        "theta_logp": prox_logp[span],
        "advantage": advantage[span],
    }


@dataclass
class LogWriter:
    """Schema v1 rows into one Parquet file, a record batch at a time; the file appears whole at
    `close` (temporary name, then rename) with the import's metadata."""

    path: Path
    source: str
    versions: bytes = ASSUMED_ON_POLICY
    _parts: list[dict[str, np.ndarray]] = field(default_factory=list)
    _rows: int = 0
    _writer: pq.ParquetWriter | None = None
    _tmp: Path | None = None

    @property
    def schema(self) -> pa.Schema:
        schema = arrow_schema(list(COLUMNS))
        return schema.with_metadata(
            {**schema.metadata, VERSIONS_KEY: self.versions, SOURCE_KEY: self.source.encode()}
        )

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, kind, value, trace) -> None:
        if kind is not None:  # nothing half-written stays behind
            self.abort()

    def add(self, response: dict[str, np.ndarray], **scalars: object) -> None:
        """One sequence: its arrays and the values repeated on each of its rows (run_id, step, ...)."""
        n = len(response["pos"])
        self._parts.append(response | {k: np.full(n, v) for k, v in scalars.items()})
        self._rows += n
        if self._rows >= BATCH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._parts:
            return
        schema = self.schema
        columns = {c: np.concatenate([p[c] for p in self._parts]) for c in COLUMNS}
        arrays = [pa.array(columns[f.name], type=f.type, from_pandas=True) for f in schema]
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
            os.close(fd)
            self._tmp = Path(tmp)
            self._writer = pq.ParquetWriter(self._tmp, schema, compression="zstd")
        self._writer.write_batch(batch)
        self._parts, self._rows = [], 0

    def close(self) -> Path | None:
        """Write what is left and publish the file; None (and no file) when nothing was added."""
        self._flush()
        if self._writer is None:
            return None
        self._writer.close()
        readable_mode(self._tmp)
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._tmp.unlink(missing_ok=True)
