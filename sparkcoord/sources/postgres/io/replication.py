"""The replication slot and the publication, through PostgreSQL's SQL functions: make sure
they exist, read changes without consuming them, and confirm what a committed batch holds.

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
  6. What is missing is created, what exists is checked, and what cannot be done is an error
     naming the role and the right it lacks: a logical slot needs the REPLICATION attribute
     (or superuser); a publication FOR TABLE needs ownership of each table (or superuser)
     and CREATE on the database. An existing slot must be a logical ``pgoutput`` slot of
     this database whose WAL is still there; an existing publication must publish every
     captured table (we never alter a publication someone else made).

  7. Creating a logical slot waits until every transaction that holds a transaction id when
     it starts has ended (PostgreSQL's logical decoding needs a consistent starting point),
     however long that is, with nothing in its own session to show it. So the creation is
     watched (:class:`SlotCreationWatch`) from another connection on a thread of its own:
     after ``warn_after_s`` and again while it waits, it asks ``pg_stat_activity`` which
     backends it waits for (those holding an xid, and those ``pg_blocking_pids`` names) and,
     when they changed, logs a WARNING naming each (pid, application, user, state, when its
     transaction started, its query cut short, masked from the word PASSWORD on) and reports the
     same text to the caller (the enumerator's status). The watch never blocks the creation
     nor the coordinator's mailbox, and a watch that cannot ask says so at DEBUG only.

Thread model: each function uses the connection it is given (autocommit), in the calling
thread: the coordinator's reader thread for peeks and the slot, the enumerator's for the
publication, the thread that learns of a committed batch for :func:`advance`; a
:class:`SlotCreationWatch` runs on a thread of its own with a connection of its own.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors

from sparkcoord.sources.postgres.core.names import TableName, check_simple_name, quote_ident
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
from sparkcoord.sources.postgres.io.catalog import composed

if TYPE_CHECKING:
    from typing_extensions import LiteralString

log = logging.getLogger("sparkcoord.sources.postgres")

PLUGIN = "pgoutput"
PROTO_VERSION = "1"
#: how long a slot creation waits before it is named a wait (rule 7)
SLOT_WAIT_WARN_S = 5.0
#: how much of a blocking backend's query a warning shows (rule 7)
QUERY_SHOWN = 120


@dataclass(frozen=True, slots=True)
class RoleRights:
    role: str
    superuser: bool
    replication: bool


@dataclass(frozen=True, slots=True)
class SlotInfo:
    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    wal_status: str | None
    active: bool


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


def _lsn(text: str | None) -> int | None:
    return None if text is None else lsn_from_text(text)


def _one(conn: psycopg.Connection[Any], statement: LiteralString,
         params: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """The one row a query of the catalog returns."""
    row = conn.execute(statement, params).fetchone()
    if row is None:
        raise PostgresSourceError(f"no row from {statement!r}")
    return tuple(row)


def role_rights(conn: psycopg.Connection[Any]) -> RoleRights:
    """The session's role and its SUPERUSER and REPLICATION attributes."""
    row = _one(conn, "SELECT rolname, rolsuper, rolreplication FROM pg_roles "
                     "WHERE rolname = current_user")
    return RoleRights(row[0], bool(row[1]), bool(row[2]))


def current_wal_lsn(conn: psycopg.Connection[Any]) -> int:
    """The WAL write position (``pg_current_wal_lsn()``)."""
    return lsn_from_text(_one(conn, "SELECT pg_current_wal_lsn()::text")[0])


def current_insert_lsn(conn: psycopg.Connection[Any]) -> int:
    """The WAL insert position (``pg_current_wal_insert_lsn()``): the end of the last WAL
    record reserved, a record boundary, so no commit record starts before it and ends after
    it; what the stream reads up to (enumerator.py rule 5)."""
    return lsn_from_text(_one(conn, "SELECT pg_current_wal_insert_lsn()::text")[0])


def current_flush_lsn(conn: psycopg.Connection[Any]) -> int:
    """The WAL flush position (``pg_current_wal_flush_lsn()``), the most a peek reads
    (rule 3)."""
    return lsn_from_text(_one(conn, "SELECT pg_current_wal_flush_lsn()::text")[0])


# -- the slot -------------------------------------------------------------------------------


def slot_info(conn: psycopg.Connection[Any], slot: str) -> SlotInfo | None:
    """The slot named ``slot``, or None when there is none."""
    row = conn.execute(
        "SELECT slot_name, plugin, slot_type, database, confirmed_flush_lsn::text, "
        "restart_lsn::text, wal_status, active FROM pg_replication_slots "
        "WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return None
    return SlotInfo(row[0], row[1], row[2], row[3], _lsn(row[4]), _lsn(row[5]), row[6],
                    bool(row[7]))


def _need_replication(conn: psycopg.Connection[Any], what: str) -> None:
    rights = role_rights(conn)
    if not (rights.superuser or rights.replication):
        raise MissingRights(
            f"role {rights.role!r} lacks the REPLICATION attribute, needed to {what} "
            f"(ALTER ROLE {quote_ident(rights.role)} REPLICATION, run by a superuser)")


def ensure_slot(conn: psycopg.Connection[Any], slot: str,
                watch: Callable[[int], AbstractContextManager[Any]] | None = None) -> bool:
    """Make sure the logical slot ``slot`` exists and fits (rule 6); True when it was created
    now. ``watch(pid)``, given the creating session's backend pid, is held around the creation
    (rule 7: :class:`SlotCreationWatch`). Called by the enumerator's planning worker when the
    source starts (and by tests)."""
    check_simple_name("replication slot", slot)
    database = _one(conn, "SELECT current_database()")[0]
    info = slot_info(conn, slot)
    if info is None:
        _need_replication(conn, f"create the logical replication slot {slot!r}")
        try:
            with (watch(conn.info.backend_pid) if watch is not None else nullcontext()):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)",
                             (slot, PLUGIN))
            return True
        except pg_errors.DuplicateObject:
            info = slot_info(conn, slot)  # made by someone else in between: check it
            if info is None:
                raise
        except pg_errors.InsufficientPrivilege as e:
            raise _rights_error(conn, f"create the logical replication slot {slot!r}",
                                e) from None
    _check_slot(info, slot, database)
    return False


@dataclass(frozen=True, slots=True)
class Backend:
    """A backend a slot creation waits for (rule 7), as ``pg_stat_activity`` shows it to the
    role (another role's backend shows its pid only, without ``pg_read_all_stats``)."""

    pid: int
    application_name: str | None
    user: str | None
    state: str | None
    xact_start: str | None
    query: str | None

    def describe(self) -> str:
        """The backend in a line: pid, application, user, state, transaction start, query."""
        parts = [f"application {self.application_name!r}" if self.application_name else "",
                 f"user {self.user!r}" if self.user else "",
                 f"state {self.state!r}" if self.state else "",
                 f"transaction started {self.xact_start}" if self.xact_start else "",
                 f"query {shown_query(self.query)!r}" if self.query else ""]
        details = ", ".join(p for p in parts if p)
        return f"pid {self.pid}" + (f" ({details})" if details else "")


_AFTER_PASSWORD = re.compile(r"(?is)\b(password)\b.*")


def shown_query(query: str) -> str:
    """A backend's query as a warning shows it (rule 7): one line, cut to
    :data:`QUERY_SHOWN` characters, everything after the word ``PASSWORD`` masked."""
    line = " ".join(_AFTER_PASSWORD.sub(r"\1 ***", query).split())
    return line if len(line) <= QUERY_SHOWN else line[:QUERY_SHOWN - 3] + "..."


def slot_creation_blockers(conn: psycopg.Connection[Any], creator_pid: int
                           ) -> tuple[Backend, ...]:
    """The backends a slot creation by ``creator_pid`` waits for (rule 7): those that hold a
    transaction id, and those its lock wait is blocked by, oldest transaction first. Called
    by a :class:`SlotCreationWatch`'s thread on its own connection."""
    rows = conn.execute(
        "SELECT pid, application_name, usename, state, "
        "to_char(xact_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS \"UTC\"'), query "
        "FROM pg_stat_activity WHERE pid <> %s AND (backend_xid IS NOT NULL "
        "OR pid = ANY(pg_blocking_pids(%s))) ORDER BY xact_start NULLS LAST, pid",
        (creator_pid, creator_pid)).fetchall()
    return tuple(Backend(int(r[0]), r[1] or None, r[2], r[3], r[4], r[5] or None)
                 for r in rows)


def slot_wait_text(slot: str, blockers: Sequence[Backend]) -> str:
    """What a WARNING and the status say of a slot creation that waits (rule 7)."""
    return (f"creating the replication slot {slot!r} waits for "
            f"{len(blockers)} transaction(s) holding a transaction id to end (PostgreSQL's "
            "logical decoding waits for every transaction open when a slot is created): "
            + "; ".join(b.describe() for b in blockers)
            + ". Commit or roll them back (or end a backend: SELECT pg_terminate_backend(pid))")


class SlotCreationWatch:
    """Watches one slot creation from another connection (rule 7), as a context manager held
    around it: on entry a daemon thread starts; it waits ``warn_after_s``, then asks which
    backends the creation waits for (:func:`slot_creation_blockers`) every ``warn_after_s``
    until the creation ends, and when they changed logs a WARNING and calls ``report`` with
    :func:`slot_wait_text` and their pids (``report(None, ())`` once the creation ended after a
    wait). Entered by
    the thread that creates the slot (the enumerator's planning worker); ``report`` is called
    on the watch's thread."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], slot: str,
                 creator_pid: int, *, warn_after_s: float = SLOT_WAIT_WARN_S,
                 report: Callable[[str | None, tuple[int, ...]], None] | None = None) -> None:
        self.connect = connect
        self.slot = slot
        self.creator_pid = creator_pid
        self.warn_after_s = warn_after_s
        self.report = report
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparkcoord-slot-watch",
                                        daemon=True)
        self.warned = False
        self._created = False

    def __enter__(self) -> SlotCreationWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._created = kind is None
        self._done.set()  # wakes the watch's thread, which ends; nothing waits for it

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        seen: tuple[int, ...] = ()
        try:
            while not self._done.wait(self.warn_after_s):
                try:
                    conn = conn if conn is not None and not conn.closed else self.connect()
                    blockers = slot_creation_blockers(conn, self.creator_pid)
                except Exception:  # noqa: BLE001 - the watch only informs (rule 7)
                    log.debug("watching the creation of slot %r failed", self.slot,
                              exc_info=True)
                    continue
                pids = tuple(b.pid for b in blockers)
                if not pids or pids == seen or self._done.is_set():
                    continue
                seen = pids
                text = slot_wait_text(self.slot, blockers)
                self.warned = True
                if self.report is not None:
                    self.report(text, pids)
                log.warning("PostgreSQL source: %s", text)
            if self.warned:
                log.info("PostgreSQL source: the creation of replication slot %r ended (%s) "
                         "after it waited", self.slot,
                         "created" if self._created else "failed")
                if self.report is not None:
                    self.report(None, ())
        finally:
            if conn is not None:
                conn.close()


def _check_slot(info: SlotInfo, slot: str, database: str) -> None:
    if info.slot_type != "logical" or info.plugin != PLUGIN:
        raise SlotProblem(f"replication slot {slot!r} exists but is a {info.slot_type} slot of "
                          f"plugin {info.plugin!r}; the source needs a logical slot of "
                          f"{PLUGIN!r}: name another slot, or drop this one")
    if info.database != database:
        raise SlotProblem(f"replication slot {slot!r} belongs to database {info.database!r}, "
                          f"not {database!r}: a logical slot reads one database; name another "
                          "slot")
    if info.wal_status == "lost":
        raise SlotProblem(f"replication slot {slot!r} has lost WAL it needs (wal_status "
                          "'lost', max_slot_wal_keep_size was exceeded): changes after its "
                          "confirmed position are gone; drop the slot and start again with a "
                          "snapshot")


def _rights_error(conn: psycopg.Connection[Any], what: str, error: Exception) -> MissingRights:
    role = _one(conn, "SELECT current_user")[0]
    primary = getattr(getattr(error, "diag", None), "message_primary", None) or str(error)
    return MissingRights(f"role {role!r} may not {what}: {primary}")


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
        row = _one(conn, "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)",
                   (slot, lsn_to_text(lsn)))
    except psycopg.Error as e:
        raise _slot_error(e, slot) from None
    return lsn_from_text(row[0])


def drop_slot(conn: psycopg.Connection[Any], slot: str) -> bool:
    """Drop ``slot`` if it exists; True when it did. For tests and the operator's clean-up."""
    check_simple_name("replication slot", slot)
    if slot_info(conn, slot) is None:
        return False
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return True


def held_wal_bytes(conn: psycopg.Connection[Any], slot: str) -> int | None:
    """How much WAL the slot keeps (from its restart position to the write position)."""
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 "
                       "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


# -- the publication ------------------------------------------------------------------------


def published_tables(conn: psycopg.Connection[Any], publication: str) -> set[TableName] | None:
    """The tables ``publication`` publishes, or None when it does not exist."""
    row = conn.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s",
                       (publication,)).fetchone()
    if row is None:
        return None
    return {TableName(schema, name) for schema, name in conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
        (publication,)).fetchall()}


def ensure_publication(conn: psycopg.Connection[Any], publication: str, tables: Sequence[TableName]) -> bool:
    """Make sure ``publication`` exists and publishes every table of ``tables`` (rule 6);
    True when it was created now. Called by the enumerator when the source starts."""
    check_simple_name("publication", publication)
    if not tables:
        raise ValueError("a publication needs at least one table")
    present = published_tables(conn, publication)
    if present is not None:
        missing = [t for t in tables if t not in present]
        if missing:
            names = ", ".join(str(t) for t in missing)
            raise PublicationProblem(
                f"publication {publication!r} exists but does not publish {names}: add them "
                f"(ALTER PUBLICATION {quote_ident(publication)} ADD TABLE "
                f"{', '.join(t.sql for t in missing)}) or name another publication")
        return False
    role = _one(conn, "SELECT current_user")[0]
    for table in tables:
        row = conn.execute(
            "SELECT pg_has_role(current_user, c.relowner, 'USAGE'), "
            "pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = to_regclass(%s)",
            (table.sql,)).fetchone()
        if row is None:
            raise PostgresSourceError(f"table {table} does not exist (or role {role!r} cannot "
                                      "see it)")
        if not row[0]:
            raise MissingRights(
                f"role {role!r} may not create publication {publication!r}: it does not own "
                f"table {table} (owned by {row[1]!r}); a publication FOR TABLE needs ownership "
                "of each table or superuser: have the owner or a superuser create it "
                f"(CREATE PUBLICATION {quote_ident(publication)} FOR TABLE "
                f"{', '.join(t.sql for t in tables)})")
    if not _one(conn, "SELECT has_database_privilege(current_database(), 'CREATE')"
                        )[0]:
        database = _one(conn, "SELECT current_database()")[0]
        raise MissingRights(f"role {role!r} may not create publication {publication!r}: it "
                            f"lacks the CREATE right on database {database!r} (GRANT CREATE "
                            f"ON DATABASE {quote_ident(database)} TO {quote_ident(role)})")
    try:
        conn.execute(composed(f"CREATE PUBLICATION {quote_ident(publication)} FOR TABLE "
                              f"{', '.join(t.sql for t in tables)}"))
    except pg_errors.DuplicateObject:
        return ensure_publication(conn, publication, tables)  # made by someone else meanwhile
    except pg_errors.InsufficientPrivilege as e:
        raise _rights_error(conn, f"create publication {publication!r}", e) from None
    return True
