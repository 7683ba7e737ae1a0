"""Time for the runtime: reading it and scheduling on it, behind one small interface so that
tests own time (``sparkcoord.testing.ManualClock``)."""

from __future__ import annotations

import abc
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from sparkcoord.coordinator import Cancellable

log = logging.getLogger(__name__)


class Clock(abc.ABC):
    @abc.abstractmethod
    def now(self) -> float:
        """Monotonic seconds."""

    @abc.abstractmethod
    def call_later(self, delay_s: float, action: Callable[[], None]) -> Cancellable:
        """Run ``action`` once after ``delay_s`` seconds, on a thread of the clock's choosing."""


class SystemClock(Clock):
    """Real time: ``time.monotonic``, and one process-wide timer thread for every instance.

    A thread per scheduled action (``threading.Timer``) would start one thread per checkpoint
    for its timeout; one thread and a heap cost the same whatever the number of epochs.

    Thread model: ``now``, ``call_later`` and ``cancel`` from any thread. Actions run one at a
    time on the timer thread (``sparkcoord-timer``, a daemon started on first use), in deadline
    order, so they must be short: the runtime's actions only enqueue or take a lock briefly.
    """

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay_s: float, action: Callable[[], None]) -> Cancellable:
        return _TIMERS.schedule(time.monotonic() + max(0.0, delay_s), action)


class _Scheduled(Cancellable):
    __slots__ = ("cancelled", "_timers")

    def __init__(self, timers: _TimerThread) -> None:
        self.cancelled = False
        self._timers = timers

    def cancel(self) -> None:
        self._timers.cancel(self)


class _TimerThread:
    """A heap of (deadline, order, handle, action) served by one daemon thread.

    Thread model: ``schedule``/``cancel`` from any thread, under ``_cond``; the thread pops due
    entries under ``_cond`` and runs each action outside it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Scheduled, Callable[[], None]]] = []
        self._order = itertools.count()
        self._cancelled = 0
        self._thread: threading.Thread | None = None

    def schedule(self, deadline: float, action: Callable[[], None]) -> _Scheduled:
        handle = _Scheduled(self)
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._order), handle, action))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sparkcoord-timer", daemon=True)
                self._thread.start()
            self._cond.notify()
        return handle

    def cancel(self, handle: _Scheduled) -> None:
        with self._cond:
            if handle.cancelled:
                return
            handle.cancelled = True
            self._cancelled += 1
            # A cancelled entry stays in the heap until its deadline; purge when they are the
            # majority, so that many cancelled long timeouts (one per checkpoint) cannot pile up.
            if self._cancelled > 64 and 2 * self._cancelled > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def pending(self) -> int:
        """Entries in the heap, cancelled ones included (tests and diagnostics)."""
        with self._cond:
            return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    heap = self._heap
                    if not heap:
                        self._cond.wait()
                        continue
                    deadline, _, handle, action = heap[0]
                    if handle.cancelled:
                        heapq.heappop(heap)
                        self._cancelled -= 1
                        continue
                    wait = deadline - time.monotonic()
                    if wait <= 0:
                        heapq.heappop(heap)
                        handle.cancelled = True  # fired: a later cancel() is a no-op
                        break
                    self._cond.wait(wait)
            try:
                action()
            except BaseException:  # noqa: BLE001 - one failing action must not stop the others
                log.exception("unhandled exception in a timer action")


_TIMERS = _TimerThread()
