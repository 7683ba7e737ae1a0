"""Workers: where a coordinator's I/O runs, off its mailbox (``CoordinatorContext.call_async``).

Rules:
  1. Work goes to a named lane of its owner (a coordinator generation): the works of one lane
     run one at a time, in the order they were handed over; lanes run beside each other and
     beside the mailbox. A coordinator that keeps a connection per kind of I/O (planning, a
     replication slot) gives each its lane, so no two calls share a connection at once.
  2. A work that was handed over runs, also after its coordinator was reset or closed (a
     release of connections must not be lost); what it posts back to the mailbox is dropped
     by the context then (``holder_context.py`` rule 2: an action of an old generation does
     not run).
  3. :class:`ThreadWorkers` keeps no idle thread: a lane's thread starts when work arrives and
     ends when the lane is empty, so a lane that blocks (a server that does not answer) holds
     no other lane and no later generation's lane (a generation's lanes are its own).
  4. A work never raises into a worker: ``call_async`` wraps it so that its error goes to the
     handler on the mailbox (or fails the job); an error escaping anyway is logged.

Thread model: ``run`` from any thread; the works on the lanes' threads (:class:`ThreadWorkers`)
or on the thread that runs them (the tests' ``ManualWorkers`` in ``sparkcoord.testing``).
"""

from __future__ import annotations

import abc
import logging
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger("sparkcoord.runtime")

Work = Callable[[], None]


class Workers(abc.ABC):
    """Runs works off the mailbox, one lane at a time per lane (module rules)."""

    @abc.abstractmethod
    def run(self, owner: str, lane: str, work: Work) -> None:
        """Run ``work`` on lane ``lane`` of ``owner`` after the lane's earlier works (rule 1).
        Called by a coordinator context's ``call_async``, on any thread."""


class ThreadWorkers(Workers):
    """Rule 3: a daemon thread per busy lane, none while a lane is empty."""

    def __init__(self, prefix: str = "sparkcoord") -> None:
        self._prefix = prefix
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, str], deque[Work]] = {}

    def run(self, owner: str, lane: str, work: Work) -> None:
        key = (owner, lane)
        with self._lock:
            queue = self._queues.get(key)
            if queue is not None:  # the lane's thread is running: it takes this one too
                queue.append(work)
                return
            self._queues[key] = deque([work])
        threading.Thread(target=self._drain, args=(key,), daemon=True,
                         name=f"{self._prefix}-{owner}-{lane}").start()

    def _drain(self, key: tuple[str, str]) -> None:
        while True:
            with self._lock:
                queue = self._queues[key]
                if not queue:
                    del self._queues[key]
                    return
                work = queue[0]
            try:
                work()
            except Exception:  # noqa: BLE001 - rule 4: call_async handles errors itself
                log.exception("a work on lane %s of %s raised", key[1], key[0])
            with self._lock:
                self._queues[key].popleft()

    def busy_lanes(self) -> list[tuple[str, str]]:
        """The (owner, lane) pairs with work queued or running (any thread; for tests and
        status)."""
        with self._lock:
            return list(self._queues)
