"""Single-thread mailboxes: where each coordinator's callbacks run, one at a time, in order.

Rules:
  1. Actions run one at a time, in submission order, never two at once.
  2. Usually on the mailbox's own thread. A thread that submits an action while the mailbox is
     idle (nothing queued, nothing running) may *claim* it and run the queue itself
     (:meth:`Mailbox.execute_claiming`, then :meth:`Mailbox.run_claimed`): a request from a
     task is then answered on its connection's thread without waking the mailbox thread (two
     thread handoffs less per request). While it runs the queue, that thread is the mailbox
     thread (:meth:`Mailbox.in_mailbox_thread` says so); rule 1 holds either way.
  3. A claiming thread is borrowed (the channel's one I/O thread serves every connection of
     the source), so a claim must be short: when a claimed run of the queue used more than
     ``claim_cpu_budget_s`` of its thread's CPU time (the coordinator computes too long) or
     took more than ``claim_wall_budget_s`` of wall time (it blocks: I/O, locks, sleeps), the
     mailbox hands out no claim for ``claim_pause_s`` (its own thread runs the actions
     meanwhile), and so a slow coordinator holds up only itself. CPU time, not wall time, for
     the tight budget: on a loaded machine a claimed run is often preempted for longer than
     the whole run costs, which says nothing about the coordinator
     (docs/decisions/046-claim-cpu-budget.md).

Thread model: ``execute`` may be called from any thread; actions run on the mailbox's own thread
(or a claiming thread, rule 2) in submission order. An action that raises does not stop the
mailbox: the mailbox's owner wraps actions so that an exception becomes a global failover of
the coordinator.
"""

from __future__ import annotations

import abc
import gc
import logging
import threading
import time
from collections import deque
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

    def execute_claiming(self, action: Action) -> bool:
        """Queue ``action``; if the mailbox was idle, claim it for the calling thread and return
        True: the caller must then call :meth:`run_claimed` (soon, and outside any lock that
        the actions may take). Any thread. By default nothing is claimed."""
        self.execute(action)
        return False

    def run_claimed(self) -> None:
        """Run the queued actions on the calling thread, which claimed the mailbox with
        :meth:`execute_claiming`, until the queue is empty; then release it."""
        raise NotImplementedError("this mailbox never hands out a claim")



class ThreadMailbox(Mailbox):
    """A mailbox backed by one daemon thread (and by claiming threads: module rules 2, 3)."""

    def __init__(self, name: str, claim_cpu_budget_s: float = 0.02,
                 claim_wall_budget_s: float = 0.25, claim_pause_s: float = 1.0) -> None:
        self.claim_cpu_budget_s = claim_cpu_budget_s
        self.claim_wall_budget_s = claim_wall_budget_s
        self.claim_pause_s = claim_pause_s
        self._claims_paused_until = 0.0  # a time.monotonic() value (rule 3)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._actions: deque[Action] = deque()
        self._busy = False  # a thread runs (or claimed) the queue
        self._owner: int | None = None  # the thread running actions now
        self._closed = False
        _time_the_collector()
        self._thread = threading.Thread(target=self._run, name=f"mailbox-{name}", daemon=True)
        self._thread.start()

    def execute(self, action: Action) -> None:
        with self._lock:
            if self._closed:
                return
            self._actions.append(action)
            if not self._busy:
                self._wake.notify()

    def execute_claiming(self, action: Action) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._actions.append(action)
            if self._busy:
                return False  # whoever runs the queue runs this one too, in order
            if self._claims_paused_until and time.monotonic() < self._claims_paused_until:
                self._wake.notify()  # rule 3: the mailbox's own thread runs it
                return False
            self._busy = True
            return True

    def run_claimed(self) -> None:
        me = threading.get_ident()
        started, cpu_started = time.monotonic(), time.thread_time()
        collected = _collector_cpu.get(me, 0.0)
        collected_wall = _collector_wall.get(me, 0.0)
        self._drain()
        # the cyclic garbage collector's passes are not the coordinator's doing: a run of a few
        # microseconds that triggers a 30 ms collection of the whole heap says nothing of it
        # (its CPU time out of the CPU budget, its wall time, preemption during it included,
        # out of the wall budget)
        took = time.monotonic() - started - (_collector_wall.get(me, 0.0) - collected_wall)
        used = time.thread_time() - cpu_started - (_collector_cpu.get(me, 0.0) - collected)
        if used > self.claim_cpu_budget_s or took > self.claim_wall_budget_s:
            # rule 3: the borrowed thread serves others too; no claims for a while
            self._claims_paused_until = time.monotonic() + self.claim_pause_s
            log.debug("a claimed mailbox run took %.1f ms (%.1f ms of CPU): no claims for "
                      "%.1f s", took * 1e3, used * 1e3, self.claim_pause_s)

    def in_mailbox_thread(self) -> bool:
        # compared on every send: an ident comparison is cheaper than current_thread()
        return threading.get_ident() == self._owner

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._actions.clear()
                self._wake.notify()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end after :meth:`close` (tests and shutdown)."""
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                while (self._busy or not self._actions) and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                self._busy = True
            self._drain()

    def _drain(self) -> None:
        # The thread that holds the claim (_busy) runs actions in order until none is left.
        self._owner = threading.get_ident()
        actions = self._actions
        while True:
            with self._lock:
                if not actions or self._closed:
                    self._owner = None
                    self._busy = False
                    return
                action = actions.popleft()
            try:
                action()
            except BaseException:  # noqa: BLE001 - the owner wraps actions; never die silently
                log.exception("unhandled exception in mailbox action")


# CPU seconds each thread spent in the cyclic garbage collector (by thread ident), for rule 3:
# written by the collector's callback in the collecting thread, read by that thread only.
# and wall seconds (monotonic clock)
_collector_cpu: dict[int, float] = {}
_collector_wall: dict[int, float] = {}
_collector_started: dict[int, tuple[float, float]] = {}


def _collector_timed(phase: str, info: dict[str, int]) -> None:
    ident = threading.get_ident()
    if phase == "start":
        _collector_started[ident] = (time.thread_time(), time.monotonic())
        return
    started = _collector_started.pop(ident, None)
    if started is not None:
        _collector_cpu[ident] = _collector_cpu.get(ident, 0.0) + time.thread_time() - started[0]
        _collector_wall[ident] = _collector_wall.get(ident, 0.0) + time.monotonic() - started[1]


_collector_installing = threading.Lock()


def _time_the_collector() -> None:
    # once per process, when the first thread mailbox is made (not at import: a process that
    # only imports sparkcoord pays nothing per collection); a lock, as two mailboxes made at
    # once would otherwise install it twice and count every collection double
    with _collector_installing:
        if _collector_timed not in gc.callbacks:
            gc.callbacks.append(_collector_timed)
