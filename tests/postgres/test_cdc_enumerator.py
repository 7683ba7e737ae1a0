"""The PostgreSQL source's enumerator (sparkcoord/sources/postgres/enumerator.py) under the
CoordinatorHarness (manual mailboxes, manual workers, no server): chunk planning runs on a
worker and never on the mailbox (the first boundary waits up to a second for the set-up), the
stream goes out in the batch of the checkpoint that holds the complete snapshot, the slot is
confirmed only after the batch holding the reported position committed, the stream reads up to
a bound learned off the mailbox that joins the state at a boundary, an availableNow run reads to
the position it started at and ends, and a restore from a checkpoint taken in the middle of the
snapshot neither loses nor repeats a chunk."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from sparkcoord.core.errors import RequestFailed
from sparkcoord.core.restore import RestorePoint
from sparkcoord.sources.postgres.core.chunks import Chunk, ChunkPlanner, PlannerState
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.splits import (
    NextChunk,
    NextStreamRead,
    SnapshotChunk,
    StreamBound,
    StreamSplit,
)
from sparkcoord.sources.postgres.enumerator import (
    PLANNING,
    SLOT,
    EnumeratorIO,
    PostgresEnumerator,
)
from sparkcoord.sources.splits import NoSplitNow
from sparkcoord.testing import CoordinatorHarness, ManualLane, ManualWorkers

ORDERS, USERS = TableName("public", "orders"), TableName("public", "users")


def lanes() -> tuple[ManualLane, ManualLane]:
    """The enumerator's planning and slot lanes (``call_async``), run by the test."""
    workers = ManualWorkers()
    return workers.lane(PLANNING), workers.lane(SLOT)


class FakeIO(EnumeratorIO):
    """Tables of integer keys; records where planning ran and what the slot was confirmed at."""

    def __init__(self, keys: dict[TableName, list[int]], chunk_size: int) -> None:
        self.keys = keys
        self.chunk_size = chunk_size
        self.harness: CoordinatorHarness | None = None
        self.on_mailbox: list[bool] = []
        self.set_ups = 0
        self.advanced: list[int] = []
        self.insert_lsn = 5000
        self.dropped: set[TableName] = set()
        #: the publication set_up creates: until then every table is unpublished
        self.published = False

    def _mailbox(self) -> bool:
        assert self.harness is not None
        return any(m.in_mailbox_thread() for m in self.harness.mailboxes.all)

    def set_up(self, tables: Sequence[TableName], snapshot: bool) -> dict[TableName, PlannerState]:
        self.on_mailbox.append(self._mailbox())
        self.set_ups += 1
        self.published = True
        return {t: PlannerState(t, "id", self.chunk_size) for t in tables} if snapshot else {}

    def plan(self, planners: dict[TableName, PlannerState], want: int
             ) -> tuple[list[Chunk], dict[TableName, PlannerState]]:
        self.on_mailbox.append(self._mailbox())
        out: list[Chunk] = []
        after = dict(planners)
        for table, state in planners.items():
            planner = ChunkPlanner.restored(state)
            while len(out) < want and (query := planner.next_query()) is not None:
                keys = [k for k in self.keys[table] if query.after is None
                        or (k >= query.after if query.inclusive else k > query.after)]
                found = keys[query.offset] if query.offset < len(keys) else None
                chunk = planner.boundary_found(query, found)
                if chunk is not None:
                    out.append(chunk)
            after[table] = planner.state
            if len(out) >= want:
                break
        return out, after

    def advance(self, lsn: int) -> int:
        self.on_mailbox.append(self._mailbox())
        self.advanced.append(lsn)
        return lsn

    def insert_position(self) -> int:
        self.on_mailbox.append(self._mailbox())
        return self.insert_lsn

    def unpublished(self, tables: Sequence[TableName]) -> tuple[TableName, ...]:
        self.on_mailbox.append(self._mailbox())
        return tuple(t for t in tables if t in self.dropped or not self.published)


class Readers:
    """What the readers keep between batches (their checkpointed state): chunks finished and
    not yet reported, with their high watermarks; and what each committed batch read."""

    def __init__(self, parallelism: int) -> None:
        self.unreported: dict[int, list[tuple[str, int]]] = {s: [] for s in range(parallelism)}
        self.read: list[str] = []  # chunks read by batches that committed
        self.lsn = 1000

    def copy(self) -> Readers:
        other = Readers(len(self.unreported))
        other.unreported = {s: list(v) for s, v in self.unreported.items()}
        other.read, other.lsn = list(self.read), self.lsn
        return other

    def batch(self, h: CoordinatorHarness, chunks_each: int = 2) -> tuple[list[str], list[Any]]:
        """One batch: each reader reports what it finished before and reads up to
        ``chunks_each`` chunks. Returns the chunks read and every answer."""
        read: list[str] = []
        answers: list[Any] = []
        for subtask in sorted(self.unreported):
            report = tuple(self.unreported[subtask])
            self.unreported[subtask] = []
            for _ in range(chunks_each):
                answer = h.request_from_subtask(subtask, NextChunk.of(report))
                report = ()
                answers.append(answer)
                if not isinstance(answer, SnapshotChunk):
                    break
                self.lsn += 7
                self.unreported[subtask].append((answer.split_id, self.lsn))
                read.append(answer.split_id)
        return read, answers


def harness(io: FakeIO, runner: ManualLane, slot_runner: ManualLane, *, url: str,
            parallelism: int = 2, tables: Sequence[TableName] = (ORDERS,),
            startup: str = "initial", available_now: bool = False,
            first_boundary_wait_s: float = 0.0) -> CoordinatorHarness:
    """The enumerator under the harness; by default its first boundary does not wait for the
    set-up (the tests that are about that wait say so)."""
    provider = functools.partial(PostgresEnumerator, io=lambda: io, tables=tuple(tables),
                                 startup=startup, plan_ahead=4, poll_interval_s=0.5,
                                 first_boundary_wait_s=first_boundary_wait_s)
    h = CoordinatorHarness(provider, parallelism, storage_url=url, available_now=available_now,
                           workers=runner.workers)
    io.harness = h
    return h


def status(h: CoordinatorHarness) -> dict[str, Any]:
    result: dict[str, Any] = h.ask_as_client("status").result()
    return result


def test_chunk_planning_runs_on_a_worker_never_on_the_mailbox_and_never_delays_a_checkpoint(
        tmp_path: Any) -> None:
    io = FakeIO({ORDERS: list(range(1000))}, chunk_size=10)
    runner, slot_runner = lanes()
    h = harness(io, runner, slot_runner, url=f"file://{tmp_path}/ckpt")
    h.start()
    assert io.set_ups == 0 and len(runner.queued) == 1  # handed to the worker, not run
    assert h.checkpoint() is not None  # the checkpoint completes while planning waits
    assert h.request_from_subtask(0, NextChunk()) == NoSplitNow()
    runner.run_all()  # set-up and the first chunks, on the worker (here: the test's thread)
    h.run()
    assert io.on_mailbox == [False, False] and io.set_ups == 1  # set-up, then planning
    # a worker's result joins the state only at a boundary (a replayed request answers the same)
    assert h.request_from_subtask(1, NextChunk()) == NoSplitNow()
    h.commit()
    h.checkpoint()
    first = h.request_from_subtask(0, NextChunk())
    assert isinstance(first, SnapshotChunk) and (first.index, first.start, first.end) == (0, None, 10)
    # planning follows the readers: a few chunks ahead, never the whole table at once
    assert status(h)["chunks_planned"] == 4
    assert not runner.queued  # three pending: enough for now
    h.commit()
    h.checkpoint()  # below plan_ahead: a cycle for one more chunk goes to the worker
    assert status(h)["chunks_planned"] == 4 and len(runner.queued) == 1
    runner.run_all()
    h.run()
    assert status(h)["chunks_planned"] == 4  # nothing joins before the next boundary
    h.commit()
    h.checkpoint()
    assert status(h)["chunks_planned"] == 5 and status(h)["pending"] == 4
    assert not any(io.on_mailbox)


def seal(h: CoordinatorHarness, future: Any) -> None:
    """Seal a checkpoint the test triggered itself (as ``h.checkpoint()`` does)."""
    record = h.service.seal(future.result())
    h.service.inbox.epoch_logged(record.epoch)
    h.run()


def first_boundary_waiting(tmp_path: Any) -> tuple[FakeIO, ManualLane, Any, Any]:
    """An enumerator whose first checkpoint was triggered while its set-up's cycle still
    waits on the worker (decision 77): the fake I/O, the worker, the harness, the future."""
    io = FakeIO({ORDERS: list(range(1000))}, chunk_size=10)
    runner, slot_runner = lanes()
    h = harness(io, runner, slot_runner, url=f"file://{tmp_path}/ckpt",
                first_boundary_wait_s=1.0)
    h.start()
    first = h.trigger_checkpoint()
    h.run()
    return io, runner, h, first


def test_the_first_boundary_waits_for_the_set_up_so_that_the_first_batch_reads_chunks(
        tmp_path: Any) -> None:
    """Decision 77: the set-up's cycle (publication, slot, the first chunks) joins at the
    first boundary when it arrives within ``first_boundary_wait_s``; a slower one joins at the
    next boundary, and no later boundary waits for planning."""
    io, runner, h, first = first_boundary_waiting(tmp_path)
    assert not first.done() and io.set_ups == 0  # waits for the worker
    runner.run_all()  # the set-up and the first chunks, on the worker
    h.run()
    assert first.done() and first.exception() is None
    seal(h, first)
    chunk = h.request_from_subtask(0, NextChunk())  # the first batch reads
    assert isinstance(chunk, SnapshotChunk) and chunk.index == 0
    assert not any(io.on_mailbox)
    # later boundaries never wait for planning
    for _ in range(3):
        h.request_from_subtask(1, NextChunk())
    assert len(runner.queued) == 1  # a cycle for more chunks waits on the worker
    h.commit()
    assert h.checkpoint() is not None and len(runner.queued) == 1


def test_the_first_boundary_waits_for_the_set_up_only_so_long(tmp_path: Any) -> None:
    io, runner, h, first = first_boundary_waiting(tmp_path)
    h.clock.advance(0.9)
    h.run()
    assert not first.done()
    h.clock.advance(0.1)  # the wait ran out: the boundary completes without the set-up
    h.run()
    assert first.done() and first.exception() is None
    seal(h, first)
    assert h.request_from_subtask(0, NextChunk()) == NoSplitNow()
    runner.run_all()  # the slow set-up arrives: it joins at the next boundary
    h.run()
    h.commit()
    assert h.checkpoint() is not None
    chunk = h.request_from_subtask(0, NextChunk())
    assert isinstance(chunk, SnapshotChunk) and chunk.index == 0


def test_a_later_checkpoint_while_the_first_boundary_waits_completes_the_waiting_one_first(
        tmp_path: Any) -> None:
    """Review finding on decision 77 (a guard: the runtime seals one epoch at a time): a
    later checkpoint taken while the first boundary waits must not move the enumerator's
    epoch back when the waiting one completes after it."""
    from concurrent.futures import Future

    io, runner, h, first = first_boundary_waiting(tmp_path)
    later: Future[Any] = Future()
    enumerator: Any = h.coordinator
    later_id = h.service.next_checkpoint_id + 1
    enumerator.checkpoint_coordinator(later_id, later)
    h.run()
    assert first.done() and first.exception() is None  # completed first, without the set-up
    runner.run_all()  # the set-up arrives: the later one (waiting for it in turn) completes
    h.run()
    assert later.done() and later.exception() is None
    assert enumerator._deferred is None and enumerator._epoch == later_id


def test_planning_keeps_two_batches_of_chunks_pending_at_the_per_batch_limit(
        tmp_path: Any) -> None:
    """Planned chunks join at boundaries (rule 2): with fewer pending than a batch may take,
    the planner would set the snapshot's pace instead of the readers."""
    io = FakeIO({ORDERS: list(range(1000))}, chunk_size=10)
    runner, slot_runner = lanes()
    provider = functools.partial(PostgresEnumerator, io=lambda: io, tables=(ORDERS,),
                                 startup="initial", poll_interval_s=0.5,
                                 max_chunks_per_batch=20)
    h = CoordinatorHarness(provider, 2, storage_url=f"file://{tmp_path}/ckpt",
                           workers=runner.workers)
    io.harness = h
    h.start()
    runner.run_all()
    h.run()
    h.checkpoint()
    assert status(h)["chunks_planned"] == 40
    taken = [h.request_from_subtask(s % 2, NextChunk()) for s in range(21)]
    assert all(isinstance(a, SnapshotChunk) for a in taken[:20]) and taken[20] == NoSplitNow()


def drive(h: CoordinatorHarness, runner: ManualLane, readers: Readers,
          stop: Callable[[list[Any]], bool], limit: int = 200) -> list[Any]:
    """Batches until ``stop(answers of the batch)``; each committed."""
    for _ in range(limit):
        runner.run_all()
        h.run()
        h.checkpoint()
        read, answers = readers.batch(h)
        h.commit()
        readers.read.extend(read)
        if stop(answers):
            return answers
    raise AssertionError("the enumerator never got there")


def test_the_stream_goes_out_in_the_batch_of_the_checkpoint_holding_the_whole_snapshot(
        tmp_path: Any) -> None:
    """Not earlier: the batch whose requests complete the snapshot gets no stream. Not later
    (decision 77): that checkpoint's batch runs only after the batches holding every snapshot
    row and report committed, so a batch more would do nothing."""
    io = FakeIO({ORDERS: list(range(50)), USERS: list(range(0, 300, 7))}, chunk_size=10)
    runner, slot_runner = lanes()
    h = harness(io, runner, slot_runner, url=f"file://{tmp_path}/ckpt", tables=(ORDERS, USERS))
    h.start()
    readers = Readers(2)
    # read every chunk; the last reports travel in a later batch
    drive(h, runner, readers, lambda answers: status(h)["chunks_finished"] == 10)
    assert len(readers.read) == len(set(readers.read)) == 10  # 5 + 5 chunks, each once
    # the batch whose requests completed the snapshot got no stream: its checkpoint is not taken
    assert status(h)["phase"] == "snapshot"
    # but it asked for the next batch, whose boundary sees the snapshot complete (no reader
    # has anything left to ask for)
    assert h.service.wants_batch()
    h.checkpoint()  # the boundary that holds the complete snapshot
    assert status(h)["phase"] == "hand-over"
    stream = h.request_from_subtask(1, NextChunk())  # that checkpoint's batch
    assert isinstance(stream, StreamSplit) and stream.filter is not None
    hws = dict(hw for hws in [readers.unreported[0], readers.unreported[1]] for hw in hws)
    assert hws == {}  # everything was reported
    orders = stream.filter.table(ORDERS)
    assert tuple(orders.boundaries) == (10, 20, 30, 40) and len(orders.hws) == 5
    assert stream.start == stream.filter.min_hw > 1000
    assert h.request_from_subtask(0, NextChunk()) == NoSplitNow()  # one stream, once
    assert status(h)["phase"] == "stream"
    # the stream's start is confirmed once the batch that handed it out committed
    assert io.advanced == [] and not slot_runner.queued
    h.commit()
    slot_runner.run_all()
    h.run()
    assert io.advanced == [stream.start]
    # the map left the enumerator with the stream: its state is a few numbers now
    h.checkpoint()
    assert status(h)["state_entries"] == 0
    assert len(pickle.dumps(h.coordinator.state)) < 1_000  # type: ignore[attr-defined]
    assert not any(io.on_mailbox)


def stream_out(h: CoordinatorHarness, runner: ManualLane) -> StreamSplit:
    """A ``latest`` source's stream, handed to subtask 0."""
    runner.run_all()
    h.run()
    h.checkpoint()  # the slot exists at this boundary: the stream goes out in its batch
    stream = h.request_from_subtask(0, NextChunk())
    assert isinstance(stream, StreamSplit)
    return stream


def test_the_slot_is_confirmed_only_after_the_batch_holding_the_reported_position_committed(
        tmp_path: Any) -> None:
    io = FakeIO({ORDERS: []}, chunk_size=10)
    runner, slot_runner = lanes()
    h = harness(io, runner, slot_runner, url=f"file://{tmp_path}/ckpt", startup="latest")
    h.start()
    stream = stream_out(h, runner)
    assert stream == StreamSplit()  # latest: no map, from the slot's confirmed position
    h.commit()
    h.checkpoint()
    h.request_from_subtask(0, NextStreamRead(5000))  # what the previous batch read to
    slot_runner.run_all()
    h.run()
    assert io.advanced == []  # the batch holding it has not committed
    h.commit()
    assert len(slot_runner.queued) == 1 and io.advanced == []  # on the slot worker, not here
    slot_runner.run_all()
    h.run()
    assert io.advanced == [5000] and status(h)["confirmed_lsn"] == 5000
    # idle tables: the reader reports the bound it read to; the slot follows
    h.checkpoint()
    h.request_from_subtask(0, NextStreamRead(5100))
    h.commit()
    slot_runner.run_all()
    h.run()
    assert io.advanced == [5000, 5100]
    assert not any(io.on_mailbox)


def test_the_stream_reads_up_to_a_bound_learned_off_the_mailbox_that_joins_at_a_boundary(
        tmp_path: Any) -> None:
    io = FakeIO({ORDERS: []}, chunk_size=10)
    runner, slot_runner = lanes()
    h = harness(io, runner, slot_runner, url=f"file://{tmp_path}/ckpt", startup="latest")
    h.start()
    stream_out(h, runner)
    assert h.request_from_subtask(0, NextStreamRead()) == StreamBound(0)  # nothing learned yet
    h.commit()
    io.insert_lsn = 7000
    h.clock.advance(0.5)  # a poll tick: the insert position is asked for on the slot worker
    h.run()
    assert len(slot_runner.queued) == 1
    slot_runner.run_all()
    h.run()
    # learned, but the running batch's answers stay what the checkpointed state says
    h.checkpoint()
    assert h.request_from_subtask(0, NextStreamRead(0)) == StreamBound(7000)
    # a retry of the task asks again and gets the logged answer, whatever was learned since
    io.insert_lsn = 9000
    h.clock.advance(0.5)
    h.run()
    slot_runner.run_all()
    h.run()
    h.retry_task(0)
    assert h.request_from_subtask(0, NextStreamRead(0), seq=0) == StreamBound(7000)
    h.finish_task(0)
    h.commit()
    h.checkpoint()
    assert h.request_from_subtask(0, NextStreamRead(7000)) == StreamBound(9000)
    h.commit()
    h.checkpoint()
    assert not h.service.wants_batch()
    # a poll that finds the insert position where it was asks for no batch (an idle database
    # runs none); one that finds it moved does
    h.clock.advance(0.5)
    h.run()
    slot_runner.run_all()
    h.run()
    assert not h.service.wants_batch()
    io.insert_lsn = 9500
    h.clock.advance(0.5)
    h.run()
    slot_runner.run_all()
    h.run()
    assert h.service.wants_batch()
    # only the stream's reader reads it
    with pytest.raises(RequestFailed, match="the stream is subtask 0's"):
        h.request_from_subtask(1, NextStreamRead(7000))
    assert h.service.failure is not None
    assert not any(io.on_mailbox)


def test_a_captured_table_that_leaves_the_publication_stops_the_job_once_its_changes_are_read(
        tmp_path: Any) -> None:
    """Rule 7: the poll finds the table gone and the insert position after it; the job fails
    naming the table only when the stream reader reports it read that far (the batch holding
    every change before the drop committed), not at the poll."""
    io = FakeIO({ORDERS: []}, chunk_size=10)
    runner, slot_runner = lanes()
    h = harness(io, runner, slot_runner, url=f"file://{tmp_path}/ckpt", startup="latest")
    h.start()
    stream_out(h, runner)
    assert h.request_from_subtask(0, NextStreamRead()) == StreamBound(0)
    h.commit()
    io.dropped.add(ORDERS)
    io.insert_lsn = 7000  # after the drop
    h.clock.advance(0.5)
    h.run()
    slot_runner.run_all()
    h.run()
    assert h.service.failure is None  # found, but what came before the drop is not read yet
    h.checkpoint()
    assert h.request_from_subtask(0, NextStreamRead(6000)) == StreamBound(7000)
    assert h.service.failure is None  # read to 6000 only
    h.commit()
    # nothing else is written (the insert position stays): a poll still asks for the batch
    # that carries the report past 7000
    h.clock.advance(0.5)
    h.run()
    slot_runner.run_all()
    h.run()
    assert h.service.wants_batch()
    h.checkpoint()
    with pytest.raises(RequestFailed, match="no longer published"):
        h.request_from_subtask(0, NextStreamRead(7000))  # the batch that read to 7000 committed
    failure = str(h.service.failure)
    assert "public.orders" in failure and "no longer published" in failure
    assert not any(io.on_mailbox)


def test_an_available_now_run_reads_the_stream_to_where_it_started_and_then_asks_no_batch(
        tmp_path: Any) -> None:
    io = FakeIO({ORDERS: []}, chunk_size=10)
    io.insert_lsn = 8000
    runner, slot_runner = lanes()
    h = harness(io, runner, slot_runner, url=f"file://{tmp_path}/ckpt", startup="latest",
                available_now=True)
    h.start()
    # the run's end, learned once at start, before the set-up created the publication (the
    # two workers run at once): no table counts as gone then (rule 7 waits for the stream)
    slot_runner.run_all()
    h.run()
    stream_out(h, runner)
    assert h.request_from_subtask(0, NextStreamRead()) == StreamBound(8000)
    h.commit()
    h.clock.advance(5.0)  # no polling in an availableNow run
    h.run()
    assert not slot_runner.queued
    h.checkpoint()
    h.request_from_subtask(0, NextStreamRead(6000))  # short of the end: another batch
    h.commit()
    assert h.coordinator._work_left()  # type: ignore[attr-defined]
    h.checkpoint()
    h.request_from_subtask(0, NextStreamRead(8000))  # at the end: nothing more is asked
    assert h.service.failure is None
    h.commit()
    slot_runner.run_all()
    h.run()
    assert not h.coordinator._work_left()  # type: ignore[attr-defined]


def test_an_available_now_snapshot_ends_with_the_batch_that_hands_the_stream_out(
        tmp_path: Any) -> None:
    """Decision 77: the boundary that completes the snapshot hands the stream out in its own
    batch and asks for no other; a run whose stream starts past its end then ends there, also
    while the slot worker has yet to confirm the stream's start."""
    io = FakeIO({ORDERS: list(range(40))}, chunk_size=10)
    io.insert_lsn = 900  # the run's end: before every chunk's high watermark (from 1000 on)
    runner, slot_runner = lanes()
    h = harness(io, runner, slot_runner, url=f"file://{tmp_path}/ckpt", available_now=True)
    h.start()
    slot_runner.run_all()  # the run's end, learned at its start
    h.run()
    readers = Readers(2)
    drive(h, runner, readers, lambda answers: any(isinstance(a, StreamSplit) for a in answers))
    # batch 0 reads the 4 chunks, batch 1 emits and reports them, batch 2 reads the stream
    assert h.epoch == 2 and sorted(readers.read) == [f"public.orders#{i}" for i in range(4)]
    assert not h.service.wants_batch()  # the run ends here
    # a boundary before the slot worker confirmed the start asks for no batch either
    assert len(slot_runner.queued) == 1
    h.checkpoint()
    assert not h.service.wants_batch()
    slot_runner.run_all()
    h.run()
    assert io.advanced == [1007] and not h.service.wants_batch()


def test_a_restore_from_a_checkpoint_mid_snapshot_neither_loses_nor_repeats_a_chunk(
        tmp_path: Any) -> None:
    url = f"file://{tmp_path}/ckpt"
    keys = {ORDERS: list(range(200))}
    io = FakeIO(keys, chunk_size=10)
    runner, slot_runner = lanes()
    h = harness(io, runner, slot_runner, url=url)
    h.start()
    readers = Readers(2)
    drive(h, runner, readers, lambda answers: len(readers.read) >= 7)
    committed_epoch = h.epoch
    kept = readers.copy()  # the readers' state of the last committed batch
    # the next batch hands out more chunks, and the driver dies before it commits
    runner.run_all()
    h.run()
    h.checkpoint()
    lost, _ = readers.batch(h)
    assert lost
    h.service.close()
    h.run()
    # restart from the last committed batch; the readers restore its state too
    io2 = FakeIO(keys, chunk_size=10)
    runner2, slot_runner2 = lanes()
    h2 = harness(io2, runner2, slot_runner2, url=url)
    h2.start(RestorePoint(committed_epoch, committed=True))
    readers = kept
    answers = drive(h2, runner2, readers, lambda answers: any(
        isinstance(a, StreamSplit) for a in answers))
    assert io2.set_ups == 0  # the slot and the publication were set up before the restore
    assert sorted(readers.read, key=lambda s: int(s.split("#")[1])) == [
        f"public.orders#{i}" for i in range(20)]  # every chunk once: none lost, none twice
    stream = next(a for a in answers if isinstance(a, StreamSplit))
    assert stream.filter is not None and len(stream.filter.table(ORDERS).hws) == 20
    assert h2.service.failure is None


def test_a_retry_that_asks_less_puts_its_chunks_back_and_its_finished_reports_in_flight_again(
        tmp_path: Any) -> None:
    io = FakeIO({ORDERS: list(range(100))}, chunk_size=10)
    runner, slot_runner = lanes()
    h = harness(io, runner, slot_runner, url=f"file://{tmp_path}/ckpt")
    h.start()
    runner.run_all()
    h.run()
    h.checkpoint()
    first = h.request_from_subtask(0, NextChunk())
    assert first.split_id == "public.orders#0"
    h.commit()
    runner.run_all()
    h.run()
    h.checkpoint()
    report = NextChunk.of(((first.split_id, 1234),))
    assert h.request_from_subtask(0, report).split_id == "public.orders#1"
    assert h.request_from_subtask(0, NextChunk()).split_id == "public.orders#2"
    # the task fails; its retry asks the first request again (answered from the log) and ends
    h.retry_task(0)
    assert h.request_from_subtask(0, report, seq=0).split_id == "public.orders#1"
    h.finish_task(0)
    assert h.request_from_subtask(1, NextChunk()).split_id == "public.orders#2"  # back, first
    # a retry that sends nothing at all: its report of chunk 0 is withdrawn too
    h.retry_task(0)
    h.finish_task(0)
    assert status(h)["chunks_finished"] == 0
    assert h.request_from_subtask(1, NextChunk()).split_id == "public.orders#1"
    h.commit()
    h.checkpoint()
    # chunk 0 is in flight to subtask 0 again: it reports it in its next batch
    assert h.request_from_subtask(0, report).split_id == "public.orders#3"
    assert status(h)["chunks_finished"] == 1 and h.service.failure is None
