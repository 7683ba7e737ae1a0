"""The coordination service: the coordinators of one job, their checkpoints and their inbox.

It lives on the driver (in Spark: the long-lived source runner process) and is driven by three
kinds of callers:
  * the driver adapter, in Spark's order of calls: the run's first decisive call restores,
    ``latest_offset_called`` completes the previous epoch and maybe seals a new one,
    ``partitions_called`` hands out an epoch's events;
  * coordinator mailboxes: checkpoint completions, declines and failures;
  * its :class:`~sparkcoord.runtime.inbox.Inbox` (the channel's handler), where every input
    from tasks and clients arrives: a failure it meets comes here.

Rules:
  1. Restore (docs/protocol.md [restore-point-from-first-driver-call] [restore-order]) happens
     once, at the first ``latest_offset_called`` or ``partitions_called`` of the run, before any
     coordinator starts; the inbox admits nothing before it.
  2. A checkpoint is sealed only when all coordinators completed it; the record is durable
     before ``checkpoint`` returns, and the epoch's inbound log is created empty (a garbage
     log of an unlogged epoch is discarded).
  3. The inbox works under the service's lock (inbox rule 1), so a restore, a seal or a commit
     and the inputs around it happen in one total order (docs/protocol.md
     [inbound-critical-section]).
  4. The first global failure wins; afterwards the service and its inbox refuse everything
     and the adapter fails the query with the failure's text. A closed service refuses too.
  5. A run whose lease was taken over by a newer run (runtime/lease.py rule 3) fails at its
     restore or its next seal with :class:`~sparkcoord.core.lease.LeaseLost`, before it
     writes (storage rule 5); a seal found fenced in ``batch_committed`` fails the job too.

Thread model: every public method may be called from any thread; service state is guarded by
``_lock``, which the inbox shares. Holders are called under it and only enqueue, so the lock
is never held while user code runs.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.coordinator import Cancellable, CoordinatorProvider
from sparkcoord.core.checkpoints import CheckpointAbort, CheckpointTracker
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.encoding import loads
from sparkcoord.core.errors import (
    CorruptRecord,
    IllegalTransition,
    SparkCoordError,
)
from sparkcoord.core.ids import NO_EPOCH, SubtaskId
from sparkcoord.core.inbound import InboundGate, ReplayedItem
from sparkcoord.core.lease import LeaseLost
from sparkcoord.core.records import CheckpointRecord
from sparkcoord.core.restore import RestorePoint, RestorePointDetector
from sparkcoord.core.stored import StoredOnce, snapshot_parts
from sparkcoord.runtime.clock import Clock, SystemClock
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.holder import CoordinatorHolder, ReplayedEvent
from sparkcoord.runtime.inbox import Inbox
from sparkcoord.runtime.mailbox import Mailbox, ThreadMailbox
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.runtime.workers import ThreadWorkers, Workers

log = logging.getLogger(__name__)


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
                 available_now: bool = False, workers: Workers | None = None) -> None:
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
        #: where the coordinators' ``call_async`` works run (runtime/workers.py)
        self.workers = workers or ThreadWorkers()
        self._lock = threading.RLock()
        self.detector = RestorePointDetector()
        self.restore_point: RestorePoint | None = None
        self.failure: str | None = None
        self._failure_listeners: list[Callable[[str], None]] = []
        self._holders: dict[str, CoordinatorHolder] = {}
        self._tracker: CheckpointTracker | None = None
        self._record: CheckpointRecord | None = None
        self._prepared: Future[PreparedCheckpoint] | None = None
        self._prepared_events: dict[str, list[list[bytes]]] = {}
        self._prepared_parts: dict[str, dict[str, StoredOnce[Any]]] = {}
        self._restored_parts: list[StoredOnce[Any]] = []
        self._timeout: Cancellable | None = None
        self._waiting: Cancellable | None = None  # the pending checkpoint's stall warning
        self._failing = False
        self._closed = False
        #: where every input arrives, from tasks and clients alike (the channel's handler)
        self.inbox = Inbox(self._lock, storage, self.codec, self._holders, self._fail,
                           self._checkpoint_pending)

    # ---------------------------------------------------------------- driver adapter calls
    def latest_offset_called(self, start_epoch: int) -> None:
        """Spark asked for the offset after ``start_epoch`` (driver thread).

        The run's first such call restores from ``start_epoch`` (committed); later ones mean the
        batch of ``start_epoch`` committed, the completion signal of docs/protocol.md
        [completion-from-latest-offset].
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
        self.inbox.epoch_logged(end_epoch)
        return self.record_for(end_epoch)

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
                self.storage.check_fence()  # rule 5
            except LeaseLost as exc:
                self._fail(f"LeaseLost: {exc}")
                raise
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
            gate = InboundGate(
                self.run_id, {s.name: s.parallelism for s in self.specs.values()},
                last_committed=epoch - 1 if epoch != NO_EPOCH else NO_EPOCH)
            replay: dict[str, list[ReplayedEvent]] = {name: [] for name in names}
            clients = record.snapshots.get(CLIENTS_KEY) if record is not None else None
            # re-sent client requests are answered once (docs/protocol.md
            # [client-requests-take-effect-once])
            if clients is not None:
                gate.client_memory_restored(loads(clients), epoch)
            self.inbox.opened(gate, record)
            if point.replays_inbound_log:
                items = InboundGate.replayed(logged).surviving_items()
                gate.clients_replayed(logged)
            elif epoch != NO_EPOCH:
                items = self.inbox.epoch_resumed(epoch, logged)
            else:
                items = []
            for item in items:
                sid = item.attempt.subtask
                if sid.operator in replay:
                    replay[sid.operator].append(self.inbox.replayed(item, 0))
            for spec in self.specs.values():
                holder = CoordinatorHolder(
                    spec.name, spec.provider, spec.parallelism, self._mailbox_factory(spec.name),
                    self.clock, self.codec, self, last_checkpoint=epoch,
                    stall_warning_s=self.config.stall_warning_s,
                    available_now=self.available_now, read_part=self.storage.read_part,
                    workers=self.workers)
                self._holders[spec.name] = holder
                snapshot = record.snapshots.get(spec.name) if record is not None else None
                holder.start(epoch, snapshot, replay[spec.name],
                             committed=point.replays_inbound_log)
        log.info("%s", restore_line(self.run_id, point, items))
        if point.replays_inbound_log:
            self.batch_committed(epoch)

    def batch_committed(self, epoch: int) -> None:
        """Spark committed the batch of ``epoch``: complete its futures, notify, prune.

        Driver thread. Repeated calls for the same epoch (Spark polls) do nothing.
        """
        with self._lock:
            tracker = self._require_running()
            if not tracker.batch_committed(epoch):
                return
            self.inbox.batch_committed(epoch)
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

    def run_ending(self) -> None:
        """An ``availableNow`` run is about to end (driver thread, in the ``latestOffset`` that
        seals nothing): wait until every coordinator's side effects of the committed batches
        are done (``OperatorCoordinator.run_ending``), up to ``run_end_wait_s``; a coordinator
        not done by then, or whose future failed, fails the job naming it, so the run does
        not report done without them."""
        waits = {name: holder.run_ending() for name, holder in self._holders.items()}
        deadline = time.monotonic() + self.config.run_end_wait_s
        for name, fut in waits.items():
            # wait() rather than result(timeout): a coordinator's own TimeoutError is a
            # failure, not our deadline (and Python 3.10's futures raise another class)
            wait_futures([fut], timeout=max(0.0, deadline - time.monotonic()))
            if not fut.done():
                self._fail(f"coordinator {name!r}: its side effects of the committed batches "
                           f"(a committer's commits) were not done {self.config.run_end_wait_s:g} "
                           f"s after the availableNow run's last batch committed; they stay "
                           f"pending in the checkpoint and run again after a restart")
            elif fut.exception() is not None:
                self._fail(f"coordinator {name!r}: its side effects of the committed batches "
                           f"failed as the availableNow run ended: {fut.exception()!r}")
            # a coordinator that raised in run_ending() failed the job already
            self.raise_if_failed()

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
            tracker = self._require_running()
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
            gate = self.inbox.gate
            clients = gate.client_memory() if gate is not None else []
        if clients:
            snapshots[CLIENTS_KEY] = pickle.dumps(clients, protocol=pickle.HIGHEST_PROTOCOL)
        record = CheckpointRecord(epoch, snapshots, prepared.events)
        started = time.perf_counter()
        try:
            self.storage.write_record(record, prepared.parts)
            self.storage.start_inbound_log(epoch)
        except LeaseLost as exc:  # rule 5: another run has the job now
            self._fail(f"LeaseLost: {exc}")
            raise
        log.info("sealed epoch %d: %d events for subtasks, written in %.1f ms", epoch,
                 prepared.event_count(), (time.perf_counter() - started) * 1e3)
        with self._lock:
            tracker = self._require_running()
            tracker.checkpoint_sealed(epoch)
            self.inbox.epoch_started(record)
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
        # the job runner then reads this file to report the cause (docs/protocol.md
        # [global-failover]).
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
            self.inbox.refuse(f"the job failed: {cause}")
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
            # a straggler task of an ended run must never append to the logs that the next
            # run of the job writes
            self.inbox.refuse("the coordination service of this run is closed", final=True)
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
        tracker = self._require_running()
        return max(tracker.last_triggered, tracker.last_sealed) + 1

    @property
    def last_sealed(self) -> int:
        return self._tracker.last_sealed if self._tracker is not None else NO_EPOCH

    @property
    def last_committed(self) -> int:
        return self._tracker.last_committed if self._tracker is not None else NO_EPOCH

    def _require_running(self) -> CheckpointTracker:
        if self._tracker is None:
            raise IllegalTransition("the service has not been restored yet: the run's first "
                                    "latestOffset/partitions call restores it")
        return self._tracker

    def _checkpoint_pending(self) -> int | None:
        # The inbox's question (under the lock): the checkpoint being taken, if one is.
        return self._tracker.pending if self._tracker is not None else None


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
