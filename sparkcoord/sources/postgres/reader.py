"""The PostgreSQL source's reader (the executor side): reads snapshot chunks with watermarks and the
replication stream, and emits Arrow record batches.

Rules:
  1. The reader is a :class:`~sparkcoord.sources.reader.SplitReader` (the split framework's
     rules hold). A chunk is read by the batch that got it, whole (watermarks.py rules 1 and
     2: :func:`read_chunk_watermarked`), into the reader's state as the chunk's position (a
     :class:`StagedChunk`: its rows as Arrow IPC bytes and its high watermark; splits.py rule
     5), and that batch asks for the next; the next batch resumes the chunk: emits its rows
     and finishes it, and its first :class:`NextChunk` reports it with its high watermark
     (the finished report, sources/reader.py rule 6; splits.py rule 3). Then it takes chunks
     until the answer is :class:`NoSplitNow` or it took ``max_chunks_per_batch`` (the
     enumerator holds the same limit for the whole batch).
  2. The stream: the reader that got the :class:`StreamSplit` keeps it unfinished, with a
     :class:`StreamPosition` as its position (the split's map lives in the position until
     the stream is past it, watermarks.py rule 5). Each batch resumes it and first asks
     :class:`NextStreamRead` with the position its previous batch read to
     (the enumerator confirms the slot there once this batch commits) and gets the
     :class:`StreamBound` ``U``; it waits until the WAL is flushed to ``U`` and reads the
     transactions ending after its position and at or before ``U``, in commit order, whole
     transactions while they keep it within ``max_changes_per_batch`` changes (at least
     one): :func:`read_stream`. So what it reads depends only on the position, ``U`` and the
     WAL (splits.py rule 5). It asks for another batch when it stopped short of ``U``. A peek
     counts the messages from the slot's confirmed position, which trails the reader by a
     batch or two, so it is asked for three times the limit, and for four times as many
     again while it was cut short before the reader's limit or ``U``. A peek that finds the
     slot held by another session (readers peek it at once; the enumerator advances it)
     tries again after a short random pause, for up to ``flush_wait_s``. A state of
     sparkcoord 0.1.0 (:class:`PostgresReaderState`) goes on as the same reader would have.
  3. Rows are converted from their text form by values.py (a chunk is read as text too,
     COPY's CSV converted a column at a time by values.py rule 5, so both halves convert
     alike; only the rows a chunk's window touches go through Python values) and become
     record batches of :func:`arrow_schema`: the
     operation and position columns, and ``key``, ``before`` and ``after`` structs of the
     captured tables' columns (the union by name; one name with two different types in two
     tables is an error naming both). Every conversion error names the table and the column.
  4. A change of a captured table whose shape differs from the table's (a column added,
     dropped, renamed or retyped while streaming; pgoutput describes the relation again,
     with a Relation message, before the first change that uses its new shape) is never
     emitted as a row of the wrong shape. The stream read stops before that change's
     transaction: the batch emits every transaction before it and keeps the position at the
     end of the last of them, with the reason (:attr:`StreamPosition.stopped`), and asks for
     the next batch; that batch reports the position and the reason in its
     :class:`NextStreamRead`, and the enumerator fails the job with a :class:`SchemaChanged`
     naming the table, the change and the way on (enumerator.py rule 7: the report comes in
     the batch after the read, which runs only once the read's batch committed). Where the
     read stops is a function of the WAL, so a batch that runs again stops at the same
     transaction, and the slot is never confirmed past what the sink holds. A chunk read
     (the snapshot) that meets such a change fails its task with the error.
  5. Credentials (docs/decisions/064-cdc-first-layer.md): the reader's :class:`ReaderConfig`
     holds the connection options, which pickle without their password; an executor connects
     with libpq's own environment (``PGPASSWORD``, ``PGPASSFILE`` or ``~/.pgpass``, a service
     file). A deployment that needs a password gives it to the executors that way; the tests set
     ``PGPASSWORD`` in the process that runs the reader.

Where the parts live (docs/decisions/104-postgres-modules.md): the output's Arrow shape in
``core/output.py`` and the rows' decoding in ``core/decoding.py`` (rules 3 and 4, pure), the chunk
read in ``io/chunk_read.py`` (rule 1), the stream read in ``io/stream_read.py`` (rule 2), what
both wait for in ``io/waits.py``, the server's key order in ``io/key_order.py``, the
:class:`ReaderConfig` in ``io/reader_config.py`` (rule 5); this module is the reader itself
and its 0.1.0 state, and every name it had is still importable from it.

Thread model: one reader per subtask per batch, used from the Spark task's thread only; its
connection is opened in that thread and closed in ``close``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkcoord.core.encoding import encoded
from sparkcoord.operator import SubtaskContext
from sparkcoord.sources.postgres.core.decoding import RowDecoder as RowDecoder
from sparkcoord.sources.postgres.core.decoding import _old_image as _old_image
from sparkcoord.sources.postgres.core.decoding import decode_transaction as decode_transaction
from sparkcoord.sources.postgres.core.output import _array as _array
from sparkcoord.sources.postgres.core.output import _key_dict as _key_dict
from sparkcoord.sources.postgres.core.output import arrow_schema as arrow_schema
from sparkcoord.sources.postgres.core.output import record_batch as record_batch
from sparkcoord.sources.postgres.core.output import snapshot_batch
from sparkcoord.sources.postgres.core.splits import (
    NextChunk,
    NextStreamRead,
    SnapshotChunk,
    StagedChunk,
    StreamBound,
    StreamSplit,
)
from sparkcoord.sources.postgres.core.watermarks import StreamPosition
from sparkcoord.sources.postgres.errors import SchemaChanged
from sparkcoord.sources.postgres.io.chunk_read import ALL_KEYS as ALL_KEYS
from sparkcoord.sources.postgres.io.chunk_read import ChunkRead as ChunkRead
from sparkcoord.sources.postgres.io.chunk_read import _copy_texts as _copy_texts
from sparkcoord.sources.postgres.io.chunk_read import _touched_keys as _touched_keys
from sparkcoord.sources.postgres.io.chunk_read import (
    read_chunk_watermarked as read_chunk_watermarked,
)
from sparkcoord.sources.postgres.io.key_order import _TEXT_CASTS as _TEXT_CASTS
from sparkcoord.sources.postgres.io.key_order import INTEGER_KEYS as INTEGER_KEYS
from sparkcoord.sources.postgres.io.key_order import KeyOrder as KeyOrder
from sparkcoord.sources.postgres.io.reader_config import ReaderConfig as ReaderConfig
from sparkcoord.sources.postgres.io.stream_read import StreamRead as StreamRead
from sparkcoord.sources.postgres.io.stream_read import read_stream as read_stream
from sparkcoord.sources.postgres.io.waits import slot_in_use as slot_in_use
from sparkcoord.sources.postgres.io.waits import wait_for_flush as wait_for_flush
from sparkcoord.sources.postgres.io.waits import while_slot_busy as while_slot_busy
from sparkcoord.sources.reader import ReaderState, SplitReader
from sparkcoord.sources.splits import Split

# every name this module defined before docs/decisions/104-postgres-modules.md is importable
# from it, as the object of its new home (the imports ``as`` themselves above, and this one):
# the output's shape and the rows' decoding in core/, the key order, the waits, the chunk read,
# the stream read and the configuration in io/
_read_batch = snapshot_batch


# -- the operator (rules 1 and 2) --------------------------------------------------------------


@encoded("postgres.PostgresReaderState")
@dataclass
class PostgresReaderState:
    """A reader's state as sparkcoord 0.1.0 checkpointed it (before the reader was a
    :class:`SplitReader`); a reader restored from one goes on from it (:func:`_upgraded`)."""

    #: chunks read by the previous batch, to be reported: (split id, high watermark)
    unreported: list[tuple[str, int]] = field(default_factory=list)
    #: their rows, to be emitted with the report (Arrow IPC streams; splits.py rule 5)
    staged: list[bytes] = field(default_factory=list)
    #: the stream's position, once this reader has it
    position: StreamPosition | None = None


def _upgraded(state: PostgresReaderState) -> tuple[ReaderState, list[bytes]]:
    """A 0.1.0 reader state as the split reader's, and the rows its previous batch staged
    (emitted first, as the 0.1.0 reader did, before the report that follows them)."""
    if state.position is not None:
        return ReaderState(unfinished=[(StreamSplit(), state.position)]), []
    return (ReaderState(unreported=[split_id for split_id, _ in state.unreported],
                        reports=dict(state.unreported)), list(state.staged))


def stream_position(state: Any) -> StreamPosition | None:
    """Where the stream reader's state says its stream is (``None``: this reader has no
    stream). Any thread; for tests and tools that look into a reader's checkpointed state."""
    if isinstance(state, PostgresReaderState):
        return state.position
    if isinstance(state, ReaderState):
        for _, position in state.unfinished:
            if isinstance(position, StreamPosition):
                return position
    return None


class PostgresReader(SplitReader):
    """The reader of one subtask (module rules), a :class:`SplitReader`: a chunk is read whole
    by one batch and kept in the state (:class:`StagedChunk`), then emitted and reported with
    its high watermark by the next (rule 1); the stream split is never finished, each batch
    reads on from its position (rule 2). Thread model: the Spark task's thread."""

    request_class = NextChunk

    def __init__(self, config: ReaderConfig, connect: Callable[[], Any] | None = None) -> None:
        self.config = config
        self._connect = connect
        self.schema = arrow_schema(config.shapes)
        self._conn: Any = None
        self._staged: list[bytes] = []
        self.max_splits_per_batch = config.max_chunks_per_batch

    @property
    def arrow_schema(self) -> pa.Schema:
        """The schema of every record batch (rule 3). Any thread."""
        return self.schema

    def open(self, context: SubtaskContext, state: Any) -> None:
        """Spark task's thread, before the batch's rows: the state of the previous epoch."""
        self._staged = []
        if isinstance(state, PostgresReaderState):
            state, self._staged = _upgraded(state)
        super().open(context, state)

    def _connection(self) -> Any:
        if self._conn is None:
            from sparkcoord.sources.postgres.io.connection import RECONNECT_S

            self._conn = (self._connect() if self._connect is not None
                          else self.config.options.connect(application_name="sparkcoord-cdc",
                                                           retry_s=RECONNECT_S))
        return self._conn

    def process(self) -> Iterator[Any]:
        """The batch's rows (Spark task's thread): rules 1 and 2."""
        for staged in self._staged:  # a 0.1.0 state's staged rows, before its report
            for batch in pa.ipc.open_stream(staged):
                self.rows += batch.num_rows
                yield batch
        self._staged = []
        yield from super().process()

    def read_split(self, split: Split, position: Any) -> Iterator[tuple[Any, Any]]:
        """Rule 1 for a chunk, rule 2 for the stream (Spark task's thread)."""
        if isinstance(split, StreamSplit):
            yield from self._stream(split, position)
            return
        if not isinstance(split, SnapshotChunk):
            raise TypeError(f"reader {self.context.operator_id}: the enumerator answered "
                            f"{split!r}")
        if position is None:
            # read whole now, emitted by the next batch with its report (splits.py rule 5)
            read = read_chunk_watermarked(self._connection(), self.config, split)
            rows = b""
            if read.batch.num_rows:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, self.schema) as writer:
                    writer.write_batch(read.batch)
                rows = sink.getvalue().to_pybytes()
            self.context.request_batch()  # rule 1: that batch emits and reports it
            yield None, StagedChunk(read.high, rows)
            return
        if position.rows:
            # the rows go out whole, and after them only the report is left: a batch the row
            # limit stops here resumes with nothing more to emit
            rows = pa.ipc.open_stream(position.rows).read_all().combine_chunks()
            for batch in rows.to_batches():
                yield batch, StagedChunk(position.high)

    def finished_report(self, split: Split, position: Any) -> Any:
        """A chunk's report is its high watermark (rule 1; splits.py rule 3)."""
        return position.high if isinstance(position, StagedChunk) else None

    def _stream(self, split: StreamSplit, position: StreamPosition | None
                ) -> Iterator[tuple[Any, Any]]:
        read_to = None if position is None else position.after
        if position is None:
            position = StreamPosition(split.start, split.filter)
        bound = self.context.request(NextStreamRead(read_to, position.stopped))
        if not isinstance(bound, StreamBound):
            raise TypeError(f"reader {self.context.operator_id}: the enumerator answered "
                            f"{bound!r} to NextStreamRead")
        if position.stopped is not None:
            # rule 4: the enumerator fails the job at this report; never read past the stop
            raise SchemaChanged(position.stopped)
        read = read_stream(self._connection(), self.config, position, bound.upto)
        if read.rows:
            yield record_batch(read.rows, self.schema), read.position
        if read.more:
            self.context.request_batch()
        yield None, read.position  # the stream never ends: kept, with its position

    def close(self) -> None:
        """Spark task's thread, at the task's end."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
