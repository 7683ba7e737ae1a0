"""The PostgreSQL source's enumerator: plans the snapshot's chunks off the mailbox, hands them to
readers, records each chunk's high watermark, hands out the stream once the snapshot is
complete and checkpointed, and confirms the slot only after the batch holding the changes
committed.

Rules:
  1. Every piece of I/O (creating the slot and the publication, asking the catalog, planning
     chunk boundaries, advancing the slot) runs off the mailbox (``call_async``, on the lanes
     ``planning`` and ``slot``, a connection each), one cycle at a time each: a table of any size
     never delays a checkpoint. A planning cycle plans at most as many chunks as keep
     ``plan_ahead`` chunks pending (chunks.py rule 1: one boundary query per chunk), so the
     pending list stays small and planning follows the readers.
  2. What a worker found joins the state only at a checkpoint boundary
     (``checkpoint_coordinator``), as the split framework's discovery does (sources/
     enumerator.py rule 2): answers to requests are a function of the checkpointed state and
     the logged requests, so a restore that replays a batch's requests answers the same. The
     planners' frontiers, the pending chunks and each table's chunk boundaries change
     together there, so a restore neither loses nor repeats a chunk: pending chunks go out
     again from the state, chunks in flight stay with the readers that have them (their
     state), planning resumes at the frontier. One boundary waits for a worker: the first
     one while the set-up's cycle (publication, slot, the first chunks) runs, for up to
     ``first_boundary_wait_s`` (1 s), so the run's first batch reads chunks instead of
     finding none (docs/decisions/077-cdc-fewer-batches.md); it completes from the mailbox
     when the cycle's result or the timer comes, and a slower set-up joins at the next boundary
     as any cycle does.
  3. A reader reports a finished chunk with its high watermark in a later batch's request
     (splits.py rule 3); the enumerator records it in the table's :class:`ChunkProgress`
     (watermarks.py rule 6). At the first boundary ``k`` after every chunk of every table is
     planned and reported, the state builds the :class:`StreamSplit` (the map, and the least
     high watermark as the start) and drops the per-chunk progress; the stream goes out to
     the first reader that asks in the batch of ``k`` or a later one (``epoch >= k``): the
     reports arrived in requests of batches before ``k``, and Spark runs batch ``k`` only
     after those batches committed, so every snapshot row is in the sink and every report
     is in a completed checkpoint before the stream is read (Flink CDC waits for the same;
     before docs/decisions/077-cdc-fewer-batches.md the stream waited for batch ``k + 1``, a
     batch that did nothing). Once handed out, the map lives in the reader only; the
     enumerator's state is a few numbers (watermarks.py rule 5).
     Startup mode ``latest`` reads no snapshot: the stream (no map, from the slot's confirmed
     position) goes out in the batch of the first boundary at which the slot exists.
  4. The slot is confirmed (``replication.advance``) only in ``notify_checkpoint_complete``:
     the position a :class:`NextStreamRead` reported in the batch of epoch ``e`` (where the
     reader's previous batch read to) is confirmed once a checkpoint ``>= e`` is notified
     committed, never before. The stream reader reports at every batch, also when the
     tables are idle (it then read to the bound it was given: replication.py rule 4), so a
     quiet publication holds WAL for no longer than about two batches. Nothing is confirmed during
     the snapshot: chunk reads peek the slot from the position it had when the source
     started, and the stream needs every transaction after the least high watermark. The
     batch that hands the stream out confirms its start (the least high watermark) once it
     commits: everything before it is in the snapshot, committed before that batch ran, and
     a peek reads from the confirmed position, so a stream that starts far behind would
     otherwise re-read what it skips at every batch.
  5. How far the stream reads (splits.py rule 5): every ``poll_interval_s`` once the stream
     is built, the enumerator learns the WAL insert position on the slot lane (a record
     boundary, so confirming it never skips a commit record that straddles it) and asks for
     a batch when it moved (an idle database runs no batches); the position joins the state
     at the next boundary (rule 2) as the stream's bound, and each :class:`NextStreamRead`
     is answered with it (a :class:`StreamBound`).
     So changes arrive within about a poll interval plus a batch, an idle publication still
     confirms the slot while anything else in the database is written (rule 4; where nothing
     is, the last batch's report waits for the next write), and a batch that runs again
     reads the same transactions.
     The stream reader asks for the next batch itself when its read stopped short of the
     bound (``max_changes_per_batch``). In an ``availableNow`` run
     (``CoordinatorContext.available_now``) there is no polling: the enumerator learns the
     insert position once, when the run starts, and that is the bound; it asks for batches
     until the stream reader reports a position at or past it (a report arrives a batch
     after its read, rule 4), so a run that ends has read every transaction committed before
     it started. The confirmation of the run's last batch then waits for the next run.
  6. A task retry that withdraws requests (``handle_items_withdrawn``) puts what their
     answers handed out back: chunks to the front of the pending list, the stream split to be
     handed out again; finished reports it withdrew are undone (the chunk is in flight to the
     subtask again, which reports it again). A withdrawn stream report is forgotten (its
     epoch's position is then confirmed by a later report: never too far).
  7. The stream stops at a position ``P`` with an error: the source fails the job when the
     stream reader reports it read to ``P`` or past it. That report comes in the batch after
     the read, which Spark runs only once the read's batch committed, so every change before
     ``P`` is in the sink first; nothing is confirmed past what the sink holds, and a
     restart finds the same and stops at the same point. Two things set a stop (the
     earlier ``P`` wins):
     a captured table the publication no longer publishes (dropped, or taken out of it) is
     found by the poll, which asks for the published tables before the insert position
     ``P``: every change the table had is before ``P`` (a ``PublicationProblem`` naming the
     tables). While a stop waits every poll asks for a batch (nothing else may be written to
     move the insert position). The check starts once the stream is built: before, the
     publication may not exist yet (the set-up creates it on the other worker, at the same
     time as an ``availableNow`` run's first poll);
     a captured table that changed shape (reader.py rule 4): the reader stopped its read
     before the first change of the new shape, at ``P``, and its next batch reports ``P``
     with the reason (``NextStreamRead.stopped``), so the job fails at that report (a
     ``SchemaChanged`` naming the table, the change and the way on).
  8. The set-up's slot creation can wait for other sessions' transactions for as long as
     they stay open (replication.py rule 7). The I/O watches it from a connection and thread
     of its own and reports what it waits for; the report is posted to the mailbox and the
     status shows it (``waiting``) until the creation ended. Nothing waits for it on the
     mailbox.

Thread model: every callback on the coordinator's mailbox; the :class:`EnumeratorIO`'s
``set_up``/``plan`` on the lane ``planning`` and ``advance``, ``unpublished`` and
``insert_position`` on the lane ``slot`` (``call_async``), each one call at a time, their
results posted back to the mailbox.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.coordinator import CoordinatorContext, OperatorCoordinator, Withdrawn
from sparkcoord.core.encoding import encoded
from sparkcoord.sources.postgres.core.chunks import Chunk, PlannerState
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.splits import (
    NextChunk,
    NextStreamRead,
    SnapshotChunk,
    StreamBound,
    StreamSplit,
)
from sparkcoord.sources.postgres.core.watermarks import ChunkProgress, StreamFilter
from sparkcoord.sources.splits import NoSplitNow

log = logging.getLogger("sparkcoord.sources.postgres")

INITIAL, LATEST = "initial", "latest"
STARTUP_MODES = (INITIAL, LATEST)

#: what the set-up's I/O reports of a wait (rule 8): its text and the pids waited for
WaitReport = Callable[[str | None, tuple[int, ...]], None]

#: the ``call_async`` lanes (rule 1): each keeps a connection of its own
PLANNING, SLOT = "planning", "slot"

#: how long the first boundary waits for the set-up's planning cycle (rule 2)
FIRST_BOUNDARY_WAIT_S = 1.0


def _ignored(result: Any, error: BaseException | None) -> None:
    """The handler of a release on close: nothing is left to do with its outcome."""


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
        """The WAL insert position now: the stream's next bound (rule 5)."""

    @abc.abstractmethod
    def unpublished(self, tables: Sequence[TableName]) -> tuple[TableName, ...]:
        """Those of ``tables`` the publication no longer publishes (dropped, or taken out of
        it; all of them when the publication was dropped): rule 7."""

    def report_waits(self, report: WaitReport) -> None:  # noqa: B027 - optional
        """Have ``report`` called (on any thread) with what the set-up waits for and the pids
        of the backends it waits for, and ``(None, ())`` once it no longer waits
        (replication.py rule 7); optional: an I/O that never waits has nothing to report.
        Called by the enumerator's worker that makes the I/O."""

    def close(self) -> None:  # noqa: B027 - optional: an I/O without connections has none
        """Release connections (any thread)."""


@encoded("postgres.CdcEnumeratorState")
@dataclass
class CdcEnumeratorState:
    """The enumerator's checkpointed state."""

    tables: tuple[TableName, ...]
    startup: str
    set_up: bool = False
    #: tables still being planned, in order
    planners: dict[TableName, PlannerState] = field(default_factory=dict)
    #: per table while the snapshot runs: boundaries and high watermarks (rule 3)
    progress: dict[TableName, ChunkProgress] = field(default_factory=dict)
    #: planned, not handed out, in key order
    pending: list[SnapshotChunk] = field(default_factory=list)
    #: split id -> (subtask, chunk), handed out and not reported finished
    in_flight: dict[str, tuple[int, SnapshotChunk]] = field(default_factory=dict)
    chunks_planned: int = 0
    chunks_finished: int = 0
    #: the checkpoint whose state first held the complete snapshot (rule 3)
    snapshot_done_at: int | None = None
    #: built, not handed out yet
    stream: StreamSplit | None = None
    stream_owner: int | None = None
    #: epoch -> the stream position reported in its batch, not yet confirmed (rule 4)
    reported: dict[int, int] = field(default_factory=dict)
    #: the slot's position as last confirmed (for status; rule 4)
    confirmed: int = 0
    #: how far the stream may read (rule 5): a WAL insert position learned before a boundary
    stream_bound: int = 0


@dataclass
class _Planned:
    set_up: bool
    planners: dict[TableName, PlannerState]
    chunks: list[Chunk]


class PostgresEnumerator(OperatorCoordinator):
    """The coordinator of a PostgreSQL source (module rules).

    Client requests: ``"status"`` (phase, chunks planned/finished/pending/in flight, whether the
    stream is out, the confirmed slot position, what the set-up waits for (rule 8), the
    state's size in entries)."""

    def __init__(self, context: CoordinatorContext, io: Callable[[], EnumeratorIO],
                 tables: Sequence[TableName], *, startup: str = INITIAL,
                 plan_ahead: int | None = None, max_chunks_per_batch: int | None = None,
                 poll_interval_s: float = 0.1,
                 first_boundary_wait_s: float = FIRST_BOUNDARY_WAIT_S) -> None:
        super().__init__(context)
        if startup not in STARTUP_MODES:
            raise ValueError(f"startup mode {startup!r}: expected one of "
                             f"{', '.join(STARTUP_MODES)}")
        if not tables:
            raise ValueError("name at least one table to capture")
        if max_chunks_per_batch is not None and max_chunks_per_batch < 1:
            raise ValueError(f"max_chunks_per_batch must be >= 1 or None, got "
                             f"{max_chunks_per_batch}")
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be positive, got {poll_interval_s}")
        self._make_io = io
        self.poll_interval_s = poll_interval_s
        self.first_boundary_wait_s = first_boundary_wait_s
        self.tables = tuple(tables)
        self.startup = startup
        # enough pending for two batches at the per-batch limit: planning joins at boundaries
        # (rule 2), so fewer would make the planner, not the readers, set the snapshot's pace
        self.plan_ahead = plan_ahead or max(16, 4 * context.parallelism,
                                            2 * (max_chunks_per_batch or 0))
        self.max_chunks_per_batch = max_chunks_per_batch
        self.state = CdcEnumeratorState(self.tables, startup)
        self._io: EnumeratorIO | None = None
        self._io_lock = threading.Lock()
        self._closed = False
        self._planning = False
        self._ready: list[_Planned] = []
        self._epoch = -1
        self._committed = -1
        #: chunks handed out in the running batch (``max_chunks_per_batch``)
        self._batch_chunks = 0
        #: chunks reported finished in the running batch, for a withdrawal (rule 6)
        self._finished_now: dict[str, SnapshotChunk] = {}
        self._advancing = False
        self._advance_target = 0
        self._confirmed = 0
        self._poll: Any = None
        self._learning = False
        #: the newest insert position learned, joining the state at the next boundary (rule 5)
        self._learned_bound = 0
        #: an availableNow run's end: the WAL insert position when it started (rule 5)
        self._run_end: int | None = None
        #: where the stream stops, and the error the job then fails with (rule 7)
        self._stop: tuple[int, Exception] | None = None
        #: the first boundary, waiting for the set-up's cycle (rule 2): id, future, timer
        self._deferred: tuple[int, Future[Any], Any] | None = None
        #: what the set-up waits for and the pids it waits for (rule 8), as the I/O reported
        self._waiting: tuple[str | None, tuple[int, ...]] = (None, ())

    # ------------------------------------------------------------------ lifecycle (mailbox)
    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        if state is None:
            state = CdcEnumeratorState(self.tables, self.startup)
        if not isinstance(state, CdcEnumeratorState):
            raise TypeError(f"enumerator {self.context.operator_id!r}: checkpointed state is a "
                            f"{type(state).__name__}, not a CdcEnumeratorState")
        if state.tables != self.tables or state.startup != self.startup:
            raise ValueError(
                f"enumerator {self.context.operator_id!r}: the checkpoint captures "
                f"{', '.join(map(str, state.tables))} (startup {state.startup!r}), the source "
                f"now {', '.join(map(str, self.tables))} (startup {self.startup!r}): start "
                "with a new checkpoint location, or name the same tables")
        self.state = state
        self._epoch = checkpoint_id
        self._committed = checkpoint_id - 1  # a restore point may be a batch that runs again
        self._confirmed = state.confirmed

    def start(self) -> None:
        if self._work_left():
            self.context.request_batch()
        self._plan_more()
        if self.context.available_now:
            self._learn_bound()
        else:
            self._poll = self.context.call_periodically(self.poll_interval_s, self._polled)

    def close(self) -> None:
        self._closed = True
        if self._poll is not None:
            self._poll.cancel()
        if self._deferred is not None:
            self._deferred[2].cancel()
            self._deferred = None
        io = self._io

        def release() -> None:
            if io is not None:
                io.close()
        self.context.call_async(release, _ignored, lane=PLANNING)

    def _get_io(self) -> EnumeratorIO:
        # on a worker: connecting is I/O
        with self._io_lock:
            if self._io is None:
                self._io = self._make_io()
                post = self.context.run_in_coordinator_thread
                self._io.report_waits(
                    lambda text, pids: post(lambda: self._set_waiting(text, pids)))
            return self._io

    def _set_waiting(self, text: str | None, pids: tuple[int, ...]) -> None:
        """What the set-up waits for, for the status (rule 8). Mailbox thread."""
        self._waiting = (None, ()) if self._closed or text is None else (text, pids)

    # ------------------------------------------------------------------ planning (rule 1)
    def _wants_planning(self) -> bool:
        if not self.state.set_up:
            return not any(r.set_up for r in self._ready)
        planners = self._ready[-1].planners if self._ready else self.state.planners
        waiting = len(self.state.pending) + sum(len(r.chunks) for r in self._ready)
        return bool(planners) and waiting < self.plan_ahead

    def _plan_more(self) -> None:
        """Start a planning cycle if one is due and none runs (mailbox thread)."""
        if self._closed or self._planning or not self._wants_planning():
            return
        self._planning = True
        set_up = self.state.set_up or any(r.set_up for r in self._ready)
        planners = dict(self._ready[-1].planners if self._ready else self.state.planners)
        waiting = len(self.state.pending) + sum(len(r.chunks) for r in self._ready)
        want = max(1, self.plan_ahead - waiting)
        snapshot = self.startup == INITIAL

        def work() -> _Planned:
            io = self._get_io()
            fresh = not set_up
            found = planners
            if fresh:
                found = io.set_up(self.tables, snapshot)
                if not snapshot:
                    found = {}
            chunks: list[Chunk] = []
            if found:
                chunks, found = io.plan(found, want)
            return _Planned(fresh, found, chunks)

        self.context.call_async(work, self._planned, lane=PLANNING)

    def _planned(self, result: _Planned | None, error: BaseException | None = None) -> None:
        if result is None:
            assert error is not None
            self._failed("planning the snapshot", error)
            return
        self._planning = False
        if self._closed:
            return
        self._ready.append(result)
        self.context.request_batch()  # a boundary applies it (rule 2); its batch hands it out
        self._complete_deferred()  # the first boundary waited for this cycle

    def _failed(self, what: str, error: BaseException) -> None:
        self._planning = False
        if self._closed:
            return
        self._complete_deferred()
        self.context.fail_job(RuntimeError(
            f"PostgreSQL source {self.context.operator_id!r}: {what} failed: "
            f"{type(error).__name__}: {error}"))

    # ------------------------------------------------------------------ checkpoints (rule 2)
    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        if self._deferred is not None:
            # a later checkpoint while the first boundary waits (the runtime seals one epoch
            # at a time, so not expected): the earlier one completes first, in order
            self._complete_deferred()
        if (self._deferred is None and self._planning and self.first_boundary_wait_s > 0
                and not self.state.set_up and not any(r.set_up for r in self._ready)):
            # the set-up's cycle runs: the first batch would find no chunk (rule 2)
            timer = self.context.call_periodically(self.first_boundary_wait_s,
                                                   self._complete_deferred)
            self._deferred = (checkpoint_id, result, timer)
            return
        self._checkpoint(checkpoint_id, result)

    def _complete_deferred(self) -> None:
        """The first boundary, once the set-up's cycle arrived or the wait ran out (mailbox)."""
        deferred, self._deferred = self._deferred, None
        if deferred is None:
            return
        checkpoint_id, result, timer = deferred
        timer.cancel()
        if not self._closed and not result.done():
            self._checkpoint(checkpoint_id, result)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if self._deferred is not None and self._deferred[0] == checkpoint_id:
            self._deferred[2].cancel()
            self._deferred = None
        if not self._closed and self._work_left():
            self.context.request_batch()  # that boundary's batch does not run: another one

    def _checkpoint(self, checkpoint_id: int, result: Future[Any]) -> None:
        state = self.state
        for planned in self._ready:
            if planned.set_up:
                state.set_up = True
                for table, planner in planned.planners.items():
                    state.progress[table] = ChunkProgress(
                        planner.key_column, integer_keys=False)
                    state.planners[table] = planner
            for chunk in planned.chunks:
                progress = state.progress[chunk.table]
                if chunk.index == 0 and not progress.planned:
                    progress.integer_keys = isinstance(chunk.end, int)
                progress.chunk_planned(chunk.index, chunk.end)
                state.pending.append(SnapshotChunk.of(chunk))
                state.chunks_planned += 1
            state.planners = {t: p for t, p in planned.planners.items() if not p.done}
        self._ready = []
        if state.set_up and state.snapshot_done_at is None and self._snapshot_complete():
            state.snapshot_done_at = checkpoint_id
            if self.startup == INITIAL:
                flt = StreamFilter.of({t: p.chunk_map() for t, p in state.progress.items()})
                state.stream = StreamSplit(start=flt.min_hw, filter=flt)
                log.info("PostgreSQL source %s: the snapshot is complete (%d chunks); the "
                         "stream goes out in the batch of checkpoint %d",
                         self.context.operator_id, state.chunks_finished, checkpoint_id)
            else:
                state.stream = StreamSplit()
            state.progress = {}
            # no request_batch: this boundary's own batch hands the stream out (rule 3)
        state.stream_bound = max(state.stream_bound, self._learned_bound)
        state.reported = {e: p for e, p in state.reported.items() if e > self._committed}
        state.confirmed = self._confirmed
        self._epoch = checkpoint_id
        self._batch_chunks = 0
        self._finished_now = {}
        self._plan_more()
        if self._stream_behind_run_end():
            self.context.request_batch()
        result.set_result(state)

    def _snapshot_complete(self) -> bool:
        s = self.state
        if self.startup == LATEST:
            return True
        return (not s.planners and not s.pending and not s.in_flight
                and all(p.done for p in s.progress.values()))

    # ------------------------------------------------------------------ requests (rules 3, 6)
    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        if isinstance(request, NextStreamRead):
            return self._stream_read(subtask, request)
        if not isinstance(request, NextChunk):
            raise TypeError(f"PostgreSQL source {self.context.operator_id!r}: subtask {subtask} "
                            f"sent {request!r}; readers ask with NextChunk or NextStreamRead")
        state = self.state
        for split_id, hw in request.finished:
            entry = state.in_flight.pop(split_id, None)
            if entry is None or entry[0] != subtask:
                raise ValueError(f"PostgreSQL source {self.context.operator_id!r}: subtask "
                                 f"{subtask} reports chunk {split_id!r} finished, which is not "
                                 f"in flight to it")
            chunk = entry[1]
            state.progress[chunk.table].chunk_finished(chunk.index, hw)
            state.chunks_finished += 1
            self._finished_now[split_id] = chunk
        if request.finished and self._work_left():
            self.context.request_batch()  # e.g. the last report: a boundary completes the snapshot
        stream = state.stream
        if (stream is not None and state.snapshot_done_at is not None
                and self._epoch >= state.snapshot_done_at):
            state.stream, state.stream_owner = None, subtask
            if stream.start:
                # rule 4: every transaction ending at or before the start is in the snapshot,
                # whose batches committed before this one ran
                previous = state.reported.get(self._epoch, 0)
                state.reported[self._epoch] = max(previous, stream.start)
            log.info("PostgreSQL source %s: the stream goes to subtask %d from %s",
                     self.context.operator_id, subtask, stream.start)
            return stream
        if state.pending and (self.max_chunks_per_batch is None
                              or self._batch_chunks < self.max_chunks_per_batch):
            chunk = state.pending.pop(0)
            state.in_flight[chunk.split_id] = (subtask, chunk)
            self._batch_chunks += 1
            if len(state.pending) < self.plan_ahead // 2:
                self._plan_more()  # only starts a worker: its result waits for a boundary
            return chunk
        if self._work_left():
            self.context.request_batch()
        return NoSplitNow()

    def _work_left(self) -> bool:
        """Whether another batch is needed: chunks to plan, hand out or hear back from, a
        snapshot whose completion a boundary has yet to see (the last report arrives in a
        batch, and only the next boundary builds the stream), the stream to hand out, or an
        availableNow run's stream short of its end. Mailbox thread."""
        s = self.state
        return bool(s.pending or s.planners or not s.set_up or s.in_flight
                    or (s.snapshot_done_at is None and self.startup == INITIAL)
                    or s.stream is not None or self._ready or self._stream_behind_run_end())

    # ------------------------------------------------------------------ the stream (rule 5)
    def _stream_read(self, subtask: int, request: NextStreamRead) -> StreamBound:
        state = self.state
        if subtask != state.stream_owner:
            raise ValueError(f"PostgreSQL source {self.context.operator_id!r}: subtask "
                             f"{subtask} reads the stream, but the stream is subtask "
                             f"{state.stream_owner}'s")
        if request.read_to is not None:
            previous = state.reported.get(self._epoch, 0)
            state.reported[self._epoch] = max(previous, request.read_to)
            if request.stopped is not None:
                from sparkcoord.sources.postgres.errors import SchemaChanged

                self._stop_at(request.read_to, SchemaChanged(
                    f"PostgreSQL source {self.context.operator_id!r}: {request.stopped}"))
            if self._stop is not None and request.read_to >= self._stop[0]:
                # rule 7: the batch that read to the stop committed
                self.context.fail_job(self._stop[1])
        return StreamBound(state.stream_bound)

    def _stop_at(self, position: int, error: Exception) -> None:
        """Rule 7: the stream stops at ``position`` with ``error`` (the earlier stop wins).
        Mailbox thread."""
        if self._stop is None or position < self._stop[0]:
            self._stop = (position, error)

    def _unpublished_error(self, gone: tuple[TableName, ...]) -> Exception:
        """Rule 7: the error of captured tables that left the publication."""
        from sparkcoord.sources.postgres.errors import PublicationProblem

        names = ", ".join(map(str, gone))
        return PublicationProblem(
            f"PostgreSQL source {self.context.operator_id!r}: captured table(s) {names} are no "
            f"longer published by the source's publication (dropped, or taken out of it); "
            "every change committed to them before that was delivered. Capture without them "
            "with a new checkpoint location, or, if a table still exists and was taken out by "
            "mistake, add it back (ALTER PUBLICATION ... ADD TABLE ...; what changed while it "
            "was out is not in the stream: capture it again with a snapshot)")

    def _polled(self) -> None:
        """A poll tick (mailbox): once the stream is built, learn a new bound; a batch
        follows."""
        if self.state.stream_owner is not None or self.state.stream is not None:
            self._learn_bound()

    def _learn_bound(self) -> None:
        if self._learning or self._closed:
            return
        self._learning = True
        # rule 7 once the stream is built: before, the publication may not exist yet (the
        # set-up creating it runs on the other worker at the same time)
        check = self.state.stream is not None or self.state.stream_owner is not None

        def work() -> tuple[int, tuple[TableName, ...]]:
            io = self._get_io()
            # rule 7: the tables first, so that the position is after what changed them
            gone = io.unpublished(self.tables) if check else ()
            return io.insert_position(), gone

        def done(result: tuple[int, tuple[TableName, ...]] | None,
                 error: BaseException | None) -> None:
            if result is None:
                assert error is not None
                self._learning = False
                self._failed("reading the WAL insert position", error)
            else:
                self._bound_learned(*result)

        self.context.call_async(work, done, lane=SLOT)

    def _bound_learned(self, position: int, gone: tuple[TableName, ...] = ()) -> None:
        self._learning = False
        if self._closed:
            return
        if gone and (self._stop is None or position < self._stop[0]):
            self._stop_at(position, self._unpublished_error(gone))
            log.warning("PostgreSQL source %s: %s no longer published; the source stops once "
                        "the stream has delivered everything before %s",
                        self.context.operator_id, ", ".join(map(str, gone)), position)
        moved = position > max(self._learned_bound, self.state.stream_bound)
        self._learned_bound = max(self._learned_bound, position)
        if self.context.available_now and self._run_end is None:
            self._run_end = position
            log.info("PostgreSQL source %s: this availableNow run reads the stream to %s",
                     self.context.operator_id, position)
        # an unmoved insert position: nothing new to read; but once tables left (rule 7), the
        # batch carrying the report past them must come even if nothing is written any more
        if self._work_left() or (self.state.stream_owner is not None
                                 and (moved or self._stop is not None)):
            self.context.request_batch()

    def _stream_behind_run_end(self) -> bool:
        """An availableNow run's stream has not yet been reported past the run's end (or the
        end is not known yet)."""
        if not self.context.available_now or self.state.stream_owner is None:
            return False
        if self._run_end is None:
            return True
        # a reported position leaves ``reported`` once its batch committed, possibly before
        # the slot worker confirmed it: the committed target counts too, else a batch or two
        # more run for nothing while the advance is on its way
        read = max([self.state.confirmed, self._confirmed, self._advance_target,
                    *self.state.reported.values()])
        return read < self._run_end

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        raise TypeError(f"PostgreSQL source {self.context.operator_id!r}: subtask {subtask} "
                        f"sent event {event!r}; its readers send requests only")

    def handle_items_withdrawn(self, subtask: int, attempt: int,
                               withdrawn: list[Withdrawn]) -> None:
        state = self.state
        back: list[SnapshotChunk] = []
        for item in reversed(withdrawn):
            request = item.item
            if isinstance(request, NextStreamRead):
                if request.read_to is not None:
                    state.reported.pop(self._epoch, None)
                continue
            if not item.is_request or not isinstance(request, NextChunk):
                continue
            answer = item.answer
            if item.answered and isinstance(answer, SnapshotChunk):
                state.in_flight.pop(answer.split_id, None)
                self._batch_chunks = max(0, self._batch_chunks - 1)
                back.append(answer)
            elif item.answered and isinstance(answer, StreamSplit):
                state.stream, state.stream_owner = answer, None
            for split_id, _ in request.finished:
                chunk = self._finished_now.pop(split_id)
                state.progress[chunk.table].chunk_unfinished(chunk.index)
                state.chunks_finished -= 1
                state.in_flight[split_id] = (subtask, chunk)
        state.pending[:0] = back[::-1]
        if back or withdrawn:
            self.context.request_batch()

    # ------------------------------------------------------------------ the slot (rule 4)
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._committed = max(self._committed, checkpoint_id)
        done = [p for e, p in self.state.reported.items() if e <= checkpoint_id]
        if not done:
            return
        target = max(done)
        if target <= max(self._confirmed, self._advance_target):
            return
        self._advance_target = target
        self._advance()

    def _advance(self) -> None:
        if self._advancing or self._closed or self._advance_target <= self._confirmed:
            return
        self._advancing = True
        target = self._advance_target

        def done(confirmed: int | None, error: BaseException | None) -> None:
            if confirmed is None:
                assert error is not None
                self._advance_failed(error)
            else:
                self._advanced(confirmed)

        self.context.call_async(lambda: self._get_io().advance(target), done, lane=SLOT)

    def _advanced(self, confirmed: int) -> None:
        self._advancing = False
        self._confirmed = max(self._confirmed, confirmed)
        self._advance()  # a later target arrived meanwhile

    def _advance_failed(self, error: BaseException) -> None:
        self._advancing = False
        if not self._closed:
            self.context.fail_job(RuntimeError(
                f"PostgreSQL source {self.context.operator_id!r}: confirming the replication "
                f"slot failed: {type(error).__name__}: {error}"))

    # ------------------------------------------------------------------ status
    def handle_client_request(self, request: Any) -> Any:
        if request == "status":
            s = self.state
            phase = ("setting up" if not s.set_up else
                     "snapshot" if s.snapshot_done_at is None else
                     "hand-over" if s.stream is not None else "stream")
            return {"phase": phase, "chunks_planned": s.chunks_planned,
                    "chunks_finished": s.chunks_finished, "pending": len(s.pending),
                    "in_flight": len(s.in_flight), "planning_done": not s.planners,
                    "stream_owner": s.stream_owner, "confirmed_lsn": self._confirmed,
                    "waiting": self._waiting[0], "blocking_pids": list(self._waiting[1]),
                    "state_entries": len(s.pending) + len(s.in_flight) + len(s.reported)
                    + sum(p.planned for p in s.progress.values())}
        raise ValueError(f"PostgreSQL source {self.context.operator_id!r}: unknown client "
                         f"request {request!r} (ask 'status')")


class PostgresEnumeratorIO(EnumeratorIO):
    """The enumerator's I/O against a server: one connection for planning and one for the
    slot, each opened on first use in the worker that uses it (rule 1). A connection the
    server closed (a restart) is opened again and the call made again, once: every call here
    is idempotent (ensure, read, advance never backwards), and opening waits for the server
    (connection.py rule 4). Where the options were unpickled (Spark's source runner) they hold
    no password: libpq's environment supplies it (connection.py rule 2)."""

    def __init__(self, options: Any, slot: str, publication: str, chunk_size: int,
                 chunk_key_columns: dict[TableName, str] | None = None, *,
                 slot_wait_warn_s: float | None = None) -> None:
        from sparkcoord.sources.postgres.io.replication import SLOT_WAIT_WARN_S

        self.options = options
        self.slot = slot
        self.publication = publication
        self.chunk_size = chunk_size
        self.chunk_key_columns = dict(chunk_key_columns or {})
        #: how long the slot's creation waits before it is named a wait (rule 8)
        self.slot_wait_warn_s = SLOT_WAIT_WARN_S if slot_wait_warn_s is None else slot_wait_warn_s
        self._report_wait: WaitReport | None = None
        self._conns: dict[str, Any] = {}

    def report_waits(self, report: WaitReport) -> None:
        self._report_wait = report

    def _watch_slot_creation(self, creator_pid: int) -> Any:
        """Rule 8: the slot's creation watched from a connection of its own."""
        from sparkcoord.sources.postgres.io.replication import SlotCreationWatch

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
        from sparkcoord.sources.postgres.reader import while_slot_busy

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
