"""Requests on real Spark (local[2,4]): subtasks pull work from the coordinator inside the
running batch, exactly once across a task retry in the middle of the queue and a fail_job;
a downstream (mapInArrow) operator asks too."""

from __future__ import annotations

import functools
import os
from collections import Counter
from concurrent.futures import Future
from typing import Any

import pytest

from sparkcoord.examples.workqueue import SCHEMA, QueueWorker, WorkQueue
from sparkcoord.spark import CoordinatedJob, OperatorSpec, SubtaskOperator
from sparkcoord.spark.recipient import RecipientOperator
from sparkcoord.testing import CoordinatorHarness
from tests.spark.helpers import sink_rows

pytestmark = pytest.mark.spark
N = 24
COSTS = [0.002 * (1 + i % 5) for i in range(N)]


class SharedQueue(WorkQueue):
    """A work queue that keeps one item for every subtask that has not asked yet: every
    subtask that asks gets at least one item (with at least P items), whichever task runs
    first and however fast it is. "The work was shared" is then true by construction, also on
    a busy machine (the plain queue let one subtask drain it before the others started).

    A subtask that would take an item kept for another gets ``None`` ("nothing more for you
    this batch"); the subtasks that have not asked yet run later in the same batch (all
    partitions of a batch run) and take the kept items, and the last of them drains the
    rest. No task waits for another, so it works with fewer cores than subtasks. The set of
    subtasks that asked is checkpointed, and only logged requests change it: deterministic."""

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        super().reset_to_checkpoint(checkpoint_id, state)
        self.asked: set[int] = set(state["asked"]) if state and "asked" in state else set()

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        waiting = self.context.parallelism - len(self.asked | {subtask})  # not asked yet
        self.asked.add(subtask)
        left = len(self.costs) - self.next + len(getattr(self, "returned", ()))
        if request == "next" and left <= waiting:
            return None  # what is left is kept for the subtasks that have not asked yet
        return super().handle_request(subtask, attempt, request)

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        queue: Future[Any] = Future()
        queue.add_done_callback(
            lambda f: result.set_result({**f.result(), "asked": sorted(self.asked)}))
        super().checkpoint_coordinator(checkpoint_id, queue)


def test_the_shared_queue_keeps_an_item_for_every_subtask_that_has_not_asked_yet() -> None:
    h = CoordinatorHarness(functools.partial(SharedQueue, costs=[0.0] * 6), parallelism=4)
    h.start()
    h.checkpoint()  # the batch of epoch 0 runs
    greedy = []
    while (answer := h.request_from_subtask(0, "next")) is not None:  # subtask 0 runs alone
        greedy.append(answer[0])
    assert greedy == [0, 1, 2]  # three items kept, one for each of subtasks 1, 2 and 3
    assert [h.request_from_subtask(s, "next")[0] for s in (3, 1)] == [3, 4]
    assert h.request_from_subtask(2, "next")[0] == 5  # the last one to ask drains the rest
    assert h.request_from_subtask(2, "next") is None


def queue_job(spark: Any, root: str, **faults: Any) -> tuple[CoordinatedJob, Any]:
    markers = os.path.join(root, "markers")
    job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
    coordinator = functools.partial(SharedQueue, costs=COSTS, marker_dir=markers,
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
    assert {r.subtask for r in rows} == {0, 1, 2, 3}  # shared: by construction (SharedQueue)
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
