"""A cheap future for event sends.

``concurrent.futures.Future()`` builds a ``threading.Condition`` (an RLock and a condition) on
construction: about 1.5 us, which dominated the cost of a send. Most send futures are never
waited on, so :class:`SendFuture` creates its condition only when someone waits, adds a
callback or cancels; completing a future nobody waits on takes a global lock briefly and sets
the state. It is a real ``Future`` for every caller (``result``, ``add_done_callback``,
``concurrent.futures.wait``, ``asyncio.wrap_future``).

Thread model: the decision "is there a condition yet?" and its creation happen under one
module lock, so a waiter either sees the finished state or gets notified; never neither.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import FINISHED, PENDING
from typing import Any

_INFLATE = threading.Lock()


class SendFuture(Future[Any]):
    """A :class:`concurrent.futures.Future` whose condition is created on first need."""

    # Class-level defaults stand in for what Future.__init__ would set; the mutable ones
    # (condition, waiter and callback lists) are created per instance on first access.
    _state = PENDING
    _result = None
    _exception = None

    def __init__(self) -> None:  # deliberately not calling Future.__init__ (see module doc)
        pass

    def __getattr__(self, name: str) -> Any:
        if name not in _LAZY:
            raise AttributeError(name)
        with _INFLATE:
            value = self.__dict__.get(name)
            if value is None:
                value = self.__dict__[name] = _LAZY[name]()
        return value

    def cancel(self) -> bool:
        """Always False: an event that was sent cannot be unsent, and events that share their
        fate share one future (see the valve), so a cancel would speak for others too."""
        return False

    def done(self) -> bool:
        return self._state not in (PENDING, "RUNNING")

    def _finish_unwatched(self, attribute: str, value: Any) -> bool:
        """Finish without a condition if nobody has created one (nobody waits); else False."""
        with _INFLATE:
            if "_condition" in self.__dict__:
                return False
            if self._state != PENDING:
                raise InvalidStateError(f"{self._state}: {self!r}")
            setattr(self, attribute, value)
            self._state = FINISHED
            return True

    def set_result(self, result: Any) -> None:
        if not self._finish_unwatched("_result", result):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._finish_unwatched("_exception", exception):
            super().set_exception(exception)

    @staticmethod
    def complete_all(futures: list[Future[Any]]) -> None:
        """Set the result None on many pending futures, taking the module lock once."""
        slow = []
        with _INFLATE:
            for f in futures:
                if isinstance(f, SendFuture) and "_condition" not in f.__dict__ and f._state == PENDING:
                    f._state = FINISHED
                else:
                    slow.append(f)
        for f in slow:
            if not f.done():
                f.set_result(None)


_LAZY: dict[str, Any] = {"_condition": threading.Condition, "_waiters": list,
                         "_done_callbacks": list}
