"""A job failure in the middle of a batch is told in a few lines, not a traceback per task
attempt (issue 14 item 5, decision 44): the job runner stops the query as soon as the job
failed, the refused tasks wait for it and are cancelled (one TaskKilled line each, no retry);
a query nobody stops fails its refused tasks with one line each. Spark's log is the stderr of
a driver program in its own process (tests/spark/failover_log_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.spark.test_driver_kill import REPO

pytestmark = [pytest.mark.spark, pytest.mark.own_processes]


def test_a_mid_batch_job_failure_cancels_the_tasks_quietly_and_loses_nothing(tmp_path) -> None:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, str(REPO / "tests" / "spark" / "failover_log_job.py"),
                           str(tmp_path)], cwd=tmp_path, env=env, timeout=400,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    managed, unmanaged = done.stderr.split("=== unmanaged ===\n")

    # the managed job: restarted once, every item exactly once
    assert summary["restarts"] == 1, summary
    assert summary["failures"] == ["coordinator 'coordinated' called fail_job: injected "
                                   "failure before item 20"], summary
    assert summary["rows"] == summary["distinct"] == 60, summary
    # ... and its log: the failure, the restart, a cancelled task in one line each; not one
    # traceback, refusal or task retry (before: a traceback per attempt, 4 attempts per task)
    lines = managed.splitlines()
    assert any("ERROR sparkcoord.runtime.service: global failure: coordinator 'coordinated' "
               "called fail_job" in line for line in lines), managed[-3000:]
    assert sum("query failed, restarting" in line for line in lines) == 1, managed[-3000:]
    first = managed.find("Traceback")
    python_part = "\n".join(line for line in managed[first:].splitlines()[:40]
                            if not line.startswith("\tat "))
    assert first < 0, python_part
    lost = [line for line in lines if "Lost task" in line]
    assert lost and all("TaskKilled" in line for line in lost), "\n".join(lost)
    assert "ChannelRejected" not in managed and "ERROR Executor" not in managed, managed[-6000:]

    # the unmanaged query: its tasks waited 1 s, then failed in one line each (Spark retried
    # them, refused again at once), and the query failed with that line
    error = summary["unmanaged_error"]
    assert error is not None and "sparkcoord.channel.client.ChannelRejected: " in error, error
    assert "the job failed: coordinator 'coordinated' called fail_job" in error, error
    assert "(nothing cancelled this task: " in unmanaged, unmanaged[-6000:]
    # one frame per refused attempt, the task's entry point: no frame of the channel client,
    # of the operator, or of PySpark (whose own frames show when no other frame is left)
    for noise in ("sparkcoord/channel/client.py", "workqueue.py", "pyspark/worker.py"):
        assert noise not in error and noise not in unmanaged, unmanaged[-6000:]
    assert unmanaged.count("ChannelRejected: ") == unmanaged.count(
        "sparkcoord/spark/subtask.py"), unmanaged[-6000:]
