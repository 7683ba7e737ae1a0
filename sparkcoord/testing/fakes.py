"""Implementation of :mod:`sparkcoord.testing` (see there): the :class:`CoordinatorHarness`; the
manual mailboxes, workers, clock and recording gateway it runs on are in ``testing/manual.py``
and stay importable from here (docs/decisions/106-inbox-modules-and-value-compare.md)."""

from __future__ import annotations

import uuid
from concurrent.futures import Future
from typing import Any

from sparkcoord.coordinator import CoordinatorProvider, OperatorCoordinator
from sparkcoord.core.entries import DriverClient
from sparkcoord.core.errors import RequestRefused
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.inbound import InboundDecision, Verdict
from sparkcoord.core.restore import FRESH, RestorePoint
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec, PreparedCheckpoint
from sparkcoord.runtime.storage import CheckpointStorage

# the names that moved out stay importable from here (``X as X``: a re-export)
from sparkcoord.testing.manual import ManualClock as ManualClock
from sparkcoord.testing.manual import ManualLane as ManualLane
from sparkcoord.testing.manual import ManualMailbox as ManualMailbox
from sparkcoord.testing.manual import ManualMailboxes as ManualMailboxes
from sparkcoord.testing.manual import ManualWorkers as ManualWorkers
from sparkcoord.testing.manual import RecordingGateway as RecordingGateway
from sparkcoord.testing.manual import _ManualTimer as _ManualTimer


class InputRefused(AssertionError):
    """The harness was asked for an input the service refused (see its reason)."""


class CoordinatorHarness:
    """A real :class:`CoordinationService` for one coordinator, fully under the test's control.

    Example::

        h = CoordinatorHarness(MyCoordinator, parallelism=2)
        h.start()
        h.send_from_subtask(0, "hello")        # as the task of subtask 0 in the running batch
        events = h.checkpoint()                # {subtask: [events sealed into the epoch]}
        h.commit()                             # notify_checkpoint_complete(epoch)
    """

    def __init__(self, coordinator: CoordinatorProvider, parallelism: int = 1, *,
                 name: str = "coordinator", config: ServiceConfig | None = None,
                 storage_url: str | None = None, available_now: bool = False,
                 workers: ManualWorkers | None = None) -> None:
        self.name = name
        self.parallelism = parallelism
        self.mailboxes = ManualMailboxes()
        self.clock = ManualClock()
        #: the coordinator's ``call_async`` works, run when the test says
        self.workers = workers or ManualWorkers()
        self.storage_url = storage_url or f"memory://sparkcoord-harness/{uuid.uuid4().hex}"
        self.storage = CheckpointStorage(self.storage_url)
        self.service = CoordinationService(
            [CoordinatorSpec(name, coordinator, parallelism)], self.storage, config=config,
            clock=self.clock, mailbox_factory=self.mailboxes, available_now=available_now,
            workers=self.workers)
        self._attempt_numbers: dict[int, int] = {}
        self._seqs: dict[TaskAttempt, int] = {}
        self._client_seqs: dict[str, int] = {}

    @property
    def coordinator(self) -> OperatorCoordinator:
        """The live coordinator instance (changes after a reset)."""
        instance = self.service.holders[self.name].coordinator
        assert instance is not None, "the coordinator is not running"
        return instance

    @property
    def epoch(self) -> int:
        return self.service.last_sealed

    def run(self) -> int:
        """Run every queued mailbox action."""
        return self.mailboxes.run_all()

    def start(self, point: RestorePoint = FRESH) -> None:
        self.service.restore(point)
        self.run()

    def trigger_checkpoint(self) -> Future[PreparedCheckpoint]:
        return self.service.trigger_checkpoint(self.service.next_checkpoint_id)

    def checkpoint(self) -> dict[int, list[Any]] | None:
        """Trigger the next checkpoint, run the mailbox, seal it; None if declined.

        Returns the decoded events sealed into the new epoch, by subtask.
        """
        future = self.trigger_checkpoint()
        self.run()
        if not future.done():
            raise AssertionError("the coordinator did not complete its checkpoint future; "
                                 "use trigger_checkpoint() and complete it yourself")
        if future.exception() is not None:
            return None
        record = self.service.seal(future.result())
        self.service.inbox.epoch_logged(record.epoch)  # as Spark's offset log would, before the batch
        self.run()
        codec = self.service.codec
        return {s: [codec.decode(p) for p in record.events_for(SubtaskId(self.name, s))]
                for s in range(self.parallelism)}

    def commit(self) -> None:
        """The batch of the last sealed epoch committed."""
        self.service.batch_committed(self.epoch)
        self.run()

    def send_from_subtask(self, subtask: int, event: Any, seq: int | None = None) -> InboundDecision:
        """Deliver ``event`` as the current task attempt of ``subtask`` in the running batch.

        Raises :class:`InputRefused` with the service's reason when the event is refused (no
        batch running, the job failed, a sequence gap): a test must not pass on an event that
        never reached the coordinator. A duplicate (a ``seq`` sent before) is not an error."""
        self._require_running_batch(f"send_from_subtask({subtask}, {event!r})")
        attempt = self._attempt(subtask)
        if seq is None:
            seq = self._seqs.get(attempt, 0)
        decision = self.service.inbox.event_received(attempt, seq, self.service.codec.encode(event))
        self._seqs[attempt] = max(self._seqs.get(attempt, 0), seq + 1)
        self.run()
        if decision.verdict is Verdict.REJECT:
            raise InputRefused(f"the event {event!r} of subtask {subtask} was refused: "
                               f"{decision.reason}")
        return decision

    def ask_from_subtask(self, subtask: int, request: Any, seq: int | None = None) -> Future[Any]:
        """Ask ``request`` as the current task attempt of ``subtask`` in the running batch (its
        next item, or item ``seq``: requests and events share one sequence) and run the
        mailbox. Returns the future of the decoded answer: it fails with
        :class:`~sparkcoord.core.errors.RequestRefused` when the coordinator refused, and
        with :class:`~sparkcoord.core.errors.RequestFailed` when the service did."""
        self._require_running_batch(f"ask_from_subtask({subtask}, {request!r})")
        attempt = self._attempt(subtask)
        if seq is None:
            seq = self._seqs.get(attempt, 0)
        logged = self.service.inbox.request_received(attempt, seq, self.service.codec.encode(request))
        self._seqs[attempt] = max(self._seqs.get(attempt, 0), seq + 1)
        answer = self._decoded(logged, f"request {seq} of subtask {subtask} ({request!r})")
        self.run()
        return answer

    def _decoded(self, logged: Future[Any], what: str) -> Future[Any]:
        """The future of the decoded answer of a logged one (a refusal: RequestRefused)."""
        answer: Future[Any] = Future()
        codec = self.service.codec

        def done(f: Future[Any]) -> None:
            if f.exception() is not None:
                answer.set_exception(f.exception())
            elif f.result().failed:
                answer.set_exception(RequestRefused(
                    f"{self.name!r} refused {what}: {f.result().payload.decode()}"))
            else:
                answer.set_result(codec.decode(f.result().payload))
        logged.add_done_callback(done)
        return answer

    def request_from_subtask(self, subtask: int, request: Any, seq: int | None = None) -> Any:
        """Like :meth:`ask_from_subtask`, but returns the answer itself; raises if the
        coordinator has not answered after the mailbox ran (a parked future: use
        :meth:`ask_from_subtask`), or the request was refused."""
        answer = self.ask_from_subtask(subtask, request, seq)
        if not answer.done():
            raise AssertionError(f"request {request!r} of subtask {subtask} is not answered yet "
                                 f"(the coordinator returned a future it has not completed); "
                                 f"use ask_from_subtask() and wait for its future")
        return answer.result()

    def ask_as_client(self, request: Any, client: str = "client", seq: int | None = None
                      ) -> Future[Any]:
        """Ask ``request`` as a client of the job (``CoordinatedJob.request``: the
        coordinator's ``handle_client_request``), with ``client``'s next number or ``seq``
        (the same number again is a re-send), and run the mailbox. The future of the decoded
        answer, as :meth:`ask_from_subtask`."""
        if seq is None:
            seq = self._client_seqs.get(client, 0)
        self._client_seqs[client] = max(self._client_seqs.get(client, 0), seq + 1)
        logged = self.service.inbox.request_received(DriverClient(self.name, client), seq,
                                                     self.service.codec.encode(request))
        answer = self._decoded(logged, f"client request {seq} ({request!r})")
        self.run()
        return answer

    def retry_task(self, subtask: int) -> InboundDecision:
        """Simulate a Spark task retry of ``subtask`` in the running batch.

        Raises :class:`InputRefused` if the service refuses the retry's registration."""
        self._require_running_batch(f"retry_task({subtask})")
        self._attempt(subtask)
        self._attempt_numbers[subtask] += 1
        decision = self.service.inbox.attempt_registered(self._current(subtask))
        self.run()
        if decision.verdict is Verdict.REJECT:
            raise InputRefused(f"the task retry of subtask {subtask} was refused: "
                               f"{decision.reason}")
        return decision

    def finish_task(self, subtask: int) -> InboundDecision:
        """The current task attempt of ``subtask`` finished its batch, having sent the items
        sent so far (as the real task does at its end, after a retry that adopted a history):
        if it sent fewer than its history holds, the coordinator's ``handle_items_withdrawn``
        gets the rest. Runs the mailbox; raises :class:`InputRefused` if refused."""
        self._require_running_batch(f"finish_task({subtask})")
        attempt = self._attempt(subtask)
        future = self.service.inbox.attempt_finished(attempt, self._seqs.get(attempt, 0))
        self.run()
        decision = future.result(timeout=0)
        if decision.verdict is Verdict.REJECT:
            raise InputRefused(f"the end of subtask {subtask}'s task was refused: "
                               f"{decision.reason}")
        return decision

    def _require_running_batch(self, what: str) -> None:
        if self.service.failure is not None:
            raise InputRefused(f"{what}: the job failed: {self.service.failure}")
        if self.epoch == -1 or self.service.last_committed >= self.epoch:
            raise InputRefused(
                f"{what}: no batch is running (last sealed epoch {self.epoch}, last committed "
                f"{self.service.last_committed}). Subtasks send inside the batch of a sealed "
                f"epoch: call checkpoint() first (and again after commit())")

    def _current(self, subtask: int) -> TaskAttempt:
        return TaskAttempt(self.service.run_id, SubtaskId(self.name, subtask), self.epoch,
                           self._attempt_numbers.get(subtask, 0))

    def _attempt(self, subtask: int) -> TaskAttempt:
        self._attempt_numbers.setdefault(subtask, 0)
        attempt = self._current(subtask)
        if self.service.inbox.live_attempt(attempt.subtask) != attempt:
            self.service.inbox.attempt_registered(attempt)
        return attempt
