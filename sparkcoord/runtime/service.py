"""The coordination service: the coordinators of one job, their checkpoints and their inbox.

It lives on the driver (in Spark: the long-lived source runner process) and is driven by three
kinds of callers:
  * the driver adapter, in Spark's order of calls: the run's first decisive call restores,
    ``latest_offset_called`` completes the previous epoch and maybe seals a new one,
    ``partitions_called`` hands out an epoch's events;
  * coordinator mailboxes: checkpoint completions, declines and failures;
  * its :class:`~sparkcoord.runtime.inbox.Inbox` (the channel's handler), where every input
    from tasks and clients arrives: a failure it meets comes here.

It is made of this module (the adapter's calls, the commit, failure and close), of its
restore (``service_restore.py``) and of its checkpoint round (``service_checkpoints.py``;
docs/decisions/105-runtime-modules.md).

Rules:
  1. Restore (docs/protocol.md [restore-point-from-first-driver-call] [restore-order]) happens
     once, at the first ``latest_offset_called`` or ``partitions_called`` of the run, before any
     coordinator starts; the inbox admits nothing before it (service_restore.py rule 1).
  2. A checkpoint is sealed only when all coordinators completed it; the record is durable
     before ``checkpoint`` returns, and the epoch's inbound log is created empty (a garbage
     log of an unlogged epoch is discarded): service_checkpoints.py rule 1.
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
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any

from sparkcoord.coordinator import Cancellable
from sparkcoord.core.checkpoints import CheckpointTracker
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.errors import IllegalTransition, SparkCoordError
from sparkcoord.core.ids import NO_EPOCH
from sparkcoord.core.records import CheckpointRecord
from sparkcoord.core.restore import RestorePoint, RestorePointDetector
from sparkcoord.core.stored import StoredOnce
from sparkcoord.runtime.clock import Clock, SystemClock
from sparkcoord.runtime.config import ServiceConfig as ServiceConfig
from sparkcoord.runtime.holder import CoordinatorHolder
from sparkcoord.runtime.inbox import Inbox
from sparkcoord.runtime.mailbox import ThreadMailbox
from sparkcoord.runtime.service_checkpoints import CLIENTS_KEY as CLIENTS_KEY
from sparkcoord.runtime.service_checkpoints import CheckpointDeclined as CheckpointDeclined
from sparkcoord.runtime.service_checkpoints import PreparedCheckpoint as PreparedCheckpoint
from sparkcoord.runtime.service_restore import CoordinatorSpec as CoordinatorSpec
from sparkcoord.runtime.service_restore import MailboxFactory as MailboxFactory
from sparkcoord.runtime.service_restore import ServiceRestore
from sparkcoord.runtime.service_restore import _counted as _counted
from sparkcoord.runtime.service_restore import restore_line as restore_line
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.runtime.workers import ThreadWorkers, Workers

log = logging.getLogger(__name__)


class JobFailed(SparkCoordError):
    """A global failure: the query must fail and be restarted from its checkpoint."""


class CoordinationService(ServiceRestore):
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
