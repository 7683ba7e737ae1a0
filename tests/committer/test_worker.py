"""The commit worker (sparkcoord/committer/worker.py): commits run in order off the caller's
thread, a failing one is retried until it returns and holds the next ones back, and a
stopped worker runs nothing more. Waits on events, never on time."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from sparkcoord.committer import Commit, CommitStuck, CommitWorker


class Recorder:
    """A committer that fails its first ``failures[epoch]`` calls for an epoch."""

    def __init__(self, failures: dict[int, int] | None = None) -> None:
        self.failures = dict(failures or {})
        self.calls: list[tuple[int, tuple[Any, ...]]] = []
        self.done: list[int] = []
        self.all_done = threading.Event()
        self.expected = 0

    def commit(self, epoch: int, items: Sequence[Any]) -> None:
        self.calls.append((epoch, tuple(items)))
        if self.failures.get(epoch, 0) > 0:
            self.failures[epoch] -= 1
            raise OSError(f"store unavailable for epoch {epoch}")

    def reported(self, epoch: int) -> None:
        self.done.append(epoch)
        if len(self.done) == self.expected:
            self.all_done.set()


def test_commits_run_in_order_and_a_failing_one_is_retried_before_the_next(caplog) -> None:
    rec = Recorder(failures={1: 2})
    rec.expected = 3
    worker = CommitWorker("files", rec.commit, rec.reported, retry_delay_s=0.01,
                          max_retry_delay_s=0.02)
    worker.submit([Commit(0, ("a",)), Commit(1, ("b",))])
    worker.submit([Commit(2, ("c",))])
    assert rec.all_done.wait(30)
    assert [e for e, _ in rec.calls] == [0, 1, 1, 1, 2]
    assert rec.done == [0, 1, 2]
    warned = [r.getMessage() for r in caplog.records if r.name == "sparkcoord.committer"]
    assert any("commit of epoch 1 failed (attempt 2)" in m and "store unavailable" in m
               for m in warned), warned
    worker.stop()


def test_a_stopped_worker_ends_a_retrying_commit_without_reporting_it_done() -> None:
    rec = Recorder(failures={0: 10**6})
    failed_once = threading.Event()

    def commit(epoch: int, items: Sequence[Any]) -> None:
        failed_once.set()
        rec.commit(epoch, items)

    worker = CommitWorker("files", commit, rec.reported, retry_delay_s=5.0,
                          max_retry_delay_s=5.0)
    worker.submit([Commit(0, ("a",))])
    assert failed_once.wait(30)
    worker.stop()
    assert worker._thread is not None
    worker._thread.join(30)
    assert not worker._thread.is_alive() and rec.done == []
    worker.submit([Commit(1, ("b",))])  # after stop: ignored (it runs after the restore)
    assert [e for e, _ in rec.calls] == [0]


def test_retry_delays_must_be_positive_and_ordered() -> None:
    with pytest.raises(ValueError, match="retry_delay_s"):
        CommitWorker("files", lambda e, i: None, lambda e: None, retry_delay_s=0)


def test_stop_lets_the_queued_commits_finish_first_as_an_available_now_run_ends() -> None:
    # the last batch's commit is handed over as the run ends; the close must wait for it
    release = threading.Event()
    rec = Recorder()
    rec.expected = 2

    def slow_commit(epoch: int, items: Sequence[Any]) -> None:
        assert release.wait(30)
        rec.commit(epoch, items)

    worker = CommitWorker("files", slow_commit, rec.reported)
    worker.submit([Commit(4, ("a",)), Commit(5, ("b",))])
    threading.Timer(0.05, release.set).start()  # the store answers while stop waits
    assert worker.stop(drain_s=30) is True
    assert rec.done == [4, 5] and [e for e, _ in rec.calls] == [4, 5]


def test_stop_gives_up_draining_a_failing_commit_and_says_which_epochs_wait(caplog) -> None:
    rec = Recorder(failures={7: 10**6})
    worker = CommitWorker("files", rec.commit, rec.reported, retry_delay_s=0.01,
                          max_retry_delay_s=0.01)
    worker.submit([Commit(7, ("a",))])
    assert worker.stop(drain_s=0.2) is False
    assert rec.done == []
    assert any("not done when the coordinator closed (epochs [7])" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_prepare_runs_once_before_the_first_commit_and_is_retried_while_the_commits_wait(
        caplog) -> None:
    journal: list[Any] = []
    preparing = threading.Event()
    submitted = threading.Event()
    failures = [2]

    def prepare() -> None:
        journal.append("prepare")
        preparing.set()
        assert submitted.wait(30)  # the commits are handed over while prepare fails
        if failures[0] > 0:
            failures[0] -= 1
            raise OSError("table not reachable")

    rec = Recorder()
    rec.expected = 2

    def commit(epoch: int, items: Sequence[Any]) -> None:
        journal.append(("commit", epoch))
        rec.commit(epoch, items)

    worker = CommitWorker("files", commit, rec.reported, retry_delay_s=0.01,
                          max_retry_delay_s=0.02, prepare=prepare)
    worker.start()  # prepare runs now, before anything is submitted
    assert preparing.wait(30)
    worker.submit([Commit(0, ("a",)), Commit(1, ("b",))])
    submitted.set()
    assert rec.all_done.wait(30)
    assert journal == ["prepare", "prepare", "prepare", ("commit", 0), ("commit", 1)]
    assert rec.done == [0, 1]
    warned = [r.getMessage() for r in caplog.records if r.name == "sparkcoord.committer"]
    assert any("'files': preparing failed (attempt 2)" in m and "table not reachable" in m
               for m in warned), warned
    # later commits do not prepare again
    rec.expected = 3
    rec.all_done.clear()
    worker.submit([Commit(2, ("c",))])
    assert rec.all_done.wait(30)
    assert journal.count("prepare") == 3 and journal[-1] == ("commit", 2)
    worker.stop()


def test_without_start_the_first_submit_runs_prepare_before_its_commit() -> None:
    journal: list[Any] = []
    rec = Recorder()
    rec.expected = 1

    def commit(epoch: int, items: Sequence[Any]) -> None:
        journal.append(("commit", epoch))
        rec.commit(epoch, items)

    worker = CommitWorker("files", commit, rec.reported,
                          prepare=lambda: journal.append("prepare"))
    assert worker._thread is None  # nothing runs before the first submit
    worker.submit([Commit(3, ("a",))])
    assert rec.all_done.wait(30)
    assert journal == ["prepare", ("commit", 3)]
    worker.stop()


def test_idle_is_done_at_once_when_nothing_is_queued() -> None:
    worker = CommitWorker("files", lambda e, i: None, lambda e: None)
    waiter = worker.idle()
    assert waiter.done() and waiter.result(timeout=0) is None
    worker.submit([])  # nothing handed over: still idle
    assert worker.idle().done()
    worker.stop()


def test_idle_completes_only_once_every_commit_handed_over_so_far_is_done() -> None:
    entered = threading.Event()
    release = threading.Event()
    rec = Recorder()

    def blocked_commit(epoch: int, items: Sequence[Any]) -> None:
        entered.set()
        assert release.wait(30)
        rec.commit(epoch, items)

    worker = CommitWorker("files", blocked_commit, rec.reported)
    worker.submit([Commit(4, ("a",)), Commit(5, ("b",))])
    assert entered.wait(30)  # the commit of epoch 4 runs and blocks
    waiter = worker.idle()
    assert not waiter.done()
    release.set()
    assert waiter.result(timeout=30) is None
    # done was reported for both before the future completed
    assert rec.done == [4, 5] and [e for e, _ in rec.calls] == [4, 5]
    assert worker.idle().done()
    worker.stop()


def test_stop_fails_a_pending_idle_future() -> None:
    entered = threading.Event()
    release = threading.Event()

    def blocked_commit(epoch: int, items: Sequence[Any]) -> None:
        entered.set()
        assert release.wait(30)

    worker = CommitWorker("files", blocked_commit, lambda e: None)
    worker.submit([Commit(6, ("a",))])
    assert entered.wait(30)
    waiter = worker.idle()
    assert not waiter.done()
    assert worker.stop() is False  # no drain: the commit is still running
    assert waiter.done()
    error = waiter.exception(timeout=0)
    assert isinstance(error, RuntimeError)
    assert "'files'" in str(error) and "stopped before its commits were done" in str(error)
    release.set()  # the running commit returns; the worker ends after it
    assert worker._thread is not None
    worker._thread.join(30)
    assert not worker._thread.is_alive()


def test_idle_on_a_stopped_worker_fails() -> None:
    worker = CommitWorker("files", lambda e, i: None, lambda e: None)
    worker.stop()
    waiter = worker.idle()
    assert waiter.done()
    error = waiter.exception(timeout=0)
    assert isinstance(error, RuntimeError)
    assert "'files'" in str(error) and "the commit worker stopped" in str(error)


class SteppingClock:
    """A clock that moves ``step`` seconds at each reading (the worker reads it per failure)."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def run_failing(failures: int, seconds_per_failure: float) -> tuple[Recorder, list[BaseException]]:
    """A commit of epoch 0 that fails ``failures`` times, each failure read
    ``seconds_per_failure`` later on the worker's clock (stuck after 5 failures over 60 s):
    the recorder once it succeeded, and what ``stuck`` was called with."""
    rec = Recorder(failures={0: failures})
    rec.expected = 1
    stuck: list[BaseException] = []
    worker = CommitWorker("sink", rec.commit, rec.reported, retry_delay_s=0.001,
                          max_retry_delay_s=0.001, stuck=stuck.append, stuck_after_s=60.0,
                          stuck_after_failures=5, clock=SteppingClock(seconds_per_failure))
    worker.submit([Commit(0, ("a",))])
    assert rec.all_done.wait(30)  # retried to the end, reported stuck or not
    worker.stop()
    return rec, stuck


def test_a_commit_failing_long_enough_is_reported_stuck_once_and_still_retried() -> None:
    rec, stuck = run_failing(12, 20.0)
    assert rec.done == [0] and len(stuck) == 1
    error = stuck[0]
    assert isinstance(error, CommitStuck)
    text = str(error)
    assert "'sink'" in text and "commit of epoch 0" in text and "5 times" in text
    assert "store unavailable for epoch 0" in text and "restart" in text


def test_a_commit_failing_often_but_briefly_is_not_reported_stuck() -> None:
    rec, stuck = run_failing(20, 1.0)
    assert stuck == [] and rec.done == [0]
