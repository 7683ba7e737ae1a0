"""A cheap future for event sends and request answers.

``concurrent.futures.Future()`` builds a ``threading.Condition`` (an RLock and a condition) on
construction: about 1.5 us, which dominated the cost of a send. Most send futures are never
waited on, so :class:`SendFuture` creates its condition only when someone waits for it or adds
a callback before it finished (reading a finished one needs none: it never changes again);
completing a future nobody waits on takes a global lock briefly and sets
the state. It is a real ``Future`` for every caller (``result``, ``add_done_callback``,
``concurrent.futures.wait``, ``asyncio.wrap_future``).

Thread model: the decision "is there a condition yet?" and its creation happen under one
module lock, so a waiter either sees the finished state or gets notified; never neither.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import FINISHED, PENDING
from concurrent.futures._base import LOGGER as _LOGGER
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
            state = self._state
            if state == PENDING:
                setattr(self, attribute, value)
                self._state = FINISHED
                return True
        # raised outside the lock: the repr takes the condition, which may create it
        raise InvalidStateError(f"{state}: {self!r}")

    # A finished future never changes again: reading it needs no condition (Future's own
    # methods take it, which would create one for every answer the channel reads).
    def add_done_callback(self, fn: Any) -> None:
        if self._state == FINISHED:
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - as Future.add_done_callback: logged, not raised
                _LOGGER.exception("exception calling callback for %r", self)
            return
        super().add_done_callback(fn)

    def result(self, timeout: float | None = None) -> Any:
        if self._state == FINISHED:
            if self._exception is not None:
                raise self._exception
            return self._result
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

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
