"""Time for the runtime: reading it and scheduling on it, behind one small interface so that
tests own time (``sparkcoord.testing.ManualClock``)."""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable

from sparkcoord.coordinator import Cancellable


class Clock(abc.ABC):
    @abc.abstractmethod
    def now(self) -> float:
        """Monotonic seconds."""

    @abc.abstractmethod
    def call_later(self, delay_s: float, action: Callable[[], None]) -> Cancellable:
        """Run ``action`` once after ``delay_s`` seconds, on a thread of the clock's choosing."""


class _TimerHandle(Cancellable):
    def __init__(self, timer: threading.Timer) -> None:
        self._timer = timer

    def cancel(self) -> None:
        self._timer.cancel()


class SystemClock(Clock):
    """Real time: ``time.monotonic`` and daemon timer threads."""

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay_s: float, action: Callable[[], None]) -> Cancellable:
        timer = threading.Timer(max(0.0, delay_s), action)
        timer.daemon = True
        timer.start()
        return _TimerHandle(timer)
