"""Where chunk key values fall among chunk boundaries, in the server's order: the I/O half of
watermarks.py rule 8, for the reader's chunk reads and its stream.

Rules:
  1. Integer keys (``int2``, ``int4``, ``int8``) are placed by Python's order, which is the
     server's; text keys (``text``, ``varchar``, ``bpchar``) by the server, with the key
     column's collation, in one query per call; a key of another type is an error naming the
     table and the column. NULL falls before every boundary.
  2. A key column's collation is asked once per table and kept.

Thread model: a :class:`KeyOrder` uses the connection it is given, in the reader's thread (the
Spark task's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sparkcoord.sources.postgres.core import values
from sparkcoord.sources.postgres.core.chunks import Chunk
from sparkcoord.sources.postgres.core.names import TableName, quote_ident
from sparkcoord.sources.postgres.core.splits import TableShape
from sparkcoord.sources.postgres.errors import PostgresSourceError
from sparkcoord.sources.postgres.io.catalog import composed

#: the chunk key types Python orders as the server does (watermarks.py rule 8)
INTEGER_KEYS = frozenset({values.INT2, values.INT4, values.INT8})
_TEXT_CASTS = {values.TEXT: "text", values.VARCHAR: "varchar", values.BPCHAR: "bpchar"}


class KeyOrder:
    """Which chunk a chunk key value falls in: Python's order for integer keys, the server's
    (one query per call) for text keys (rules 1 and 2). Thread model: the reader's."""

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
