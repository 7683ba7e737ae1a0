"""The Arrow shape of what the PostgreSQL source emits (reader.py rule 3): the schema, and
rows as record batches of it. Pure functions of their inputs (no connection, no clock).

Rules:
  1. :func:`arrow_schema` is the source's one schema: the operation and position columns,
     and ``key``, ``before`` and ``after`` structs of the captured tables' columns (the union
     by name, in the tables' order); one name with two different types in two tables is an
     error naming both.
  2. Every batch the reader emits is of that schema: :func:`record_batch` for rows as values
     (the stream, and a chunk's rows its window touched), :func:`snapshot_batch` for a
     chunk's rows as typed columns (the rows no change touched: values.py rule 5). A value
     Arrow refuses is an error naming its table and column.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from sparkcoord.sources.postgres.core import values
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.pgoutput import POSTGRES_EPOCH_UNIX_US
from sparkcoord.sources.postgres.core.splits import TableShape
from sparkcoord.sources.postgres.core.watermarks import OutRow
from sparkcoord.sources.postgres.errors import PostgresSourceError, ValueConversionError


def arrow_schema(shapes: Sequence[TableShape]) -> pa.Schema:
    """The source's Arrow schema (rule 1). Any thread."""
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
    """``rows`` as a record batch of ``schema`` (rule 2); a value Arrow refuses is an error
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


def snapshot_batch(shape: TableShape, columns: Mapping[str, pa.Array], length: int, high: int,
                   schema: pa.Schema) -> pa.RecordBatch:
    """Snapshot (``'r'``) rows of ``shape``'s table from its typed columns (rule 2): the
    rows of a chunk read that no change of its window touched. Any thread."""
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
