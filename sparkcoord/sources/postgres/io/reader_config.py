"""What every PostgreSQL source reader is given (reader.py rules 1, 2 and 5): where to connect,
the slot and the publication, the captured tables' shapes and the batch limits; the reader and
its reads (io/chunk_read.py, io/stream_read.py) take it.

Rules:
  1. A :class:`ReaderConfig` is pickled to the executors with the reader: its connection
     options pickle without their password (connection.py rule 2; reader.py rule 5).
  2. It is immutable: every reader of a query is given the same one.

Thread model: none (an immutable value, any thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.splits import TableShape
from sparkcoord.sources.postgres.errors import PostgresSourceError

if TYPE_CHECKING:
    from sparkcoord.sources.postgres.io.connection import ConnectionOptions


@dataclass(frozen=True)
class ReaderConfig:
    """What every reader is given (pickled to the executors: no password, rule 1)."""

    options: ConnectionOptions
    slot: str
    publication: str
    shapes: tuple[TableShape, ...]
    max_changes_per_batch: int = 10_000
    max_chunks_per_batch: int | None = None
    #: how long a chunk read waits for the WAL to be flushed to its high watermark
    flush_wait_s: float = 30.0

    def shape(self, table: TableName) -> TableShape:
        """The captured table ``table``'s shape (an error when it is not captured). Any
        thread."""
        for shape in self.shapes:
            if shape.table == table:
                return shape
        raise PostgresSourceError(f"table {table} is not captured by this source")
