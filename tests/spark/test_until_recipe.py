"""The documented stop condition on real Spark (issue 24 item 4;
docs/decisions/051-client-request-across-failover.md):
``job.run(writer, until=lambda: job.request("queue", "status")["done"])`` keeps running the job
across a ``fail_job`` (the failed run refuses the request; the job restarts) and across a
killed driver program (a new driver program on the same checkpoint asks the restored run),
and a failure the restart strategy gives up on still ends the job with its own cause."""

from __future__ import annotations

import functools
import os
import pathlib
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import Future
from typing import Any

import pytest

from sparkcoord.examples.sinks import read_batch_files
from sparkcoord.examples.workqueue import SCHEMA, QueueWorker, WorkQueue
from sparkcoord.runtime.restart import NoRestart
from sparkcoord.spark import CoordinatedJob, JobGaveUp
from tests.spark.helpers import sink_rows

pytestmark = pytest.mark.spark
REPO = pathlib.Path(__file__).resolve().parents[2]
N = 24


class CommittedQueue(WorkQueue):
    """A work queue whose status says ``done`` once every item was handed out in a batch
    that committed (``notify_checkpoint_complete(n)``: every item handed out so far was
    answered in a batch up to n). So a job that stops when it is done has every item in its
    sink, and the test can check them all."""

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        super().reset_to_checkpoint(checkpoint_id, state)
        self.committed: int = state.get("committed", 0) if state else 0

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        # handed out and not taken back from a failed attempt (WorkQueue's "returned" items)
        self.committed = self.next - len(getattr(self, "returned", ()))

    def handle_client_request(self, request: Any) -> Any:
        answer = super().handle_client_request(request)
        if request == "status":
            answer["done"] = self.committed >= len(self.costs)
        return answer

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        queue: Future[Any] = Future()
        queue.add_done_callback(
            lambda f: result.set_result({**f.result(), "committed": self.committed}))
        super().checkpoint_coordinator(checkpoint_id, queue)


def queue_job(spark: Any, root: pathlib.Path, fail_job_after: int) -> tuple[CoordinatedJob, Any]:
    job = CoordinatedJob(spark, str(root / "ckpt"))
    coordinator = functools.partial(CommittedQueue, costs=[0.01] * N,
                                    fail_job_after=fail_job_after, marker_dir=str(root / "markers"))
    df = job.source(QueueWorker, coordinator, 4, SCHEMA, name="queue")
    out = str(root / "out")
    return job, df.writeStream.format("parquet").option("path", out).trigger(
        processingTime="0 seconds")


def test_the_documented_until_recipe_survives_a_fail_job_and_ends_the_job_when_done(
        spark, tmp_path) -> None:
    job, writer = queue_job(spark, tmp_path, fail_job_after=N // 2)
    failures: list[str] = []
    # the recipe of coordinators.md and CoordinatedJob.request's docstring, as written there
    report = job.run(writer, until=lambda: job.request("queue", "status")["done"],
                     on_failure=failures.append, timeout_s=240)
    assert report.restarts == 1, report
    assert "injected failure before item 12" in failures[0], failures
    items = Counter(r.item for r in sink_rows(spark, str(tmp_path / "out")))
    assert sorted(items) == list(range(N)) and set(items.values()) == {1}, items
    assert job._requests._clients == {}  # the connection to the ended run is closed with the job


def test_a_failure_the_strategy_gives_up_on_ends_the_until_recipe_job_with_its_own_cause(
        spark, tmp_path) -> None:
    job, writer = queue_job(spark, tmp_path, fail_job_after=N // 2)
    with pytest.raises(JobGaveUp) as caught:
        job.run(writer, until=lambda: job.request("queue", "status")["done"],
                restart=NoRestart(), timeout_s=240)
    first = str(caught.value).splitlines()[0]
    assert first.startswith("coordinator 'queue' called fail_job: injected failure before "
                            "item 12"), first


def run_kill_job(workdir: pathlib.Path, kill: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARKCOORD_TEST_KILL"}
    env["PYSPARK_PYTHON"] = sys.executable
    if kill is not None:
        env["SPARKCOORD_TEST_KILL"] = kill
    return subprocess.run([sys.executable, "-m", "tests.spark.until_kill_job", str(workdir),
                           str(N)], cwd=REPO, env=env, start_new_session=True, timeout=400,
                          capture_output=True, text=True)


@pytest.mark.own_processes
def test_the_documented_until_recipe_ends_the_job_after_a_killed_driver_restarts_it(
        tmp_path) -> None:
    markers = tmp_path / "markers"
    first = run_kill_job(tmp_path, f"answered:0:{markers}")  # mid-queue, inside a batch
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert (markers / "killed-answered").exists()
    second = run_kill_job(tmp_path, None)  # a new driver program on the same checkpoint
    assert second.returncode == 0, second.stderr[-3000:]
    assert "ended by until: restarts 0" in second.stdout, second.stdout
    rows = [r for b in read_batch_files(str(tmp_path / "sink")).values() for r in b]
    assert sorted(r["item"] for r in rows) == list(range(N))  # every item once
