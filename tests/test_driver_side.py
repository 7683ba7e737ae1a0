"""The driver side of a coordinated source after a job failure (decision 44): refused tasks
are told to wait for the job runner to cancel them, and ``latestOffset`` answers "no batch"
for as long, so that the runner stops the query before Spark fails it; an ``availableNow`` run
fails at once. The real service, storage and channel server, no Spark."""

from __future__ import annotations

import pytest

from sparkcoord.channel.client import ChannelClient, ChannelRejected
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.examples.numbers import NumbersCoordinator
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.service import JobFailed
from sparkcoord.spark.driver import DriverSide
from sparkcoord.spark.spec import OperatorSpec, SourceSpec
from tests.channel.test_cancel_wait import Parks, parked_request_when_failing, record_sleeps

NO_EPOCH = -1


def driver_side(tmp_path, cancel_wait_s: float, coordinator: object = NumbersCoordinator
                ) -> DriverSide:
    spec = SourceSpec("numbers", str(tmp_path / "coordination"),
                      [OperatorSpec("numbers", coordinator, object, 2)], "v int",
                      config=ServiceConfig(cancel_wait_s=cancel_wait_s))
    return DriverSide(spec)


def test_refused_tasks_wait_only_after_a_job_failure_and_latest_offset_only_while_the_run_is_open(
        tmp_path) -> None:
    d = driver_side(tmp_path, cancel_wait_s=30.0)
    try:
        d.latest_epoch(NO_EPOCH)  # restores the run
        assert d.cancel_wait_ms() == 0  # nothing failed: a refusal fails its task at once
        d.service.fail_job("the table is gone")
        left = d.cancel_wait_ms()
        assert 25_000 < left <= 30_000, left  # what is left of cancel_wait_s since the failure
        assert 0 < d.server.failover_hold() <= left  # what the channel tells refused tasks
    finally:
        d.close()
    # the run is closed (the query stopped for the failure): latestOffset waits no more, but
    # a task still running is one of the failed job's, being cancelled: its refusal still holds
    assert d.cancel_wait_ms() == 0
    assert 25_000 < d.refusal_hold_ms() <= 30_000


def test_latest_offset_answers_no_batch_while_the_job_runner_may_still_stop_the_query(
        tmp_path) -> None:
    d = driver_side(tmp_path, cancel_wait_s=30.0)
    try:
        first = d.latest_epoch(NO_EPOCH)  # the job's first batch always runs
        assert first == 0
        d.service.fail_job("the table is gone")
        # Spark asks again and again while the runner notices: no batch, no failed query
        assert d.latest_epoch(first) == first
        assert d.latest_epoch(first) == first
        # an availableNow run would end on "no batch" as if done: it fails at once
        with pytest.raises(JobFailed, match="the table is gone"):
            d.latest_epoch(first, wait_for_cancel=False)
    finally:
        d.close()


def test_latest_offset_fails_the_query_once_the_wait_is_over(tmp_path) -> None:
    d = driver_side(tmp_path, cancel_wait_s=0.0)  # a query nobody stops: fail at once
    try:
        first = d.latest_epoch(NO_EPOCH)
        d.service.fail_job("the table is gone")
        assert d.cancel_wait_ms() == 0
        # refusals still say "the job failed" (a hold of 1 ms): one line, no traceback
        assert d.refusal_hold_ms() == d.server.failover_hold() == 1
        with pytest.raises(JobFailed, match="the table is gone"):
            d.latest_epoch(first)
    finally:
        d.close()


def test_a_request_waiting_when_the_job_fails_is_refused_with_the_hold(tmp_path,
                                                                       monkeypatch) -> None:
    # Regression: the failing service answers its waiting requests before it tells its
    # listeners, so the hold was still 0 for them: the task failed at once, with a traceback,
    # and Spark retried it (seen about once in eight runs of tests/spark/test_quiet_failover)
    slept = record_sleeps(monkeypatch)
    d = driver_side(tmp_path, cancel_wait_s=30.0, coordinator=Parks)
    try:
        epoch = d.latest_epoch(NO_EPOCH)
        client = ChannelClient(d.address, d.secret,
                               TaskAttempt(d.service.run_id, SubtaskId("numbers", 0), epoch, 0))
        client.register()
        errors = parked_request_when_failing(client,
                                             lambda: d.service.fail_job("the table is gone"))
        assert len(errors) == 1 and isinstance(errors[0], ChannelRejected), errors
        assert len(slept) == 1 and 25 < slept[0] <= 30, slept  # held for the job runner
        client.close()
    finally:
        d.close()


class _DeclinesOnce(__import__("sparkcoord").OperatorCoordinator):
    """Asks for a second batch, declines checkpoint 1 once, and has a commit pending until the
    test says it is done (``run_ending``)."""

    declined: list[int] = []
    ending: list[str] = []

    def checkpoint_coordinator(self, checkpoint_id: int, result: object) -> None:
        if checkpoint_id == 0:
            self.context.request_batch()
        if checkpoint_id == 1 and not self.declined:
            self.declined.append(checkpoint_id)
            result.set_exception(RuntimeError("not now"))  # type: ignore[attr-defined]
            return
        result.set_result(None)  # type: ignore[attr-defined]

    def run_ending(self) -> object:
        self.ending.append("asked")
        return None


def test_a_declined_checkpoint_in_an_available_now_run_is_tried_again_not_taken_for_the_end(
        tmp_path) -> None:
    # "no batch" ends an availableNow run: a decline answered that way ended the run with its
    # work not done and its commits not waited for (found by review)
    import time

    spec = SourceSpec("src", str(tmp_path / "coordination"),
                      [OperatorSpec("c", _DeclinesOnce, object, 1)], "v int",
                      config=ServiceConfig(tolerable_checkpoint_failures=3))
    side = DriverSide(spec, available_now=True)
    try:
        assert side.latest_epoch(-1, wait_for_cancel=False) == 0
        deadline = time.monotonic() + 10
        while not side.service.wants_batch():  # the mailbox ran checkpoint 0's request
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # declined once (ids only grow past a decline), then sealed as 2; before: 0, the end
        assert side.latest_epoch(0, wait_for_cancel=False) == 2
        assert _DeclinesOnce.declined == [1] and _DeclinesOnce.ending == []
    finally:
        side.close()
