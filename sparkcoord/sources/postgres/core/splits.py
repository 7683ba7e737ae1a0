"""What flows between the PostgreSQL source's enumerator and its readers: the snapshot chunks, the
one stream split, the readers' requests and progress reports, and the captured tables' shapes.

Rules:
  1. A :class:`SnapshotChunk` is a table's key range (chunks.py's :class:`~.chunks.Chunk` as a
     split): small and picklable, a few dozen bytes; its id is ``schema.table#index``.
  2. The :class:`StreamSplit` goes out once, after the snapshot (or at once for the
     ``latest`` startup mode): it carries where the stream starts (every transaction ending
     at or before ``start`` is in the snapshot) and the high-watermark map the stream filters
     with until it is past it (watermarks.py rules 4 and 5; None without a snapshot).
  3. A reader asks with :class:`NextChunk` (the split framework's ``NextSplit``), carrying the
     chunks it finished *in an earlier batch* with their high watermarks as their finished
     reports (sources/reader.py rule 6), read from its checkpointed state. A chunk read is not
     repeatable (a task retry reads the chunk again, at a later high watermark), and
     every item a subtask sends is compared with the logged one when a retry sends it again
     (docs/protocol.md [resent-item-equals-logged]): so nothing a read returns is sent in the
     batch that read it. The same holds for :class:`NextStreamRead`, the stream reader's report
     of the position its previous batch read to, sent at the start of the next batch.
  4. A :class:`TableShape` is what a reader needs of a captured table: its columns (name,
     type oid, type modifier, an array's declared dimensions), its row key (the primary key, or, for a table without one, the
     chunk key column, which must then be unique and NOT NULL) and its chunk key column, which
     must be one of the row key's columns (watermarks.py rule 3).
  5. What a batch emits is a function of what is durable before it runs (its subtask's state
     of the previous epoch and its logged answers), so a batch that runs again after a
     restart (Spark re-runs the last batch whose commit it did not log, also when the sink
     had already committed it) emits exactly what it emitted before: a chunk's rows are
     emitted by the batch *after* the one that read them, from the reader's checkpointed
     state (a :class:`StagedChunk`: the chunk's position in the reader's state), together
     with the chunk's high-watermark report; the stream is read after the
     position in that state and up to the :class:`StreamBound` the enumerator answered
     (logged), at most ``max_changes_per_batch`` changes in whole transactions, in order.

Thread model: none (immutable values).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sparkcoord.core.encoding import encoded
from sparkcoord.sources.postgres.core import chunks
from sparkcoord.sources.postgres.core.chunks import Key, choose_chunk_key
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.tables import TableInfo
from sparkcoord.sources.postgres.core.watermarks import StreamFilter
from sparkcoord.sources.postgres.errors import ChunkKeyError
from sparkcoord.sources.splits import NextSplit, Split

STREAM_SPLIT_ID = "stream"


@encoded("postgres.SnapshotChunk")
@dataclass(frozen=True, kw_only=True)
class SnapshotChunk(Split):
    """Rows of ``table`` whose ``key_column`` is in ``[start, end)`` (rule 1)."""

    table: TableName
    key_column: str
    index: int
    start: Key | None
    end: Key | None

    @classmethod
    def of(cls, chunk: chunks.Chunk) -> SnapshotChunk:
        return cls(split_id=chunk.split_id, table=chunk.table, key_column=chunk.key_column,
                   index=chunk.index, start=chunk.start, end=chunk.end)

    @property
    def chunk(self) -> chunks.Chunk:
        return chunks.Chunk(self.table, self.key_column, self.index, self.start, self.end)


@encoded("postgres.StreamSplit")
@dataclass(frozen=True, kw_only=True)
class StreamSplit(Split):
    """The replication stream (rule 2): ``start`` is the position to read after (0: the
    slot's confirmed position), ``filter`` the map it filters with (None: none)."""

    split_id: str = STREAM_SPLIT_ID
    start: int = 0
    filter: StreamFilter | None = None


def _reports_apart(fields: dict[str, Any]) -> dict[str, Any]:
    """NextChunk version 1 -> 2: ``(split id, high watermark)`` pairs become the finished ids
    and their reports (docs/decisions/103-postgres-on-the-split-framework.md)."""
    pairs = tuple(tuple(pair) for pair in fields.get("finished", ()))
    return {"finished": tuple(split_id for split_id, _ in pairs), "watermarks": None,
            "reports": pairs}


@encoded("postgres.NextChunk", version=2, upgrades={1: _reports_apart},
         first_fields=("finished",))
@dataclass(frozen=True)
class NextChunk(NextSplit):
    """A reader's request (rule 3): the chunks it finished in an earlier batch, each with its
    high watermark as its report, and "give me a chunk, or the stream". A ``NextSplit`` of
    its own name, so that a request logged by sparkcoord 0.1.0 (version 1: ``finished`` as
    ``(split id, high watermark)`` pairs) reads as the same request."""

    @classmethod
    def of(cls, finished: Iterable[tuple[str, int]] = ()) -> NextChunk:
        """The request reporting ``(split id, high watermark)`` of each finished chunk. Any
        thread."""
        pairs = tuple(finished)
        return cls(tuple(split_id for split_id, _ in pairs), None, pairs)


@encoded("postgres.StagedChunk")
@dataclass(frozen=True)
class StagedChunk:
    """A chunk read whole by a batch, to be emitted and reported by the next one (rule 5):
    the reader keeps it as the chunk's position in its state. ``high``: the chunk's high
    watermark; ``rows``: its rows as an Arrow IPC stream (empty when it had none)."""

    high: int
    rows: bytes = b""


@encoded("postgres.NextStreamRead")
@dataclass(frozen=True)
class NextStreamRead:
    """The stream reader's request at the start of each of its batches (rules 3 and 5):
    its previous batch read every transaction ending at or before ``read_to`` (None in the
    batch that got the stream), so the slot may be confirmed there once this batch commits;
    and "how far may this batch read?". ``stopped``: the previous batch stopped at
    ``read_to`` before a transaction it cannot emit (a captured table changed shape: reader.py
    rule 4), and why; the enumerator then fails the job (enumerator.py rule 7)."""

    read_to: int | None = None
    stopped: str | None = None


@encoded("postgres.StreamBound")
@dataclass(frozen=True)
class StreamBound:
    """The enumerator's answer to :class:`NextStreamRead` (rule 5): read the transactions
    ending after your position and at or before ``upto``, a WAL insert position (a record
    boundary: no commit record starts before it and ends after it) the enumerator learned
    before this batch; 0: nothing yet."""

    upto: int


@dataclass(frozen=True)
class ShapeColumn:
    name: str
    type_oid: int
    type_modifier: int
    #: an array column's declared dimensions, at least 1 (values.py rule 3)
    dimensions: int = 1


@dataclass(frozen=True)
class TableShape:
    """A captured table as the reader sees it (rule 4)."""

    table: TableName
    columns: tuple[ShapeColumn, ...]
    key: tuple[str, ...]
    chunk_key_column: str

    @classmethod
    def of(cls, info: TableInfo, chunk_key_column: str | None = None) -> TableShape:
        """The shape of a table the catalog described; a :class:`ChunkKeyError` naming the
        table when its chunk key column is not part of its primary key (rule 4). Any
        thread."""
        column = choose_chunk_key(info.table, info.primary_key, info.column_types,
                                  chunk_key_column)
        key = info.primary_key or (column,)
        if not info.primary_key:
            nullable = any(c.name == column and not c.not_null for c in info.columns)
            if column not in info.unique_columns or nullable:
                raise ChunkKeyError(
                    f"table {info.table} has no primary key, and its chunk key column "
                    f"{column!r} is not a unique NOT NULL column: it is then the row key, and "
                    "rows with equal values could not be told apart. Add a primary key, or "
                    "name a column with a unique index of its own and NOT NULL")
        if column not in key:
            raise ChunkKeyError(
                f"table {info.table}: the chunk key column {column!r} is not part of its primary "
                f"key ({', '.join(key)}); the snapshot can hand over to the stream exactly only "
                "when each key stays in one chunk: name a primary key column")
        return cls(info.table, tuple(ShapeColumn(c.name, c.type_oid, c.type_modifier,
                                                 max(c.dimensions, 1))
                                     for c in info.columns), key, column)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> ShapeColumn:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)
