"""The creation of a logical replication slot, watched (replication.py rule 7): which
transactions it waits for, named in a WARNING and in the source's status.

Rules:
  1. Creating a logical slot waits until every transaction that holds a transaction id when
     it starts has ended (PostgreSQL's logical decoding needs a consistent starting point),
     however long that is, with nothing in its own session to show it. So the creation is
     watched (:class:`SlotCreationWatch`) from another connection on a thread of its own:
     after ``warn_after_s`` and again while it waits, it asks ``pg_stat_activity`` which
     backends it waits for (those holding an xid, and those ``pg_blocking_pids`` names) and,
     when they changed, logs a WARNING naming each (pid, application, user, state, when its
     transaction started, its query cut short, masked from the word PASSWORD on) and reports the
     same text to the caller (the enumerator's status). The watch never blocks the creation
     nor the coordinator's mailbox, and a watch that cannot ask says so at DEBUG only.

Thread model: a :class:`SlotCreationWatch` is entered by the thread that creates the slot and
runs on a daemon thread of its own, with a connection of its own.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import psycopg

log = logging.getLogger("sparkcoord.sources.postgres")

#: how long a slot creation waits before it is named a wait (rule 1)
SLOT_WAIT_WARN_S = 5.0
#: how much of a blocking backend's query a warning shows (rule 1)
QUERY_SHOWN = 120


@dataclass(frozen=True, slots=True)
class Backend:
    """A backend a slot creation waits for (rule 1), as ``pg_stat_activity`` shows it to the
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
    """A backend's query as a warning shows it (rule 1): one line, cut to
    :data:`QUERY_SHOWN` characters, everything after the word ``PASSWORD`` masked."""
    line = " ".join(_AFTER_PASSWORD.sub(r"\1 ***", query).split())
    return line if len(line) <= QUERY_SHOWN else line[:QUERY_SHOWN - 3] + "..."


def slot_creation_blockers(conn: psycopg.Connection[Any], creator_pid: int
                           ) -> tuple[Backend, ...]:
    """The backends a slot creation by ``creator_pid`` waits for (rule 1): those that hold a
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
    """What a WARNING and the status say of a slot creation that waits (rule 1)."""
    return (f"creating the replication slot {slot!r} waits for "
            f"{len(blockers)} transaction(s) holding a transaction id to end (PostgreSQL's "
            "logical decoding waits for every transaction open when a slot is created): "
            + "; ".join(b.describe() for b in blockers)
            + ". Commit or roll them back (or end a backend: SELECT pg_terminate_backend(pid))")


class SlotCreationWatch:
    """Watches one slot creation from another connection (rule 1), as a context manager held
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
                except Exception:  # noqa: BLE001 - the watch only informs (rule 1)
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
