"""A foreign local process floods the channel server with idle connections while a query runs
(issue 24 item 5): no task fails, the query does not restart, every item is taken once."""

from __future__ import annotations

import functools
import glob
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import pytest

from sparkcoord.examples.workqueue import SCHEMA, QueueWorker, WorkQueue
from sparkcoord.spark import CoordinatedJob, SubtaskContext
from tests.channel.test_channel_limits import FLOOD
from tests.spark.helpers import sink_rows

pytestmark = pytest.mark.spark
N = 40
BATCHES_UNDER_ATTACK = 4


class MarkingWorker(QueueWorker):
    """A queue worker that leaves a file per task attempt it opens: a task retry (a failed
    attempt) shows as a Spark attempt number above 0."""

    def __init__(self, marker_dir: str) -> None:
        super().__init__(marker_dir=marker_dir)

    def open(self, context: SubtaskContext, state: Any) -> None:
        super().open(context, state)
        assert self.marker_dir is not None
        name = f"open-{context.subtask}-{context.epoch}-{context.spark_attempt}"
        with open(os.path.join(self.marker_dir, name), "w"):
            pass


def test_a_flood_of_idle_connections_during_a_query_fails_no_task_and_restarts_nothing(
        spark, tmp_path) -> None:
    markers = str(tmp_path / "markers")
    os.makedirs(markers)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"), checkpoint_interval_s=0.5)
    coordinator = functools.partial(WorkQueue, costs=[0.05] * N)
    df = job.source(functools.partial(MarkingWorker, markers), coordinator, 4, SCHEMA,
                    name="queue")
    out = str(tmp_path / "out")
    channel_file = os.path.join(job.coordination_url("queue"), "channel.json")
    # 200 connections held open by another process, each reopened as soon as the server
    # closes it, from before the first batch (it waits for the run's channel.json) to the end
    attacker = subprocess.Popen([sys.executable, "-c", FLOOD, channel_file, "200", "reopen"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert attacker.stdin is not None and attacker.stdout is not None
    ready_at: list[float] = []  # wall time, as the markers' mtime

    def await_ready() -> None:
        assert attacker.stdout is not None
        if attacker.stdout.readline().startswith("ready"):
            ready_at.append(time.time())

    threading.Thread(target=await_ready, daemon=True).start()

    def epochs_opened_under_attack() -> set[int]:
        if not ready_at:
            return set()
        return {int(path.rsplit("-", 2)[1]) for path in glob.glob(f"{markers}/open-*")
                if os.stat(path).st_mtime > ready_at[0]}

    def done() -> bool:
        return (len(epochs_opened_under_attack()) >= BATCHES_UNDER_ATTACK
                and len(sink_rows(spark, out)) >= N)

    failures: list[str] = []
    writer = (df.writeStream.format("parquet").option("path", out)
              .trigger(processingTime="0 seconds"))
    try:
        report = job.run(writer, until=done, poll_s=0.3, timeout_s=240,
                         on_failure=failures.append)
    finally:
        out_text, _ = attacker.communicate(timeout=30)  # closes its stdin: it stops
    attack = out_text.strip().splitlines()[-1]
    assert '"closed": 0' not in attack, attack  # the server was shedding the flood
    assert failures == [] and report.failures == [] and report.restarts == 0
    attempts = {path.rsplit("-", 1)[1] for path in glob.glob(f"{markers}/open-*")}
    assert attempts == {"0"}, sorted(glob.glob(f"{markers}/open-*"))  # no task retried
    items = Counter(r.item for r in sink_rows(spark, out))
    assert sorted(items) == list(range(N)) and set(items.values()) == {1}
