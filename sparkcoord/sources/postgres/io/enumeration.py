"""The PostgreSQL source enumerator's I/O: what the enumerator asks of the server (the port,
:class:`EnumeratorIO`) and its implementation against a server (:class:`PostgresEnumeratorIO`).

Rules:
  1. Every call runs off the enumerator's mailbox, on a ``call_async`` lane of its own
     (enumerator.py rule 1): ``set_up`` and ``plan`` on the planning lane, ``advance``,
     ``unpublished`` and ``insert_position`` on the slot lane; never two calls of one lane at
     once. Each lane has a connection of its own, opened on first use in the worker that
     uses it.
  2. Every call is idempotent (ensure, read, advance never backwards), so a call whose
     connection the server closed (a restart) is made again, once, on a new connection;
     opening waits for the server (connection.py rule 4).
  3. Where the options were unpickled (Spark's source runner) they hold no password: libpq's
     environment supplies it (connection.py rule 2).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sparkcoord.sources.postgres.core.chunks import Chunk, PlannerState
from sparkcoord.sources.postgres.core.names import TableName

log = logging.getLogger("sparkcoord.sources.postgres")

#: what the set-up's I/O reports of a wait (enumerator.py rule 8): its text and the pids
#: waited for
WaitReport = Callable[[str | None, tuple[int, ...]], None]


class EnumeratorIO(abc.ABC):
    """The enumerator's I/O (rule 1). Thread model: ``set_up`` and ``plan`` on the planning
    lane, ``advance``, ``unpublished`` and ``insert_position`` on the slot lane; never two
    calls of one lane at once."""

    @abc.abstractmethod
    def set_up(self, tables: Sequence[TableName], snapshot: bool) -> dict[TableName, PlannerState]:
        """Make sure the publication and the slot exist (replication.py rule 6); with
        ``snapshot``, each table's fresh planner state (its chunk key checked)."""

    @abc.abstractmethod
    def plan(self, planners: dict[TableName, PlannerState], want: int
             ) -> tuple[list[Chunk], dict[TableName, PlannerState]]:
        """Up to ``want`` next chunks, the tables in order, and the planners after them."""

    @abc.abstractmethod
    def advance(self, lsn: int) -> int:
        """Confirm the slot at ``lsn``; the confirmed position afterwards."""

    @abc.abstractmethod
    def insert_position(self) -> int:
        """The WAL insert position now: the stream's next bound (enumerator.py rule 5)."""

    @abc.abstractmethod
    def unpublished(self, tables: Sequence[TableName]) -> tuple[TableName, ...]:
        """Those of ``tables`` the publication no longer publishes (dropped, or taken out of
        it; all of them when the publication was dropped): enumerator.py rule 7."""

    def report_waits(self, report: WaitReport) -> None:  # noqa: B027 - optional
        """Have ``report`` called (on any thread) with what the set-up waits for and the pids
        of the backends it waits for, and ``(None, ())`` once it no longer waits
        (replication.py rule 7); optional: an I/O that never waits has nothing to report.
        Called by the enumerator's worker that makes the I/O."""

    def close(self) -> None:  # noqa: B027 - optional: an I/O without connections has none
        """Release connections (any thread)."""


class PostgresEnumeratorIO(EnumeratorIO):
    """The enumerator's I/O against a server: one connection for planning and one for the
    slot, each opened on first use in the worker that uses it (rules 1-3). A connection the
    server closed (a restart) is opened again and the call made again, once: every call here
    is idempotent (ensure, read, advance never backwards), and opening waits for the server
    (connection.py rule 4). Where the options were unpickled (Spark's source runner) they hold
    no password: libpq's environment supplies it (connection.py rule 2)."""

    def __init__(self, options: Any, slot: str, publication: str, chunk_size: int,
                 chunk_key_columns: dict[TableName, str] | None = None, *,
                 slot_wait_warn_s: float | None = None) -> None:
        from sparkcoord.sources.postgres.io.slot_watch import SLOT_WAIT_WARN_S

        self.options = options
        self.slot = slot
        self.publication = publication
        self.chunk_size = chunk_size
        self.chunk_key_columns = dict(chunk_key_columns or {})
        #: how long the slot's creation waits before it is named a wait (enumerator.py
        #: rule 8)
        self.slot_wait_warn_s = SLOT_WAIT_WARN_S if slot_wait_warn_s is None else slot_wait_warn_s
        self._report_wait: WaitReport | None = None
        self._conns: dict[str, Any] = {}

    def report_waits(self, report: WaitReport) -> None:
        self._report_wait = report

    def _watch_slot_creation(self, creator_pid: int) -> Any:
        """Rule 8: the slot's creation watched from a connection of its own."""
        from sparkcoord.sources.postgres.io.slot_watch import SlotCreationWatch

        return SlotCreationWatch(
            lambda: self.options.connect(application_name="sparkcoord-cdc-watch", retry_s=0.0),
            self.slot, creator_pid, warn_after_s=self.slot_wait_warn_s,
            report=self._report_wait)

    def _call(self, role: str, action: Callable[[Any], Any]) -> Any:
        """``action(connection)`` on the ``role`` connection ("planner" or "slot"), again on a
        new connection if the server closed this one."""
        import psycopg

        from sparkcoord.sources.postgres.io.connection import RECONNECT_S

        for attempt in (1, 2):
            conn = self._conns.get(role)
            if conn is None or conn.closed:
                conn = self._conns[role] = self.options.connect(
                    application_name=f"sparkcoord-cdc-{role}", retry_s=RECONNECT_S)
            try:
                return action(conn)
            except psycopg.OperationalError as e:
                self._drop(role)
                if attempt == 2:
                    raise
                log.warning("PostgreSQL source: the %s connection to %s was lost (%s); "
                            "connecting again", role, self.options.describe(),
                            self.options.scrub(str(e)).strip().splitlines()[0])
        raise AssertionError("unreachable")

    def _drop(self, role: str) -> None:
        conn = self._conns.pop(role, None)
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                log.debug("closing a PostgreSQL connection failed", exc_info=True)

    def set_up(self, tables: Sequence[TableName], snapshot: bool) -> dict[TableName, PlannerState]:
        from sparkcoord.sources.postgres.core.splits import TableShape
        from sparkcoord.sources.postgres.io import catalog, replication

        def work(conn: Any) -> dict[TableName, PlannerState]:
            planners: dict[TableName, PlannerState] = {}
            for table in tables:
                shape = TableShape.of(catalog.table_info(conn, table),
                                      self.chunk_key_columns.get(table))
                planners[table] = PlannerState(table, shape.chunk_key_column, self.chunk_size)
            replication.ensure_publication(conn, self.publication, list(tables))
            replication.ensure_slot(conn, self.slot, watch=self._watch_slot_creation)
            return planners if snapshot else {}

        result: dict[TableName, PlannerState] = self._call("planner", work)
        return result

    def plan(self, planners: dict[TableName, PlannerState], want: int
             ) -> tuple[list[Chunk], dict[TableName, PlannerState]]:
        from sparkcoord.sources.postgres.core.chunks import ChunkPlanner
        from sparkcoord.sources.postgres.io import catalog

        def work(conn: Any) -> tuple[list[Chunk], dict[TableName, PlannerState]]:
            out: list[Chunk] = []
            after = dict(planners)
            for table, state in planners.items():
                if state.done:
                    continue
                planner = ChunkPlanner.restored(state)
                while len(out) < want:
                    chunk = catalog.next_chunk(conn, planner)
                    if chunk is None:
                        break
                    out.append(chunk)
                after[table] = planner.state
                if len(out) >= want:
                    break
            return out, after

        result: tuple[list[Chunk], dict[TableName, PlannerState]] = self._call("planner", work)
        return result

    def advance(self, lsn: int) -> int:
        from sparkcoord.sources.postgres.io import replication
        from sparkcoord.sources.postgres.io.waits import while_slot_busy

        def work(conn: Any) -> int:
            confirmed: int = while_slot_busy(
                lambda: replication.advance(conn, self.slot, lsn), 60.0, "confirming the slot")
            return confirmed

        result: int = self._call("slot", work)
        return result

    def insert_position(self) -> int:
        from sparkcoord.sources.postgres.io import replication

        result: int = self._call("slot", replication.current_insert_lsn)
        return result

    def unpublished(self, tables: Sequence[TableName]) -> tuple[TableName, ...]:
        from sparkcoord.sources.postgres.io import replication

        present = self._call("slot", lambda conn: replication.published_tables(
            conn, self.publication))
        return tuple(t for t in tables if present is None or t not in present)

    def close(self) -> None:
        for role in list(self._conns):
            self._drop(role)
