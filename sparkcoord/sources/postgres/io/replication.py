"""The replication slot and the publication, through PostgreSQL's SQL functions: read changes
without consuming them, and confirm what a committed batch holds (making sure they exist is
io/set_up.py; watching a slot's creation, io/slot_watch.py).

We read the slot with ``pg_logical_slot_peek_binary_changes`` over an ordinary connection
instead of the streaming replication protocol (psycopg 3 does not speak it): a peek returns
whole committed transactions and moves nothing, and ``pg_replication_slot_advance`` moves
the slot's confirmed position when, and only when, the caller says so.

Rules:
  1. A peek never changes the slot. Only :func:`advance` does, and the coordinator calls it
     with a position recorded in a checkpoint, after the batch of that checkpoint committed:
     a restart before that re-reads the same transactions from the slot, never loses them.
  2. The server skips, from the confirmed position ``P`` on, every transaction whose commit
     record starts before ``P``. So confirming a transaction's ``end_lsn`` (the end of its
     commit record) confirms it and everything committed before it, and nothing after.
  3. A peek reads up to ``F``, the WAL *flush* position asked for just before it (the
     decoder reads only flushed WAL; the write position may be ahead of it), and, when it
     was not cut short by its change limit, returns every transaction of the publication
     whose commit record starts before ``F``. Its :attr:`Peek.read_to` is then ``F`` (or
     the last returned transaction's ``end_lsn`` when that is later); when the limit cut it
     short, it is the last returned transaction's ``end_lsn``.
  4. The idle publication rule: a checkpoint records ``read_to`` of the peeks whose
     transactions its batch holds (the last such peek's), and after that batch commits the
     slot is advanced to it. Every transaction before ``read_to`` that touched the
     publication is in that batch or an earlier committed one (rules 2 and 3), so nothing
     is lost, and when the captured tables are idle (a peek returns nothing) the slot still
     advances to ``F`` at every checkpoint: a quiet publication holds no more WAL than is
     written between two checkpoints, however busy the rest of the database is.
  5. :func:`advance` never moves backwards: asking for a position at or before the slot's
     confirmed one does nothing (the server would refuse it).
  6. Set-up (io/set_up.py, its rule 1 in full): what is missing is created, what exists is
     checked, and what cannot be done is an error naming the role and the right it lacks.
  7. A slot's creation is watched (io/slot_watch.py, its rule 1 in full): the transactions it
     waits for are named in a WARNING and in the enumerator's status.

Thread model: each function uses the connection it is given (autocommit), in the calling
thread: the coordinator's reader thread for peeks, the thread that learns of a committed batch
for :func:`advance`. The set-up (io/set_up.py) and the watch (io/slot_watch.py) are modules of
their own; their names are importable from here (docs/decisions/104-postgres-modules.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from sparkcoord.sources.postgres.core.names import TableName as TableName
from sparkcoord.sources.postgres.core.names import check_simple_name
from sparkcoord.sources.postgres.core.pgoutput import (
    Decoder,
    Transaction,
    lsn_from_text,
    lsn_to_text,
)
from sparkcoord.sources.postgres.errors import (
    MissingRights,
    PostgresSourceError,
    PublicationProblem,
    SlotProblem,
)
from sparkcoord.sources.postgres.io.set_up import PLUGIN as PLUGIN
from sparkcoord.sources.postgres.io.set_up import RoleRights as RoleRights
from sparkcoord.sources.postgres.io.set_up import SlotInfo as SlotInfo
from sparkcoord.sources.postgres.io.set_up import _check_slot as _check_slot
from sparkcoord.sources.postgres.io.set_up import _lsn as _lsn
from sparkcoord.sources.postgres.io.set_up import _need_replication as _need_replication
from sparkcoord.sources.postgres.io.set_up import _rights_error as _rights_error
from sparkcoord.sources.postgres.io.set_up import drop_slot as drop_slot
from sparkcoord.sources.postgres.io.set_up import ensure_publication as ensure_publication
from sparkcoord.sources.postgres.io.set_up import ensure_slot as ensure_slot
from sparkcoord.sources.postgres.io.set_up import one_row
from sparkcoord.sources.postgres.io.set_up import published_tables as published_tables
from sparkcoord.sources.postgres.io.set_up import role_rights as role_rights
from sparkcoord.sources.postgres.io.set_up import slot_info as slot_info
from sparkcoord.sources.postgres.io.slot_watch import _AFTER_PASSWORD as _AFTER_PASSWORD
from sparkcoord.sources.postgres.io.slot_watch import QUERY_SHOWN as QUERY_SHOWN
from sparkcoord.sources.postgres.io.slot_watch import SLOT_WAIT_WARN_S as SLOT_WAIT_WARN_S
from sparkcoord.sources.postgres.io.slot_watch import Backend as Backend
from sparkcoord.sources.postgres.io.slot_watch import SlotCreationWatch as SlotCreationWatch
from sparkcoord.sources.postgres.io.slot_watch import shown_query as shown_query
from sparkcoord.sources.postgres.io.slot_watch import (
    slot_creation_blockers as slot_creation_blockers,
)
from sparkcoord.sources.postgres.io.slot_watch import slot_wait_text as slot_wait_text

# every name this module defined before docs/decisions/104-postgres-modules.md is importable
# from it, as the object of its new home (the imports ``as`` themselves above, and this one):
# the set-up in io/set_up.py, the slot creation's watch in io/slot_watch.py
_one = one_row

PROTO_VERSION = "1"


@dataclass(frozen=True, slots=True)
class Peek:
    """What one peek returned (rule 3)."""

    transactions: tuple[Transaction, ...]
    #: the WAL flush position asked for just before the peek (``F``)
    upto_lsn: int
    #: the position the slot may be confirmed at once these transactions are committed
    read_to: int
    #: the change limit stopped the peek before ``upto_lsn``
    cut_short: bool
    #: rows (pgoutput messages) the server returned
    messages: int


def current_wal_lsn(conn: psycopg.Connection[Any]) -> int:
    """The WAL write position (``pg_current_wal_lsn()``)."""
    return lsn_from_text(one_row(conn, "SELECT pg_current_wal_lsn()::text")[0])


def current_insert_lsn(conn: psycopg.Connection[Any]) -> int:
    """The WAL insert position (``pg_current_wal_insert_lsn()``): the end of the last WAL
    record reserved, a record boundary, so no commit record starts before it and ends after
    it; what the stream reads up to (enumerator.py rule 5)."""
    return lsn_from_text(one_row(conn, "SELECT pg_current_wal_insert_lsn()::text")[0])


def current_flush_lsn(conn: psycopg.Connection[Any]) -> int:
    """The WAL flush position (``pg_current_wal_flush_lsn()``), the most a peek reads
    (rule 3)."""
    return lsn_from_text(one_row(conn, "SELECT pg_current_wal_flush_lsn()::text")[0])


def _slot_error(error: psycopg.Error, slot: str, publication: str | None = None
                ) -> PostgresSourceError:
    message = getattr(error.diag, "message_primary", None) or str(error)
    if isinstance(error, pg_errors.InsufficientPrivilege):
        return MissingRights(f"reading replication slot {slot!r}: {message} (the role needs "
                             "the REPLICATION attribute)")
    if "publication" in message and publication is not None:
        return PublicationProblem(f"reading replication slot {slot!r} with publication "
                                  f"{publication!r}: {message}")
    if isinstance(error, pg_errors.UndefinedObject):
        return SlotProblem(f"replication slot {slot!r} does not exist (was it dropped?): "
                           f"{message}; changes since its last confirmed position cannot be "
                           "read again: start again with a snapshot")
    if "already been removed" in message:
        return SlotProblem(f"replication slot {slot!r} needs WAL that was removed: {message}")
    if "can no longer get changes" in message or "cannot be advanced" in message:
        return SlotProblem(
            f"replication slot {slot!r} was invalidated: the server removed WAL it still "
            f"needed (max_slot_wal_keep_size; pg_replication_slots shows wal_status 'lost'), "
            f"so changes since its last confirmed position are lost ({message}); start again "
            "with a snapshot (a new checkpoint location; drop the slot), and give the slot "
            "more room or keep the source running")
    if isinstance(error, pg_errors.ObjectInUse):
        return SlotProblem(f"replication slot {slot!r} is in use by another process: {message}")
    return SlotProblem(f"replication slot {slot!r}: {message}")


def peek(conn: psycopg.Connection[Any], slot: str, publication: str, *, upto_nchanges: int | None = None,
         upto_lsn: int | None = None, after_lsn: int = 0) -> Peek:
    """The committed transactions of ``publication`` in the slot, without consuming them
    (rules 1 and 3): up to the flush position (or ``upto_lsn``), at most about
    ``upto_nchanges`` messages (whole transactions, so possibly more), and only those
    ending after ``after_lsn`` (already delivered but not yet confirmed ones are left out, their
    changes not even parsed: ``after_lsn`` is a record boundary, a transaction's end or an
    insert position, so a commit record starting before it ends at or before it).
    Called by the coordinator's reader thread."""
    check_simple_name("replication slot", slot)
    check_simple_name("publication", publication)
    if upto_nchanges is not None and upto_nchanges < 1:
        raise ValueError(f"upto_nchanges must be >= 1 or None, got {upto_nchanges}")
    limit = current_flush_lsn(conn) if upto_lsn is None else upto_lsn
    try:
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
            "'proto_version', %s, 'publication_names', %s)",
            (slot, lsn_to_text(limit), upto_nchanges, PROTO_VERSION, publication)).fetchall()
    except psycopg.Error as e:
        raise _slot_error(e, slot, publication) from None
    decoder = Decoder()
    transactions = list(decoder.transactions((bytes(row[0]) for row in rows), after_lsn))
    if decoder.in_transaction:
        raise SlotProblem(f"replication slot {slot!r}: a peek ended inside a transaction "
                          "(the server returns whole transactions)")
    cut_short = upto_nchanges is not None and len(rows) >= upto_nchanges
    last_end = decoder.last_end_lsn
    read_to = last_end if cut_short else max(limit, last_end)
    return Peek(tuple(t for t in transactions if t.end_lsn > after_lsn), limit, read_to,
                cut_short, len(rows))


def advance(conn: psycopg.Connection[Any], slot: str, lsn: int) -> int:
    """Confirm ``slot`` up to ``lsn`` (rules 1, 2 and 5): the server may then drop the WAL
    before it. Returns the slot's confirmed position afterwards. Called only once the batch
    holding every change before ``lsn`` committed (the coordinator's checkpoint
    notification)."""
    check_simple_name("replication slot", slot)
    info = slot_info(conn, slot)
    if info is None:
        raise SlotProblem(f"replication slot {slot!r} does not exist (was it dropped?): "
                          "cannot confirm its position")
    confirmed = info.confirmed_flush_lsn or 0
    if lsn <= confirmed:
        return confirmed
    try:
        row = one_row(conn, "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)",
                   (slot, lsn_to_text(lsn)))
    except psycopg.Error as e:
        raise _slot_error(e, slot) from None
    return lsn_from_text(row[0])


def held_wal_bytes(conn: psycopg.Connection[Any], slot: str) -> int | None:
    """How much WAL the slot keeps (from its restart position to the write position)."""
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 "
                       "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])
