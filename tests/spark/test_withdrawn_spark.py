"""A task retry that pulls less than its failed attempt, on real Spark (local[2,4]): the items
the failed attempt was handed and the retry did not pull again go back to the work queue and
are read exactly once (docs/protocol.md [every-answer-consumed-or-returned]); a coordinator
that cannot take them back fails the job loudly instead of losing them."""

from __future__ import annotations

import functools
import os
from collections import Counter
from typing import Any

import pytest

from sparkcoord import OperatorCoordinator
from sparkcoord.examples.workqueue import SCHEMA, QueueWorker, WorkQueue
from sparkcoord.runtime.restart import NoRestart
from sparkcoord.spark import CoordinatedJob
from sparkcoord.spark.job import JobGaveUp
from tests.spark.helpers import latest_snapshot, sink_rows

pytestmark = pytest.mark.spark
N = 16
COSTS = [0.002] * N


class RecordingQueue(WorkQueue):
    """The example's work queue, also keeping (in its checkpointed state) every item it took
    back, and from which subtask: what the test reads from the newest checkpoint."""

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        super().reset_to_checkpoint(checkpoint_id, state)
        self.took_back: list[tuple[int, int]] = list((state or {}).get("took_back", []))

    def handle_items_withdrawn(self, subtask: int, attempt: int, withdrawn: list[Any]) -> None:
        self.took_back += [(subtask, w.answer[0]) for w in withdrawn if w.answered]
        super().handle_items_withdrawn(subtask, attempt, withdrawn)

    def checkpoint_coordinator(self, checkpoint_id: int, result: Any) -> None:
        result.set_result({"next": self.next, "assigned": self.assigned, "added": self.added,
                           "returned": self.returned, "took_back": self.took_back})


class QueueThatCannotTakeBack(WorkQueue):
    """A work queue without ``handle_items_withdrawn``: the base class's, which fails the job."""

    handle_items_withdrawn = OperatorCoordinator.handle_items_withdrawn


def budget_job(spark: Any, root: str, queue: type[WorkQueue] = RecordingQueue
               ) -> tuple[CoordinatedJob, Any]:
    markers = os.path.join(root, "markers")
    job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
    coordinator = functools.partial(queue, costs=COSTS, marker_dir=markers)
    # the task that takes item N/2 fails once; its retry's budget allows no item at all, so
    # every item its failed attempt pulled (N/2 at least) must come back
    worker = functools.partial(QueueWorker, marker_dir=markers, fail_task_at=N // 2,
                               retry_budget=0)
    return job, job.source(worker, coordinator, 2, SCHEMA, name="queue")


def test_a_retry_that_pulls_less_gives_the_rest_back_and_every_item_is_read_once(
        spark, tmp_path) -> None:
    job, df = budget_job(spark, str(tmp_path))
    out = str(tmp_path / "out")
    writer = df.writeStream.format("parquet").option("path", out).trigger(
        processingTime="0 seconds")
    report = job.run(writer, until=lambda: len(sink_rows(spark, out)) >= N, poll_s=0.3,
                     timeout_s=240)
    assert os.path.exists(tmp_path / "markers" / f"fail_task-{N // 2}"), "no task failed"
    assert report.restarts == 0 and report.failures == []
    items = Counter(r.item for r in sink_rows(spark, out))
    assert sorted(items) == list(range(N)) and set(items.values()) == {1}, items
    took_back = latest_snapshot(job, "queue", "queue")["took_back"]
    # the failed attempt pulled item N/2 (and maybe more); its retry pulled none again
    assert N // 2 in {item for _, item in took_back}, took_back
    assert len({subtask for subtask, _ in took_back}) == 1


def test_a_coordinator_that_cannot_take_answers_back_fails_the_job_naming_what_to_implement(
        spark, tmp_path) -> None:
    job, df = budget_job(spark, str(tmp_path), QueueThatCannotTakeBack)
    out = str(tmp_path / "out")
    writer = df.writeStream.format("parquet").option("path", out).trigger(
        processingTime="0 seconds")
    with pytest.raises(JobGaveUp) as failed:
        job.run(writer, restart=NoRestart(), until=lambda: len(sink_rows(spark, out)) >= N,
                poll_s=0.3, timeout_s=240)
    text = str(failed.value)
    assert "WithdrawnNotHandled" in text and "implement handle_items_withdrawn" in text
    assert "subtask" in text and "'queue'" in text
    assert sink_rows(spark, out) == []  # the batch never committed: nothing lost, nothing half
