"""The driver side of a coordinated source after a job failure (decision 44): refused tasks
are told to wait for the job runner to cancel them, and ``latestOffset`` answers "no batch"
for as long, so that the runner stops the query before Spark fails it; an ``availableNow`` run
fails at once. The real service, storage and channel server, no Spark."""

from __future__ import annotations

import pytest

from sparkcoord.examples.numbers import NumbersCoordinator
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.service import JobFailed
from sparkcoord.spark.driver import DriverSide
from sparkcoord.spark.source import OperatorSpec, SourceSpec

NO_EPOCH = -1


def driver_side(tmp_path, cancel_wait_s: float) -> DriverSide:
    spec = SourceSpec("numbers", str(tmp_path / "coordination"),
                      [OperatorSpec("numbers", NumbersCoordinator, object, 2)], "v int",
                      config=ServiceConfig(cancel_wait_s=cancel_wait_s))
    return DriverSide(spec)


def test_refused_tasks_wait_only_after_a_job_failure_and_only_while_the_run_is_open(
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
    # the run is closed: nothing will cancel a straggler, a refusal is a plain one
    assert d.cancel_wait_ms() == d.refusal_hold_ms() == 0


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
