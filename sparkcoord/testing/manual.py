"""Manual fakes of :mod:`sparkcoord.testing`: mailboxes and workers that run only when the test
says, a clock that moves only when the test advances it, and a gateway that records what a
coordinator sends (the harness, ``testing/fakes.py``, is built on them).

Thread model: the test's thread; while a manual mailbox runs an action, the calling thread
counts as the mailbox thread.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sparkcoord.coordinator import Cancellable, SubtaskGateway
from sparkcoord.core.codec import EventCodec
from sparkcoord.runtime.clock import Clock
from sparkcoord.runtime.mailbox import Action, Mailbox
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
