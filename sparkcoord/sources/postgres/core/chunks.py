"""Splitting a table into key chunks for the snapshot, one chunk at a time, as Flink CDC's
incremental snapshot does, but keeping only the frontier.

A *chunk* is a range ``[start, end)`` of one column's values (the primary key, or a chunk key
column the user named); reading every chunk of a table reads every row once. The planner is
sans-IO: it says which boundary to look up next (a :class:`BoundaryQuery`), the I/O layer
runs it (catalog.py: ``SELECT key ... WHERE key >= X ORDER BY key OFFSET N LIMIT 1``) and
hands the answer back, and the planner returns the chunk that answer closes.

Rules:
  1. Chunks are planned in key order, one per answered query, so a table of any size never
     blocks: a caller can hand out chunk ``i`` before chunk ``i + 1`` is known. The planner
     holds only the frontier (the next chunk's start), the next chunk's index and whether it
     is done; its state is a few dozen bytes whatever the table's size.
  2. Chunk ``i`` is ``[start, end)``: ``start`` is the previous chunk's ``end`` (None for the
     first), ``end`` the key found at offset ``chunk_size`` among the keys ``>= start``, or
     None for the last chunk (no such key). With a unique key each chunk but the last holds
     exactly ``chunk_size`` rows at planning time. Rows whose key is NULL (a nullable chunk
     key column) belong to the first chunk, whose query says so.
  3. A non-unique chunk key column can answer a boundary equal to its chunk's start (more
     than ``chunk_size`` rows share the key): the planner then asks for the first key
     strictly greater, so the chunk holds every row of that key and chunks never overlap or
     stall.
  4. Comparisons are the server's (the column's collation): the planner never orders keys
     itself; it compares keys only for equality (rule 3).
  5. A table without a primary key needs a named chunk key column; a composite primary key
     needs one too (composite chunking is not yet supported); the key's type must be an
     integer or a text type. Each failure is a :class:`ChunkKeyError` naming the table.

Thread model: a planner belongs to one thread (the enumerator's planning thread); its state
and its chunks are immutable values any thread may read and pickle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkcoord.core.encoding import encoded
from sparkcoord.sources.postgres.core import values
from sparkcoord.sources.postgres.core.names import TableName, quote_ident
from sparkcoord.sources.postgres.errors import ChunkKeyError

Key = int | str

#: the key types rule 5 admits
KEY_TYPES = frozenset({values.INT2, values.INT4, values.INT8, values.TEXT, values.VARCHAR,
                       values.BPCHAR})


@dataclass(frozen=True, slots=True)
class Chunk:
    """Rows of ``table`` whose ``key_column`` value is in ``[start, end)`` (None: unbounded;
    the first chunk also holds NULL keys). Small and picklable: the split's identity."""

    table: TableName
    key_column: str
    index: int
    start: Key | None
    end: Key | None

    @property
    def split_id(self) -> str:
        return f"{self.table}#{self.index}"

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.end is None


@dataclass(frozen=True, slots=True)
class BoundaryQuery:
    """Ask: the key at ``offset`` among the keys ``>= after`` (``> after`` when not
    ``inclusive``; every non-NULL key when ``after`` is None), in key order."""

    after: Key | None
    inclusive: bool
    offset: int


@encoded("postgres.PlannerState")
@dataclass(frozen=True, slots=True)
class PlannerState:
    """What a checkpoint keeps of a planner (rule 1)."""

    table: TableName
    key_column: str
    chunk_size: int
    frontier: Key | None = None
    next_index: int = 0
    done: bool = False
    #: the last boundary equalled its chunk's start: ask for the first key strictly after
    strictly_after: bool = False


class ChunkPlanner:
    """Plans one table's chunks (module docstring).

    Thread model: one thread at a time (the enumerator's planning thread)."""

    def __init__(self, table: TableName, key_column: str, chunk_size: int) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk size must be >= 1, got {chunk_size}")
        self._state = PlannerState(table, key_column, chunk_size)
        self._asked: BoundaryQuery | None = None

    @classmethod
    def restored(cls, state: PlannerState) -> ChunkPlanner:
        """The planner a checkpoint holds; it continues after the last chunk it returned.
        Called by the enumerator when it restores (its mailbox thread)."""
        planner = cls(state.table, state.key_column, state.chunk_size)
        planner._state = state
        return planner

    @property
    def state(self) -> PlannerState:
        return self._state

    @property
    def done(self) -> bool:
        """Every chunk was returned (the last one has ``end`` None)."""
        return self._state.done

    def next_query(self) -> BoundaryQuery | None:
        """The boundary to look up for the next chunk, or None when done. Asking again before
        answering returns the same query. Called on the planning thread."""
        s = self._state
        if s.done:
            return None
        if s.strictly_after:
            self._asked = BoundaryQuery(s.frontier, False, 0)
        else:
            self._asked = BoundaryQuery(s.frontier, True, s.chunk_size)
        return self._asked

    def boundary_found(self, query: BoundaryQuery, key: Key | None) -> Chunk | None:
        """The I/O layer's answer to ``query`` (the key, or None when there is no such row).
        Returns the chunk it closes, or None when the answer only showed that more rows share
        the chunk's start (rule 3: the next query asks past them). Called on the planning
        thread."""
        if query != self._asked:
            raise ValueError(f"answer to {query}, but the planner asked {self._asked}")
        self._asked = None
        s = self._state
        if key is not None and s.frontier is not None and key == s.frontier:
            if not query.inclusive:
                raise ValueError(f"table {s.table}: the first key after {key!r} was "
                                 f"{key!r} itself")
            self._state = _replace(s, strictly_after=True)
            return None
        chunk = Chunk(s.table, s.key_column, s.next_index, s.frontier, key)
        self._state = _replace(s, frontier=key, next_index=s.next_index + 1,
                               done=key is None, strictly_after=False)
        return chunk


def _replace(state: PlannerState, **changes: Any) -> PlannerState:
    return dataclasses.replace(state, **changes)


# -- the chunk key (rule 5) ------------------------------------------------------------------


def choose_chunk_key(table: TableName, primary_key: Sequence[str],
                     column_types: dict[str, int], chunk_key_column: str | None = None) -> str:
    """The column ``table`` is chunked by: ``chunk_key_column`` when named, else the primary
    key's single column; a :class:`ChunkKeyError` naming the table otherwise (rule 5).
    ``column_types`` maps each column to its type oid. Any thread."""
    if chunk_key_column is not None:
        column = chunk_key_column
        if column not in column_types:
            raise ChunkKeyError(f"table {table} has no column {column!r} to chunk by (its "
                                f"columns: {', '.join(column_types)})")
    elif not primary_key:
        raise ChunkKeyError(f"table {table} has no primary key: name a chunk key column (the "
                            "option chunkKeyColumn) to split its snapshot by")
    elif len(primary_key) > 1:
        raise ChunkKeyError(f"table {table} has a composite primary key "
                            f"({', '.join(primary_key)}): splitting by a composite key is not "
                            "yet supported; name one of its columns as the chunk key column "
                            "(the option chunkKeyColumn)")
    else:
        column = primary_key[0]
    oid = column_types[column]
    if oid not in KEY_TYPES:
        name = values.TYPE_NAMES.get(oid, f"type oid {oid}")
        raise ChunkKeyError(f"table {table}: column {column!r} is of type {name}; a chunk key "
                            "must be an integer (smallint, integer, bigint) or text (text, "
                            "varchar, char) column for now")
    return column


# -- SQL for the I/O layer (rule 4: the server orders) ---------------------------------------


def boundary_sql(table: TableName, key_column: str,
                 query: BoundaryQuery) -> tuple[str, tuple[object, ...]]:
    """The statement answering ``query`` and its parameters (psycopg's ``%s`` style). Any
    thread."""
    key = quote_ident(key_column)
    params: tuple[object, ...]
    if query.after is None:
        where, params = f"{key} IS NOT NULL", ()
    else:
        where, params = f"{key} {'>=' if query.inclusive else '>'} %s", (query.after,)
    return (f"SELECT {key} FROM {table.sql} WHERE {where} ORDER BY {key} "
            f"OFFSET {int(query.offset)} LIMIT 1", params)


def chunk_sql(chunk: Chunk, columns: Sequence[str] | None = None
              ) -> tuple[str, tuple[object, ...]]:
    """The statement reading ``chunk``'s rows (``columns``, or all) and its parameters. Any
    thread."""
    key = quote_ident(chunk.key_column)
    wanted = "*" if columns is None else ", ".join(quote_ident(c) for c in columns)
    conditions: list[str] = []
    params: list[object] = []
    if chunk.start is not None:
        conditions.append(f"{key} >= %s")
        params.append(chunk.start)
    if chunk.end is not None:
        conditions.append(f"{key} < %s")
        params.append(chunk.end)
    where = " AND ".join(conditions)
    if chunk.start is None and chunk.end is not None:
        where = f"({where} OR {key} IS NULL)"
    return (f"SELECT {wanted} FROM {chunk.table.sql}" + (f" WHERE {where}" if where else ""),
            tuple(params))
