"""The values the snapshot-to-stream rules speak of, sans-IO: a transaction as the slot gives
it, decoded (:class:`TxChanges` of :class:`RowChange`), the snapshot that decides which
transactions a chunk read saw (:class:`Visibility`), and the rows the source emits
(:class:`OutRow`, with Debezium's operation letters).

The rules are ``watermarks.py``'s (its vocabulary, and rules 2 and 7 for these values); a
rule number alone is that module's. The reader (``reader.py``) decodes pgoutput into these
values in a Spark task and turns the rows into record batches; ``watermarks.py`` merges and
filters them. Every name here is importable from ``watermarks.py`` as before
(docs/decisions/107-file-reading-and-sink-modules.md).

Thread model: none (immutable values and a pure parse).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkcoord.sources.postgres.core.names import TableName

#: rule 7's operation letters
READ, CREATE, UPDATE, DELETE, TRUNCATE = "r", "c", "u", "d", "t"

#: a row key: the primary key's values, in key order
Key = tuple[Any, ...]
#: a row: column name -> value
RowValues = dict[str, Any]


class Unchanged:
    """The value of an unchanged TOASTed column that pgoutput did not send (rule 7)."""

    _instance: Unchanged | None = None

    def __new__(cls) -> Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"

    def __reduce__(self) -> Any:
        return (Unchanged, ())


UNCHANGED = Unchanged()


# -- what the slot gives, decoded -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowChange:
    """One change of a transaction, in values (reader.py decodes pgoutput's into these).

    ``kind``: ``'c'``, ``'u'``, ``'d'`` or ``'t'``. ``key``: the new row's key (insert,
    update) or the deleted key. ``old_key``: an update's key before, when pgoutput sent the
    old key or row (a key change, or REPLICA IDENTITY FULL), else None. ``chunk_value`` and
    ``old_chunk_value``: the chunk key column's value in the new (deleted) row and in the old
    key or row. ``before``: the old image as sent (key columns only for ``'K'``); ``full_before``
    tells whether it is the whole row."""

    kind: str
    table: TableName
    key: Key | None = None
    after: RowValues | None = None
    chunk_value: Any = None
    old_key: Key | None = None
    old_chunk_value: Any = None
    before: RowValues | None = None
    full_before: bool = False


@dataclass(frozen=True, slots=True)
class TxChanges:
    """One committed transaction: its xid, commit LSN, end LSN (its position ``x``), commit
    time (microseconds since 2000-01-01 UTC, pgoutput's) and changes in order."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    changes: tuple[RowChange, ...]


@dataclass(frozen=True, slots=True)
class OutRow:
    """One output row (rule 7)."""

    op: str
    table: TableName
    key: Key | None
    after: RowValues | None
    before: RowValues | None
    lsn: int
    commit_lsn: int | None = None
    seq: int | None = None
    commit_time: int | None = None
    xid: int | None = None
    unchanged: tuple[str, ...] = ()


# -- rule 2: which transactions a snapshot sees ---------------------------------------------


def precedes(a: int, b: int) -> bool:
    """32-bit transaction id ``a`` is older than ``b`` (PostgreSQL's TransactionIdPrecedes)."""
    diff = (a - b) & 0xFFFFFFFF
    return diff >= 0x80000000


@dataclass(frozen=True, slots=True)
class Visibility:
    """An MVCC snapshot as ``pg_current_snapshot()`` shows it (``xmin:xmax:xip,...``), reduced
    to 32-bit xids as pgoutput sends them (modular comparison, as the server's)."""

    xmin: int
    xmax: int
    in_progress: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str) -> Visibility:
        """``pg_current_snapshot()::text``. Any thread."""
        try:
            xmin, xmax, xip = text.strip().split(":")
            running = frozenset(int(x) & 0xFFFFFFFF for x in xip.split(",") if x)
            return cls(int(xmin) & 0xFFFFFFFF, int(xmax) & 0xFFFFFFFF, running)
        except ValueError:
            raise ValueError(f"not a pg_snapshot text: {text!r}") from None

    def sees(self, xid: int) -> bool:
        """Whether a transaction that committed (the slot only returns committed ones) is
        visible in this snapshot."""
        xid &= 0xFFFFFFFF
        if precedes(xid, self.xmin):
            return True
        if not precedes(xid, self.xmax):
            return False
        return xid not in self.in_progress
