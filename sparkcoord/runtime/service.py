"""The coordination service: the coordinators of one job, their checkpoints and their inbox.

It lives on the driver (in Spark: the long-lived source runner process) and is driven by three
kinds of callers:
  * the driver adapter, in Spark's order of calls: the run's first decisive call restores,
    ``latest_offset_called`` completes the previous epoch and maybe seals a new one,
    ``partitions_called`` hands out an epoch's events;
  * channel threads, one per subtask connection: registrations and events (rule 6);
  * coordinator mailboxes: checkpoint completions, declines and failures.

Rules:
  1. Restore (DESIGN rule 8) happens once, at the first ``latest_offset_called`` or
     ``partitions_called`` of the run, before any coordinator starts.
  2. A checkpoint is sealed only when all coordinators completed it; the record is durable
     before ``checkpoint`` returns, and the epoch's inbound log is created empty (a garbage
     log of an unlogged epoch is discarded).
  3. Inbound admission, durable append, hand-off to the mailbox and the answer to the sender
     happen under one lock, in one total order (DESIGN rule 6, finding A).
  4. A task retry resets the subtask's coordinator before the new attempt is acknowledged
     (rule 7). The first global failure wins; afterwards the service refuses everything and
     the adapter fails the query with the failure's text.

Thread model: every public method may be called from any thread; service state is guarded by
``_lock``. Holders are called under it and only enqueue, so the lock is never held while user
code runs.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.coordinator import Cancellable, CoordinatorProvider, Withdrawn
from sparkcoord.core.checkpoints import CheckpointAbort, CheckpointTracker
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.errors import (
    CorruptRecord,
    IllegalTransition,
    RequestFailed,
    SparkCoordError,
)
from sparkcoord.core.ids import NO_EPOCH, SubtaskId, TaskAttempt
from sparkcoord.core.inbound import (
    ClientResponseEntry,
    InboundDecision,
    InboundGate,
    LogEntry,
    ReplayedItem,
    ResponseEntry,
    RunDecision,
    Verdict,
    WithdrawnItem,
    kept_at_rerun,
)
from sparkcoord.core.records import CheckpointRecord, encode_log_entry
from sparkcoord.core.restore import RestorePoint, RestorePointDetector
from sparkcoord.core.stored import StoredOnce, snapshot_parts
from sparkcoord.runtime.clock import Clock, SystemClock
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.futures import SendFuture
from sparkcoord.runtime.holder import Answered, CoordinatorHolder, ReplayedEvent
from sparkcoord.runtime.mailbox import Mailbox, ThreadMailbox
from sparkcoord.runtime.storage import CheckpointStorage

log = logging.getLogger(__name__)


#: The logged answer to a task's or a client's request.
Answer = ResponseEntry | ClientResponseEntry
#: Where a record keeps the service's memory of client requests (no operator has this name).
CLIENTS_KEY = "\x00clients"


class CheckpointDeclined(SparkCoordError):
    """A checkpoint was declined by a coordinator or timed out; nothing was sealed."""


class JobFailed(SparkCoordError):
    """A global failure: the query must fail and be restarted from its checkpoint."""


@dataclass(frozen=True)
class CoordinatorSpec:
    """One coordinated operator: its name, how to create its coordinator, its parallelism."""

    name: str
    provider: CoordinatorProvider
    parallelism: int


@dataclass
class PreparedCheckpoint:
    """Every coordinator completed ``checkpoint_id``: what the record will hold."""

    checkpoint_id: int
    snapshots: dict[str, bytes | None]
    events: dict[SubtaskId, list[bytes]] = field(default_factory=dict)
    #: the state parts the snapshots refer to, by name (core/stored.py)
    parts: dict[str, StoredOnce[Any]] = field(default_factory=dict)

    def event_count(self) -> int:
        return sum(len(v) for v in self.events.values())


MailboxFactory = Callable[[str], Mailbox]


class CoordinationService:
    """Hosts the coordinators of one job for one run. See the module docstring."""

    def __init__(self, specs: Sequence[CoordinatorSpec], storage: CheckpointStorage, *,
                 config: ServiceConfig | None = None, clock: Clock | None = None,
                 mailbox_factory: MailboxFactory | None = None, run_id: str | None = None,
                 available_now: bool = False) -> None:
        if not specs:
            raise ValueError("a coordination service needs at least one coordinator")
        self.specs = {spec.name: spec for spec in specs}
        if len(self.specs) != len(specs):
            raise ValueError(f"coordinator names must be unique: {[s.name for s in specs]}")
        self.storage = storage
        self.config = config or ServiceConfig()
        self.clock = clock or SystemClock()
        self.codec = EventCodec(self.config.max_event_bytes)
        self.run_id = run_id or uuid.uuid4().hex[:16]
        #: this run is Spark's ``Trigger.AvailableNow`` (coordinators read it from their
        #: context: the run ends at the first trigger that seals nothing)
        self.available_now = available_now
        self._mailbox_factory = mailbox_factory or ThreadMailbox
        self._lock = threading.RLock()
        self.detector = RestorePointDetector()
        self.restore_point: RestorePoint | None = None
        self.failure: str | None = None
        self._failure_listeners: list[Callable[[str], None]] = []
        self._holders: dict[str, CoordinatorHolder] = {}
        self._tracker: CheckpointTracker | None = None
        self._gate: InboundGate | None = None
        self._record: CheckpointRecord | None = None
        self._prepared: Future[PreparedCheckpoint] | None = None
        self._prepared_events: dict[str, list[list[bytes]]] = {}
        self._prepared_parts: dict[str, dict[str, StoredOnce[Any]]] = {}
        self._restored_parts: list[StoredOnce[Any]] = []
        self._timeout: Cancellable | None = None
        self._waiting: Cancellable | None = None  # the pending checkpoint's stall warning
        self._failing = False
        self._closed = False
        # tasks waiting for the answer to item seq of a subtask's history (rule 5)
        self._waiters: dict[tuple[SubtaskId, int], Future[Answer]] = {}
        # clients waiting for answers, by (operator, client id, seq)
        self._client_waiters: dict[tuple[str, str, int], Future[Answer]] = {}
        # finishes whose withdrawal the coordinator has not taken back yet (a re-sent finish
        # waits for the same decision)
        self._finishing: dict[TaskAttempt, Future[InboundDecision]] = {}

    # ---------------------------------------------------------------- driver adapter calls
    def latest_offset_called(self, start_epoch: int) -> None:
        """Spark asked for the offset after ``start_epoch`` (driver thread).

        The run's first such call restores from ``start_epoch`` (committed); later ones mean the
        batch of ``start_epoch`` committed, the completion signal of DESIGN rule 9.
        """
        self.raise_if_failed()
        point, first = self.detector.latest_offset_requested(start_epoch)
        if first:
            self.restore(point)
        elif start_epoch != NO_EPOCH:
            self.batch_committed(start_epoch)

    def partitions_called(self, start_epoch: int, end_epoch: int) -> CheckpointRecord | None:
        """Spark planned the batch (start_epoch, end_epoch] (driver thread).

        Returns the record whose events the batch delivers. As the run's first call it restores
        to ``end_epoch`` (logged, not committed) and truncates that epoch's inbound log.
        """
        self.raise_if_failed()
        point, first = self.detector.partitions_requested(start_epoch, end_epoch)
        if first:
            self.restore(point)
        self.epoch_logged(end_epoch)
        return self.record_for(end_epoch)

    def epoch_logged(self, epoch: int) -> None:
        """Spark logged ``epoch`` (any thread): client requests may now go to its log."""
        with self._lock:
            if self._gate is not None:
                self._gate.epoch_logged(epoch)

    def restore(self, point: RestorePoint) -> None:
        """Create and start the coordinators from ``point``. Once per run (driver thread).

        Committed point N: reset to snapshot N, replay the surviving events of inbound log N in
        log order, then notify complete(N). Uncommitted point N: truncate inbound log N durably,
        reset to snapshot N; the batch of N runs again.
        """
        with self._lock:
            if self.restore_point is not None:
                raise IllegalTransition(f"run {self.run_id} was already restored to "
                                        f"{self.restore_point}; cannot restore to {point}")
            epoch = point.epoch
            # every file read here is verified; a missing or damaged one fails the job with an
            # error naming it (and the same error comes back at every restart: it needs a person)
            try:
                record = self.storage.read_record(epoch) if epoch != NO_EPOCH else None
                # the state parts its snapshots refer to, checked now (and held: the holders
                # load the snapshots on their mailbox threads)
                self._restored_parts = [
                    self.storage.read_part(name)
                    for snapshot in (record.snapshots.values() if record is not None else ())
                    for name in snapshot_parts(snapshot, f"the record of epoch {epoch}")]
                if point.replays_inbound_log:
                    logged = self.storage.read_inbound_log(epoch, remember=True)
                elif epoch != NO_EPOCH:
                    logged = self.storage.read_uncommitted_inbound_log(epoch)
                else:
                    logged = []
            except CorruptRecord as exc:
                what = "committed" if point.committed else "logged, not committed,"
                self._fail(f"cannot restore the checkpoint of epoch {epoch} ({what} in Spark's "
                           f"log): {exc}")
                raise
            self.restore_point = point
            self._record = record
            names = list(self.specs)
            self._tracker = CheckpointTracker(
                names, self.config.tolerable_checkpoint_failures,
                last_sealed=epoch, last_committed=epoch - 1 if epoch != NO_EPOCH else NO_EPOCH)
            self._gate = InboundGate(
                self.run_id, {s.name: s.parallelism for s in self.specs.values()},
                last_committed=epoch - 1 if epoch != NO_EPOCH else NO_EPOCH)
            replay: dict[str, list[ReplayedEvent]] = {name: [] for name in names}
            clients = record.snapshots.get(CLIENTS_KEY) if record is not None else None
            if clients is not None:  # re-sent client requests are answered once (decision 38)
                self._gate.client_memory_restored(pickle.loads(clients), epoch)
            if point.replays_inbound_log:
                items = InboundGate.replayed(logged).surviving_items()
                self._gate.clients_replayed(logged)
            elif epoch != NO_EPOCH:
                items = self._resume_epoch(epoch, logged)
            else:
                items = []
            for item in items:
                sid = item.attempt.subtask
                if sid.operator in replay:
                    replay[sid.operator].append(self._replayed(item, 0))
            for spec in self.specs.values():
                holder = CoordinatorHolder(
                    spec.name, spec.provider, spec.parallelism, self._mailbox_factory(spec.name),
                    self.clock, self.codec, self, last_checkpoint=epoch,
                    stall_warning_s=self.config.stall_warning_s,
                    available_now=self.available_now, read_part=self.storage.read_part)
                self._holders[spec.name] = holder
                snapshot = record.snapshots.get(spec.name) if record is not None else None
                holder.start(epoch, snapshot, replay[spec.name])
        log.info("%s", restore_line(self.run_id, point, items))
        if point.replays_inbound_log:
            self.batch_committed(epoch)

    def _resume_epoch(self, epoch: int, logged: list[LogEntry]) -> list[ReplayedItem]:
        # Under the lock, at a restore to the uncommitted epoch ``epoch`` (its batch runs
        # again). Operators that answered requests in it keep their history: tasks of the
        # previous run may have acted on those answers (and a sink may have kept that output),
        # so the batch's new tasks adopt it (decision 36). For every other operator the log is
        # truncated, as DESIGN rule 8 says. The kept entries replace the log durably before
        # anything else, and the coordinators get them again, as after a committed batch.
        assert self._gate is not None
        kept = kept_at_rerun(logged)
        self.storage.start_inbound_log(epoch, b"".join(encode_log_entry(e) for e in kept))
        self._gate.epoch_resumed(epoch, kept)
        if kept:  # the restore's INFO line counts the items these entries hold
            log.debug("epoch %d runs again: %d entries of its inbound log kept (items, "
                      "registrations, answers, finishes) of %s", epoch, len(kept),
                      ", ".join(sorted({e.attempt.subtask.operator for e in kept})))
        return self._gate.surviving_items()

    def _replayed(self, item: ReplayedItem, execution_attempt: int) -> ReplayedEvent:
        # A logged item as the holder hands it to a coordinator again (a reset, a restore).
        index = item.attempt.subtask.index
        if item.withdrawn is not None:
            return ReplayedEvent(index, execution_attempt, self._withdrawn(item.withdrawn),
                                 withdrawn=True)
        return ReplayedEvent(index, execution_attempt, self.codec.decode(item.payload),
                             self._replay_answer(item) if item.is_request else None, item.client)

    def _withdrawn(self, items: Sequence[WithdrawnItem]) -> list[Withdrawn]:
        # What ``handle_items_withdrawn`` is handed: the items and their answers, unpickled
        # (each was unpickled once before it was logged; a refused answer hands out nothing)
        decode = self.codec.decode
        out = []
        for item in items:
            response = item.response
            answered = response is not None and not response.failed
            out.append(Withdrawn(decode(item.payload), item.is_request, answered,
                                 decode(response.payload) if answered and response else None))
        return out

    def _replay_answer(self, item: ReplayedItem) -> Answered:
        """Where the answer to a replayed request goes: compared with the logged answer (a
        different one means the coordinator is not deterministic, and fails the job), or, if
        none was logged (the batch runs again), logged and served like a live answer."""
        attempt, seq, logged = item.attempt, item.seq, item.response

        def answered(payload: bytes, failed: bool) -> None:
            if item.client:
                # a client's answer reflects the state when it was asked; only its effect
                # must survive (decision 38): not compared, logged if it was not yet
                if logged is None:
                    self._client_response_ready(attempt, seq, payload, failed)
                return
            if logged is None:
                self._response_ready(attempt, seq, payload, failed)
                return
            if (logged.payload, logged.failed) == (payload, failed) or (
                    not failed and not logged.failed and self._same_value(logged.payload, payload)):
                return
            self._fail(f"nondeterministic coordinator {attempt.subtask.operator!r}: replaying "
                       f"request {seq} of {attempt.subtask} in epoch {attempt.epoch} gave a "
                       f"different answer than the logged one, which the task already used; "
                       f"handle_request must answer from the checkpointed state and the "
                       f"replayed inputs only (docs/coordinators.md, Requests)")
        return answered

    def _same_value(self, a: bytes, b: bytes) -> bool:
        try:
            return bool(self.codec.decode(a) == self.codec.decode(b))
        except Exception:  # noqa: BLE001 - a response that does not unpickle is not equal
            return False

    def batch_committed(self, epoch: int) -> None:
        """Spark committed the batch of ``epoch``: complete its futures, notify, prune.

        Driver thread. Repeated calls for the same epoch (Spark polls) do nothing.
        """
        with self._lock:
            tracker, gate = self._require_running()
            if not tracker.batch_committed(epoch):
                return
            gate.batch_committed(epoch)
            self._fail_waiters(f"the batch of epoch {epoch} committed")  # none expected
            # the gate admits nothing more for this epoch: its log is final
            try:
                self.storage.seal_inbound_log(epoch)
            except Exception as exc:
                self._fail(f"cannot write the seal of the inbound log of epoch {epoch}: {exc!r}")
                raise
            for holder in self._holders.values():
                holder.batch_committed(epoch)
        log.info("the batch of epoch %d committed: inbound log sealed, coordinators notified",
                 epoch)
        self.storage.prune(epoch)

    def has_held_events(self) -> bool:
        """Whether any coordinator holds events for a future epoch (a hint; any thread)."""
        return any(h.held_count() for h in self._holders.values())

    def wants_batch(self) -> bool:
        """Whether a new epoch should be sealed now (a hint; any thread): events are held for
        a subtask, a coordinator or subtask asked for a batch (work pending), or nothing was
        ever sealed (the first batch of a job lets its subtasks register and ask)."""
        return (self.last_sealed == NO_EPOCH
                or any(h.held_count() or h.batch_requested for h in self._holders.values()))

    def trigger_checkpoint(self, checkpoint_id: int) -> Future[PreparedCheckpoint]:
        """Start checkpoint ``checkpoint_id`` on every coordinator (driver thread).

        The future resolves when all completed, or fails with :class:`CheckpointDeclined` (a
        decline, a timeout) or :class:`JobFailed`.
        """
        with self._lock:
            self.raise_if_failed()
            tracker, _ = self._require_running()
            tracker.checkpoint_triggered(checkpoint_id)
            future: Future[PreparedCheckpoint] = Future()
            self._prepared = future
            self._prepared_events = {}
            self._prepared_parts = {}
            self._timeout = self.clock.call_later(
                self.config.checkpoint_timeout_s, lambda: self._timed_out(checkpoint_id))
            if self.config.stall_warning_s > 0:
                self._waiting = self.clock.call_later(
                    self.config.stall_warning_s, lambda: self._checkpoint_waiting(checkpoint_id, 1))
            for holder in self._holders.values():
                holder.trigger_checkpoint(checkpoint_id)
            return future

    def seal(self, prepared: PreparedCheckpoint) -> CheckpointRecord:
        """Write the record of a prepared checkpoint durably and start its epoch (driver thread).

        Only after this returns may the epoch's offset be handed to Spark.
        """
        epoch = prepared.checkpoint_id
        snapshots = dict(prepared.snapshots)
        with self._lock:
            # the client requests behind these snapshots (none is admitted while a checkpoint
            # is pending), so that a restore to this record answers their re-sends once
            clients = self._gate.client_memory() if self._gate is not None else []
        if clients:
            snapshots[CLIENTS_KEY] = pickle.dumps(clients, protocol=pickle.HIGHEST_PROTOCOL)
        record = CheckpointRecord(epoch, snapshots, prepared.events)
        started = time.perf_counter()
        self.storage.write_record(record, prepared.parts)
        self.storage.start_inbound_log(epoch)
        log.info("sealed epoch %d: %d events for subtasks, written in %.1f ms", epoch,
                 prepared.event_count(), (time.perf_counter() - started) * 1e3)
        with self._lock:
            tracker, gate = self._require_running()
            tracker.checkpoint_sealed(epoch)
            gate.epoch_started(epoch)
            self._record = record
            for holder in self._holders.values():
                holder.checkpoint_sealed(epoch)
        return record

    def checkpoint(self, checkpoint_id: int) -> CheckpointRecord | None:
        """Trigger, wait for and seal ``checkpoint_id``; None if it was declined (blocking).

        Driver thread, with real mailboxes. Raises :class:`JobFailed` on a global failure.
        """
        future = self.trigger_checkpoint(checkpoint_id)
        try:
            prepared = future.result()
        except CheckpointDeclined as exc:
            log.warning("%s", exc)
            self.raise_if_failed()
            return None
        return self.seal(prepared)

    def record_for(self, epoch: int) -> CheckpointRecord | None:
        """The record of ``epoch`` (None for the initial epoch). Any thread."""
        if epoch == NO_EPOCH:
            return None
        record = self._record
        if record is not None and record.epoch == epoch:
            return record
        return self.storage.read_record(epoch)

    # ------------------------------------------------------------------- channel threads
    def attempt_registered(self, attempt: TaskAttempt) -> InboundDecision:
        """A task announced its attempt (channel thread). Answer the task with the verdict."""
        with self._lock:
            refusal = self._inbound_refusal()
            if refusal:
                return InboundDecision(Verdict.REJECT, refusal)
            assert self._gate is not None
            decision = self._gate.attempt_registered(attempt)
            if decision.verdict is Verdict.ACCEPT:
                if decision.replaced is not None and not decision.adopted:
                    self._subtask_failed(attempt, decision)
                elif (decision.replaced is not None and decision.replaced.run != attempt.run
                      and attempt.number == 0):
                    # not a retry: the batch of a restored, uncommitted epoch runs again, and
                    # its first task takes over what the earlier run's task sent (gate rule 5)
                    log.info("epoch %d runs again after a restart: task of %s (Spark attempt "
                             "%d) continues the %d items its task of the earlier run sent, "
                             "answered from the log", attempt.epoch, attempt.subtask,
                             attempt.number, decision.history_length)
                elif decision.replaced is not None:
                    log.info("task of %s in epoch %d was retried (Spark attempt %d): it continues "
                             "the failed attempt's history (its requests were answered)",
                             attempt.subtask, attempt.epoch, attempt.number)
                self._append(attempt.epoch)
            return decision

    def attempt_finished(self, attempt: TaskAttempt, sent: int) -> Future[InboundDecision]:
        """``attempt`` (which asked a request or continues an adopted history) finished its
        batch having sent ``sent`` items (channel thread). Returns the future of the
        decision; the task waits for it before it ends.

        The finish is logged (gate rule 6). If the attempt sent fewer items than its history
        holds, the rest is withdrawn: in the same inbound critical section it is put on the
        coordinator's mailbox (``handle_items_withdrawn``), like an event, and the decision
        comes once the coordinator took the items back, so a coordinator that raises there
        fails the job before the batch can commit (DESIGN 2c); a task still waiting for an
        answer to a withdrawn request hears that none will come. A shorter history than an
        earlier run's finished attempt sent fails the job (divergence)."""
        done: Future[InboundDecision] = SendFuture()
        sid = attempt.subtask
        with self._lock:
            refusal = self._inbound_refusal()
            if refusal:
                done.set_result(InboundDecision(Verdict.REJECT, refusal))
                return done
            assert self._gate is not None
            pending = self._finishing.get(attempt)
            if pending is not None:
                return pending  # a re-sent finish: the decision comes when the first one's does
            decision = self._gate.attempt_finished(attempt, sent)
            if decision.verdict is Verdict.ACCEPT:
                self._append(attempt.epoch)
            if decision.verdict is not Verdict.ACCEPT or not decision.withdrawn:
                done.set_result(decision)
            else:
                self._finishing[attempt] = done
                for item in decision.withdrawn:
                    waiter = self._waiters.pop((sid, item.seq), None)
                    if waiter is not None and not waiter.done():
                        waiter.set_exception(RequestFailed(
                            f"request {item.seq} of {sid} was withdrawn: {attempt} finished "
                            f"without it"))

                def taken(ok: bool) -> None:  # the coordinator's thread, after its callback
                    with self._lock:
                        self._finishing.pop(attempt, None)
                    if not done.done():
                        done.set_result(decision if ok else InboundDecision(
                            Verdict.REJECT, f"the job failed: {self.failure}" if self.failure
                            else f"coordinator {sid.operator!r} is not running"))
                self._holders[sid.operator].deliver_withdrawn(
                    sid.index, decision.execution_attempt, self._withdrawn(decision.withdrawn),
                    taken)
        if decision.diverged:
            self._fail(decision.reason)  # outside the lock, like every failure
        elif decision.withdrawn:
            log.info("task of %s in epoch %d (Spark attempt %d) finished after %d items of its "
                     "history of %d: %d withdrawn and handed back to coordinator %r", sid,
                     attempt.epoch, attempt.number, sent, sent + len(decision.withdrawn),
                     len(decision.withdrawn), sid.operator)
        return done

    def history_length(self, subtask: SubtaskId) -> int:
        """The length of ``subtask``'s history in the running epoch (driver thread, when
        planning a batch): above 0 when its tasks continue a kept history (gate rule 6)."""
        with self._lock:
            return self._gate.history_length(subtask) if self._gate is not None else 0

    def event_received(self, attempt: TaskAttempt, seq: int, payload: bytes) -> InboundDecision:
        """Event ``seq`` of ``attempt`` arrived (channel thread). Acknowledge only on ACCEPT or
        DUPLICATE; the event is then logged durably and on the coordinator's mailbox."""
        return self.event_runs_received([(attempt, seq, (payload,))])[0].of_one(seq, attempt)

    def event_runs_received(self, runs: Sequence[tuple[TaskAttempt, int, tuple[bytes, ...]]]
                            ) -> list[RunDecision]:
        """Runs of consecutive events ``(attempt, first_seq, payloads)`` arrived together on one
        connection (channel thread), in send order.

        The critical section of one event, once for all of them: every run is decided by the
        gate, every accepted event is appended to the inbound log with one write, then put on
        its coordinator's mailbox in order; the caller acknowledges after this returns. A run is
        cut at an event that cannot be unpickled: those before it count, it and the rest are
        rejected. Decisions come back in the same order as the runs.
        """
        decode = self.codec.decode
        decoded: list[list[Any]] = []
        unreadable: list[tuple[int, str] | None] = []
        for attempt, first_seq, payloads in runs:
            try:
                decoded.append(list(map(decode, payloads)))
                unreadable.append(None)
            except Exception:  # noqa: BLE001 - unpickling raises anything: find the culprit
                decoded.append(good := [])
                for i, payload in enumerate(payloads):
                    try:
                        good.append(decode(payload))
                    except Exception as exc:  # noqa: BLE001
                        unreadable.append((i, f"event {first_seq + i} of {attempt} cannot be "
                                              f"unpickled on the driver: {exc!r}"))
                        break
                else:  # the second pass read them all (an unpickler that failed only once)
                    unreadable.append(None)
        with self._lock:
            refusal = self._inbound_refusal()
            if refusal:
                return [RunDecision(0, 0, len(p), refusal) for _, _, p in runs]
            gate = self._gate
            assert gate is not None
            decisions: list[RunDecision] = []
            accepted: list[tuple[TaskAttempt, int, list[Any]]] = []
            entries: list[bytes] = []
            for (attempt, first_seq, payloads), events, bad in zip(runs, decoded, unreadable, strict=True):
                readable = payloads if bad is None else payloads[:bad[0]]
                decision = (gate.event_run_received(attempt, first_seq, readable) if readable
                            else RunDecision(0, 0, 0))
                if bad is not None and not decision.rejected:
                    decision = RunDecision(decision.duplicates, decision.accepted,
                                           len(payloads) - len(readable), bad[1],
                                           decision.execution_attempt)
                decisions.append(decision)
                if decision.accepted:
                    if entries and accepted[-1][0].epoch != attempt.epoch:
                        self._append_many(accepted[-1][0].epoch, entries)
                        entries = []
                    entries.append(encode_log_entry(gate.last_entry))
                    start = decision.duplicates
                    accepted.append((attempt, decision.execution_attempt,
                                     events[start:start + decision.accepted]))
            if entries:
                self._append_many(accepted[-1][0].epoch, entries)
            diverged = next((d.reason for d in decisions if d.diverged), None)
            by_operator: dict[str, list[tuple[int, int, list[Any]]]] = {}
            for attempt, execution_attempt, events in accepted:  # one connection: one operator
                by_operator.setdefault(attempt.subtask.operator, []).append(
                    (attempt.subtask.index, execution_attempt, events))
            for operator, items in by_operator.items():
                self._holders[operator].deliver_many(items)
        if diverged is not None:
            self._fail(diverged)
        return decisions

    def request_received(self, attempt: TaskAttempt, seq: int, payload: bytes
                         ) -> Future[Answer]:
        """Request ``seq`` of ``attempt`` arrived (channel thread). Returns the future of its
        logged answer: the channel sends it to the task once it resolves, or the future's
        error (:class:`~sparkcoord.core.errors.RequestFailed`) when it fails.

        The request is decided by the gate, logged, and handed to the coordinator in the
        inbound critical section (rule 3); a repeated request (a re-send, or a retry that
        adopted the history: DESIGN 2b) gets the logged answer without reaching the
        coordinator again. A repeated request whose bytes differ fails the job.
        """
        answer: Future[Answer] = SendFuture()  # no condition unless someone waits
        request = self._decoded_request(payload, f"request {seq} of {attempt}", answer)
        if answer.done():
            return answer
        claimed: CoordinatorHolder | None = None
        with self._lock:
            gate = self._admitting(answer)
            if gate is None:
                return answer
            decision = gate.request_received(attempt, seq, payload)
            sid = attempt.subtask
            if decision.verdict is Verdict.REJECT:
                answer.set_exception(RequestFailed(decision.reason))
                if not decision.diverged:
                    return answer
            elif decision.verdict is Verdict.DUPLICATE:
                if decision.response is not None:
                    answer.set_result(decision.response)
                    return answer
                return self._waiters.setdefault((sid, seq), answer)
            else:
                self._append(attempt.epoch)
                self._waiters[(sid, seq)] = answer
                holder = self._holders[sid.operator]
                if holder.deliver_request(
                        sid.index, decision.execution_attempt, request,
                        lambda data, failed: self._response_ready(attempt, seq, data, failed)):
                    claimed = holder
                else:
                    return answer
        if claimed is not None:
            # this thread claimed the idle mailbox: it runs handle_request (and whatever was
            # queued behind it) now, outside the lock (rule 3: no user code under the lock)
            claimed.mailbox.run_claimed()
            return answer
        self._fail(decision.reason)  # diverged: outside the lock, like every failure
        return answer

    def client_request_received(self, operator: str, client: str, seq: int, payload: bytes
                                ) -> Future[Answer]:
        """Request ``seq`` of ``client`` (the user's driver program, through
        ``CoordinatedJob.request``) to ``operator`` arrived (channel thread). Returns the future
        of its logged answer, as :meth:`request_received` does for a task.

        Logged in the current epoch's log (the running batch's, or after a committed batch's
        entries until the next epoch starts: decision 38) before the coordinator's
        ``handle_client_request`` sees it, so its effect survives a reset and a restore; a
        re-send of the same ``(client, seq)`` is answered from the log.
        """
        answer: Future[Answer] = SendFuture()
        request = self._decoded_request(payload, f"client request {seq} to {operator!r}", answer)
        if answer.done():
            return answer
        with self._lock:
            gate = self._admitting(answer, client=True)
            if gate is None:
                return answer
            decision = gate.client_request_received(operator, client, seq, payload)
            key = (operator, client, seq)
            if decision.verdict is Verdict.REJECT:
                answer.set_exception(RequestFailed(decision.reason))
                return answer
            if decision.verdict is Verdict.DUPLICATE:
                if decision.response is not None:
                    answer.set_result(decision.response)
                    return answer
                return self._client_waiters.setdefault(key, answer)
            epoch = gate.client_log_epoch
            assert epoch is not None
            identity = gate.last_entry.attempt
            self._append(epoch)
            self._client_waiters[key] = answer
            holder = self._holders[operator]
            if not holder.deliver_client_request(
                    request,
                    lambda data, failed: self._client_response_ready(identity, seq, data, failed)):
                return answer
        holder.mailbox.run_claimed()  # claimed the idle mailbox: answer here, outside the lock
        return answer

    def _decoded_request(self, payload: bytes, what: str, answer: Future[Answer]) -> Any:
        # Unpickled before it is logged (decision 6): a request the driver cannot unpickle
        # fails ``answer`` (the asker learns why) and is never logged.
        try:
            return self.codec.decode(payload)
        except Exception as exc:  # noqa: BLE001 - unpickling raises anything
            answer.set_exception(RequestFailed(f"{what} cannot be unpickled on the driver: "
                                               f"{exc!r}"))
            return None

    def _admitting(self, answer: Future[Answer], client: bool = False) -> InboundGate | None:
        # Under the lock: the gate, or None (and ``answer`` failed) when nothing is admitted.
        refusal = self._inbound_refusal()
        if not refusal and client and self._tracker is not None \
                and self._tracker.pending is not None:
            # A client request handled after a coordinator's boundary would be in neither
            # the snapshot nor a log that a restore to this checkpoint replays: hold it off
            # until the checkpoint is sealed or aborted (between batches, briefly).
            refusal = (f"checkpoint {self._tracker.pending} is being taken; ask again")
        if refusal:
            answer.set_exception(RequestFailed(refusal))
            return None
        return self._gate

    def _client_response_ready(self, asked_by: TaskAttempt, seq: int, payload: bytes,
                               failed: bool) -> None:
        with self._lock:
            if self._closed or self.failure is not None or self._gate is None:
                return
            entry = self._gate.client_response_recorded(asked_by, seq, payload, failed)
            epoch = self._gate.client_log_epoch
            if entry is None or epoch is None:
                return
            self._append(epoch)  # the current log, maybe a later epoch's than the request's
            waiter = self._client_waiters.pop((asked_by.subtask.operator, asked_by.run, seq), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(entry)

    def _response_ready(self, asked_by: TaskAttempt, seq: int, payload: bytes,
                        failed: bool) -> None:
        # The coordinator's thread that produced the answer: log it, then hand it to the task
        # waiting for it (if any: a retry that adopts the history may ask later).
        with self._lock:
            if self._closed or self.failure is not None or self._gate is None:
                return
            entry = self._gate.response_recorded(asked_by, seq, payload, failed)
            if entry is None:
                return
            self._append(asked_by.epoch)
            waiter = self._waiters.pop((asked_by.subtask, seq), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(entry)

    def _fail_waiters(self, why: str) -> None:
        # Under the lock or not: every task waiting for an answer learns that none will come,
        # and every task waiting for its finish that it is refused
        finishing, self._finishing = self._finishing, {}
        for done in finishing.values():
            if not done.done():
                done.set_result(InboundDecision(Verdict.REJECT, why))
        waiters, self._waiters = self._waiters, {}
        for (sid, seq), waiter in waiters.items():
            if not waiter.done():
                waiter.set_exception(RequestFailed(f"request {seq} of {sid}: {why}"))

    def _fail_client_waiters(self, why: str) -> None:
        waiters, self._client_waiters = self._client_waiters, {}
        for (operator, client, seq), waiter in waiters.items():
            if not waiter.done():
                waiter.set_exception(RequestFailed(f"request {seq} of client {client} to "
                                                   f"{operator!r}: {why}"))

    def _inbound_refusal(self) -> str:
        # Under the lock. A closed service refuses too: a straggler task of an ended run must
        # never append to the logs that the next run of the job writes.
        if self._closed:
            return "the coordination service of this run is closed"
        if self.failure is not None:
            return f"the job failed: {self.failure}"
        if self._gate is None:
            return "the service has not been restored yet"
        return ""

    def _append_many(self, epoch: int, entries: list[bytes]) -> None:
        try:
            self.storage.append_inbound(epoch, b"".join(entries))
        except Exception as exc:
            self._fail(f"cannot append to the inbound log of epoch {epoch}: {exc!r}")
            raise

    def _append(self, epoch: int) -> None:
        assert self._gate is not None
        try:
            self.storage.append_inbound(epoch, encode_log_entry(self._gate.last_entry))
        except Exception as exc:
            self._fail(f"cannot append to the inbound log of epoch {epoch}: {exc!r}")
            raise

    def _subtask_failed(self, attempt: TaskAttempt, decision: InboundDecision) -> None:
        assert self._gate is not None and decision.replaced is not None
        sid = attempt.subtask
        record = self._record
        if record is None or record.epoch != attempt.epoch:
            raise IllegalTransition(f"task retry {attempt} without the record of its epoch")
        # the other subtasks' events and the clients' requests, in log order (a reset comes
        # before any subtask request of the epoch: rule 5 of the gate)
        replay = [self._replayed(i, 0 if i.client
                                 else self._gate.execution_attempt(i.attempt.subtask))
                  for i in self._gate.surviving_items(sid.operator, excluding=sid)]
        reason = (f"task of {sid} in epoch {attempt.epoch} was retried: Spark attempt "
                  f"{decision.replaced.number} replaced by attempt {attempt.number}")
        log.info("%s; coordinator %r reset to the snapshot of epoch %d, %d entries of the "
                 "other subtasks and clients replayed", reason, sid.operator, attempt.epoch,
                 len(replay))
        self._holders[sid.operator].subtask_failed(
            sid.index, decision.execution_attempt - 1, reason, attempt.epoch,
            record.snapshots.get(sid.operator), replay)

    # --------------------------------------------------------------- holder listener side
    def coordinator_completed(self, name: str, checkpoint_id: int, snapshot: bytes | None,
                              events: list[list[bytes]],
                              parts: dict[str, StoredOnce[Any]] | None = None) -> None:
        """A coordinator's boundary (its mailbox thread)."""
        with self._lock:
            tracker = self._tracker
            if tracker is None or tracker.pending != checkpoint_id:
                return
            self._prepared_events[name] = events
            self._prepared_parts[name] = parts or {}
            if not tracker.coordinator_completed(name, checkpoint_id, snapshot):
                return
            self._cancel_checkpoint_timers()
            prepared = PreparedCheckpoint(checkpoint_id, tracker.snapshots(checkpoint_id))
            for op, per_subtask in self._prepared_events.items():
                for index, payloads in enumerate(per_subtask):
                    if payloads:
                        prepared.events[SubtaskId(op, index)] = payloads
            for held in self._prepared_parts.values():
                prepared.parts.update(held)
            future = self._prepared
        if future is not None:
            future.set_result(prepared)

    def coordinator_declined(self, name: str, checkpoint_id: int, reason: str) -> None:
        """A coordinator failed its checkpoint future (its mailbox thread)."""
        with self._lock:
            if self._tracker is None:
                return
            self._apply_abort(self._tracker.coordinator_declined(name, checkpoint_id, reason))

    def coordinator_failed(self, name: str, cause: str) -> None:
        """``fail_job`` or a callback exception (its mailbox thread)."""
        self._fail(cause)

    def _cancel_checkpoint_timers(self) -> None:
        # Under the lock: the pending checkpoint's timeout and stall warning.
        for timer in (self._timeout, self._waiting):
            if timer is not None:
                timer.cancel()

    def _checkpoint_waiting(self, checkpoint_id: int, intervals: int) -> None:
        # Clock's timer thread: the checkpoint is still pending after ``intervals`` warnings'
        # worth of time; say who it waits for, until it is sealed, aborted or timed out.
        with self._lock:
            tracker = self._tracker
            if self._closed or tracker is None or tracker.pending != checkpoint_id:
                return
            waiting = tracker.waiting_for()
            self._waiting = self.clock.call_later(
                self.config.stall_warning_s,
                lambda: self._checkpoint_waiting(checkpoint_id, intervals + 1))
        if waiting:
            log.warning("checkpoint %d has waited %.0f s for %s %s to complete the checkpoint "
                        "future (it is declined after %.0f s: ServiceConfig.checkpoint_timeout_s)",
                        checkpoint_id, intervals * self.config.stall_warning_s,
                        "coordinator" if len(waiting) == 1 else "coordinators",
                        ", ".join(repr(w) for w in waiting), self.config.checkpoint_timeout_s)

    def _timed_out(self, checkpoint_id: int) -> None:
        with self._lock:
            if self._tracker is None:
                return
            self._apply_abort(self._tracker.checkpoint_timed_out(
                checkpoint_id, self.config.checkpoint_timeout_s))

    def _apply_abort(self, abort: CheckpointAbort | None) -> None:
        if abort is None:
            return
        self._cancel_checkpoint_timers()
        for holder in self._holders.values():
            holder.checkpoint_aborted(abort.checkpoint_id)
        if abort.fail_job is not None:
            self._fail(abort.fail_job)  # fails the pending future with JobFailed
        future, self._prepared = self._prepared, None
        if future is not None and not future.done():
            future.set_exception(CheckpointDeclined(abort.reason))

    # --------------------------------------------------------------------------- failures
    def add_failure_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(cause)`` (on the failing thread) at the first global failure."""
        self._failure_listeners.append(listener)

    def _fail(self, cause: str) -> None:
        with self._lock:
            if self.failure is not None or self._failing:
                return
            self._failing = True  # the first failure wins
        log.error("global failure: %s", cause)
        # Recorded before the failure is published: once it is, the query may end at once, and
        # the job runner then reads this file to report the cause (decision 35).
        try:
            self.storage.record_failure(self.run_id, cause)
        except Exception:  # noqa: BLE001 - the report is a courtesy; the failure stands
            log.exception("cannot record the failure of run %s", self.run_id)
        with self._lock:
            self.failure = cause
            for holder in self._holders.values():
                holder.globally_failed(cause)
            future, self._prepared = self._prepared, None
            if self._waiting is not None:
                self._waiting.cancel()  # the timeout stays: it aborts the checkpoint
            self._fail_waiters(f"the job failed: {cause}")
            self._fail_client_waiters(f"the job failed: {cause}")
        if future is not None and not future.done():
            future.set_exception(JobFailed(cause))
        for listener in self._failure_listeners:
            listener(cause)

    def fail_job(self, cause: str) -> None:
        """Fail the job from outside the coordinators (e.g. a Spark-side error). Any thread."""
        self._fail(cause)

    def raise_if_failed(self) -> None:
        """Raise :class:`JobFailed` if a global failure happened. Any thread."""
        if self.failure is not None:
            raise JobFailed(self.failure)

    def close(self) -> None:
        """End of the run: close coordinators, mailboxes and storage handles. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cancel_checkpoint_timers()
            self._fail_waiters("the coordination service of this run is closed")
            self._fail_client_waiters("the coordination service of this run is closed")
            holders = list(self._holders.values())
        for holder in holders:
            holder.close()
        self.storage.close()

    # ------------------------------------------------------------------------------ misc
    @property
    def holders(self) -> Mapping[str, CoordinatorHolder]:
        return self._holders

    @property
    def next_checkpoint_id(self) -> int:
        """The id the next checkpoint must have (ids only increase, even past declines)."""
        tracker, _ = self._require_running()
        return max(tracker.last_triggered, tracker.last_sealed) + 1

    @property
    def last_sealed(self) -> int:
        return self._tracker.last_sealed if self._tracker is not None else NO_EPOCH

    @property
    def last_committed(self) -> int:
        return self._tracker.last_committed if self._tracker is not None else NO_EPOCH

    def live_attempt(self, subtask: SubtaskId) -> TaskAttempt | None:
        """The live task attempt of ``subtask`` in the running batch, if any. Any thread."""
        with self._lock:
            return self._gate.live_attempt(subtask) if self._gate is not None else None

    def _require_running(self) -> tuple[CheckpointTracker, InboundGate]:
        if self._tracker is None or self._gate is None:
            raise IllegalTransition("the service has not been restored yet: the run's first "
                                    "latestOffset/partitions call restores it")
        return self._tracker, self._gate


def restore_line(run_id: str, point: RestorePoint, items: Sequence[ReplayedItem]) -> str:
    """The one INFO line of a restore: from where the run starts, and what the numbers are
    that the coordinators get again (``items``: the logged events, requests and withdrawals
    handed to them, in log order) and why (issue 25)."""
    epoch = point.epoch
    if epoch == NO_EPOCH:
        return f"run {run_id} starts fresh: Spark's log holds no epoch of this source yet"
    operators = sorted({i.attempt.subtask.operator for i in items})
    to = (f"coordinator{'s' if len(operators) > 1 else ''} {', '.join(operators)}"
          if operators else "the coordinators")
    if point.committed:
        handed = (f"what was sent to {to} in it handed again ({_counted(items)})" if items
                  else "nothing was sent to them in it")
        return (f"run {run_id} restored epoch {epoch}, whose batch committed: coordinators "
                f"reset to its snapshot, {handed}, then told it committed")
    line = (f"run {run_id} restored epoch {epoch}, logged but not committed: its batch runs "
            f"again from the snapshot of epoch {epoch}")
    if not items:
        return line
    them = "it" if len(operators) == 1 else "them"
    return (f"{line}. Answers were given out in it, so what was sent to {to} before the "
            f"restart is kept ({_counted(items)}): handed to {them} again, and the batch's "
            f"tasks continue from it, answered from the log")


def _counted(items: Sequence[ReplayedItem]) -> str:
    """``items`` by kind: ``"1 request"``, ``"7 items: 5 requests, 2 events"``."""
    kinds = {"request": 0, "event": 0, "client request": 0, "withdrawal": 0}
    for item in items:
        kind = ("withdrawal" if item.withdrawn is not None else "client request" if item.client
                else "request" if item.is_request else "event")
        kinds[kind] += 1
    parts = [f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in kinds.items() if n]
    return parts[0] if len(parts) == 1 else f"{len(items)} items: {', '.join(parts)}"
