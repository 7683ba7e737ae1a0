"""A packed split's members (rule 8 of :mod:`sparkcoord.sources.files`): their bytes fetched
ahead on a remote filesystem, their records counted, and the rows of several joined into one
record batch.

Used by the file reader (:class:`~sparkcoord.sources.files.reading.FileReader`) for a packed
split, in a Spark task on the task's thread; the reader keeps the order of the members, their
positions and what each member's rows become (rules 3, 6, 7, 8). A rule number alone is the
file source's (``sources/files/__init__.py``).

Thread model: the task's thread calls everything here; a :class:`MemberFetcher` on a remote
filesystem runs ``cat_file`` on a small thread pool (``sparkcoord-fetch``) of its own, made
per packed split and shut down when the split is read or the read stops. The pool's threads
only fetch bytes; the task's thread takes their results in member order.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from sparkcoord.sources.files.listing import _is_local
from sparkcoord.sources.files.split import Member


class MemberFetcher:
    """The bytes of a packed split's members (rule 8), in order, from member ``first`` on.
    A local file is read when asked for; on a remote filesystem (S3, ...) a small thread pool
    fetches the next members ahead with ``cat_file`` while the reader parses: at most
    ``ahead`` members and, past the one being read, ``max_bytes`` bytes (a member may be
    bigger alone). Made and used by :class:`~.reading.FileReader` in the Spark task's thread; the
    pool's threads only fetch. :meth:`close` drops what was fetched and not read."""

    def __init__(self, fs: Any, members: tuple[Member, ...], first: int, *, ahead: int,
                 max_bytes: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.fs = fs
        self.members = members
        self.ahead = max(1, ahead)
        self.max_bytes = max_bytes
        self.local = _is_local(fs)
        self._next = first
        self._waiting: dict[int, Any] = {}
        self._pool = (None if self.local or self.ahead == 1 else
                      ThreadPoolExecutor(self.ahead, thread_name_prefix="sparkcoord-fetch"))

    def _read(self, path: str) -> bytes:
        if self.local:
            with open(path, "rb") as f:
                return f.read()
        data: bytes = self.fs.cat_file(path)
        return data

    def _fill(self) -> None:
        assert self._pool is not None
        held = sum(self.members[i][1] for i in self._waiting)
        while self._next < len(self.members) and len(self._waiting) < self.ahead:
            size = self.members[self._next][1]
            if self._waiting and held + size > self.max_bytes:
                break
            self._waiting[self._next] = self._pool.submit(self._read, self.members[self._next][0])
            held += size
            self._next += 1

    def get(self, index: int) -> bytes:
        """Member ``index``'s bytes (members are asked for in order); a failure to fetch it
        is raised here."""
        if self._pool is None:
            return self._read(self.members[index][0])
        if index not in self._waiting:
            self._next = max(self._next, index)
            self._fill()
        future = self._waiting.pop(index)
        self._fill()
        data: bytes = future.result()
        return data

    def close(self) -> None:
        if self._pool is not None:
            for future in self._waiting.values():
                future.cancel()
            self._waiting.clear()
            self._pool.shutdown(wait=False, cancel_futures=True)


#: a line with nothing but white space (or nothing), where CSV and JSON count differently
BLANK_LINE = re.compile(rb"(?:^|\n)[ \t\r\f\v]*(?:\n|$)")


def record_count(body: bytes) -> int | None:
    """The records of ``body`` (whole lines, no header): its non-blank lines; None when a line
    holds white space only (whether that is a record depends on the format). Reader (task
    thread), for the one-parse path of a packed split."""
    if body.endswith(b"\n"):
        body = body[:-1]
    if not body:
        return 0
    if BLANK_LINE.search(body) is None:
        return body.count(b"\n") + 1
    count = 0
    for line in body.split(b"\n"):
        if line.strip():
            count += 1
        elif line:
            return None
    return count


def joined_tables(tables: list[Any]) -> Any:
    """One record batch of the rows of ``tables`` (same schema, some rows)."""
    import pyarrow as pa

    return pa.concat_tables(tables).combine_chunks().to_batches()[0]


def cumulative(counts: list[int]) -> Iterator[int]:
    """The running totals of ``counts``: the rows read after each member (task thread)."""
    total = 0
    for count in counts:
        total += count
        yield total
