"""The job handle on real Spark (issue 14): ``CoordinatedJob.start`` returns at once with the
running query, ``stop`` ends it, and the batch count is not capped at Spark's 100 progress
reports; what a ``StreamingQuery`` tells (``id``, ``runId``, ``name``, ``recentProgress``,
``lastProgress``, ``status``), the handle tells across restarts (issue 25 item 5)."""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sparkcoord.examples.numbers import SCHEMA, NumberCollector, NumbersCoordinator, _once
from sparkcoord.spark import CoordinatedJob
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
    # one query: its id and runId, and one report per batch id of the (up to) 100 reports
    # Spark kept (an idle trigger reports the next batch id too), the last one the newest
    assert handle.report.runIds == [handle.runId] and handle.id == str(handle.query.id)
    recent = handle.recentProgress
    kept_by_spark = {p.batchId for p in handle.query.recentProgress}
    assert [p.batchId for p in recent] == sorted(kept_by_spark) and len(kept_by_spark) > 50
    assert {str(p.runId) for p in recent} == {handle.runId}
    assert handle.lastProgress is not None
    assert handle.lastProgress.batchId == recent[-1].batchId == handle.query.lastProgress.batchId


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


def test_the_handle_keeps_the_newest_hundred_reports_across_queries_one_per_batch() -> None:
    # no Spark needed: stand-ins with the two fields the merge reads, plus a tag
    from types import SimpleNamespace

    from sparkcoord.spark.job import PROGRESS_KEPT, merge_progress

    def report(run: str, batch: int, tag: str = "ran") -> SimpleNamespace:
        return SimpleNamespace(runId=run, batchId=batch, tag=tag)

    first = [report("run-1", b) for b in range(80)]
    # the restarted query reruns batch 79, then reports batch 140 idle before running it
    second = ([report("run-2", b) for b in range(79, 140)] + [report("run-2", 140, "idle")]
              + [report("run-2", 140)])
    merged = merge_progress(first + second)
    assert PROGRESS_KEPT == 100 and len(merged) == 100
    assert [(p.runId, p.batchId) for p in merged] == (
        [("run-1", b) for b in range(42, 80)] + [("run-2", b) for b in range(79, 141)])
    assert merged[-1].tag == "ran"  # the idle report of batch 140 gave way to its run


class FailsOnceAfterThreeBatches(NumbersCoordinator):
    """Calls ``fail_job`` once in the job's life (a marker file), when the batch of epoch 2
    committed: the first query has reported progress for several batches by then."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if checkpoint_id >= 2 and _once(self.marker_dir, "fail_job-after-batches"):
            self.context.fail_job(f"injected failure after the batch of epoch {checkpoint_id}")


def test_progress_id_and_status_of_the_handle_continue_across_a_restart(spark, tmp_path) -> None:
    from sparkcoord.runtime.restart import FixedDelay

    # a checkpoint interval of 0 seals an epoch at every trigger: a batch each time
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"), checkpoint_interval_s=0.0)
    coordinator = functools.partial(FailsOnceAfterThreeBatches, total=10_000, per_tick=3,
                                    interval_s=0.02, marker_dir=str(tmp_path / "markers"))
    df = job.source(NumberCollector, coordinator, 2, SCHEMA, name="numbers")
    writer = (df.writeStream.format("noop").queryName("handle_across_restarts")
              .trigger(processingTime="0 seconds"))
    handles: list[Any] = []
    started = threading.Event()
    status_at_failure: list[dict[str, Any]] = []

    def on_failure(cause: str) -> None:  # the handle's thread, before the restart
        started.wait(60)
        status_at_failure.append(handles[0].status)

    def second_query_ran_a_batch() -> bool:  # the handle's thread, after each poll
        h = handles[0] if started.is_set() else None
        return h is not None and h.restarts == 1 and any(
            str(p.runId) == h.runId and "addBatch" in (p.durationMs or {})
            for p in h.report.recentProgress)

    handles.append(job.start(writer, restart=FixedDelay(attempts=1, delay_s=0.0),
                             until=second_query_ran_a_batch, poll_s=0.2, timeout_s=180,
                             on_failure=on_failure))
    started.set()
    handle = handles[0]
    assert handle.await_termination(240) is True
    assert handle.restarts == 1 and "injected failure" in handle.failures[0]

    runs = handle.report.runIds
    assert len(runs) == 2 and runs[0] != runs[1] and handle.runId == runs[1]
    recent = handle.recentProgress
    run_of = [str(p.runId) for p in recent]
    # the reports of both queries, the first query's first; one per (runId, batchId)
    assert run_of == sorted(run_of, key=runs.index) and set(run_of) == set(runs)
    assert len({(p.runId, p.batchId) for p in recent}) == len(recent)
    ran_first = [p for p in recent if str(p.runId) == runs[0] and "addBatch" in p.durationMs]
    assert len(ran_first) >= 2
    # Spark's id persists across the restart: every report and the handle carry the same one
    assert handle.id is not None and {str(p.id) for p in recent} == {handle.id}
    assert handle.report.id == handle.id and handle.name == "handle_across_restarts"
    # lastProgress is the newest report, of the second query
    last = handle.lastProgress
    assert last is not None and (last.runId, last.batchId) == (recent[-1].runId,
                                                              recent[-1].batchId)
    assert str(last.runId) == runs[1] and last.timestamp == max(p.timestamp for p in recent)
    assert [(p.runId, p.batchId) for p in handle.report.recentProgress] == [
        (p.runId, p.batchId) for p in recent]
    assert handle.report.lastProgress is not None
    # status: while no query ran, a dict of Spark's keys saying what the job did
    assert len(status_at_failure) == 1
    assert status_at_failure[0]["message"].startswith(
        "Query failed: coordinator 'numbers' called fail_job: injected failure")
    assert status_at_failure[0]["isTriggerActive"] is False
    assert handle.status == {"message": "Stopped", "isDataAvailable": False,
                             "isTriggerActive": False}
