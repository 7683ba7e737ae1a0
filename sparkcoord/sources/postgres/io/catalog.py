"""What the snapshot needs to know about a captured table, asked of the server (the I/O half
of chunks.py): the table's columns and primary key, the next chunk boundary, a chunk's rows.

Thread model: each function uses the psycopg connection it is given, in the calling thread
(the enumerator's planning thread, or a reader's task); none keeps state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from sparkcoord.sources.postgres.core.chunks import (
    BoundaryQuery,
    Chunk,
    ChunkPlanner,
    Key,
    boundary_sql,
    choose_chunk_key,
    chunk_sql,
)
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.tables import TableColumn, TableInfo
from sparkcoord.sources.postgres.errors import PostgresSourceError

__all__ = ["TableColumn", "TableInfo", "composed", "table_info"]  # the tables' shapes: core/tables.py

if TYPE_CHECKING:
    from psycopg import Connection
    from typing_extensions import LiteralString


def composed(statement: str) -> LiteralString:
    """``statement``, made only of constants and names quoted by ``quote_ident`` (names.py
    rule 2), as the literal string psycopg's types ask for. Any thread."""
    return statement  # mypy reads LiteralString as str; the rule above is what makes it one


def table_info(conn: Connection[Any], table: TableName) -> TableInfo:
    """``table``'s columns (in order, without dropped ones) and primary key columns (in key
    order); an error naming the table when it does not exist. Called on the enumerator's
    planning thread."""
    row = conn.execute("SELECT to_regclass(%s)::oid", (table.sql,)).fetchone()
    if row is None or row[0] is None:
        raise PostgresSourceError(f"table {table} does not exist (or the role cannot see it)")
    oid = row[0]
    columns = tuple(TableColumn(name, type_oid, modifier, not_null, dimensions)
                    for name, type_oid, modifier, not_null, dimensions in conn.execute(
                        "SELECT attname, atttypid::int8, atttypmod, attnotnull, attndims::int "
                        "FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT "
                        "attisdropped ORDER BY attnum", (oid,)).fetchall())
    key = tuple(name for (name,) in conn.execute(
        "SELECT a.attname FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) "
        "WITH ORDINALITY AS k(attnum, position) JOIN pg_attribute a "
        "ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.position", (oid,)).fetchall())
    unique = frozenset(name for (name,) in conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = i.indkey[0] WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid "
        "AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL", (oid,)).fetchall())
    return TableInfo(table, columns, key, unique)


def planner_for(conn: Connection[Any], table: TableName, chunk_size: int,
                chunk_key_column: str | None = None) -> ChunkPlanner:
    """A planner for ``table`` by its primary key or ``chunk_key_column`` (chunks.py rule 5).
    Called on the enumerator's planning thread."""
    info = table_info(conn, table)
    column = choose_chunk_key(table, info.primary_key, info.column_types, chunk_key_column)
    return ChunkPlanner(table, column, chunk_size)


def next_boundary(conn: Connection[Any], planner: ChunkPlanner, query: BoundaryQuery) -> Key | None:
    """The answer to ``query`` (chunks.py). Called on the enumerator's planning thread."""
    s = planner.state
    statement, params = boundary_sql(s.table, s.key_column, query)
    row = conn.execute(composed(statement), params).fetchone()
    return None if row is None else cast(Key, row[0])


def next_chunk(conn: Connection[Any], planner: ChunkPlanner) -> Chunk | None:
    """The planner's next chunk, asking the server as often as chunks.py rule 3 needs; None
    when the planner is done. Called on the enumerator's planning thread, one chunk at a
    time, so a checkpoint in between sees a small state (rule 1)."""
    while (query := planner.next_query()) is not None:
        chunk = planner.boundary_found(query, next_boundary(conn, planner, query))
        if chunk is not None:
            return chunk
    return None


def read_chunk(conn: Connection[Any], chunk: Chunk, columns: list[str] | None = None,
               batch_rows: int = 10_000) -> Iterator[tuple[Any, ...]]:
    """``chunk``'s rows as psycopg loads them (Python values), fetched ``batch_rows`` at a
    time through a server-side cursor. Called by a reader's task."""
    statement, params = chunk_sql(chunk, columns)
    with conn.transaction(), conn.cursor(name=f"chunk_{chunk.index}") as cursor:
        cursor.execute(composed(statement), params)
        while rows := cursor.fetchmany(batch_rows):
            yield from rows
