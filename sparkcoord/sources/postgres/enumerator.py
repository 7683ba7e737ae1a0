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
the chunks' progress, the stream's hand-over, the set-up's waits; the stream's control (its
bound, its stops, the slot's confirmation: rules 4, 5, 7) is a :class:`StreamControl`
(streaming.py) it calls from its hooks, and its state and discovery (:class:`CdcEnumeratorState`,
:class:`ChunkPlanning`) are in planning.py. The names stay importable from here.

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
  4. The slot is confirmed only once the batch holding the changes committed: streaming.py
     rule 4.
  5. How far the stream reads, learned by polling the WAL insert position (an availableNow
     run's end once): streaming.py rule 5.
  6. A task retry that withdraws requests (``handle_items_withdrawn``) puts what their
     answers handed out back, as the split framework does (enumerator.py rule 3): chunks and
     the stream split to the front of the pending splits; finished reports it withdrew are
     undone (the chunk is in flight to the subtask again, which reports it again, and its
     high watermark leaves the progress). A withdrawn stream report is forgotten (its
     epoch's position is then confirmed by a later report: never too far).
  7. The stream stops at a position with an error once everything before it is in the sink:
     streaming.py rule 7.
  8. The set-up's slot creation can wait for other sessions' transactions for as long as
     they stay open (replication.py rule 7). The I/O watches it from a connection and thread
     of its own and reports what it waits for; the report is posted to the mailbox and the
     status shows it (``waiting``) until the creation ended. Nothing waits for it on the
     mailbox.

Thread model: every callback on the coordinator's mailbox; the :class:`EnumeratorIO`'s
``set_up``/``plan`` on the lane ``planning`` (through :class:`ChunkPlanning`, planning.py) and
``advance``, ``unpublished`` and ``insert_position`` on the lane ``slot`` (``call_async``;
through :class:`StreamControl`, streaming.py), each one call at a time, their results posted
back to the mailbox.
"""


from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from sparkcoord.coordinator import CoordinatorContext, Withdrawn
from sparkcoord.sources.enumerator import SplitEnumerator
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
from sparkcoord.sources.postgres.planning import INITIAL as INITIAL
from sparkcoord.sources.postgres.planning import LATEST as LATEST
from sparkcoord.sources.postgres.planning import STARTUP_MODES as STARTUP_MODES
from sparkcoord.sources.postgres.planning import CdcEnumeratorState as CdcEnumeratorState
from sparkcoord.sources.postgres.planning import ChunkPlanning as ChunkPlanning
from sparkcoord.sources.postgres.planning import PlanningState as PlanningState
from sparkcoord.sources.postgres.streaming import SLOT as SLOT
from sparkcoord.sources.postgres.streaming import StreamControl
from sparkcoord.sources.splits import ReadLimit, Split

log = logging.getLogger("sparkcoord.sources.postgres")

#: the ``call_async`` lanes (rule 1): each keeps a connection of its own (``SLOT``: streaming.py)
PLANNING = "planning"

#: how long the first boundary waits for the set-up's planning cycle (rule 2)
FIRST_BOUNDARY_WAIT_S = 1.0


def _ignored(result: Any, error: BaseException | None) -> None:
    """The handler of a release on close: nothing is left to do with its outcome."""


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
        self._poll: Any = None
        #: the stream's bound, its stops and the slot's confirmation (rules 4, 5, 7)
        self._stream = StreamControl(
            context, self._get_io, self.tables, state=lambda: self.state,
            closed=lambda: self._closed, owner=self._stream_owner, work_left=self._work_left,
            failed=self.work_failed)
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
        self._stream.restored()

    def start(self) -> None:
        if self._work_left():
            self.context.request_batch()
        super().start()  # the first planning cycle goes to its lane (rule 1)
        if self.context.available_now:
            self._stream.learn_bound()
        else:
            self._poll = self.context.call_periodically(self.poll_interval_s,
                                                        self._stream.polled)

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
        self._stream.boundary_reached(self._committed)
        if self._stream.behind_run_end():
            self.context.request_batch()

    def _snapshot_complete(self) -> bool:
        s = self.state
        if self.startup == LATEST:
            return True
        return (self.discovery.exhausted(s.discovery) and not self._pending
                and not self._chunks_in_flight() and all(p.done for p in s.progress.values()))

    def _chunks_in_flight(self) -> int:
        return sum(1 for split_id in self.state.in_flight if split_id != STREAM_SPLIT_ID)

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
            self._stream.reported(self._epoch, split.start)
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
                    or self._cycles.held or self._stream.behind_run_end())

    def handle_items_withdrawn(self, subtask: int, attempt: int,
                               withdrawn: list[Withdrawn]) -> None:
        for item in withdrawn:
            if isinstance(item.item, NextStreamRead) and item.item.read_to is not None:
                self.state.reported.pop(self._epoch, None)  # rule 6
        super().handle_items_withdrawn(subtask, attempt, withdrawn)
        if withdrawn:
            self.context.request_batch()

    # ------------------------------------------------------------------ the stream (rules 5, 7)
    def _stream_read(self, subtask: int, request: NextStreamRead) -> StreamBound:
        owner = self._stream_owner()
        if subtask != owner:
            raise ValueError(f"PostgreSQL source {self.context.operator_id!r}: subtask "
                             f"{subtask} reads the stream, but the stream is subtask "
                             f"{owner}'s")
        self._stream.stream_read(self._epoch, request)
        return StreamBound(self.state.stream_bound)

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        raise TypeError(f"PostgreSQL source {self.context.operator_id!r}: subtask {subtask} "
                        f"sent event {event!r}; its readers send requests only")

    # ------------------------------------------------------------------ the slot (rule 4)
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._committed = max(self._committed, checkpoint_id)
        self._stream.batch_committed(checkpoint_id)  # streaming.py rule 4

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
                    "stream_owner": owner, "confirmed_lsn": self._stream.confirmed,
                    "waiting": self._waiting[0], "blocking_pids": list(self._waiting[1]),
                    "state_entries": pending + self._chunks_in_flight() + len(s.reported)
                    + sum(p.planned for p in s.progress.values())}
        raise ValueError(f"PostgreSQL source {self.context.operator_id!r}: unknown client "
                         f"request {request!r} (ask 'status')")
