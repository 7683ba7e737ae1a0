"""A snapshot chunk read with watermarks (watermarks.py rules 1 and 2, the I/O half; reader.py
rule 1): the chunk's rows as of its high watermark, as a record batch of the source's schema.

Rules:
  1. The chunk is read in one REPEATABLE READ, READ ONLY transaction: its snapshot ``S``
     first, then the rows, then the insert position ``H`` (the high watermark, after every
     commit ``S`` sees). Then the slot is peeked up to ``H`` (once the WAL is flushed there,
     waits.py) and the window's transactions (those ending at or before ``H`` that ``S``
     does not see) are merged into the rows (watermarks.py rules 1 and 2).
  2. The rows are read as text, COPY's CSV, and converted a column at a time (values.py
     rule 5); only the rows whose keys the window touches (all of them after a TRUNCATE) go
     through Python values (reader.py rule 3). Every conversion error names the table and
     the column.
  3. A change of the window whose table changed shape fails the read with
     :class:`SchemaChanged` (decoding.py rule 2; reader.py rule 4).

Thread model: the reader's (the Spark task's thread), on its autocommit connection. psycopg is
not imported here at the top (``io/replication.py`` is, inside the read).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sparkcoord.sources.postgres.core import values
from sparkcoord.sources.postgres.core.chunks import chunk_sql
from sparkcoord.sources.postgres.core.decoding import RowDecoder, decode_transaction
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.output import arrow_schema, record_batch, snapshot_batch
from sparkcoord.sources.postgres.core.pgoutput import lsn_from_text
from sparkcoord.sources.postgres.core.splits import SnapshotChunk, TableShape
from sparkcoord.sources.postgres.core.watermarks import (
    Key,
    RowValues,
    TxChanges,
    Visibility,
    merge_window,
    snapshot_rows,
    window_values,
)
from sparkcoord.sources.postgres.errors import ValueConversionError
from sparkcoord.sources.postgres.io.catalog import composed
from sparkcoord.sources.postgres.io.key_order import KeyOrder
from sparkcoord.sources.postgres.io.waits import wait_for_flush, while_slot_busy

if TYPE_CHECKING:
    from sparkcoord.sources.postgres.io.reader_config import ReaderConfig


@dataclass
class ChunkRead:
    """A chunk as of its high watermark: its ``'r'`` rows as a record batch of
    :func:`arrow_schema` (output.py rule 2) and the high watermark."""

    batch: pa.RecordBatch
    high: int


def read_chunk_watermarked(conn: Any, config: ReaderConfig, chunk: SnapshotChunk,
                           order: KeyOrder | None = None) -> ChunkRead:
    """``chunk``'s rows as of its high watermark (watermarks.py rules 1 and 2), read as text
    with ``COPY ... TO STDOUT (FORMAT csv)`` and converted a column at a time (values.py rule
    5); the window's changes are merged into the rows whose keys they touch, which alone go
    through Python values (rules 1 to 3). ``conn``: an autocommit connection of the reader's
    thread. Called by the reader, in the Spark task's thread, for the chunk its batch got."""
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
        return ChunkRead(snapshot_batch(shape, columns, length, high, schema), high)
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
    untouched = snapshot_batch(shape, kept, sum(1 for h in hit if not h), high, schema)
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
