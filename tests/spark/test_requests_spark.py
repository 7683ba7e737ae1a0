"""Requests on real Spark (local[2,4]): subtasks pull work from the coordinator inside the
running batch, exactly once across a task retry in the middle of the queue and a fail_job;
a downstream (mapInArrow) operator asks too."""

from __future__ import annotations

import functools
import os
from collections import Counter
from typing import Any

import pytest

from sparkcoord.examples.workqueue import SCHEMA, QueueWorker, WorkQueue
from sparkcoord.spark import CoordinatedJob, OperatorSpec, SubtaskOperator
from sparkcoord.spark.recipient import RecipientOperator
from tests.spark.helpers import sink_rows

pytestmark = pytest.mark.spark
N = 24
COSTS = [0.002 * (1 + i % 5) for i in range(N)]


def queue_job(spark: Any, root: str, **faults: Any) -> tuple[CoordinatedJob, Any]:
    markers = os.path.join(root, "markers")
    job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
    coordinator = functools.partial(WorkQueue, costs=COSTS, marker_dir=markers,
                                    fail_job_after=faults.get("fail_job_after"))
    worker = functools.partial(QueueWorker, marker_dir=markers,
                               fail_task_at=faults.get("fail_task_at"))
    return job, job.source(worker, coordinator, 4, SCHEMA, name="queue")


def run_until_items(spark: Any, job: CoordinatedJob, df: Any, out: str, **options: Any) -> Any:
    writer = df.writeStream.format("parquet").option("path", out).trigger(processingTime="0 seconds")
    return job.run(writer, until=lambda: len(sink_rows(spark, out)) >= N, poll_s=0.3,
                   timeout_s=240, **options)


def test_subtasks_pull_every_item_exactly_once_inside_the_first_batch(spark, tmp_path) -> None:
    # a coordinator that only answers requests still gets its first batch (no interval set)
    job, df = queue_job(spark, str(tmp_path))
    out = str(tmp_path / "out")
    report = run_until_items(spark, job, df, out)
    rows = sink_rows(spark, out)
    assert sorted(r.item for r in rows) == list(range(N))
    assert {r.epoch for r in rows} == {0}  # answered inside the running batch, not the next
    assert len({r.subtask for r in rows}) >= 2  # the work was shared
    assert report.failures == []


def test_a_task_retry_in_the_middle_of_the_queue_gets_its_items_again_and_loses_none(
        spark, tmp_path) -> None:
    job, df = queue_job(spark, str(tmp_path), fail_task_at=N // 2)
    out = str(tmp_path / "out")
    report = run_until_items(spark, job, df, out)
    assert os.path.exists(tmp_path / "markers" / f"fail_task-{N // 2}"), "no task failed"
    assert report.restarts == 0  # a Spark task retry, not a query restart
    items = Counter(r.item for r in sink_rows(spark, out))
    assert sorted(items) == list(range(N)) and set(items.values()) == {1}


def test_a_fail_job_in_the_middle_of_the_queue_reruns_the_batch_with_the_logged_answers(
        spark, tmp_path) -> None:
    job, df = queue_job(spark, str(tmp_path), fail_job_after=N // 2)
    out = str(tmp_path / "out")
    failures: list[str] = []
    report = run_until_items(spark, job, df, out, on_failure=failures.append)
    assert report.restarts == 1 and "injected failure before item" in failures[0]
    rows = sink_rows(spark, out)
    items = Counter(r.item for r in rows)
    assert sorted(items) == list(range(N)) and set(items.values()) == {1}
    assert {r.epoch for r in rows} == {0}  # the rerun of epoch 0's batch finished the queue


class AskingRecipient(RecipientOperator):
    """A downstream operator that asks the coordinator for an id per input chunk."""

    def process_input(self, rows: list[dict[str, Any]]) -> Any:
        if rows:
            answer = self.context.request("next")
            if answer is not None:
                yield (answer[0], self.context.subtask, self.context.epoch)


class Emits(SubtaskOperator):
    def process(self) -> Any:
        yield (self.context.subtask, self.context.subtask, self.context.epoch)


def test_a_downstream_operator_asks_the_coordinator_inside_its_batch(spark, tmp_path) -> None:
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    source = OperatorSpec("emit", WorkQueue, Emits, 2)
    recipient = OperatorSpec("ask", functools.partial(WorkQueue, costs=[0.0] * 8),
                             AskingRecipient, 2)
    df = job.sources([source], SCHEMA, name="src", recipients=[recipient])
    out_df = job.apply(df, "ask", SCHEMA, source="src")
    out = str(tmp_path / "out")
    writer = (out_df.writeStream.format("parquet").option("path", out)
              .trigger(processingTime="0 seconds"))
    job.run(writer, until=lambda: len(sink_rows(spark, out)) >= 1, poll_s=0.3, timeout_s=180)
    rows = sink_rows(spark, out)
    ids = [r.item for r in rows]
    assert ids and len(ids) == len(set(ids)) and set(ids) <= set(range(8))
    assert {r.epoch for r in rows} == {0}


def test_a_job_ends_when_its_coordinator_says_so_through_a_client_request(spark, tmp_path) -> None:
    job, df = queue_job(spark, str(tmp_path))
    out = str(tmp_path / "out")
    writer = df.writeStream.format("parquet").option("path", out).trigger(processingTime="0 seconds")
    seen: list[dict[str, Any]] = []

    def done() -> bool:
        status = job.request("queue", "status", timeout_s=60)  # the driver program asks
        seen.append(status)
        return bool(status["done"]) and len(sink_rows(spark, out)) >= N

    handle = job.start(writer, until=done, poll_s=0.2, timeout_s=180)
    assert handle.await_termination(200)
    assert seen[-1] == {"handed_out": N, "left": 0, "done": True}
    assert sorted(r.item for r in sink_rows(spark, out)) == list(range(N))
