"""The split enumerator's committer (rule 6 of sparkcoord/sources/enumerator.py) through the
coordinator harness: once a batch commits, the committer gets the epoch and the splits its
readers reported finished; a commit not seen done is run again after a restore; a retry that
withdraws a finished report takes its split out of the batch's commit."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from typing import Any

from sparkcoord.core.restore import RestorePoint
from sparkcoord.sources import NextSplit, Split, SplitEnumerator
from sparkcoord.testing import CoordinatorHarness
from tests.sources.test_alignment_wiring import Splits


class Published:
    """A committer that records its calls; ``fail`` makes it raise until cleared."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[str]]] = []
        self.fail = False
        self.called = threading.Event()

    def __call__(self, epoch: int, splits: Sequence[Any]) -> None:
        self.calls.append((epoch, [s.split_id for s in splits]))
        self.called.set()
        if self.fail:
            raise OSError("the manifest store is down")

    def wait_call(self) -> tuple[int, list[str]]:
        assert self.called.wait(30), "the committer was not called"
        self.called.clear()
        return self.calls[-1]


def harness(url: str, published: Published, parallelism: int = 1) -> CoordinatorHarness:
    splits = [Split(f"s{k}") for k in range(4)]
    enumerator = functools.partial(SplitEnumerator, discovery=Splits(splits),
                                   committer=published, commit_drain_s=0.2)
    return CoordinatorHarness(enumerator, parallelism, name="files", storage_url=url)


def settled(h: CoordinatorHarness) -> list[int]:
    """Run the mailbox until no commit is pending (the worker reports "done" from its thread
    once the committer returned); the pending epochs, empty unless it gave up waiting."""
    deadline = time.monotonic() + 30
    while True:
        h.run()
        pending = h.ask_as_client("status").result()["commits_pending"]
        if not pending or time.monotonic() > deadline:
            return list(pending)
        time.sleep(0.01)


def read(h: CoordinatorHarness, subtask: int, splits: int, report_last: bool = True) -> list[str]:
    """A reader takes ``splits`` splits, reporting each finished with its next request."""
    got: list[str] = []
    for _ in range(splits):
        answer = h.request_from_subtask(subtask, NextSplit(tuple(got[-1:])))
        assert isinstance(answer, Split), answer
        got.append(answer.split_id)
    if report_last:
        h.request_from_subtask(subtask, NextSplit(tuple(got[-1:])))
    return got


def test_a_committed_batch_calls_the_committer_with_the_splits_its_readers_finished(
        tmp_path) -> None:
    published = Published()
    h = harness(f"file://{tmp_path}/records", published)
    h.start()
    h.checkpoint()
    assert read(h, 0, 2) == ["s0", "s1"]
    assert published.calls == []  # not before the batch commits
    h.commit()
    assert published.wait_call() == (h.epoch, ["s0", "s1"])
    assert settled(h) == []  # the worker's "done" reached the mailbox
    h.checkpoint()
    read(h, 0, 1, report_last=False)  # s2 taken, not reported: not in this batch's commit
    h.commit()
    h.run()
    assert len(published.calls) == 1
    h.service.close()
    h.run()  # the close runs on the mailbox: it stops the commit worker


def test_a_commit_not_seen_done_runs_again_after_a_restore(tmp_path) -> None:
    url = f"file://{tmp_path}/records"
    published = Published()
    published.fail = True  # the store is down: the commit of the first batch keeps failing
    h = harness(url, published)
    h.start()
    h.checkpoint()
    read(h, 0, 2)
    first = h.epoch
    h.commit()
    assert published.wait_call() == (first, ["s0", "s1"])
    h.checkpoint()  # the next checkpoint holds the pending commit
    assert h.ask_as_client("status").result()["commits_pending"] == [first]
    second = h.epoch
    h.commit()
    h.service.close()  # the driver dies; the commit was never seen done
    h.run()
    again = Published()
    h = harness(url, again)
    h.start(RestorePoint(second, committed=True))
    assert again.wait_call() == (first, ["s0", "s1"])  # the same epoch, the same splits
    assert settled(h) == []
    h.service.close()
    h.run()  # the close runs on the mailbox: it stops the commit worker


def test_a_retry_that_withdraws_a_finished_report_takes_its_split_out_of_the_commit(
        tmp_path) -> None:
    published = Published()
    h = harness(f"file://{tmp_path}/records", published)
    h.start()
    h.checkpoint()
    # the first attempt reads s0 and s1 and reports s0 finished with the request for s1
    assert read(h, 0, 2, report_last=False) == ["s0", "s1"]
    h.retry_task(0)
    # the retry adopts the history, re-sends the first request only, and finishes
    assert h.request_from_subtask(0, NextSplit(())).split_id == "s0"
    h.finish_task(0)
    h.run()
    assert h.service.failure is None, h.service.failure
    h.commit()
    h.run()
    # nothing was reported finished by the surviving attempt: no commit was issued (one
    # would be pending until the committer returned and its report reached the mailbox)
    status = h.ask_as_client("status").result()
    assert published.calls == []
    assert status["commits_pending"] == [] and status["pending"] == 3, status
    h.service.close()
    h.run()  # the close runs on the mailbox: it stops the commit worker
