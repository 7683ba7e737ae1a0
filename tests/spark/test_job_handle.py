"""The job handle on real Spark (issue 14): ``CoordinatedJob.start`` returns at once with the
running query, ``stop`` ends it, and the batch count is not capped at Spark's 100 progress
reports."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.spark.helpers import numbers_job

pytestmark = pytest.mark.spark


def committed_batches(job) -> int:
    # Spark keeps only the newest 100 commit files (minBatchesToRetain): the batches one fresh
    # query committed are its newest batch id + 1
    commits = Path(job.spark_checkpoint) / "commits"
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.exists() else []
    return max(ids) + 1 if ids else 0


def wait_for(predicate, timeout_s: float, what) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"{what() if callable(what) else what}: not after {timeout_s} s")
        time.sleep(0.2)


def test_start_returns_a_handle_on_the_running_query_and_stop_ends_the_job(
        spark, tmp_path) -> None:
    # a checkpoint interval of 0 seals an epoch at every trigger: a batch each time
    job, df = numbers_job(spark, str(tmp_path), total=10_000, checkpoint_interval_s=0.0)
    writer = df.writeStream.format("noop").trigger(processingTime="0 seconds")
    handle = job.start(writer)
    try:
        wait_for(lambda: handle.query is not None, 60, "the query started")
        assert handle.running and handle.query.isActive and handle.query.id is not None
        assert handle.await_termination(0.1) is False  # still running
        # past Spark's 100 kept progress reports: the count must not stop there
        wait_for(lambda: committed_batches(job) >= 110, 240,
                 lambda: f"110 committed batches (committed {committed_batches(job)}, counted "
                         f"{handle.report.batches}, failures {handle.failures}, error "
                         f"{handle.exception()!r}, status {handle.query and handle.query.status})")
    finally:
        handle.stop(timeout_s=60)
    assert not handle.running and handle.await_termination(0) is True
    assert not handle.query.isActive
    assert handle.exception() is None and handle.restarts == 0 and handle.failures == []
    assert handle.report.batches == committed_batches(job) >= 110


def test_a_failed_job_keeps_its_error_on_the_handle(spark, tmp_path) -> None:
    from sparkcoord.runtime.restart import NoRestart
    from sparkcoord.spark import JobGaveUp

    job, df = numbers_job(spark, str(tmp_path), total=12, fail_job_at=3)
    writer = df.writeStream.format("noop").trigger(processingTime="0 seconds")
    handle = job.start(writer, restart=NoRestart())
    with pytest.raises(JobGaveUp, match="^coordinator 'numbers' called fail_job"):
        handle.await_termination(240)
    assert isinstance(handle.exception(), JobGaveUp)
    assert handle.last_failure is not None and "injected failure" in handle.last_failure
    assert os.path.exists(tmp_path / "markers")
