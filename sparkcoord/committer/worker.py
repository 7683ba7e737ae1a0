"""The commit worker: runs a coordinator's commits off its mailbox, in order, until each is done.

Rules:
  1. Commits run one at a time, in the order they were handed over (the ledger hands them
     out in epoch order), on the worker's own thread: a commit may block on a remote store
     and must never hold up the mailbox (the coordinator's events, requests and checkpoints).
  2. A commit that raises is retried with a growing pause (``retry_delay_s`` doubling up to
     ``max_retry_delay_s``), each failure logged as a WARNING naming the operator, the epoch
     and the error; it is never skipped. The next commit waits for it. One that has failed
     for ``stuck_after_s`` and at least ``stuck_after_failures`` times in a row is *stuck*:
     ``stuck(error)`` is called once (a coordinator fails the job with it: a continuous run
     must not go on producing batches whose side effects never happen while only WARNINGs
     say so), and the retries go on until the worker is stopped.
  3. Done is reported back on the mailbox (``run_in_coordinator_thread``), where the ledger
     forgets the commit; the report of a worker that was stopped is dropped by the fenced
     context, so a commit is forgotten only by the coordinator that saw it done.
  4. ``prepare`` (optional: a sink opening its table and sweeping its orphans) runs first on
     the worker's thread, before any commit, retried like a commit; :meth:`start` runs it at
     once (otherwise the first submit starts the thread).
  5. ``stop`` first lets the queued commits run for up to ``drain_s`` (the end of an
     ``availableNow`` run: its last batch's commit is handed over as the run ends, and a run
     that reports done must have made it), then ends the worker after the commit it runs (a
     user call is never interrupted). Commits not done stay pending in the coordinator's
     checkpointed state, or in the log of the batch that produced them, and run again after
     a restore (the committer must be idempotent per epoch).

Thread model: :meth:`submit` and :meth:`stop` are called on the coordinator's mailbox thread;
the user's committer runs on the worker thread (``sparkcoord-commit-<operator>``), started on
the first submit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from sparkcoord.committer.ledger import Commit

log = logging.getLogger("sparkcoord.committer")

#: The user's commit: called with the epoch and what its batch produced.
CommitFunction = Callable[[int, Sequence[Any]], None]


class CommitWorker:
    """Runs commits of one coordinator (rules 1-4)."""

    def __init__(self, operator: str, commit: CommitFunction,
                 done: Callable[[int], None], *, retry_delay_s: float = 0.5,
                 max_retry_delay_s: float = 30.0,
                 prepare: Callable[[], None] | None = None,
                 stuck: Callable[[Exception], None] | None = None,
                 stuck_after_s: float = 300.0, stuck_after_failures: int = 8,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``done(epoch)`` is called on the worker thread once a commit returned; the owner
        posts it to its mailbox (``context.run_in_coordinator_thread``). ``prepare``: rule
        4. ``stuck``: rule 2, called on the worker thread with a :class:`CommitStuck`."""
        if retry_delay_s <= 0 or max_retry_delay_s < retry_delay_s:
            raise ValueError(f"commit retry delays must satisfy 0 < retry_delay_s <= "
                             f"max_retry_delay_s, got {retry_delay_s} and {max_retry_delay_s}")
        self.operator = operator
        self._commit = commit
        self._done = done
        self._retry_delay_s = retry_delay_s
        self._max_retry_delay_s = max_retry_delay_s
        self._stuck = stuck
        self._stuck_after_s = stuck_after_s
        self._stuck_after_failures = stuck_after_failures
        self._clock = clock
        self._queue: deque[Commit] = deque()
        self._wake = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._prepare = prepare
        #: idle() futures, completed once the queue is empty
        self._idle_waiters: list[Future[None]] = []

    def start(self) -> None:
        """Start the worker's thread now (mailbox thread, at the coordinator's start), so that
        ``prepare`` runs before the first commit is handed over (rule 4)."""
        with self._wake:
            self._start_thread()

    def _start_thread(self) -> None:
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"sparkcoord-commit-{self.operator}")
            self._thread.start()

    def submit(self, commits: Sequence[Commit]) -> None:
        """Run ``commits`` after the ones handed over before (mailbox thread)."""
        if not commits:
            return
        with self._wake:
            if self._stopped:
                return  # a stopped coordinator's commits run again after its restore
            self._queue.extend(commits)
            self._wake.notify()
            self._start_thread()

    def idle(self) -> Future[None]:
        """A future that completes once every commit handed over so far is done (at once if
        none is queued). Mailbox thread (``OperatorCoordinator.run_ending``). A stopped
        worker's future fails: its commits run again after a restore."""
        waiter: Future[None] = Future()
        with self._wake:
            if self._stopped:
                waiter.set_exception(RuntimeError(
                    f"operator {self.operator!r}: the commit worker stopped; commits not done "
                    "then run again after a restore"))
            elif not self._queue:
                waiter.set_result(None)
            else:
                self._idle_waiters.append(waiter)
        return waiter

    def stop(self, drain_s: float = 0.0) -> bool:
        """End the worker (mailbox thread, at the coordinator's close): wait up to
        ``drain_s`` for the queued commits to be done, then stop after the commit it runs
        (not waiting for that one). Whether every queued commit was done."""
        with self._wake:
            drained = self._wake.wait_for(lambda: not self._queue, timeout=drain_s)
            if not drained:
                log.warning("operator %r: %d commit(s) not done when the coordinator closed "
                            "(epochs %s); they run again after a restart", self.operator,
                            len(self._queue), [c.epoch for c in self._queue])
            self._stopped = True
            self._queue.clear()
            self._wake.notify_all()
            waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            waiter.set_exception(RuntimeError(f"operator {self.operator!r}: the commit worker "
                                              "stopped before its commits were done"))
        return drained

    def _run(self) -> None:
        if self._prepare is not None and not self._attempt("preparing", self._prepare):
            return
        while True:
            with self._wake:
                while not self._queue and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                commit = self._queue[0]
            if not self._run_one(commit):
                return
            self._done(commit.epoch)
            with self._wake:
                if self._queue and self._queue[0] is commit:
                    self._queue.popleft()
                self._wake.notify_all()  # a draining stop waits for the queue to empty
                idle, self._idle_waiters = (
                    (self._idle_waiters, []) if not self._queue else ([], self._idle_waiters))
            for waiter in idle:
                waiter.set_result(None)

    def _run_one(self, commit: Commit) -> bool:
        """Run ``commit`` until it returns (rule 2); False if the worker stopped meanwhile."""
        return self._attempt(f"the commit of epoch {commit.epoch}",
                             lambda: self._commit(commit.epoch, commit.items))

    def _attempt(self, what: str, action: Callable[[], None]) -> bool:
        """Run ``action`` until it returns (rule 2); False if the worker stopped meanwhile."""
        delay, failures, since, reported = self._retry_delay_s, 0, 0.0, False
        while True:
            try:
                action()
                if failures:
                    log.warning("operator %r: %s succeeded after %d failed attempt(s)",
                                self.operator, what, failures)
                return True
            except Exception as exc:  # noqa: BLE001 - the user's commit: retried, never lost
                failures += 1
                now = self._clock()
                since = now if failures == 1 else since
                log.warning("operator %r: %s failed (attempt %d), retrying in %.1f s: %s: %s",
                            self.operator, what, failures, delay, type(exc).__name__, exc)
                if (self._stuck is not None and not reported
                        and failures >= self._stuck_after_failures
                        and now - since >= self._stuck_after_s):
                    reported = True
                    self._stuck(CommitStuck(self.operator, what, failures, now - since, exc))
            with self._wake:
                if self._wake.wait_for(lambda: self._stopped, timeout=delay):
                    return False
            delay = min(delay * 2, self._max_retry_delay_s)


class CommitStuck(RuntimeError):
    """A commit (or the worker's ``prepare``) failed over and over (rule 2); names the
    operator, what failed, how often and for how long, and the last error."""

    def __init__(self, operator: str, what: str, failures: int, seconds: float,
                 last: Exception) -> None:
        super().__init__(
            f"operator {operator!r}: {what} failed {failures} times in a row over "
            f"{seconds:.0f} s; last error: {type(last).__name__}: {last}. It stays pending "
            f"in the checkpoint and runs again after a restart; fix the cause (the table's "
            f"storage, its catalog, permissions) and restart the query")
        self.operator, self.what, self.failures, self.seconds = operator, what, failures, seconds
        self.last = last
