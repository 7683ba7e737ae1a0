"""The PostgreSQL source's enumerator: plans the snapshot's chunks off the mailbox, hands them to
readers, records each chunk's high watermark, hands out the stream once the snapshot is
complete and checkpointed, and confirms the slot only after the batch holding the changes
committed.

It is a :class:`~sparkcoord.sources.enumerator.SplitEnumerator` (Flink CDC's
``IncrementalSourceEnumerator`` over a hybrid assigner is the model): the chunks are its
pending splits, planning is its discovery on demand (sources/enumerator.py rule 8: a
:class:`ChunkPlanning` whose state is the tables' planners), a chunk's high watermark is the
reader's finished report (enumerator.py rule 7), and the stream split joins the pending
splits at the boundary that holds the complete snapshot. What is the source's own is here:
the chunks' progress, the stream's hand-over, the slot, the stream's bound and its stops.

Rules:
  1. Every piece of I/O (creating the slot and the publication, asking the catalog, planning
     chunk boundaries, advancing the slot) runs off the mailbox (``call_async``, on the lanes
     ``planning`` and ``slot``, a connection each: io/enumeration.py), one cycle at a time
     each: a table of any size never delays a checkpoint. A planning cycle plans at most as
     many chunks as keep ``plan_ahead`` chunks pending (chunks.py rule 1: one boundary query
     per chunk; the split framework's ``discover_ahead``), so the pending list stays small and
     planning follows the readers. The first cycle sets up the publication and the slot.
  2. What a worker found joins the state only at a checkpoint boundary
     (``checkpoint_coordinator``), as the split framework's discovery does (sources/
     enumerator.py rule 2): answers to requests are a function of the checkpointed state and
     the logged requests, so a restore that replays a batch's requests answers the same. The
     planners' frontiers, the pending chunks and each table's chunk boundaries change
     together there, so a restore neither loses nor repeats a chunk: pending chunks go out
     again from the state, chunks in flight stay with the readers that have them (their
     state), planning resumes at the frontier. One boundary waits for a worker: the first
     one while the set-up's cycle (publication, slot, the first chunks) runs, for up to
     ``first_boundary_wait_s`` (1 s; sources/enumerator.py rule 8), so the run's first batch
     reads chunks instead of finding none (docs/decisions/077-cdc-fewer-batches.md).
  3. A reader reports a finished chunk with its high watermark in a later batch's request
     (splits.py rule 3); the enumerator records it in the table's :class:`ChunkProgress`
     (watermarks.py rule 6). At the first boundary ``k`` after every chunk of every table is
     planned and reported, the state builds the :class:`StreamSplit` (the map, and the least
     high watermark as the start), adds it to the pending splits and drops the per-chunk
     progress; the stream goes out to the first reader that asks in the batch of ``k`` or a
     later one (``epoch >= k``): the
     reports arrived in requests of batches before ``k``, and Spark runs batch ``k`` only
     after those batches committed, so every snapshot row is in the sink and every report
     is in a completed checkpoint before the stream is read (Flink CDC waits for the same;
     before docs/decisions/077-cdc-fewer-batches.md the stream waited for batch ``k + 1``, a
     batch that did nothing). Once handed out, the map lives in the reader only; the
     enumerator's state is a few numbers (watermarks.py rule 5; the split it keeps in flight
     is a bare :class:`StreamSplit`).
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
     answers handed out back, as the split framework does (enumerator.py rule 3): chunks and
     the stream split to the front of the pending splits; finished reports it withdrew are
     undone (the chunk is in flight to the subtask again, which reports it again, and its
     high watermark leaves the progress). A withdrawn stream report is forgotten (its
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
``set_up``/``plan`` on the lane ``planning`` (through :class:`ChunkPlanning`) and
``advance``, ``unpublished`` and ``insert_position`` on the lane ``slot`` (``call_async``),
each one call at a time, their results posted back to the mailbox.
"""


from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.coordinator import CoordinatorContext, Withdrawn
from sparkcoord.core.encoding import encoded
from sparkcoord.sources.enumerator import EnumeratorState, SplitDiscovery, SplitEnumerator
from sparkcoord.sources.postgres.core.chunks import PlannerState
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.splits import (
    STREAM_SPLIT_ID,
    NextChunk,
    NextStreamRead,
    SnapshotChunk,
    StreamBound,
    StreamSplit,
)
from sparkcoord.sources.postgres.core.watermarks import ChunkProgress, StreamFilter
from sparkcoord.sources.postgres.io.enumeration import (
    EnumeratorIO as EnumeratorIO,
)
from sparkcoord.sources.postgres.io.enumeration import (
    PostgresEnumeratorIO as PostgresEnumeratorIO,
)
from sparkcoord.sources.postgres.io.enumeration import (
    WaitReport as WaitReport,
)
from sparkcoord.sources.splits import ReadLimit, Split

log = logging.getLogger("sparkcoord.sources.postgres")

INITIAL, LATEST = "initial", "latest"
STARTUP_MODES = (INITIAL, LATEST)

#: the ``call_async`` lanes (rule 1): each keeps a connection of its own
PLANNING, SLOT = "planning", "slot"

#: how long the first boundary waits for the set-up's planning cycle (rule 2)
FIRST_BOUNDARY_WAIT_S = 1.0


def _ignored(result: Any, error: BaseException | None) -> None:
    """The handler of a release on close: nothing is left to do with its outcome."""


@encoded("postgres.PlanningState")
@dataclass
class PlanningState:
    """Chunk planning's state (the enumerator's discovery state): whether the set-up ran, and
    each table's planner, in table order (a planner that is done stays, so the boundary that
    applies a cycle knows every table's chunk key column)."""

    set_up: bool = False
    planners: dict[TableName, PlannerState] = field(default_factory=dict)


class ChunkPlanning(SplitDiscovery):
    """Planning the snapshot's chunks as the enumerator's discovery on demand (rule 1;
    sources/enumerator.py rule 8). Thread model: ``discover_some`` on the planning lane, one
    cycle at a time; ``exhausted`` and ``size_of`` on the mailbox."""

    def __init__(self, io: Callable[[], EnumeratorIO], tables: Sequence[TableName],
                 snapshot: bool) -> None:
        self._io = io
        self.tables = tuple(tables)
        self.snapshot = snapshot

    def initial_state(self) -> PlanningState:
        return PlanningState()

    def discover(self, state: Any) -> tuple[list[Split], Any]:
        return self.discover_some(state, 1)

    def discover_some(self, state: Any, want: int) -> tuple[list[Split], Any]:
        io = self._io()
        planners = dict(state.planners)
        if not state.set_up:
            planners = io.set_up(self.tables, self.snapshot)
            if not self.snapshot:
                planners = {}
        chunks: list[Split] = []
        if any(not p.done for p in planners.values()):
            planned, after = io.plan({t: p for t, p in planners.items() if not p.done}, want)
            planners.update(after)
            chunks = [SnapshotChunk.of(chunk) for chunk in planned]
        return chunks, PlanningState(True, planners)

    def exhausted(self, state: Any) -> bool:
        return bool(state.set_up) and all(p.done for p in state.planners.values())

    def size_of(self, state: Any) -> int:
        return len(state.planners)


def _from_version_1(fields: dict[str, Any]) -> dict[str, Any]:
    """CdcEnumeratorState version 1 (sparkcoord 0.1.0, an enumerator of its own) -> 2 (a
    :class:`SplitEnumerator`'s state): the pending chunks, the stream built and not handed
    out, and what is in flight become the framework's pending and in-flight splits; the set-up
    and the planners the discovery state."""
    pending: list[Split] = list(fields.get("pending", []))
    chunks_pending = len(pending)
    in_flight: dict[str, int] = {}
    in_flight_splits: dict[str, Split] = {}
    for split_id, (subtask, chunk) in dict(fields.get("in_flight", {})).items():
        in_flight[split_id], in_flight_splits[split_id] = subtask, chunk
    if fields.get("stream") is not None:
        pending.append(fields["stream"])
    owner = fields.get("stream_owner")
    if owner is not None:
        in_flight[STREAM_SPLIT_ID], in_flight_splits[STREAM_SPLIT_ID] = owner, StreamSplit()
    set_up = bool(fields.get("set_up", False))
    planned = int(fields.get("chunks_planned", 0))
    return {"tables": fields["tables"], "startup": fields["startup"], "pending": pending,
            "in_flight": in_flight, "in_flight_splits": in_flight_splits,
            "discovery": PlanningState(set_up, dict(fields.get("planners", {}))),
            "discovered_once": set_up, "handed_out": planned - chunks_pending
            + (owner is not None), "finished": int(fields.get("chunks_finished", 0)),
            "progress": dict(fields.get("progress", {})), "chunks_planned": planned,
            "snapshot_done_at": fields.get("snapshot_done_at"),
            "reported": dict(fields.get("reported", {})),
            "confirmed": int(fields.get("confirmed", 0)),
            "stream_bound": int(fields.get("stream_bound", 0))}


@encoded("postgres.CdcEnumeratorState", version=2, upgrades={1: _from_version_1},
         first_fields=("tables", "startup", "set_up", "planners", "progress", "pending",
                       "in_flight", "chunks_planned", "chunks_finished", "snapshot_done_at",
                       "stream", "stream_owner", "reported", "confirmed", "stream_bound"))
@dataclass(kw_only=True)
class CdcEnumeratorState(EnumeratorState):
    """The enumerator's checkpointed state: the split framework's (pending chunks and the
    stream split before it goes out, what is in flight, the planners as the discovery state)
    and the source's own."""

    tables: tuple[TableName, ...] = ()
    startup: str = INITIAL
    #: per table while the snapshot runs: boundaries and high watermarks (rule 3)
    progress: dict[TableName, ChunkProgress] = field(default_factory=dict)
    chunks_planned: int = 0
    #: the checkpoint whose state first held the complete snapshot (rule 3)
    snapshot_done_at: int | None = None
    #: epoch -> the stream position reported in its batch, not yet confirmed (rule 4)
    reported: dict[int, int] = field(default_factory=dict)
    #: the slot's position as last confirmed (for status; rule 4)
    confirmed: int = 0
    #: how far the stream may read (rule 5): a WAL insert position learned before a boundary
    stream_bound: int = 0


class PostgresEnumerator(SplitEnumerator):
    """The coordinator of a PostgreSQL source (module rules).

    Client requests: ``"status"`` (phase, chunks planned/finished/pending/in flight, whether the
    stream is out, the confirmed slot position, what the set-up waits for (rule 8), the
    state's size in entries)."""

    state: CdcEnumeratorState
    keeps_splits_in_flight = True
    keeps_discovered_splits = True
    discovery_lane = PLANNING
    discovery_name = "planning the snapshot"

    def __init__(self, context: CoordinatorContext, io: Callable[[], EnumeratorIO],
                 tables: Sequence[TableName], *, startup: str = INITIAL,
                 plan_ahead: int | None = None, max_chunks_per_batch: int | None = None,
                 poll_interval_s: float = 0.1,
                 first_boundary_wait_s: float = FIRST_BOUNDARY_WAIT_S) -> None:
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
        self.tables = tuple(tables)
        self.startup = startup
        # enough pending for two batches at the per-batch limit: planning joins at boundaries
        # (rule 2), so fewer would make the planner, not the readers, set the snapshot's pace
        self.plan_ahead = plan_ahead or max(16, 4 * context.parallelism,
                                            2 * (max_chunks_per_batch or 0))
        self.max_chunks_per_batch = max_chunks_per_batch
        self._make_io = io
        self._io: EnumeratorIO | None = None
        self._io_lock = threading.Lock()
        super().__init__(context, ChunkPlanning(self._get_io, self.tables, startup == INITIAL),
                         limit=ReadLimit(max_units=max_chunks_per_batch),
                         discover_ahead=self.plan_ahead,
                         first_boundary_wait_s=first_boundary_wait_s)
        self.poll_interval_s = poll_interval_s
        self.state = self.fresh_state()
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
        #: what the set-up waits for and the pids it waits for (rule 8), as the I/O reported
        self._waiting: tuple[str | None, tuple[int, ...]] = (None, ())

    def describe(self) -> str:
        return f"PostgreSQL source {self.context.operator_id!r}"

    # ------------------------------------------------------------------ lifecycle (mailbox)
    def fresh_state(self) -> CdcEnumeratorState:
        return CdcEnumeratorState(tables=self.tables, startup=self.startup,
                                  discovery=PlanningState())

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        if state is not None and not isinstance(state, CdcEnumeratorState):
            raise TypeError(f"enumerator {self.context.operator_id!r}: checkpointed state is a "
                            f"{type(state).__name__}, not a CdcEnumeratorState")
        if state is not None and (state.tables != self.tables or state.startup != self.startup):
            raise ValueError(
                f"enumerator {self.context.operator_id!r}: the checkpoint captures "
                f"{', '.join(map(str, state.tables))} (startup {state.startup!r}), the source "
                f"now {', '.join(map(str, self.tables))} (startup {self.startup!r}): start "
                "with a new checkpoint location, or name the same tables")
        super().reset_to_checkpoint(checkpoint_id, state)
        self._confirmed = self.state.confirmed

    def start(self) -> None:
        if self._work_left():
            self.context.request_batch()
        super().start()  # the first planning cycle goes to its lane (rule 1)
        if self.context.available_now:
            self._learn_bound()
        else:
            self._poll = self.context.call_periodically(self.poll_interval_s, self._polled)

    def close(self) -> None:
        super().close()
        if self._poll is not None:
            self._poll.cancel()
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

    # ------------------------------------------------------------------ boundaries (rule 2)
    def discovery_applied(self, found: list[Split], after: Any) -> None:
        progress = self.state.progress
        for table, planner in after.planners.items():
            if table not in progress and self.state.snapshot_done_at is None:
                progress[table] = ChunkProgress(planner.key_column, integer_keys=False)
        for chunk in found:
            assert isinstance(chunk, SnapshotChunk)
            table = progress[chunk.table]
            if chunk.index == 0 and not table.planned:
                table.integer_keys = isinstance(chunk.end, int)
            table.chunk_planned(chunk.index, chunk.end)
            self.state.chunks_planned += 1

    def boundary_reached(self, checkpoint_id: int) -> None:
        state = self.state
        if state.discovered_once and state.snapshot_done_at is None and self._snapshot_complete():
            state.snapshot_done_at = checkpoint_id
            if self.startup == INITIAL:
                flt = StreamFilter.of({t: p.chunk_map() for t, p in state.progress.items()})
                stream = StreamSplit(start=flt.min_hw, filter=flt)
                log.info("PostgreSQL source %s: the snapshot is complete (%d chunks); the "
                         "stream goes out in the batch of checkpoint %d",
                         self.context.operator_id, state.finished, checkpoint_id)
            else:
                stream = StreamSplit()
            state.progress = {}
            self.add_splits([stream])
            # no request_batch: this boundary's own batch hands the stream out (rule 3)
        state.stream_bound = max(state.stream_bound, self._learned_bound)
        state.reported = {e: p for e, p in state.reported.items() if e > self._committed}
        state.confirmed = self._confirmed
        if self._stream_behind_run_end():
            self.context.request_batch()

    def _snapshot_complete(self) -> bool:
        s = self.state
        if self.startup == LATEST:
            return True
        return (self.discovery.exhausted(s.discovery) and not self._pending
                and not self._chunks_in_flight() and all(p.done for p in s.progress.values()))

    def _chunks_in_flight(self) -> int:
        return sum(1 for split_id in self.state.in_flight if split_id != STREAM_SPLIT_ID)

    def _failed(self, what: str, error: BaseException) -> None:
        """Work on a lane failed (mailbox thread): the job fails, naming the source."""
        if self._closed:
            return
        self._complete_deferred()
        self.context.fail_job(RuntimeError(
            f"PostgreSQL source {self.context.operator_id!r}: {what} failed: "
            f"{type(error).__name__}: {error}"))

    def _stream_owner(self) -> int | None:
        return self.state.in_flight.get(STREAM_SPLIT_ID)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        super().notify_checkpoint_aborted(checkpoint_id)
        if not self._closed and self._work_left():
            self.context.request_batch()  # that boundary's batch does not run: another one

    # ------------------------------------------------------------------ requests (rules 3, 6)
    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        if isinstance(request, NextStreamRead):
            return self._stream_read(subtask, request)
        if not isinstance(request, NextChunk):
            raise TypeError(f"PostgreSQL source {self.context.operator_id!r}: subtask {subtask} "
                            f"sent {request!r}; readers ask with NextChunk or NextStreamRead")
        for split_id in request.finished:
            if self.state.in_flight.get(split_id) != subtask:
                raise ValueError(f"PostgreSQL source {self.context.operator_id!r}: subtask "
                                 f"{subtask} reports chunk {split_id!r} finished, which is not "
                                 f"in flight to it")
        answer = super().handle_request(subtask, attempt, request)
        if request.finished and self._work_left():
            self.context.request_batch()  # e.g. the last report: a boundary completes the snapshot
        return answer

    def split_finished(self, subtask: int, split: Split, report: Any) -> None:
        if not isinstance(split, SnapshotChunk) or not isinstance(report, int):
            raise ValueError(f"PostgreSQL source {self.context.operator_id!r}: subtask "
                             f"{subtask} reports {split.split_id!r} finished with {report!r}, "
                             "not a snapshot chunk with its high watermark")
        self.state.progress[split.table].chunk_finished(split.index, report)

    def finished_report_withdrawn(self, subtask: int, split: Split, report: Any) -> None:
        assert isinstance(split, SnapshotChunk)
        self.state.progress[split.table].chunk_unfinished(split.index)

    def split_handed_out(self, subtask: int, split: Split) -> None:
        if not isinstance(split, StreamSplit):
            return
        # rule 3: once handed out, the map lives in the reader only
        assert self.state.in_flight_splits is not None
        self.state.in_flight_splits[STREAM_SPLIT_ID] = StreamSplit()
        if split.start:
            # rule 4: every transaction ending at or before the start is in the snapshot,
            # whose batches committed before this one ran
            previous = self.state.reported.get(self._epoch, 0)
            self.state.reported[self._epoch] = max(previous, split.start)
        log.info("PostgreSQL source %s: the stream goes to subtask %d from %s",
                 self.context.operator_id, subtask, split.start)

    def another_batch_wanted(self, subtask: int) -> bool:
        return self._work_left()

    def _work_left(self) -> bool:
        """Whether another batch is needed: chunks to plan, hand out or hear back from, a
        snapshot whose completion a boundary has yet to see (the last report arrives in a
        batch, and only the next boundary builds the stream), the stream to hand out, or an
        availableNow run's stream short of its end. Mailbox thread."""
        s = self.state
        return bool(self._pending or not self.discovery.exhausted(s.discovery)
                    or self._chunks_in_flight()
                    or (s.snapshot_done_at is None and self.startup == INITIAL)
                    or self._ready_count or self._stream_behind_run_end())

    def handle_items_withdrawn(self, subtask: int, attempt: int,
                               withdrawn: list[Withdrawn]) -> None:
        for item in withdrawn:
            if isinstance(item.item, NextStreamRead) and item.item.read_to is not None:
                self.state.reported.pop(self._epoch, None)  # rule 6
        super().handle_items_withdrawn(subtask, attempt, withdrawn)
        if withdrawn:
            self.context.request_batch()

    # ------------------------------------------------------------------ the stream (rule 5)
    def _stream_read(self, subtask: int, request: NextStreamRead) -> StreamBound:
        state = self.state
        owner = self._stream_owner()
        if subtask != owner:
            raise ValueError(f"PostgreSQL source {self.context.operator_id!r}: subtask "
                             f"{subtask} reads the stream, but the stream is subtask "
                             f"{owner}'s")
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
        if self.state.snapshot_done_at is not None:  # the stream is built
            self._learn_bound()

    def _learn_bound(self) -> None:
        if self._learning or self._closed:
            return
        self._learning = True
        # rule 7 once the stream is built: before, the publication may not exist yet (the
        # set-up creating it runs on the other worker at the same time)
        check = self.state.snapshot_done_at is not None

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
        if self._work_left() or (self._stream_owner() is not None
                                 and (moved or self._stop is not None)):
            self.context.request_batch()

    def _stream_behind_run_end(self) -> bool:
        """An availableNow run's stream has not yet been reported past the run's end (or the
        end is not known yet)."""
        if not self.context.available_now or self._stream_owner() is None:
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
            owner = self._stream_owner()
            phase = ("setting up" if not s.discovered_once else
                     "snapshot" if s.snapshot_done_at is None else
                     "hand-over" if owner is None else "stream")
            pending = len(self._pending) - (phase == "hand-over")  # chunks, not the stream
            return {"phase": phase, "chunks_planned": s.chunks_planned,
                    "chunks_finished": s.finished, "pending": pending,
                    "in_flight": self._chunks_in_flight(),
                    "planning_done": self.discovery.exhausted(s.discovery),
                    "stream_owner": owner, "confirmed_lsn": self._confirmed,
                    "waiting": self._waiting[0], "blocking_pids": list(self._waiting[1]),
                    "state_entries": pending + self._chunks_in_flight() + len(s.reported)
                    + sum(p.planned for p in s.progress.values())}
        raise ValueError(f"PostgreSQL source {self.context.operator_id!r}: unknown client "
                         f"request {request!r} (ask 'status')")
