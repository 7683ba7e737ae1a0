"""The few file operations sparkcoord needs, on a local directory or any fsspec URL.

Why a local directory does not go through fsspec: this module is imported by the parts of
sparkcoord that run in Spark's Python workers (a subtask reading and writing its state, a
downstream operator reading Spark's offset log), and importing fsspec brings asyncio, ssl,
email and importlib.metadata: about 5,600 objects the garbage collector tracks. PySpark's
worker daemon runs a full ``gc.collect()`` after every task, so every task of a worker that
imported fsspec paid ~6 ms walking them (measured: docs/decisions/032-worker-imports.md). A path
or a ``file://`` URL is served with ``os`` calls; any other URL goes through fsspec, imported
only then.

Thread model: no state of its own beyond the fsspec filesystem (thread-safe for our use); any
thread.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import uuid
from typing import Any


class Files:
    """File operations on one store. Paths are absolute within the store (posix style)."""

    def read(self, path: str) -> bytes:
        """The whole file; ``FileNotFoundError`` if it does not exist."""
        raise NotImplementedError

    def names(self, directory: str) -> list[str]:
        """The base names in ``directory``; empty if it does not exist."""
        raise NotImplementedError

    def write_atomic(self, path: str, data: bytes, *, fsync: bool = False,
                     private: bool = False) -> None:
        """Write ``data`` under a temporary name and rename it over ``path`` (creating parents).

        ``private``: readable and writable by the owner only (mode 0600) from the moment the
        temporary file exists (a secret never sits in a wider file). Local files only: object
        stores have no modes, and fsspec stores ignore it (their access is the store's).
        """
        raise NotImplementedError

    def remove(self, path: str) -> None:
        """Delete a file or a directory tree; nothing if it does not exist."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        """Whether a file is at ``path`` (one ``stat``, or one request to the store)."""
        raise NotImplementedError

    def create_exclusive(self, path: str, data: bytes) -> None:
        """Create ``path`` holding ``data`` only if nothing is there, atomically (of two
        callers, one succeeds); ``FileExistsError`` otherwise. Local: written under a
        temporary name and hard-linked to ``path`` (``link(2)`` refuses an existing name);
        S3 through s3fs: a put with ``If-None-Match: *``; other fsspec stores: their
        ``pipe_file(mode="create")`` (fsspec's default checks, then writes: not atomic).
        Called by the job runner as it takes a lease (driver program; runtime/lease.py)."""
        raise NotImplementedError

    def makedirs(self, directory: str) -> None:
        """Create ``directory`` and its parents; nothing if it exists (an object store has no
        empty directories: nothing there either). Called by the checkpoint storage when it
        opens a job's directory (the runner's driver side, or a tool; any thread)."""
        raise NotImplementedError


class LocalFiles(Files):
    """A local directory, through ``os`` (no fsspec import)."""

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def names(self, directory: str) -> list[str]:
        try:
            return os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def write_atomic(self, path: str, data: bytes, *, fsync: bool = False,
                     private: bool = False) -> None:
        parent = posixpath.dirname(path)
        os.makedirs(parent, exist_ok=True)
        tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
        # private: created 0600 (less if the umask says so), never wider; else 0666 less the umask
        with open(tmp, "wb", opener=_create_private if private else None) as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if fsync:  # the rename itself is durable only once the directory entry is on disk
            fsync_directory(parent)

    def remove(self, path: str) -> None:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            return
        try:
            os.remove(path)
        except FileNotFoundError:
            pass

    def makedirs(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def create_exclusive(self, path: str, data: bytes) -> None:
        parent = posixpath.dirname(path)
        os.makedirs(parent, exist_ok=True)
        tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic, and refuses an existing name: complete or absent
        finally:
            os.remove(tmp)
        fsync_directory(parent)


def fsync_directory(path: str) -> None:
    """Force a local directory's entries (a new or renamed file in it) to disk."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _create_private(path: str, flags: int) -> int:
    """``open``'s opener for a new file that only its owner may read or write."""
    return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)


class FsspecFiles(Files):
    """Any fsspec filesystem (object stores, HDFS, memory://)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def read(self, path: str) -> bytes:
        data: bytes = self.fs.cat_file(path)
        return data

    def names(self, directory: str) -> list[str]:
        try:
            return [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(directory, detail=False)]
        except FileNotFoundError:
            return []

    def write_atomic(self, path: str, data: bytes, *, fsync: bool = False,
                     private: bool = False) -> None:
        # private is ignored: object stores have no file modes (see Files.write_atomic)
        parent = posixpath.dirname(path)
        self.fs.makedirs(parent, exist_ok=True)
        tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
        self.fs.pipe_file(tmp, data)
        try:
            self.fs.mv(tmp, path)
        except (FileExistsError, OSError):
            # Some stores refuse to rename over an existing object: the existing one is
            # replaced anyway (a garbage record or a retried state), so delete it and rename.
            self.remove(path)
            self.fs.mv(tmp, path)

    def remove(self, path: str) -> None:
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def makedirs(self, directory: str) -> None:
        self.fs.makedirs(directory, exist_ok=True)

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def create_exclusive(self, path: str, data: bytes) -> None:
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.fs.pipe_file(path, data, mode="create")
        self.fs.invalidate_cache(posixpath.dirname(path))


#: the schemes fsspec's local filesystem strips from a local path, in the order it tries them
LOCAL_PREFIXES = ("file://", "file:", "local://", "local:")


def local_path(url: str) -> str | None:
    """The path a local ``url`` names, its scheme stripped as fsspec's local filesystem strips
    it and nothing else changed: a plain path, or one of :data:`LOCAL_PREFIXES` and a path;
    None for any other URL. Any process, any thread."""
    for prefix in LOCAL_PREFIXES:
        if url.startswith(prefix):
            return url[len(prefix):]
    return None if "://" in url else url


def is_local_url(url: str) -> bool:
    """A plain path or a local URL (``file:``, ``local:``; served without fsspec)."""
    return local_path(url) is not None


def files_for(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Files, str]:
    """The store of ``url`` and the root path within it (no trailing slash): a local path is
    made absolute and normalized (every process of a job computes a directory this way).
    Any process, any thread."""
    path = local_path(url)
    if path is not None and not storage_options:
        return LocalFiles(), os.path.abspath(path).rstrip("/") or "/"
    import fsspec  # only for remote stores: see the module docstring

    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return FsspecFiles(fs), root.rstrip("/") or "/"
