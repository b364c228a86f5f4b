"""Token logs where they live: local paths, or object-storage URIs (`s3://bucket/prefix/`, `gs://...`).

A URI is read through pyarrow's filesystems, with the credentials and endpoint of the usual environment
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL` for an
S3-compatible server; `GOOGLE_APPLICATION_CREDENTIALS`). The objects of a call are copied into a private
temporary folder (`Staging`) and checked, summarised and digested there exactly like local files, so a
file's identity stays the BLAKE2b of its bytes wherever it was read from; reports and the store name the
URI. The token inspector reads a recorded URI through `verified_copy`, which keeps a copy only while it
holds the bytes recorded at replay.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from evaluator.errors import UsageError

COPY_CHUNK = 1 << 22


def is_uri(location: str | os.PathLike) -> bool:
    """True for `scheme://...` (object storage), False for a local path."""
    return "://" in str(location) and not str(location).startswith("file://")


def _filesystem(uri: str):
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError) as error:  # unknown scheme, bad bucket name, no credentials
        raise UsageError(f"{uri}: cannot open: {error}") from None


def list_parquet(uri: str) -> list[str]:
    """The URIs of the Parquet objects at `uri`: the object itself, or every `*.parquet` under it as a
    prefix, in sorted order. A `UsageError` when there is nothing there."""
    import pyarrow.fs as pafs

    fs, root = _filesystem(uri)
    scheme = uri.split("://", 1)[0]
    try:
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.File:
            return [uri]
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
            dest = self.folder / object_uri.replace("://", "/", 1)
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


def verified_copy(uri: str, digest: str, cache: Path) -> Path | None:
    """A local copy of the object at `uri` while it holds the bytes recorded at replay (`digest`); None
    when it is gone or has other bytes. Copies are kept in `cache` by digest and the object's size and
    modification time, so an unchanged object is fetched once and a rewritten one is checked again."""
    import pyarrow.fs as pafs

    try:
        fs, path = _filesystem(uri)
        info = fs.get_file_info(path)
    except (OSError, UsageError):
        return None
    if info.type != pafs.FileType.File:
        return None
    dest = cache / digest / f"{info.size}-{info.mtime_ns}" / uri.replace("://", "/", 1)
    if dest.is_file():
        return dest
    partial = dest.with_name(dest.name + ".part")
    try:
        matches = download(uri, partial) == digest
    except (OSError, UsageError):
        matches = False
    if not matches:
        partial.unlink(missing_ok=True)
        return None
    os.replace(partial, dest)
    return dest
