"""The restore of the coordination service: the coordinators of a run created and started
from the checkpoint Spark's first call names, with the inbound log of its epoch.

:class:`ServiceRestore` holds the restore of
:class:`~sparkcoord.runtime.service.CoordinationService`, which is made of it, of the
checkpoint round (``service_checkpoints.py``, which this class extends: the service is the
holders' listener from their start on) and of failure and close (``service.py``; no import
circle: ``service.py`` imports this module, this module nothing of the service's but the
round). A rule number alone is this module's; the service's are cited as "service rule N".

Rules:
  1. Restore (docs/protocol.md [restore-point-from-first-driver-call] [restore-order]) happens
     once, at the first ``latest_offset_called`` or ``partitions_called`` of the run, before any
     coordinator starts; the inbox admits nothing before it. This is service rule 1.
  2. Every file a restore reads is verified (the record, the state parts its snapshots refer
     to, the inbound log): a missing or damaged one fails the job with an error naming it,
     and a lease taken over fails it with ``LeaseLost`` before anything is read (service
     rule 5).
  3. A restore says in one INFO line from where the run starts and what the coordinators are
     handed again, and why (:func:`restore_line`).

Thread model: the driver thread, under the service's ``_lock`` (shared with the inbox,
service rule 3); the holders are started under it and only enqueue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkcoord.coordinator import CoordinatorProvider
from sparkcoord.core.checkpoints import CheckpointTracker
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.encoding import loads
from sparkcoord.core.errors import CorruptRecord, IllegalTransition
from sparkcoord.core.ids import NO_EPOCH
from sparkcoord.core.inbound import InboundGate, ReplayedItem
from sparkcoord.core.lease import LeaseLost
from sparkcoord.core.restore import RestorePoint
from sparkcoord.core.stored import StoredOnce, snapshot_parts
from sparkcoord.runtime.holder import CoordinatorHolder, ReplayedEvent
from sparkcoord.runtime.mailbox import Mailbox
from sparkcoord.runtime.service_checkpoints import CLIENTS_KEY, ServiceCheckpoints
from sparkcoord.runtime.workers import Workers

# the service's logger: log setups and tests name it (docs/decisions/105-runtime-modules.md)
log = logging.getLogger("sparkcoord.runtime.service")


@dataclass(frozen=True)
class CoordinatorSpec:
    """One coordinated operator: its name, how to create its coordinator, its parallelism."""

    name: str
    provider: CoordinatorProvider
    parallelism: int


MailboxFactory = Callable[[str], Mailbox]


class ServiceRestore(ServiceCheckpoints):
    """The restore of :class:`~sparkcoord.runtime.service.CoordinationService` (module
    rules); not used alone."""

    # what the restore uses of the service (``service.py``), for the type checker
    specs: dict[str, CoordinatorSpec]
    run_id: str
    available_now: bool
    codec: EventCodec
    workers: Workers
    restore_point: RestorePoint | None
    _mailbox_factory: MailboxFactory
    _restored_parts: list[StoredOnce[Any]]

    if TYPE_CHECKING:
        def batch_committed(self, epoch: int) -> None: ...

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
                self.storage.check_fence()  # service rule 5
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
