"""The snapshot-to-stream logic of change data capture, sans-IO: a chunk read with low and high
watermarks (DBLog, as Flink CDC's incremental snapshot), the stream filter that lets the
replication stream take over from the chunks without losing or repeating a change, and the
per-chunk high-watermark map, kept compact and released once the stream is past it.

Vocabulary: a *transaction* is what the slot returns (pgoutput's, decoded into
:class:`TxChanges`); its position ``x`` is its ``end_lsn``, the end of its commit record (what
confirming the slot at ``x`` confirms: replication.py rule 2). A chunk's *high watermark*
``hw(c)`` is an LSN such that the chunk's rows, as read, are exactly the chunk as of every
transaction with ``x <= hw(c)`` and of none after.

Rules:
  1. A chunk read (the I/O half: io/chunk_read.py) opens a REPEATABLE READ
     transaction, takes its MVCC snapshot ``S`` (``pg_current_snapshot()``, the first
     statement), reads the chunk's rows with a plain SELECT in ``S``, then takes the WAL
     *insert* position ``H`` (not the flush position: under ``synchronous_commit=off`` a
     commit is visible before it is flushed), waits until the WAL is flushed to ``H`` and
     peeks the slot up to ``H``. Every transaction visible in ``S`` wrote its commit record
     before ``S`` was taken, so it ends at or before ``H``; ``hw(c) = H``. (The low
     watermark ``L`` of DBLog is not needed: rule 2 decides by visibility.)
  2. The *window* is the peeked transactions not visible in ``S`` (by xid against ``S``'s
     ``xmin``, ``xmax`` and in-progress list: :class:`Visibility`) that end at or before
     ``H``. Deciding by visibility rather than by a low-watermark LSN closes DBLog's race: a
     transaction whose commit record was written before a low watermark ``L`` but that was
     not yet visible when ``S`` was taken would be in neither the rows nor an ``(L, H]``
     window. Changes are applied to the rows, in commit order, by the row key:
     :func:`merge_window`: an insert puts its row if its chunk value is in the chunk's range;
     an update removes the old key's row and puts the new row if in range (a key change moves
     a row out of, into, or within the chunk); a delete removes the key; a TRUNCATE empties
     the chunk. An unchanged TOASTed column of an update keeps the value of the row it
     replaces (the rows', or the old image under REPLICA IDENTITY FULL). The result is the
     chunk as of ``H``.
  3. The row key is the table's primary key; the chunk key column must be one of its columns
     (or, for a table without a primary key, the chunk key column is the row key and the
     table needs REPLICA IDENTITY FULL for updates and deletes). So every key lives in
     exactly one chunk, the one its chunk value falls in, and a key changes chunk only by a
     key change, whose old key pgoutput sends.
  4. The stream filter: after the snapshot, a change at position ``x`` to a key in chunk
     ``c`` is emitted iff ``x > hw(c)``. A key-changing update is two changes, as Debezium
     emits it: a delete of the old key (filtered by the old key's chunk) then an insert of
     the new key (filtered by the new key's chunk), so each key's history is its chunk's
     rows at ``hw(c)`` plus exactly the changes after. A TRUNCATE is emitted as ``'t'`` when
     ``x`` is past every chunk's ``hw`` of its table, dropped when before all of them, and is
     an error in between (the chunks disagree on whether it happened; restart the snapshot).
  5. Once the stream's position is at or past the greatest ``hw`` of all chunks, every later
     transaction is emitted whole and the map is released (:meth:`StreamPosition.after`):
     the reader's and the enumerator's state are then a few numbers, whatever the number of
     chunks (Flink CDC keeps every chunk for the job's life: flink-cdc#865, FLINK-40697).
  6. The map is compact: chunks of one table are contiguous key ranges, so a table is its
     sorted boundaries and one ``hw`` per chunk (:class:`ChunkMap`); while the snapshot runs
     the enumerator builds it in :class:`ChunkProgress`, whose full segments of
     ``SEGMENT_CHUNKS`` chunks become stored-once parts (core/stored.py) written once.
  7. Output rows (:class:`OutRow`) carry an operation letter (Debezium's: ``'r'`` snapshot
     read, ``'c'`` insert, ``'u'`` update, ``'d'`` delete, and ``'t'`` truncate), the table,
     the key, the after-image, the before-image (the whole old row under REPLICA IDENTITY
     FULL, the old key columns when only they were sent, else none), the position ``lsn``
     (the transaction's end LSN, or the chunk's ``hw`` for a snapshot row), the commit LSN,
     the change's index in its transaction, the commit time, the xid, and the columns of an
     update's after-image that were unchanged TOASTed values not sent (their value there is
     None: keep the value you have). Applying the rows by key in ``(lsn, seq)`` order gives
     the tables' state.
  8. Keys are ordered by the server (chunks.py rule 4). :meth:`ChunkMap.index_of` bisects
     with Python's order, right for integer keys; for text keys the I/O half asks the server
     where each key falls (one query per chunk read, and per transaction while the stream
     holds the map) and passes the answer as ``locate``.

The values these rules speak of (the decoded transactions, :class:`Visibility`, the output
rows) are defined in ``rows.py`` and importable from here.

Thread model: none (pure functions and immutable values), except :class:`ChunkProgress`,
which belongs to the enumerator's mailbox thread.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.core.encoding import encoded
from sparkcoord.core.stored import StoredOnce
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.rows import (
    CREATE,
    DELETE,
    READ,
    TRUNCATE,
    UNCHANGED,
    UPDATE,
    Key,
    OutRow,
    RowChange,
    RowValues,
    TxChanges,
    Unchanged,
    Visibility,
    precedes,
)
from sparkcoord.sources.postgres.errors import PostgresSourceError

#: the module's names, with those that moved to ``rows.py`` (importable from here as before)
__all__ = ["CREATE", "DELETE", "READ", "SEGMENT_CHUNKS", "TRUNCATE", "UNCHANGED", "UPDATE",
           "ChunkMap", "ChunkProgress", "Key", "Locate", "OutRow", "RowChange", "RowValues",
           "StreamFilter", "StreamPosition", "TxChanges", "Unchanged", "Visibility",
           "WatermarkError", "merge_window", "snapshot_rows", "stream_rows", "window_values"]

#: its name here before it moved to ``rows.py`` (the same function)
_precedes = precedes

#: where chunk values fall: table and values -> chunk indexes (rule 8)
Locate = Callable[[TableName, Sequence[Any]], Sequence[int]]

#: chunks per stored-once segment of a :class:`ChunkProgress` (rule 6)
SEGMENT_CHUNKS = 1024


class WatermarkError(PostgresSourceError):
    """A change the snapshot-to-stream hand-over cannot place exactly (names the table)."""


# -- rule 2: the window merge ---------------------------------------------------------------


def window_values(table: TableName, transactions: Iterable[TxChanges], visible: Visibility,
                  high: int) -> list[Any]:
    """The chunk values of ``table``'s window changes (rule 2), for an I/O half that must ask
    the server which of them are in the chunk (rule 8). Any thread."""
    out: list[Any] = []
    for tx in transactions:
        if tx.end_lsn > high or visible.sees(tx.xid):
            continue
        for change in tx.changes:
            if change.table == table and change.kind in (CREATE, UPDATE):
                out.append(change.chunk_value)
    return out


def merge_window(table: TableName, rows: dict[Key, RowValues], transactions: Iterable[TxChanges],
                 *, visible: Visibility, high: int,
                 in_chunk: Callable[[Any], bool]) -> dict[Key, RowValues]:
    """The chunk of ``table`` as of ``high``: ``rows`` (read in snapshot ``visible``, by key)
    with the window's changes applied (rule 2). ``rows`` is changed in place and returned.
    ``transactions`` in commit order; ``in_chunk(value)``: whether a chunk key value is in the
    chunk's range (NULL too for the first chunk). Any thread."""
    for tx in transactions:
        if tx.end_lsn > high or visible.sees(tx.xid):
            continue
        for change in tx.changes:
            if change.table != table:
                continue
            kind = change.kind
            if kind == TRUNCATE:
                rows.clear()
            elif kind == DELETE:
                rows.pop(_need_key(change), None)
            elif kind == CREATE:
                if in_chunk(change.chunk_value):
                    rows[_need_key(change)] = dict(_need_after(change))
            elif kind == UPDATE:
                key = _need_key(change)
                old = change.old_key if change.old_key is not None else key
                previous = rows.pop(old, None)
                if in_chunk(change.chunk_value):
                    rows[key] = _filled(change, previous)
            else:
                raise WatermarkError(f"table {table}: unknown change kind {kind!r}")
    return rows


def _need_key(change: RowChange) -> Key:
    if change.key is None:
        raise WatermarkError(f"table {change.table}: a {change.kind!r} change without a key")
    return change.key


def _need_after(change: RowChange) -> RowValues:
    if change.after is None:
        raise WatermarkError(f"table {change.table}: a {change.kind!r} change without its row")
    return change.after


def _filled(change: RowChange, previous: RowValues | None) -> RowValues:
    """An update's new row with unchanged TOASTed values taken from the row it replaces
    (rule 2): ``previous``, else the old image under REPLICA IDENTITY FULL."""
    after = dict(_need_after(change))
    missing = [name for name, value in after.items() if value is UNCHANGED]
    if not missing:
        return after
    source = previous if previous is not None else (change.before if change.full_before
                                                    else None)
    if source is None:
        raise WatermarkError(
            f"table {change.table}: an update moved key {change.key!r} into a chunk with "
            f"unchanged TOASTed column(s) {', '.join(missing)} whose value was not sent; set "
            f"REPLICA IDENTITY FULL on the table and start the snapshot again")
    for name in missing:
        after[name] = source.get(name)
    return after


def snapshot_rows(table: TableName, rows: Mapping[Key, RowValues], high: int) -> list[OutRow]:
    """The ``'r'`` rows of a chunk read as of ``high`` (rule 7). Any thread."""
    return [OutRow(READ, table, key, row, None, high) for key, row in rows.items()]


# -- rules 4 to 6: the high-watermark map ---------------------------------------------------


@encoded("postgres.ChunkMap")
@dataclass(frozen=True)
class ChunkMap:
    """One table's chunks (rule 6): ``boundaries[i]`` is chunk ``i``'s end and chunk
    ``i + 1``'s start (sorted by the server); ``hws[i]`` is chunk ``i``'s high watermark."""

    key_column: str
    #: an ``array('q')`` for integer keys (8 bytes a chunk), a tuple for text keys
    boundaries: Sequence[Any]
    hws: array[int]

    def __post_init__(self) -> None:
        if len(self.hws) != len(self.boundaries) + 1:
            raise ValueError(f"a chunk map of {len(self.hws)} high watermarks needs "
                             f"{len(self.hws) - 1} boundaries, got {len(self.boundaries)}")

    def index_of(self, value: Any) -> int:
        """The chunk a chunk key value falls in, by Python's order (rule 8); NULL: the
        first."""
        return 0 if value is None else bisect.bisect_right(self.boundaries, value)

    @property
    def min_hw(self) -> int:
        return min(self.hws)

    @property
    def max_hw(self) -> int:
        return max(self.hws)


@encoded("postgres.StreamFilter")
@dataclass(frozen=True)
class StreamFilter:
    """Every captured table's :class:`ChunkMap` (rule 4), each possibly a stored-once part."""

    tables: tuple[tuple[TableName, ChunkMap | StoredOnce[ChunkMap]], ...]
    min_hw: int
    max_hw: int

    @classmethod
    def of(cls, maps: Mapping[TableName, ChunkMap | StoredOnce[ChunkMap]]) -> StreamFilter:
        values = [m.value if isinstance(m, StoredOnce) else m for m in maps.values()]
        if not values:
            raise ValueError("a stream filter needs at least one table")
        return cls(tuple(sorted(maps.items(), key=lambda kv: kv[0])),
                   min(m.min_hw for m in values), max(m.max_hw for m in values))

    def table(self, table: TableName) -> ChunkMap:
        for name, chunk_map in self.tables:
            if name == table:
                return chunk_map.value if isinstance(chunk_map, StoredOnce) else chunk_map
        raise WatermarkError(f"a change of table {table}, which the snapshot did not read")


def stream_rows(tx: TxChanges, flt: StreamFilter | None, locate: Locate | None = None
                ) -> list[OutRow]:
    """The rows the stream emits for ``tx`` (rules 4 and 7): all of them when ``flt`` is None
    (released, or a stream without a snapshot) or ``tx`` is past every chunk, else the
    changes after their chunk's high watermark. ``locate``: where chunk values fall (rule 8;
    default :meth:`ChunkMap.index_of`). Any thread."""
    x = tx.end_lsn
    active = flt is not None and x <= flt.max_hw
    if active and x <= flt.min_hw:  # type: ignore[union-attr]
        return []  # every chunk holds it already
    located: dict[tuple[TableName, Any], int] = {}
    if active and locate is not None:
        wanted: dict[TableName, list[Any]] = {}
        for change in tx.changes:
            if change.kind in (CREATE, UPDATE, DELETE):
                wanted.setdefault(change.table, []).extend(
                    (change.chunk_value, change.old_chunk_value))
        for table, values in wanted.items():
            for value, index in zip(values, locate(table, values), strict=True):
                located[(table, value)] = index

    def after_hw(table: TableName, value: Any) -> bool:
        if not active:
            return True
        assert flt is not None
        chunk_map = flt.table(table)
        index = located.get((table, value)) if locate is not None else None
        if index is None:
            index = chunk_map.index_of(value)
        return x > chunk_map.hws[index]

    out: list[OutRow] = []
    for seq, change in enumerate(tx.changes):
        def row(op: str, key: Key | None, after: RowValues | None,
                before: RowValues | None, unchanged: tuple[str, ...] = (),
                change: RowChange = change, seq: int = seq) -> OutRow:
            return OutRow(op, change.table, key, after, before, x, tx.commit_lsn, seq,
                          tx.commit_time, tx.xid, unchanged)

        kind = change.kind
        if kind == TRUNCATE:
            if active:
                assert flt is not None
                chunk_map = flt.table(change.table)
                if x <= chunk_map.min_hw:
                    continue
                if x <= chunk_map.max_hw:
                    raise WatermarkError(
                        f"table {change.table} was truncated (transaction {tx.xid}) while its "
                        "snapshot chunks were read: some chunks hold the truncation and some "
                        "do not; start the capture again with a snapshot")
            out.append(row(TRUNCATE, None, None, None))
        elif kind == CREATE:
            if after_hw(change.table, change.chunk_value):
                out.append(row(CREATE, change.key, change.after, None))
        elif kind == DELETE:
            if after_hw(change.table, change.chunk_value):
                out.append(row(DELETE, change.key, None, change.before))
        elif kind == UPDATE:
            after, unchanged = _after_image(change)
            if change.old_key is not None and change.old_key != change.key:
                # rule 4: a key change is a delete of the old key and an insert of the new
                if after_hw(change.table, change.old_chunk_value):
                    out.append(row(DELETE, change.old_key, None, change.before))
                if after_hw(change.table, change.chunk_value):
                    out.append(row(CREATE, change.key, after, None, unchanged))
            elif after_hw(change.table, change.chunk_value):
                out.append(row(UPDATE, change.key, after,
                               change.before if change.full_before else None, unchanged))
        else:
            raise WatermarkError(f"table {change.table}: unknown change kind {kind!r}")
    return out


def _after_image(change: RowChange) -> tuple[RowValues, tuple[str, ...]]:
    """An update's after-image for output (rule 7): unchanged TOASTed values from the old row
    under REPLICA IDENTITY FULL, else None and named."""
    after = dict(_need_after(change))
    missing = tuple(n for n, v in after.items() if v is UNCHANGED)
    if not missing:
        return after, ()
    if change.full_before and change.before is not None:
        for name in missing:
            after[name] = change.before.get(name)
        return after, ()
    for name in missing:
        after[name] = None
    return after, missing


@encoded("postgres.StreamPosition")
@dataclass(frozen=True)
class StreamPosition:
    """Where the stream reader is: every transaction ending at or before ``after`` was read
    (the next peek asks for those after it), and the filter while it is still needed (rule 5).
    """

    after: int
    filter: StreamFilter | None = None
    #: why the stream stops at ``after``: the next transaction cannot be emitted (a captured
    #: table changed shape, reader.py rule 4); the message names the table and the way on
    stopped: str | None = None

    def moved_to(self, read_to: int) -> StreamPosition:
        """The position after a peek that read to ``read_to``: the filter is dropped once
        ``read_to`` is at or past every chunk's high watermark (rule 5)."""
        after = max(self.after, read_to)
        flt = self.filter
        if flt is not None and after >= flt.max_hw:
            flt = None
        return StreamPosition(after, flt, self.stopped)


# -- rule 6: the map while the snapshot runs (the enumerator's) -----------------------------


def _stored(values: list[Any], code: str) -> StoredOnce[Any]:
    part: StoredOnce[Any] = StoredOnce(array(code, values) if code else tuple(values))
    part.digest  # noqa: B018 - pickled and hashed now, once
    return part


def _values(segment: Any) -> Sequence[Any]:
    values: Sequence[Any] = segment.value if isinstance(segment, StoredOnce) else segment
    return values


@encoded("postgres.ChunkProgress")
@dataclass
class ChunkProgress:
    """One table's chunks while the snapshot runs (rule 6): the boundaries planned so far
    (appended in key order) and each chunk's high watermark once its reader reported it (0:
    not yet). Held as segments of :data:`SEGMENT_CHUNKS`: a segment that is full (and, for
    the watermarks, all reported) becomes a stored-once part, so a checkpoint writes only the
    segments still changing. Mailbox thread."""

    key_column: str
    integer_keys: bool
    boundaries: list[Any] = field(default_factory=list)  # segments (tuples, arrays, parts)
    hws: list[Any] = field(default_factory=list)  # segments (arrays or parts)
    planned: int = 0
    finished: int = 0
    last_planned: bool = False

    def _code(self) -> str:
        return "q" if self.integer_keys else ""

    def chunk_planned(self, index: int, end: Any) -> None:
        """Chunk ``index`` (the next) was planned with end ``end`` (None: the last)."""
        if index != self.planned or self.last_planned:
            raise ValueError(f"chunk {index} planned after {self.planned} chunks"
                             f"{' (the last one was planned)' if self.last_planned else ''}")
        segment, offset = divmod(index, SEGMENT_CHUNKS)
        if offset == 0:
            self.hws.append(array("Q"))
        self.hws[segment].append(0)
        self.planned += 1
        if end is None:
            self.last_planned = True
            return
        if offset == 0:
            self.boundaries.append([])
        current = self.boundaries[-1]
        current.append(end)
        if len(current) == SEGMENT_CHUNKS:
            self.boundaries[-1] = _stored(current, self._code())

    def chunk_finished(self, index: int, hw: int) -> None:
        """Chunk ``index``'s reader reported high watermark ``hw`` (> 0)."""
        if not 0 <= index < self.planned:
            raise ValueError(f"chunk {index} finished, but {self.planned} were planned")
        if hw <= 0:
            raise ValueError(f"a high watermark is a positive LSN, got {hw}")
        segment, offset = divmod(index, SEGMENT_CHUNKS)
        values = self.hws[segment]
        if isinstance(values, StoredOnce):
            raise ValueError(f"chunk {index} finished twice")
        if values[offset]:
            raise ValueError(f"chunk {index} finished twice")
        values[offset] = hw
        self.finished += 1
        if len(values) == SEGMENT_CHUNKS and all(values):
            self.hws[segment] = _stored(list(values), "Q")

    def chunk_unfinished(self, index: int) -> None:
        """Chunk ``index``'s finish was withdrawn (a task retry that reports it again)."""
        segment, offset = divmod(index, SEGMENT_CHUNKS)
        values = self.hws[segment]
        if isinstance(values, StoredOnce):
            values = self.hws[segment] = array("Q", values.value)
        if values[offset]:
            values[offset] = 0
            self.finished -= 1

    @property
    def done(self) -> bool:
        return self.last_planned and self.finished == self.planned

    def chunk_map(self) -> ChunkMap:
        """The finished map (rule 6); every chunk planned and finished."""
        if not self.done:
            raise ValueError(f"{self.finished} of {self.planned} chunks finished")
        flat = (v for s in self.boundaries for v in _values(s))
        boundaries: Sequence[Any] = array("q", flat) if self.integer_keys else tuple(flat)
        hws = array("Q", (v for s in self.hws for v in _values(s)))
        return ChunkMap(self.key_column, boundaries, hws)
