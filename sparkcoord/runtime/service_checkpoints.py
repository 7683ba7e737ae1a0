"""The checkpoint round of the coordination service: trigger, completion, decline or
timeout, seal; and the record an epoch's batch delivers.

:class:`ServiceCheckpoints` holds these methods of
:class:`~sparkcoord.runtime.service.CoordinationService`, which is made of it, of the restore
path (``service_restore.py``) and of failure and close (``service.py``; no import circle:
``service.py`` imports this module, this module nothing of the service's). A rule number
alone is this module's; the service's are cited as "service rule N".

Rules:
  1. A checkpoint is sealed only when all coordinators completed it; the record is durable
     before ``checkpoint`` returns, and the epoch's inbound log is created empty (a garbage
     log of an unlogged epoch is discarded). This is service rule 2.
  2. A decline of any coordinator, or the checkpoint's timeout (``checkpoint_timeout_s``),
     aborts the pending checkpoint on every holder; after ``tolerable_checkpoint_failures``
     aborted checkpoints in a row, the next abort fails the job (core/checkpoints.py rule 3). While it is pending, a WARNING every ``stall_warning_s`` names
     the coordinators it waits for.
  3. The record holds the client requests behind its snapshots (``CLIENTS_KEY``): none is
     admitted while a checkpoint is pending (inbox rule 3), so a restore to the record answers
     their re-sends once.

Thread model: as ``service.py``: the driver thread triggers, waits and seals; the coordinators'
mailbox threads complete and decline; the clock's timer thread times out and warns. State is
guarded by the service's ``_lock``, which is never held while the record is written.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkcoord.coordinator import Cancellable
from sparkcoord.core.checkpoints import CheckpointAbort, CheckpointTracker
from sparkcoord.core.errors import SparkCoordError
from sparkcoord.core.ids import NO_EPOCH, SubtaskId
from sparkcoord.core.lease import LeaseLost
from sparkcoord.core.records import CheckpointRecord
from sparkcoord.core.stored import StoredOnce
from sparkcoord.runtime.clock import Clock
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.holder import CoordinatorHolder
from sparkcoord.runtime.inbox import Inbox
from sparkcoord.runtime.storage import CheckpointStorage

# the service's logger: log setups and tests name it (docs/decisions/105-runtime-modules.md)
log = logging.getLogger("sparkcoord.runtime.service")

#: the module that exports :class:`CheckpointDeclined` and names it: its path before this
#: module existed, so an error line reads as before
EXPORTED_BY = "sparkcoord.runtime.service"


#: Where a record keeps the service's memory of client requests (no operator has this name).
CLIENTS_KEY = "\x00clients"


class CheckpointDeclined(SparkCoordError):
    """A checkpoint was declined by a coordinator or timed out; nothing was sealed."""


CheckpointDeclined.__module__ = EXPORTED_BY


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


class ServiceCheckpoints:
    """The checkpoint round's methods of
    :class:`~sparkcoord.runtime.service.CoordinationService` (module rules); not used alone."""

    # what the checkpoint round uses of the service (``service.py``), for the type checker
    storage: CheckpointStorage
    config: ServiceConfig
    clock: Clock
    inbox: Inbox
    _lock: threading.RLock
    _holders: dict[str, CoordinatorHolder]
    _tracker: CheckpointTracker | None
    _record: CheckpointRecord | None
    _prepared: Future[PreparedCheckpoint] | None
    _prepared_events: dict[str, list[list[bytes]]]
    _prepared_parts: dict[str, dict[str, StoredOnce[Any]]]
    _timeout: Cancellable | None
    _waiting: Cancellable | None
    _closed: bool

    if TYPE_CHECKING:
        def raise_if_failed(self) -> None: ...

        def _fail(self, cause: str) -> None: ...

        def _require_running(self) -> CheckpointTracker: ...

    # ---------------------------------------------------------- the round (driver thread)
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
        except LeaseLost as exc:  # service rule 5: another run has the job now
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
