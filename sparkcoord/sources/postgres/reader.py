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

Thread model: one reader per subtask per batch, used from the Spark task's thread only; its
connection is opened in that thread and closed in ``close``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sparkcoord.core.encoding import encoded
from sparkcoord.operator import SubtaskContext
from sparkcoord.sources.postgres.core import values
from sparkcoord.sources.postgres.core.chunks import Chunk, chunk_sql
from sparkcoord.sources.postgres.core.names import TableName, quote_ident
from sparkcoord.sources.postgres.core.pgoutput import (
    POSTGRES_EPOCH_UNIX_US,
    Delete,
    Insert,
    Relation,
    Row,
    Toast,
    Transaction,
    Truncate,
    Update,
    lsn_from_text,
)
from sparkcoord.sources.postgres.core.rows import (
    UNCHANGED,
    Key,
    OutRow,
    RowChange,
    RowValues,
    TxChanges,
    Visibility,
)
from sparkcoord.sources.postgres.core.splits import (
    NextChunk,
    NextStreamRead,
    SnapshotChunk,
    StagedChunk,
    StreamBound,
    StreamSplit,
    TableShape,
)
from sparkcoord.sources.postgres.core.watermarks import (
    StreamPosition,
    merge_window,
    snapshot_rows,
    stream_rows,
    window_values,
)
from sparkcoord.sources.postgres.errors import (
    PostgresSourceError,
    SchemaChanged,
    SlotProblem,
    ValueConversionError,
)
from sparkcoord.sources.postgres.io.catalog import composed
from sparkcoord.sources.reader import ReaderState, SplitReader
from sparkcoord.sources.splits import Split

if TYPE_CHECKING:
    from sparkcoord.sources.postgres.io.connection import ConnectionOptions

log = logging.getLogger("sparkcoord.sources.postgres")

#: the chunk key types Python orders as the server does (watermarks.py rule 8)
INTEGER_KEYS = frozenset({values.INT2, values.INT4, values.INT8})
_TEXT_CASTS = {values.TEXT: "text", values.VARCHAR: "varchar", values.BPCHAR: "bpchar"}


@dataclass(frozen=True)
class ReaderConfig:
    """What every reader is given (pickled to the executors: no password, rule 5)."""

    options: ConnectionOptions
    slot: str
    publication: str
    shapes: tuple[TableShape, ...]
    max_changes_per_batch: int = 10_000
    max_chunks_per_batch: int | None = None
    #: how long a chunk read waits for the WAL to be flushed to its high watermark
    flush_wait_s: float = 30.0

    def shape(self, table: TableName) -> TableShape:
        for shape in self.shapes:
            if shape.table == table:
                return shape
        raise PostgresSourceError(f"table {table} is not captured by this source")


# -- rule 3: the schema ------------------------------------------------------------------------


def arrow_schema(shapes: Sequence[TableShape]) -> pa.Schema:
    """The source's Arrow schema (rule 3). Any thread."""
    columns: dict[str, tuple[pa.DataType, TableName]] = {}
    keys: list[str] = []
    for shape in shapes:
        for column in shape.columns:
            kind = values.arrow_type(column.type_oid, column.type_modifier, column.dimensions)
            seen = columns.get(column.name)
            if seen is not None and seen[0] != kind:
                raise PostgresSourceError(
                    f"column {column.name!r} is {seen[0]} in table {seen[1]} and {kind} in table "
                    f"{shape.table}: one source's before/after columns hold one type per name; "
                    "capture these tables with two sources")
            columns.setdefault(column.name, (kind, shape.table))
        keys.extend(k for k in shape.key if k not in keys)
    row = pa.struct([pa.field(name, kind) for name, (kind, _) in columns.items()])
    key = pa.struct([pa.field(name, columns[name][0]) for name in keys])
    return pa.schema([
        pa.field("op", pa.string(), nullable=False),
        pa.field("table", pa.string(), nullable=False),
        pa.field("lsn", pa.int64(), nullable=False),
        pa.field("commit_lsn", pa.int64()),
        pa.field("seq", pa.int32()),
        pa.field("commit_time", pa.timestamp("us", tz="UTC")),
        pa.field("xid", pa.int64()),
        pa.field("key", key),
        pa.field("before", row),
        pa.field("after", row),
        pa.field("unchanged", pa.list_(pa.string())),
    ])


def record_batch(rows: Sequence[OutRow], schema: pa.Schema) -> pa.RecordBatch:
    """``rows`` as a record batch of ``schema`` (rule 3); a value Arrow refuses is an error
    naming its table and column. Any thread."""
    def column(name: str, pick: Callable[[OutRow], Any]) -> pa.Array:
        kind = schema.field(name).type
        if pa.types.is_struct(kind):
            parts = [pick(r) for r in rows]
            children = [_array([p.get(f.name) if p is not None else None for p in parts],
                               f.type, f"{name}.{f.name}", rows) for f in kind]
            mask = pa.array([p is None for p in parts], pa.bool_())
            return pa.StructArray.from_arrays(children, fields=list(kind), mask=mask)
        return _array([pick(r) for r in rows], kind, name, rows)

    arrays = [
        column("op", lambda r: r.op),
        column("table", lambda r: str(r.table)),
        column("lsn", lambda r: r.lsn),
        column("commit_lsn", lambda r: r.commit_lsn),
        column("seq", lambda r: r.seq),
        column("commit_time", lambda r: None if r.commit_time is None
               else r.commit_time + POSTGRES_EPOCH_UNIX_US),
        column("xid", lambda r: r.xid),
        column("key", lambda r: None if r.key is None else _key_dict(r, schema)),
        column("before", lambda r: r.before),
        column("after", lambda r: r.after),
        column("unchanged", lambda r: list(r.unchanged) if r.unchanged else None),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _key_dict(row: OutRow, schema: pa.Schema) -> dict[str, Any]:
    image = row.after if row.after is not None else row.before
    if image is not None:
        return {f.name: image.get(f.name) for f in schema.field("key").type}
    return {}


def _array(items: list[Any], kind: pa.DataType, name: str, rows: Sequence[OutRow]) -> pa.Array:
    try:
        return pa.array(items, kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        for item, row in zip(items, rows, strict=True):
            try:
                pa.array([item], kind)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                raise ValueConversionError(f"table {row.table}, column {name!r}: value "
                                           f"{str(item)[:64]!r} does not fit {kind}: {e}") from None
        raise


# -- rule 3: values from text ------------------------------------------------------------------


class RowDecoder:
    """Text forms to values for one table (rules 3 and 4). Any thread."""

    def __init__(self, shape: TableShape) -> None:
        self.shape = shape
        self.names = shape.column_names
        self.converters = [values.converter(c.type_oid, c.type_modifier, c.dimensions)
                           for c in shape.columns]

    def row(self, texts: Sequence[Any]) -> RowValues:
        out: RowValues = {}
        for name, convert, text in zip(self.names, self.converters, texts, strict=True):
            if text is None:
                out[name] = None
            elif isinstance(text, Toast):
                out[name] = UNCHANGED
            else:
                try:
                    out[name] = convert(text)
                except ValueConversionError as e:
                    raise ValueConversionError(
                        f"table {self.shape.table}, column {name!r}: {e}") from None
        return out

    def key(self, row: RowValues) -> Key:
        return tuple(row[k] for k in self.shape.key)

    def convert(self, name: str, text: str) -> Any:
        """Column ``name``'s value from its text form (not NULL, not TOASTed)."""
        index = self.names.index(name)
        try:
            return self.converters[index](text)
        except ValueConversionError as e:
            raise ValueConversionError(f"table {self.shape.table}, column {name!r}: {e}") from None

    def check(self, relation: Relation) -> None:
        """Rule 4: ``relation`` (pgoutput's description) has this table's columns."""
        got = [(c.name, c.type_oid, c.type_modifier) for c in relation.columns]
        want = [(c.name, c.type_oid, c.type_modifier) for c in self.shape.columns]
        if got == want:
            return
        got_names, want_names = [g[0] for g in got], [w[0] for w in want]
        added = [n for n in got_names if n not in want_names]
        dropped = [n for n in want_names if n not in got_names]
        retyped = [g[0] for g in got for w in want if g[0] == w[0] and g[1:] != w[1:]]
        what = "; ".join(part for part in (
            f"column(s) added: {', '.join(added)}" if added else "",
            f"column(s) dropped: {', '.join(dropped)}" if dropped else "",
            f"column(s) retyped: {', '.join(retyped)}" if retyped else "",
            "columns reordered" if not (added or dropped or retyped) else "") if part)
        raise SchemaChanged(
            f"table {self.shape.table} changed while it was captured ({what}): the source "
            "stops rather than emit rows of another shape; every change committed before the "
            "first change of the new shape was delivered. Start it again with a new "
            "checkpoint location (startup mode 'initial' reads the table again with its new "
            "columns; drop the old replication slot): the changes written with the new shape "
            "stay in the stream, so undoing the change now does not let this checkpoint go on")


def decode_transaction(tx: Transaction, decoders: Mapping[TableName, RowDecoder]) -> TxChanges:
    """A pgoutput transaction as values (changes of tables not captured are left out). Any
    thread."""
    changes: list[RowChange] = []
    for index, change in enumerate(tx.changes):
        relations = tx.relations[index]
        if isinstance(change, Truncate):
            for relation in relations:
                table = TableName(relation.namespace or "pg_catalog", relation.name)
                if table in decoders:
                    changes.append(RowChange("t", table))
            continue
        relation = relations[0]
        table = TableName(relation.namespace or "pg_catalog", relation.name)
        decoder = decoders.get(table)
        if decoder is None:
            continue
        decoder.check(relation)
        column = decoder.shape.chunk_key_column
        if isinstance(change, Insert):
            after = decoder.row(change.new)
            changes.append(RowChange("c", table, decoder.key(after), after, after[column]))
        elif isinstance(change, Update):
            after = decoder.row(change.new)
            key = decoder.key(after)
            before = _old_image(decoder, change.old, change.old_kind)
            old_key = decoder.key(before) if before is not None else None
            changes.append(RowChange(
                "u", table, key, after, after[column], old_key,
                before[column] if before is not None else after[column], before,
                change.old_kind == "O"))
        elif isinstance(change, Delete):
            before = _old_image(decoder, change.old, change.old_kind)
            assert before is not None
            changes.append(RowChange("d", table, decoder.key(before), None, before[column],
                                     before=before, full_before=change.old_kind == "O"))
    return TxChanges(tx.xid, tx.commit_lsn, tx.end_lsn, tx.commit_time, tuple(changes))


def _old_image(decoder: RowDecoder, old: Row | None, kind: str) -> RowValues | None:
    if old is None:
        return None
    image = decoder.row(old)
    if kind == "K":  # the old key's columns only (the others are sent as NULL)
        return {k: image[k] for k in decoder.shape.key}
    return image


# -- rule 8 of watermarks.py: where keys fall, in the server's order -------------------------------


class KeyOrder:
    """Which chunk a chunk key value falls in: Python's order for integer keys, the server's
    (one query per call) for text keys. Thread model: the reader's."""

    def __init__(self, conn: Any, shapes: Iterable[TableShape]) -> None:
        self.conn = conn
        self.shapes = {s.table: s for s in shapes}
        self._collations: dict[TableName, str] = {}

    def positions(self, table: TableName, boundaries: Sequence[Any],
                  keys: Sequence[Any]) -> list[int]:
        """For each key, how many of the sorted ``boundaries`` are at or before it (NULL:
        0)."""
        shape = self.shapes[table]
        column = shape.column(shape.chunk_key_column)
        if column.type_oid in INTEGER_KEYS or not keys:
            import bisect
            return [0 if k is None else bisect.bisect_right(boundaries, k) for k in keys]
        cast = _TEXT_CASTS.get(column.type_oid)
        if cast is None:
            raise PostgresSourceError(f"table {table}: chunk key column "
                                      f"{shape.chunk_key_column!r} has a type the source cannot "
                                      "order")
        collation = self._collation(table, shape.chunk_key_column)
        rows = self.conn.execute(composed(
            f"SELECT (SELECT count(*) FROM unnest(%s::text[]) AS b(v) WHERE "
            f"b.v::{cast} COLLATE {collation} <= k.v::{cast} COLLATE {collation}) "
            "FROM unnest(%s::text[]) WITH ORDINALITY AS k(v, i) ORDER BY k.i"),
            (list(boundaries), list(keys))).fetchall()
        return [int(r[0]) for r in rows]

    def _collation(self, table: TableName, column: str) -> str:
        found = self._collations.get(table)
        if found is None:
            row = self.conn.execute(
                "SELECT c.collname, n.nspname FROM pg_attribute a JOIN pg_collation c ON "
                "c.oid = a.attcollation JOIN pg_namespace n ON n.oid = c.collnamespace "
                "WHERE a.attrelid = to_regclass(%s) AND a.attname = %s",
                (table.sql, column)).fetchone()
            found = ('"default"' if row is None else
                     f"{quote_ident(row[1])}.{quote_ident(row[0])}")
            self._collations[table] = found
        return found

    def in_chunk(self, chunk: Chunk, keys: Sequence[Any]) -> Callable[[Any], bool]:
        """Whether each of ``keys`` is in ``chunk``'s range, as a function of the key."""
        bounds = [b for b in (chunk.start, chunk.end) if b is not None]
        target = 1 if chunk.start is not None else 0
        distinct = list(dict.fromkeys(k for k in keys if k is not None))
        inside = {k: p == target for k, p in
                  zip(distinct, self.positions(chunk.table, bounds, distinct), strict=True)}
        return lambda k: chunk.start is None if k is None else inside[k]

    def locate(self, flt: Any) -> Callable[[TableName, Sequence[Any]], Sequence[int]]:
        """watermarks.py's ``locate`` for a stream filter: a query per transaction for text
        keys, only while the stream still holds the map (watermarks.py rule 5)."""
        def locate(table: TableName, keys: Sequence[Any]) -> Sequence[int]:
            return self.positions(table, flt.table(table).boundaries, keys)
        return locate


# -- the slot, shared --------------------------------------------------------------------------


def slot_in_use(error: BaseException) -> bool:
    """Whether ``error`` says another session holds the slot right now (a peek or an advance
    acquires it for its duration: PostgreSQL's "replication slot ... is active for PID")."""
    return isinstance(error, SlotProblem) and "in use by another process" in str(error)


def while_slot_busy(action: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``action()``, again after a short random pause while another session holds the slot
    (several readers peek it at once during the snapshot, and the enumerator advances it
    while the stream reader peeks), until ``timeout_s``. Any thread."""
    import random

    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while True:
        try:
            return action()
        except SlotProblem as e:
            if not slot_in_use(e) or time.monotonic() > deadline:
                raise
            log.debug("%s: the slot is busy, trying again", what)
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 0.2)


# -- watermarks.py rules 1 and 2: a chunk read --------------------------------------------------


def wait_for_flush(conn: Any, lsn: int, timeout_s: float) -> None:
    """Until the WAL is flushed to ``lsn`` (a peek reads flushed WAL only)."""
    deadline = time.monotonic() + timeout_s
    while True:
        row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        if row is not None and lsn_from_text(row[0]) >= lsn:
            return
        if time.monotonic() > deadline:
            raise PostgresSourceError(f"the WAL was not flushed to the chunk's high watermark "
                                      f"within {timeout_s} s")
        time.sleep(0.01)


@dataclass
class ChunkRead:
    """A chunk as of its high watermark: its ``'r'`` rows as a record batch of
    :func:`arrow_schema` (rule 3) and the high watermark."""

    batch: pa.RecordBatch
    high: int


def read_chunk_watermarked(conn: Any, config: ReaderConfig, chunk: SnapshotChunk,
                           order: KeyOrder | None = None) -> ChunkRead:
    """``chunk``'s rows as of its high watermark (watermarks.py rules 1 and 2), read as text
    with ``COPY ... TO STDOUT (FORMAT csv)`` and converted a column at a time (values.py rule
    5); the window's changes are merged into the rows whose keys they touch, which alone go
    through Python values. ``conn``: an autocommit connection of the reader's thread."""
    from sparkcoord.sources.postgres.io import replication

    shape = config.shape(chunk.table)
    statement, params = chunk_sql(chunk.chunk, list(shape.column_names))
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()  # takes S
        assert row is not None
        visible = Visibility.parse(row[0])
        texts = _copy_texts(conn, statement, params, shape)
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        high = lsn_from_text(row[0])  # H: after every commit S sees
    wait_for_flush(conn, high, config.flush_wait_s)
    peek = while_slot_busy(
        lambda: replication.peek(conn, config.slot, config.publication, upto_lsn=high),
        config.flush_wait_s, f"reading chunk {chunk.split_id}")
    decoder = RowDecoder(shape)
    decoders = {chunk.table: decoder}
    window = [decode_transaction(tx, decoders) for tx in peek.transactions
              if tx.end_lsn <= high and not visible.sees(tx.xid)]
    schema = arrow_schema(config.shapes)
    columns = {}
    for column in shape.columns:
        try:
            columns[column.name] = values.column_from_texts(
                column.type_oid, column.type_modifier, texts[column.name], column.dimensions)
        except ValueConversionError as e:
            raise ValueConversionError(
                f"table {shape.table}, column {column.name!r}: {e}") from None
    touched = _touched_keys(chunk.table, window)
    if touched is None:  # nothing in the window: the rows as read
        length = len(texts[shape.columns[0].name])
        return ChunkRead(_read_batch(shape, columns, length, high, schema), high)
    # the rows the window touches (all of them after a TRUNCATE) go through Python values;
    # their keys too, from the texts (a float4 key as Arrow's float32 is not the window's)
    keys = list(zip(*([None if t is None else decoder.convert(k, t)
                       for t in texts[k].to_pylist()] for k in shape.key), strict=True))
    hit = [True] * len(keys) if touched is ALL_KEYS else [k in touched for k in keys]
    rows: dict[Key, RowValues] = {}
    for index in (i for i, h in enumerate(hit) if h):
        values_ = decoder.row([texts[n][index].as_py() for n in shape.column_names])
        rows[decoder.key(values_)] = values_
    order = order or KeyOrder(conn, config.shapes)
    in_chunk = order.in_chunk(chunk.chunk, window_values(chunk.table, window, visible, high))
    merged = merge_window(chunk.table, rows, window, visible=visible, high=high,
                          in_chunk=in_chunk)
    keep = pa.array([not h for h in hit], pa.bool_())
    kept = {name: array.filter(keep) for name, array in columns.items()}
    untouched = _read_batch(shape, kept, sum(1 for h in hit if not h), high, schema)
    changed = record_batch(snapshot_rows(chunk.table, merged, high), schema)
    return ChunkRead(pa.concat_batches([untouched, changed]), high)


#: :func:`_touched_keys`' answer when a TRUNCATE touched every row
ALL_KEYS: frozenset[Key] = frozenset({("*all*",)})


def _touched_keys(table: TableName, window: Sequence[TxChanges]) -> frozenset[Key] | None:
    """The keys of ``table`` the window's changes touch (None: none; :data:`ALL_KEYS`: a
    TRUNCATE)."""
    keys: set[Key] = set()
    for tx in window:
        for change in tx.changes:
            if change.table != table:
                continue
            if change.kind == "t":
                return ALL_KEYS
            if change.key is not None:
                keys.add(change.key)
            if change.old_key is not None:
                keys.add(change.old_key)
    return frozenset(keys) if keys else None


def _copy_texts(conn: Any, statement: str, params: Sequence[Any],
                shape: TableShape) -> dict[str, pa.Array]:
    """The statement's rows as text forms (values.py rule 2), one string column per table
    column: COPY's CSV, read by Arrow (an unquoted empty field is NULL, a quoted one the
    empty string)."""
    import pyarrow.csv as csv

    # Arrow's CSV reader drops a byte-order mark at the start of its input, and COPY does not
    # quote a value that begins with one: ours goes first, so a first value that begins with
    # one keeps it
    data = bytearray(b"\xef\xbb\xbf")
    with conn.cursor() as cursor:
        copy_sql = f"COPY ({statement}) TO STDOUT (FORMAT csv)"
        with cursor.copy(composed(copy_sql), params) as copy:
            for block in copy:
                data += block
    names = list(shape.column_names)
    if len(data) == 3:
        return {n: pa.array([], pa.string()) for n in names}
    table = csv.read_csv(
        pa.py_buffer(bytes(data)),
        read_options=csv.ReadOptions(column_names=names, use_threads=False,
                                     block_size=max(1 << 20, len(data) + 1)),
        parse_options=csv.ParseOptions(newlines_in_values=True),
        convert_options=csv.ConvertOptions(
            column_types={n: pa.string() for n in names}, strings_can_be_null=True,
            quoted_strings_can_be_null=False, null_values=[""]))
    return {n: table.column(n).combine_chunks() for n in names}


def _read_batch(shape: TableShape, columns: Mapping[str, pa.Array], length: int, high: int,
                schema: pa.Schema) -> pa.RecordBatch:
    """Snapshot (``'r'``) rows of ``shape``'s table from its typed columns (rule 3)."""
    def struct(kind: pa.StructType) -> pa.Array:
        children = [columns[f.name] if f.name in columns else pa.nulls(length, f.type)
                    for f in kind]
        return pa.StructArray.from_arrays(children, fields=list(kind))

    after = schema.field("after").type
    return pa.RecordBatch.from_arrays([
        pa.array(["r"] * length, pa.string()),
        pa.array([str(shape.table)] * length, pa.string()),
        pa.array([high] * length, pa.int64()),
        pa.nulls(length, pa.int64()),
        pa.nulls(length, pa.int32()),
        pa.nulls(length, pa.timestamp("us", tz="UTC")),
        pa.nulls(length, pa.int64()),
        struct(schema.field("key").type),
        pa.nulls(length, after),
        struct(after),
        pa.nulls(length, pa.list_(pa.string())),
    ], schema=schema)


# -- the stream ---------------------------------------------------------------------------------


@dataclass
class StreamRead:
    rows: list[OutRow]
    position: StreamPosition
    more: bool
    transactions: int


def read_stream(conn: Any, config: ReaderConfig, position: StreamPosition, upto: int,
                order: KeyOrder | None = None) -> StreamRead:
    """The transactions ending after ``position`` and at or before ``upto``, in commit order,
    whole ones while they keep the read within ``max_changes_per_batch`` changes (at least
    one): a function of the position, ``upto`` and the WAL (rule 2)."""
    from sparkcoord.sources.postgres.io import replication

    if upto <= position.after:
        return StreamRead([], position, False, 0)
    wait_for_flush(conn, upto, config.flush_wait_s)
    limit = config.max_changes_per_batch
    after = position.after
    messages = 3 * limit

    def peek_up_to(messages: int) -> Any:
        return while_slot_busy(
            lambda: replication.peek(conn, config.slot, config.publication,
                                     upto_nchanges=messages, upto_lsn=upto, after_lsn=after),
            config.flush_wait_s, "reading the stream")

    while True:
        peek = peek_up_to(messages)
        taken: list[Transaction] = []
        size, full, past = 0, False, False
        for tx in peek.transactions:
            if tx.end_lsn > upto:
                past = True
                break
            if taken and size + len(tx.changes) + 2 > limit:
                full = True
                break
            taken.append(tx)
            size += len(tx.changes) + 2
        if full or past or not peek.cut_short:
            break
        messages *= 4  # cut short before the reader's limit or the bound: ask for more
    decoders = {s.table: RowDecoder(s) for s in config.shapes}
    order = order or KeyOrder(conn, config.shapes)
    rows: list[OutRow] = []
    emitted = 0
    for tx in taken:
        try:
            changes = decode_transaction(tx, decoders)
        except SchemaChanged as e:  # rule 4: stop before it, at the last transaction's end
            return StreamRead(rows, dataclasses.replace(position, stopped=str(e)), True,
                              emitted)
        flt = position.filter
        rows.extend(stream_rows(changes, flt, order.locate(flt) if flt is not None else None))
        position = position.moved_to(tx.end_lsn)
        emitted += 1
    if not full:
        position = position.moved_to(upto)
    return StreamRead(rows, position, full, emitted)


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
