"""Listing files: the filesystem of a URL (fsspec's, or :class:`LocalFileSystem` for a local
path) and the files under a root, in path order.

Runs wherever files are listed or opened: in Spark's Python source runner process on the
driver host (discovery, on the enumerator's discovery thread; a fresh source's first listing on
its mailbox), in the user's driver program thread (:func:`~.schema.infer_schema`, when the
source is built), and in Spark's Python workers on the executors (the reader's
:func:`filesystem`, on the task's thread).

Thread model: :func:`filesystem` keeps one fsspec instance per process and set of options in a
dict without a lock: each process calls it from one thread at a time (one discovery cycle at a
time, one task at a time in a worker), and a race would only make a second instance. A
:class:`Lister` is made per discovery cycle and used by the thread that made it. Rule numbers
are the package's (:mod:`sparkcoord.sources.files`).
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import Any

from sparkcoord.runtime.files import local_path


@dataclass(frozen=True)
class FileEntry:
    """A listed file: its path, size and modification time as the listing saw them."""

    path: str
    size: int
    mtime: float


_FILESYSTEMS: dict[tuple[str, str], Any] = {}

class LocalFileSystem:
    """The calls the file source makes on local files, with ``os`` and ``open``: what
    :func:`filesystem` gives for an absolute local path, so that no process that lists or reads
    local files imports fsspec (its import is ~25 ms in the source runner and in every new
    task worker, and its objects are walked by the garbage collection PySpark runs after every
    task: docs/decisions/032-worker-imports.md, docs/decisions/085-compiled-bench-local-files.md).
    The :class:`Lister` lists it with ``os.scandir``.

    Thread model: no state; any thread of any process (the runner's discovery thread, the
    user's driver program, a task's thread or a packed split's fetch threads)."""

    protocol = "file"

    @staticmethod
    def _strip_protocol(url: str) -> str:
        """The path of an absolute local ``url``, exactly as fsspec's local filesystem gives it
        (paths are kept in checkpoints: a restored source compares them): the scheme
        stripped, no normalization, trailing slashes dropped."""
        path = local_path(url)
        return (url if path is None else path).rstrip("/") or "/"

    def open(self, path: str, mode: str = "rb") -> Any:
        """``path`` opened; read modes carry ``size``, the open file's own size, as fsspec's
        files do (the reader checks it against the split: a file deleted or replaced after it
        was opened is still the file read)."""
        f: Any = open(path, mode)  # noqa: SIM115 - the caller closes it
        if "r" in mode:
            f.size = os.fstat(f.fileno()).st_size
        return f

    def size(self, path: str) -> int:
        """The size of ``path`` now."""
        return os.path.getsize(path)

    def cat_file(self, path: str) -> bytes:
        """The whole of ``path``."""
        with open(path, "rb") as f:
            return f.read()


def _is_local_path(url: str, storage_options: dict[str, Any] | None) -> bool:
    """``url`` is an absolute local path :class:`LocalFileSystem` serves as fsspec would: no
    options, a POSIX system, and after the scheme an absolute path (a relative one or ``~``
    goes through fsspec, which makes it absolute its own way)."""
    path = local_path(url)
    return not storage_options and os.sep == "/" and path is not None and path.startswith("/")


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The filesystem of ``url`` and the path inside it: a :class:`LocalFileSystem` (no state,
    made per call) for an absolute local path, else fsspec's, one instance per process and
    set of options (readers run many tasks in one Python worker)."""
    if _is_local_path(url, storage_options):
        return LocalFileSystem(), LocalFileSystem._strip_protocol(url)
    import fsspec

    key = (url.split("://", 1)[0] if "://" in url else "file",
           json.dumps(storage_options or {}, sort_keys=True, default=str))
    fs = _FILESYSTEMS.get(key)
    if fs is None:
        fs, _ = fsspec.core.url_to_fs(url, **(storage_options or {}))
        _FILESYSTEMS[key] = fs
    return fs, fs._strip_protocol(url)


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _is_s3(fs: Any) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "s3" in protocols or "s3a" in protocols


def _mtime(info: dict[str, Any]) -> float:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        try:
            from datetime import datetime

            return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
    return 0.0


def _visible(name: str) -> bool:
    base = name.rstrip("/").rsplit("/", 1)[-1]
    return not base.startswith(("_", "."))


def _skip_dir(directory: str, marker: str) -> bool:
    """Every path under ``directory`` sorts at or before ``marker`` (rule 2)."""
    prefix = directory.rstrip("/") + "/"
    return bool(marker) and marker > prefix and not marker.startswith(prefix)


class Lister:
    """Lists files under a root in lexical path order, optionally only after a marker."""

    def __init__(self, fs: Any, root: str, *, recursive: bool, glob: str | None) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.recursive = recursive
        self.glob = glob

    def _wanted(self, path: str) -> bool:
        base = path.rsplit("/", 1)[-1]
        return _visible(base) and (self.glob is None or fnmatch.fnmatchcase(base, self.glob))

    def after(self, marker: str, limit: int | None,
              skip: Container[str] = ()) -> list[FileEntry]:
        """Files whose path sorts after ``marker`` ("" for all), at most ``limit``, in order;
        paths in ``skip`` are left out (locally without a stat)."""
        if _is_s3(self.fs):
            out = [e for e in self._s3_after(marker, None if skip else limit)
                   if e.path not in skip]
        else:
            out = sorted(self._walk(self.root, marker, skip), key=lambda e: e.path)
        return out if limit is None else out[:limit]

    def _walk(self, directory: str, marker: str, skip: Container[str]) -> Iterator[FileEntry]:
        if _is_local(self.fs):
            entries = self._local_entries(directory, marker)
        else:
            entries = self._generic_entries(directory)
        for path, is_dir, info in entries:
            if is_dir:
                if self.recursive and _visible(path) and not _skip_dir(path, marker):
                    yield from self._walk(path, marker, skip)
            elif path > marker and path not in skip and self._wanted(path):
                entry = info() if callable(info) else info
                if entry is not None:
                    yield entry

    def _local_entries(self, directory: str, marker: str) -> Iterator[tuple[str, bool, Any]]:
        # scandir, and stat only the names after the marker: a directory of 100k old files
        # costs one readdir, not 100k stats
        try:
            scan = os.scandir(directory)
        except FileNotFoundError:
            return
        with scan:
            for entry in scan:
                path = f"{directory}/{entry.name}"
                if entry.is_dir(follow_symlinks=True):
                    yield path, True, None
                elif path > marker:
                    def stat(e: os.DirEntry[str] = entry, p: str = path) -> FileEntry | None:
                        try:
                            st = e.stat()
                        except FileNotFoundError:
                            return None  # deleted while listing
                        return FileEntry(p, st.st_size, st.st_mtime)
                    yield path, False, stat

    def _generic_entries(self, directory: str) -> Iterator[tuple[str, bool, Any]]:
        try:
            infos = self.fs.ls(directory, detail=True)
        except FileNotFoundError:
            return
        for info in infos:
            path = str(info["name"]).rstrip("/")
            if info.get("type") == "directory":
                yield path, True, None
            else:
                yield path, False, FileEntry(path, int(info.get("size") or 0), _mtime(info))

    def _s3_after(self, marker: str, limit: int | None) -> list[FileEntry]:
        bucket, _, prefix = self.root.partition("/")
        prefix = f"{prefix}/" if prefix else ""
        start_after = marker.partition("/")[2] if marker else ""
        out: list[FileEntry] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if not self.recursive:
            kwargs["Delimiter"] = "/"
        if start_after:
            kwargs["StartAfter"] = start_after
        while True:
            page = self.fs.call_s3("list_objects_v2", **kwargs)
            for obj in page.get("Contents", []):
                path = f"{bucket}/{obj['Key']}"
                if obj["Key"].endswith("/") or not self._wanted(path):
                    continue
                if self.recursive and not all(_visible(p) for p in obj["Key"][len(prefix):].split("/")):
                    continue
                out.append(FileEntry(path, int(obj["Size"]), _mtime(obj)))
            if limit is not None and len(out) >= limit:
                break
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
            kwargs["ContinuationToken"] = token
            kwargs.pop("StartAfter", None)
        return out
