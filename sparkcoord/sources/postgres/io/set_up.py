"""The replication slot and the publication, set up: what is missing is created, what exists
is checked (replication.py rule 6), and the slot dropped when asked.

Rules:
  1. What is missing is created, what exists is checked, and what cannot be done is an error
     naming the role and the right it lacks: a logical slot needs the REPLICATION attribute
     (or superuser); a publication FOR TABLE needs ownership of each table (or superuser)
     and CREATE on the database. An existing slot must be a logical ``pgoutput`` slot of
     this database whose WAL is still there; an existing publication must publish every
     captured table (we never alter a publication someone else made).
  2. A slot or a publication made by someone else between our check and our creation is
     checked as an existing one.
  3. The creation of a slot may wait for a long time (slot_watch.py rule 1): the caller
     gives a watch, held around the creation.

Thread model: each function uses the connection it is given (autocommit), in the calling
thread: the enumerator's planning worker for the slot and the publication (and tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors

from sparkcoord.sources.postgres.core.names import TableName, check_simple_name, quote_ident
from sparkcoord.sources.postgres.core.pgoutput import lsn_from_text
from sparkcoord.sources.postgres.errors import (
    MissingRights,
    PostgresSourceError,
    PublicationProblem,
    SlotProblem,
)
from sparkcoord.sources.postgres.io.catalog import composed

if TYPE_CHECKING:
    from typing_extensions import LiteralString

PLUGIN = "pgoutput"


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


def _lsn(text: str | None) -> int | None:
    return None if text is None else lsn_from_text(text)


def one_row(conn: psycopg.Connection[Any], statement: LiteralString,
         params: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """The one row a query of the catalog returns."""
    row = conn.execute(statement, params).fetchone()
    if row is None:
        raise PostgresSourceError(f"no row from {statement!r}")
    return tuple(row)


def role_rights(conn: psycopg.Connection[Any]) -> RoleRights:
    """The session's role and its SUPERUSER and REPLICATION attributes."""
    row = one_row(conn, "SELECT rolname, rolsuper, rolreplication FROM pg_roles "
                     "WHERE rolname = current_user")
    return RoleRights(row[0], bool(row[1]), bool(row[2]))


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
    """Make sure the logical slot ``slot`` exists and fits (rules 1 and 2); True when it was
    created now. ``watch(pid)``, given the creating session's backend pid, is held around the
    creation (rule 3: slot_watch.py's :class:`SlotCreationWatch`). Called by the enumerator's
    planning worker when the source starts (and by tests)."""
    check_simple_name("replication slot", slot)
    database = one_row(conn, "SELECT current_database()")[0]
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
    role = one_row(conn, "SELECT current_user")[0]
    primary = getattr(getattr(error, "diag", None), "message_primary", None) or str(error)
    return MissingRights(f"role {role!r} may not {what}: {primary}")


def drop_slot(conn: psycopg.Connection[Any], slot: str) -> bool:
    """Drop ``slot`` if it exists; True when it did. For tests and the operator's clean-up."""
    check_simple_name("replication slot", slot)
    if slot_info(conn, slot) is None:
        return False
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return True


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
    """Make sure ``publication`` exists and publishes every table of ``tables`` (rules 1 and 2);
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
    role = one_row(conn, "SELECT current_user")[0]
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
    if not one_row(conn, "SELECT has_database_privilege(current_database(), 'CREATE')"
                        )[0]:
        database = one_row(conn, "SELECT current_database()")[0]
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
