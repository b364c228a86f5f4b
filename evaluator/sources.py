"""Token logs where they live: local paths, or object-storage URIs (`s3://bucket/prefix/`, `gs://...`).

A URI is read through pyarrow's filesystems, with the credentials and endpoint of the usual environment
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL` for an
S3-compatible server; `GOOGLE_APPLICATION_CREDENTIALS`) and nothing else: a URI is `s3://BUCKET/KEY` or
`gs://BUCKET/KEY` (`object_path`), never one with options, credentials, a host or a port, so a URI
recorded in a store cannot choose where a request goes or what it carries. The objects of a call are
copied into a private temporary folder (`Staging`) and checked, summarised and digested there exactly like
local files, so a file's identity stays the BLAKE2b of its bytes wherever it was read from; reports and
the store name the URI. The token inspector reads a recorded URI through `verified_copy`, which keeps a
copy only while it holds the bytes recorded at replay.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from evaluator.errors import UsageError

COPY_CHUNK = 1 << 22


def is_uri(location: str | os.PathLike) -> bool:
    """True for `scheme://...` (object storage), False for a local path."""
    return "://" in str(location) and not str(location).startswith("file://")


_OBJECT_URI = re.compile(
    r"(?P<scheme>s3|gs)://(?P<bucket>[A-Za-z0-9][A-Za-z0-9._-]{1,220}[A-Za-z0-9])"
    r"(?:/(?P<key>[^?#\x00-\x1f\x7f-\x9f]*))?"
)
DIGEST = re.compile(r"[0-9a-f]{64}")
"""What `file_digest` returns (and a store records): 64 lowercase hex digits."""


def object_path(uri: str) -> tuple[str, str]:
    """(scheme, `bucket/key`) of `s3://BUCKET/KEY` or `gs://BUCKET/KEY` (the key taken literally); a
    `UsageError` for any other URI: options (`?endpoint_override=...`), credentials, a host or port, or
    another scheme would let the URI, not the environment, choose where requests go and what they carry."""
    found = _OBJECT_URI.fullmatch(uri)
    if found is not None and {".", ".."} & set((found["key"] or "").split("/")):
        raise UsageError(f"{uri}: a key with a `.` or `..` segment names another object once the URI is sent")
    if found is None:
        raise UsageError(
            f"{uri}: not an object-storage URI proxaudit reads: s3://BUCKET/KEY or gs://BUCKET/KEY, without "
            "options, credentials, host or port (the endpoint, region and credentials come from the "
            "environment: AWS_ENDPOINT_URL, AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID, ...)"
        )
    return found["scheme"], f"{found['bucket']}/{found['key'] or ''}".rstrip("/")


def _filesystem(uri: str):
    """(filesystem, path) of an object's URI (`object_path`), the filesystem configured by the
    environment alone."""
    import pyarrow.fs as pafs

    scheme, path = object_path(uri)
    try:
        filesystem, _ = pafs.FileSystem.from_uri(f"{scheme}://{path.split('/', 1)[0]}")
    except (OSError, ValueError) as error:  # no credentials, a bucket the SDK refuses
        raise UsageError(f"{uri}: cannot open: {error}") from None
    return filesystem, path


def parquet_rows(source) -> int | None:
    """The row count in the footer of the Parquet file at `source` (a path or an open file), None when
    it is not one (a cheap check before reading or hashing the whole file)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(source).metadata.num_rows
    except Exception:  # pyarrow raises several types for a file that is not Parquet
        return None


def list_parquet(uri: str) -> list[str]:
    """The URIs of the Parquet objects at `uri`: the object itself, or every `*.parquet` under it as a
    prefix, in sorted order. A `UsageError` when there is nothing there."""
    import pyarrow.fs as pafs

    fs, root = _filesystem(uri)
    scheme = uri.split("://", 1)[0]
    try:
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.File:
            return [f"{scheme}://{root}"]
        if info.type == pafs.FileType.NotFound:
            raise UsageError(f"{uri}: no such object or prefix")
        found = fs.get_file_info(pafs.FileSelector(root.rstrip("/"), recursive=True))
    except OSError as error:
        raise UsageError(f"{uri}: cannot list: {error}") from None
    names = sorted(i.path for i in found if i.type == pafs.FileType.File and i.path.endswith(".parquet"))
    return [f"{scheme}://{name}" for name in names]


def _hasher():
    return hashlib.blake2b(digest_size=32)


def file_digest(path: str | os.PathLike) -> str:
    """BLAKE2b (256-bit) of the file's bytes: a file's identity in the store (the same bytes are never
    ingested twice), wherever they were read from."""
    digest = _hasher()
    with open(path, "rb") as source:
        while chunk := source.read(COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def download(uri: str, dest: Path) -> str:
    """Copy the object at `uri` to `dest`, streaming; returns the digest of its bytes (`file_digest` of
    the copy, computed on the way)."""
    fs, path = _filesystem(uri)
    digest = _hasher()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with fs.open_input_stream(path) as source, open(dest, "wb") as sink:
        while chunk := source.read(COPY_CHUNK):
            digest.update(chunk)
            sink.write(chunk)
    return digest.hexdigest()


class Staging:
    """The files of one call as local paths, objects of URIs copied into a temporary folder removed on
    exit; `location` maps a path back to what the user named (the URI of a copied object)."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.uris: dict[Path, str] = {}
        self._named: dict[str, Path] = {}
        self.digests: dict[Path, str] = {}
        """`file_digest` of each copy, computed while it was downloaded."""

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def stage(self, uri: str) -> list[Path]:
        """Copy every Parquet object at `uri` here; their local paths, in the URIs' order. An object that
        cannot be read is a `UsageError` naming it."""
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="proxaudit-stage-"))
        local = []
        for object_uri in list_parquet(uri):
            # named by number: a key is the bucket's data, and `..` or `*` in it must not reach a path
            dest = self._named.setdefault(object_uri, self.folder / f"{len(self._named):06d}.parquet")
            if dest not in self.uris:
                try:
                    self.digests[dest] = download(object_uri, dest)
                except OSError as error:
                    raise UsageError(f"{object_uri}: cannot read: {error}") from None
                self.uris[dest] = object_uri
            local.append(dest)
        return local

    def location(self, path: Path) -> Path | str:
        """The URI a staged copy came from, else the path itself."""
        return self.uris.get(path, path)


def recorded_location(location: Path | str) -> str:
    """A file's location as the store records it: a URI as given, a path resolved."""
    return location if isinstance(location, str) else str(location.resolve())


_MISMATCHED: set[tuple] = set()
"""(uri, digest, size, mtime) of objects found to hold other bytes: not fetched again while unchanged."""


def verified_copy(uri: str, digest: str, n_rows: int, cache: Path) -> Path | None:
    """A local copy of the object at `uri` while it holds the bytes recorded at replay (`digest`, and
    `n_rows` in its Parquet footer, read first so that no other object is fetched whole); None when it is
    gone or has other bytes. Copies are kept in `cache` under the digest, the object's size and
    modification time, so an unchanged object is fetched once and a rewritten one is checked again."""
    import pyarrow.fs as pafs

    if not DIGEST.fullmatch(digest):
        return None
    try:
        fs, path = _filesystem(uri)
        info = fs.get_file_info(path)
    except (OSError, UsageError):
        return None
    if info.type != pafs.FileType.File:
        return None
    dest = cache / f"{digest}-{info.size}-{info.mtime_ns}.parquet"
    seen = (uri, digest, info.size, info.mtime_ns)
    if dest.is_file() or seen in _MISMATCHED:
        return dest if dest.is_file() else None
    partial = dest.with_name(dest.name + ".part")
    try:
        with fs.open_input_file(path) as footer:
            matches = parquet_rows(footer) == n_rows and download(uri, partial) == digest
    except (OSError, UsageError):
        matches = False
    if not matches:
        partial.unlink(missing_ok=True)
        _MISMATCHED.add(seen)
        return None
    os.replace(partial, dest)
    return dest
