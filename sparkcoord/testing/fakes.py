"""Implementation of :mod:`sparkcoord.testing` (see there)."""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sparkcoord.coordinator import (
    Cancellable,
    CoordinatorProvider,
    OperatorCoordinator,
    SubtaskGateway,
)
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.entries import DriverClient
from sparkcoord.core.errors import RequestRefused
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.inbound import InboundDecision, Verdict
from sparkcoord.core.restore import FRESH, RestorePoint
from sparkcoord.runtime.clock import Clock
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.mailbox import Action, Mailbox
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec, PreparedCheckpoint
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.runtime.workers import Workers

_get_ident = threading.get_ident


class ManualMailbox(Mailbox):
    """A mailbox whose actions run only inside :meth:`run_one` / :meth:`run_all`.

    While an action runs, the calling thread counts as the mailbox thread.
    """

    def __init__(self, name: str = "manual") -> None:
        self.name = name
        self._queue: deque[Action] = deque()
        self._running_in: int | None = None
        self.closed = False

    def execute(self, action: Action) -> None:
        if not self.closed:
            self._queue.append(action)

    def in_mailbox_thread(self) -> bool:
        return self._running_in == _get_ident()

    def close(self) -> None:
        self.closed = True
        self._queue.clear()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def run_one(self) -> bool:
        """Run the oldest queued action; False if there was none."""
        if not self._queue:
            return False
        action = self._queue.popleft()
        outer = self._running_in
        self._running_in = threading.get_ident()
        try:
            action()
        finally:
            self._running_in = outer
        return True

    def run_all(self, limit: int = 1_000_000) -> int:
        """Run actions until the queue is empty (actions may queue more). Returns the count."""
        n = 0
        while self.run_one():
            n += 1
            if n >= limit:
                raise RuntimeError(f"mailbox {self.name!r} still busy after {limit} actions")
        return n


class ManualMailboxes:
    """A mailbox factory for :class:`CoordinationService` that hands out manual mailboxes."""

    def __init__(self) -> None:
        self.all: list[ManualMailbox] = []

    def __call__(self, name: str) -> ManualMailbox:
        mailbox = ManualMailbox(name)
        self.all.append(mailbox)
        return mailbox

    def run_all(self, limit: int = 1_000_000) -> int:
        """Run every mailbox until all are empty."""
        total = 0
        while True:
            n = sum(m.run_all(limit) for m in self.all)
            total += n
            if n == 0:
                return total

    def run_random(self, rng: random.Random, steps: int) -> int:
        """Run up to ``steps`` actions, picking a non-empty mailbox at random each time."""
        done = 0
        for _ in range(steps):
            busy = [m for m in self.all if m.pending]
            if not busy:
                break
            rng.choice(busy).run_one()
            done += 1
        return done


class ManualWorkers(Workers):
    """Workers whose works run only when the test says (``run_all``, ``run_one``), on the
    test's thread, in the order they were handed over; ``inline=True`` runs each at once, on
    the thread that hands it over (the mailbox's, for ``call_async`` from a callback).

    ``lane(name)`` is one lane's view (every owner's works on it: the coordinator's
    generations), with ``queued`` and ``run_all`` as a runner the test holds."""

    def __init__(self, inline: bool = False) -> None:
        self.inline = inline
        self._queue: deque[tuple[str, str, Callable[[], None]]] = deque()

    def run(self, owner: str, lane: str, work: Callable[[], None]) -> None:
        if self.inline:
            work()
        else:
            self._queue.append((owner, lane, work))

    def queued(self, lane: str | None = None) -> list[Callable[[], None]]:
        """The works waiting, of ``lane`` (every lane's if None)."""
        return [w for _, name, w in self._queue if lane is None or name == lane]

    def run_one(self, lane: str | None = None) -> bool:
        """Run the oldest waiting work of ``lane`` (any lane's if None); False if none."""
        for entry in self._queue:
            if lane is None or entry[1] == lane:
                self._queue.remove(entry)
                entry[2]()
                return True
        return False

    def run_all(self, lane: str | None = None, limit: int = 1_000_000) -> int:
        """Run works of ``lane`` (every lane's if None) until none waits (a work may hand over
        more). Returns the count."""
        n = 0
        while self.run_one(lane):
            n += 1
            if n >= limit:
                raise RuntimeError(f"more than {limit} works: a work keeps handing over more")
        return n

    def lane(self, name: str) -> ManualLane:
        return ManualLane(self, name)


class ManualLane:
    """One lane of :class:`ManualWorkers`, as a test holds it."""

    def __init__(self, workers: ManualWorkers, name: str) -> None:
        self.workers = workers
        self.name = name

    @property
    def queued(self) -> list[Callable[[], None]]:
        return self.workers.queued(self.name)

    def run_one(self) -> bool:
        return self.workers.run_one(self.name)

    def run_all(self) -> int:
        return self.workers.run_all(self.name)

    def run(self) -> int:
        return self.run_all()


class _ManualTimer(Cancellable):
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock(Clock):
    """Time that moves only in :meth:`advance`; due actions run inside it, in time order."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._seq = itertools.count()
        self._due: list[tuple[float, int, _ManualTimer, Callable[[], None]]] = []

    def now(self) -> float:
        return self._now

    def call_later(self, delay_s: float, action: Callable[[], None]) -> Cancellable:
        timer = _ManualTimer()
        heapq.heappush(self._due, (self._now + max(0.0, delay_s), next(self._seq), timer, action))
        return timer

    def advance(self, seconds: float) -> None:
        """Move time forward, running every action that falls due on the way."""
        target = self._now + seconds
        while self._due and self._due[0][0] <= target:
            when, _, timer, action = heapq.heappop(self._due)
            self._now = when
            if not timer.cancelled:
                action()
        self._now = target

    @property
    def scheduled(self) -> int:
        return sum(1 for _, _, t, _ in self._due if not t.cancelled)


class RecordingGateway(SubtaskGateway):
    """A gateway for unit tests of coordinator logic: records events, futures stay open.

    Events are encoded with the real codec, so unpicklable events fail as they would for real.
    """

    def __init__(self, subtask: int = 0, attempt: int = 0, codec: EventCodec | None = None) -> None:
        self.subtask = subtask
        self.attempt = attempt
        self.codec = codec or EventCodec()
        self.events: list[Any] = []
        self.futures: list[Future[None]] = []

    def send_event(self, event: Any) -> Future[None]:
        self.codec.encode(event)
        self.events.append(event)
        fut: Future[None] = Future()
        self.futures.append(fut)
        return fut

    def complete_all(self) -> None:
        for fut in self.futures:
            if not fut.done():
                fut.set_result(None)


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
