"""Errors of the PostgreSQL source. Each names what is wrong (the table, the role, the right,
the server) and never a password.

Thread model: none.
"""

from __future__ import annotations

from sparkcoord.core.errors import SparkCoordError


class PostgresSourceError(SparkCoordError):
    """Base class of every error the PostgreSQL source raises on purpose."""


class PgOutputError(PostgresSourceError, ValueError):
    """A pgoutput message that does not follow the format: names the message type and the
    byte offset where decoding failed."""

    def __init__(self, message_type: str, offset: int, problem: str) -> None:
        super().__init__(f"pgoutput {message_type} message, byte {offset}: {problem}")
        self.message_type = message_type
        self.offset = offset


class ValueConversionError(PostgresSourceError, ValueError):
    """A column value that its type's conversion cannot represent (a numeric NaN as a decimal,
    a timestamp before year 1)."""


class ConnectionRefused(PostgresSourceError):
    """The server could not be reached or refused the login: names host, port, database and
    user, never the password. ``transient``: the server was not reachable or not accepting
    connections yet (starting up, replaying WAL after a crash, shutting down, too many
    clients), as during a restart; a refused login (wrong password, unknown role or
    database) is not."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class MissingRights(PostgresSourceError):
    """The role lacks a right the source needs: names the role, the right and the statement
    that grants it."""


class SlotProblem(PostgresSourceError):
    """The replication slot is missing (dropped), of another plugin or database, or its WAL
    was removed."""


class PublicationProblem(PostgresSourceError):
    """The publication does not publish a captured table."""


class SchemaChanged(PostgresSourceError):
    """A captured table's shape changed while streaming (reader.py rule 4): names the table,
    the change and the way on."""


class ChunkKeyError(PostgresSourceError):
    """A table that cannot be split into key chunks as asked: no primary key and no chunk key
    column named, a composite key (not yet supported), a key type we cannot order by."""
