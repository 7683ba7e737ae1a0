"""Single-thread mailboxes: where each coordinator's callbacks run, one at a time, in order.

Thread model: ``execute`` may be called from any thread; actions run on the mailbox's own thread
in submission order. An action that raises does not stop the mailbox: the mailbox's owner wraps
actions so that an exception becomes a global failover of the coordinator.
"""

from __future__ import annotations

import abc
import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Action = Callable[[], None]


class Mailbox(abc.ABC):
    """A FIFO of actions run on one thread."""

    @abc.abstractmethod
    def execute(self, action: Action) -> None:
        """Queue ``action``. Any thread. Ignored after :meth:`close`."""

    @abc.abstractmethod
    def in_mailbox_thread(self) -> bool:
        """Whether the caller is the thread that runs this mailbox's actions."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop taking actions; queued ones are dropped. Any thread; idempotent."""


_STOP = object()


class ThreadMailbox(Mailbox):
    """A mailbox backed by one daemon thread."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"mailbox-{name}", daemon=True)
        self._thread.start()
        # compared on every send: an ident comparison is cheaper than current_thread()
        self._ident = self._thread.ident

    def execute(self, action: Action) -> None:
        if not self._closed:
            self._queue.put(action)

    def in_mailbox_thread(self) -> bool:
        return threading.get_ident() == self._ident

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end after :meth:`close` (tests and shutdown)."""
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            action = self._queue.get()
            if action is _STOP or self._closed:
                return
            try:
                action()  # type: ignore[operator]
            except BaseException:  # noqa: BLE001 - the owner wraps actions; never die silently
                log.exception("unhandled exception in mailbox action")
