"""Recovery: how long a failure costs, from the failure to the next committed batch.

1. A task fails (a Spark task retry inside the batch; the coordinator is reset or told, the
   retried task re-registers): from the instant the operator raised to the commit of the
   batch it was in. Baseline: the median interval between commits away from the failure.
2. A coordinator calls ``fail_job`` (global failover: the query fails, CoordinatedJob.run
   restarts it from its checkpoint after the restart strategy's delay, here 0.5 s): from
   ``fail_job`` to the first batch committed by the restarted query (a batch that was already
   running may still commit after ``fail_job``; it does not count). Baseline: a fresh query's
   time from ``start()`` to its first committed batch, in the same run.
Instants come from marker files written at the failure (sparkcoord.examples.numbers) and the
modification times of Spark's commit log files.
"""

from __future__ import annotations

import functools
import os
import statistics
import tempfile
import time
from typing import Any

from bench.common import figure


def _commit_times(job: Any) -> list[float]:
    commits = os.path.join(job.spark_checkpoint, "commits")
    if not os.path.isdir(commits):
        return []
    return sorted(os.path.getmtime(os.path.join(commits, n)) for n in os.listdir(commits) if n.isdigit())


def _one(spark: Any, root: str, failure: str) -> dict[str, float]:
    from sparkcoord.examples.numbers import SCHEMA, NumberCollector, NumbersCoordinator
    from sparkcoord.runtime.restart import FixedDelay
    from sparkcoord.spark import CoordinatedJob

    markers = os.path.join(root, "markers")
    job = CoordinatedJob(spark, os.path.join(root, "ckpt"), checkpoint_interval_s=0.2)
    coordinator = functools.partial(NumbersCoordinator, total=10**6, per_tick=2, interval_s=0.05,
                                    fail_job_at=30 if failure == "fail_job" else None,
                                    marker_dir=markers)
    operator = functools.partial(NumberCollector, fail_task_at=30 if failure == "task" else None,
                                 marker_dir=markers, report=True)
    df = job.source(operator, coordinator, 2, SCHEMA, name="numbers")
    marker = os.path.join(markers, "fail_task-numbers-0" if failure == "task" else "fail_job-numbers")

    # A batch already running when fail_job is called may still commit (the query fails at
    # its next driver call): only commits after the driver saw the failure are the restart's.
    query_failed_at: list[float] = []

    def counted_from() -> float | None:
        if not os.path.exists(marker):
            return None
        if failure == "fail_job":
            return query_failed_at[0] if query_failed_at else None
        return os.path.getmtime(marker)

    def recovered() -> bool:
        since = counted_from()
        return since is not None and len([t for t in _commit_times(job) if t > since]) >= 2

    started = time.time()
    job.run(df.writeStream.format("noop").trigger(processingTime="0 seconds"),
            restart=FixedDelay(attempts=2, delay_s=0.5), until=recovered, poll_s=0.1, timeout_s=300,
            on_failure=lambda _: query_failed_at.append(time.time()))
    failed_at = os.path.getmtime(marker)
    since = counted_from()
    assert since is not None
    commits = _commit_times(job)
    before = [t for t in commits if t <= failed_at]
    after = [t for t in commits if t > since]
    # commit intervals away from the failure: before it, and after the recovery's first commit
    intervals = [b - a for seq in (before, after) for a, b in zip(seq, seq[1:], strict=False)]
    return {"recovery_s": after[0] - failed_at,
            "batch_interval_s": statistics.median(intervals) if intervals else float("nan"),
            "first_commit_s": commits[0] - started}


def run(preset: str, spark: Any) -> dict[str, Any]:
    reps = 1 if preset == "quick" else 3
    got: dict[str, list[dict[str, float]]] = {"task": [], "fail_job": []}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        for i in range(reps):
            for failure in got:
                got[failure].append(_one(spark, os.path.join(tmp, f"{failure}-{i}"), failure))
    task = statistics.median(r["recovery_s"] for r in got["task"])
    task_base = statistics.median(r["batch_interval_s"] for r in got["task"])
    job = statistics.median(r["recovery_s"] for r in got["fail_job"])
    fresh = statistics.median(r["first_commit_s"] for r in got["fail_job"] + got["task"])
    figures = [
        figure("recovery", "task failure -> its batch committed", task * 1e3, "ms", task_base * 1e3),
        figure("recovery", "fail_job -> first batch committed after the restart", job * 1e3, "ms",
               fresh * 1e3),
    ]
    notes = [f"- {reps} run(s) each; baselines: median interval between commits away from the task "
             f"failure ({task_base * 1e3:.0f} ms), a fresh query's start to its first commit "
             f"({fresh * 1e3:.0f} ms); the restart includes the restart strategy's 0.5 s delay"]
    return {"figures": figures, "raw": got, "notes": notes}
