"""Restart strategies: after a global failure, whether to restart the query and after how long.

Plain objects with no clock of their own: the job runner passes the current time in, so tests
drive them with any numbers. Each call to :meth:`RestartStrategy.next_delay` records one failure.
"""

from __future__ import annotations

import abc
from collections import deque
from dataclasses import dataclass, field


class RestartStrategy(abc.ABC):
    @abc.abstractmethod
    def next_delay(self, now: float) -> float | None:
        """A failure happened at ``now``: seconds to wait before restarting, or None to give up.

        Called by the job runner on the driver program's thread, once per failure.
        """

    def succeeded(self, now: float) -> None:  # noqa: B027 - optional hook
        """The restarted query committed a batch at ``now`` (strategies may reset)."""


@dataclass
class NoRestart(RestartStrategy):
    def next_delay(self, now: float) -> float | None:
        return None


@dataclass
class FixedDelay(RestartStrategy):
    """Up to ``attempts`` restarts over the job's life, each after ``delay_s``."""

    attempts: int
    delay_s: float = 1.0
    used: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.attempts < 0 or self.delay_s < 0:
            raise ValueError(f"FixedDelay needs attempts >= 0 and delay_s >= 0, got "
                             f"attempts={self.attempts}, delay_s={self.delay_s}")

    def next_delay(self, now: float) -> float | None:
        if self.used >= self.attempts:
            return None
        self.used += 1
        return self.delay_s


@dataclass
class ExponentialBackoff(RestartStrategy):
    """Delays ``initial_s``, ``initial_s*multiplier``, ... capped at ``max_s``.

    The delay goes back to ``initial_s`` after ``reset_after_s`` seconds without a failure;
    ``max_attempts`` (None: unlimited) bounds the restarts in a row.
    """

    initial_s: float = 1.0
    max_s: float = 60.0
    multiplier: float = 2.0
    reset_after_s: float = 300.0
    max_attempts: int | None = None
    _current: float = field(default=0.0, init=False)
    _in_a_row: int = field(default=0, init=False)
    _last_failure: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s or self.multiplier < 1:
            raise ValueError("ExponentialBackoff needs 0 < initial_s <= max_s and multiplier >= 1")

    def next_delay(self, now: float) -> float | None:
        if self._last_failure is not None and now - self._last_failure >= self.reset_after_s:
            self._current = 0.0
            self._in_a_row = 0
        self._last_failure = now
        if self.max_attempts is not None and self._in_a_row >= self.max_attempts:
            return None
        self._in_a_row += 1
        self._current = self.initial_s if self._current == 0 else min(
            self.max_s, self._current * self.multiplier)
        return self._current


@dataclass
class FailureRate(RestartStrategy):
    """Restart after ``delay_s`` unless more than ``max_failures`` happened within ``interval_s``."""

    max_failures: int
    interval_s: float
    delay_s: float = 1.0
    _failures: deque[float] = field(default_factory=deque, init=False)

    def __post_init__(self) -> None:
        if self.max_failures < 1 or self.interval_s <= 0 or self.delay_s < 0:
            raise ValueError("FailureRate needs max_failures >= 1, interval_s > 0, delay_s >= 0")

    def next_delay(self, now: float) -> float | None:
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self.interval_s:
            self._failures.popleft()
        if len(self._failures) > self.max_failures:
            return None
        return self.delay_s
