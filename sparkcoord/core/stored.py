"""Stored-once parts of a coordinator's checkpointed state, and the snapshot format that names them.

A coordinator's state is pickled at every checkpoint boundary and written in that epoch's
record. A state that holds a big value changing rarely (a source's backlog of discovered
splits, the files a listing has seen) would write all of it at every trigger; wrapped in a
:class:`StoredOnce`, that value is written once, as a *part* named by the SHA-256 of its bytes,
and every record that holds it refers to it by that name (as Flink's incremental checkpoints
share files between checkpoints).

Rules:
  1. A part is immutable: its bytes are the pickle of its value, taken once, and its name is
     their SHA-256 digest. Whoever wraps a value in :class:`StoredOnce` hands it over: it must
     not change afterwards (make a new part instead).
  2. A snapshot that refers to parts is ``PARTS_MAGIC | u32 count | count x 32-byte digests |
     pickle``; its pickle stands for each part by the part's digest. A snapshot without parts
     is a plain pickle, as every snapshot was before parts existed (a pickle never starts with
     ``PARTS_MAGIC``), so older records read as before. The digests are readable without
     unpickling anything, so that retention can tell which parts a record needs.
  3. Parts are written before the record that refers to them, and deleted only once no record
     present refers to them (runtime/storage.py, rules 1 and 3).
  4. A part read back is checked against its name before it is unpickled.
  5. Outside a snapshot (an event, an answer, a part's own value), a :class:`StoredOnce` is
     pickled with its value, as any object.

Thread model: :func:`dump_snapshot` and :func:`load_snapshot` may run on any thread, several at
once (the collector and the loader are per context). A :class:`StoredOnce` computes its bytes
at most once; two threads asking at the same instant may both compute them (the same bytes).
"""

from __future__ import annotations

import contextvars
import hashlib
import pickle
import struct
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sparkcoord.core.encoding import loads
from sparkcoord.core.errors import CorruptRecord

T = TypeVar("T")

PARTS_MAGIC = b"SPPT"
_COUNT = struct.Struct(">I")
_DIGEST_BYTES = 32

#: while a snapshot is pickled: digest -> part, the parts it refers to (rule 2)
_collecting: contextvars.ContextVar[dict[str, StoredOnce[Any]] | None] = contextvars.ContextVar(
    "sparkcoord_stored_collecting", default=None)
#: while a snapshot is unpickled: digest -> part, resolving the names its pickle holds
_loading: contextvars.ContextVar[Callable[[str], StoredOnce[Any]] | None] = contextvars.ContextVar(
    "sparkcoord_stored_loading", default=None)


class StoredOnce(Generic[T]):
    """An immutable value in a coordinator's checkpointed state that is written once and
    referred to by name from every record that holds it (module rules 1-5).

    Created by coordinator code (a source's discovery thread, the mailbox); ``value`` is read
    from any thread. :attr:`digest` pickles the value the first time it is asked for: ask for
    it on the thread that made the value (a discovery thread) to keep that cost off the
    checkpoint boundary."""

    __slots__ = ("value", "_data", "_digest", "__weakref__")

    def __init__(self, value: T) -> None:
        self.value = value
        self._data: bytes | None = None
        self._digest: str | None = None

    @classmethod
    def read_back(cls, digest: str, data: bytes) -> StoredOnce[Any]:
        """A part as storage read it (rule 4: ``data`` is checked against ``digest``). Called
        by the runtime while a snapshot is loaded (the mailbox or the driver thread)."""
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise CorruptRecord(f"state part {digest}: its bytes hash to {actual}")
        token = _loading.set(None)  # a part's own value is a plain pickle (rule 5)
        try:
            part = cls(loads(data))
        finally:
            _loading.reset(token)
        part._data, part._digest = data, digest
        return part

    @property
    def data(self) -> bytes:
        """The part's bytes: the pickle of its value (computed once)."""
        if self._data is None:
            token = _collecting.set(None)  # nested parts are pickled with their value (rule 5)
            try:
                self._data = pickle.dumps(self.value, protocol=pickle.HIGHEST_PROTOCOL)
            finally:
                _collecting.reset(token)
        return self._data

    @property
    def digest(self) -> str:
        """The part's name: the SHA-256 of :attr:`data`, in hex (computed once)."""
        if self._digest is None:
            self._digest = hashlib.sha256(self.data).hexdigest()
        return self._digest

    def __reduce__(self) -> tuple[Any, ...]:
        collecting = _collecting.get()
        if collecting is None:
            return (StoredOnce, (self.value,))  # rule 5
        collecting[self.digest] = self
        return (_stored_part, (self.digest,))

    def __repr__(self) -> str:
        return f"StoredOnce({self.value!r})"


def _stored_part(digest: str) -> StoredOnce[Any]:
    load = _loading.get()
    if load is None:
        raise CorruptRecord(f"state part {digest} is referred to outside a snapshot being "
                            f"loaded (a snapshot with parts must be read with load_snapshot)")
    return load(digest)


def dump_snapshot(value: Any) -> tuple[bytes, dict[str, StoredOnce[Any]]]:
    """The snapshot bytes of ``value`` and the parts they refer to (rule 2). Called by the
    coordinator's holder at the checkpoint boundary, on the thread that completed the
    checkpoint future."""
    parts: dict[str, StoredOnce[Any]] = {}
    token = _collecting.set(parts)
    try:
        body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        _collecting.reset(token)
    if not parts:
        return body, parts
    names = b"".join(bytes.fromhex(digest) for digest in parts)
    return b"".join((PARTS_MAGIC, _COUNT.pack(len(parts)), names, body)), parts


def snapshot_parts(snapshot: bytes | None, what: str = "snapshot") -> list[str]:
    """The names of the parts ``snapshot`` refers to, read without unpickling (rule 2). Any
    thread; storage's retention and ``inspect`` call it."""
    if snapshot is None or not snapshot.startswith(PARTS_MAGIC):
        return []
    head = len(PARTS_MAGIC)
    if len(snapshot) < head + _COUNT.size:
        raise CorruptRecord(f"{what}: a snapshot with parts is cut short")
    (count,) = _COUNT.unpack_from(snapshot, head)
    start = head + _COUNT.size
    end = start + count * _DIGEST_BYTES
    if len(snapshot) < end:
        raise CorruptRecord(f"{what}: a snapshot names {count} parts but is cut short")
    return [snapshot[i:i + _DIGEST_BYTES].hex() for i in range(start, end, _DIGEST_BYTES)]


def load_snapshot(snapshot: bytes, read_part: Callable[[str], StoredOnce[Any]] | None,
                  what: str = "snapshot") -> Any:
    """The value ``snapshot`` was dumped from (rule 2), its parts got from ``read_part`` (by
    name; it checks them, rule 4). Called by the holder as it creates a coordinator (its
    mailbox thread) and by ``inspect --decode``."""
    names = snapshot_parts(snapshot, what)
    if not names:
        return loads(snapshot)
    if read_part is None:
        raise CorruptRecord(f"{what} refers to {len(names)} state part(s) and nothing was "
                            f"given to read them")
    body = memoryview(snapshot)[len(PARTS_MAGIC) + _COUNT.size + len(names) * _DIGEST_BYTES:]
    known = set(names)
    seen: dict[str, StoredOnce[Any]] = {}

    def load(digest: str) -> StoredOnce[Any]:
        if digest not in known:
            raise CorruptRecord(f"{what} refers to state part {digest}, which its header does "
                                f"not name")
        part = seen.get(digest)
        if part is None:
            part = seen[digest] = read_part(digest)
        return part

    token = _loading.set(load)
    try:
        return loads(body)
    finally:
        _loading.reset(token)
