"""Helpers for the Spark tests: run a numbers job until its sink holds what it should."""

from __future__ import annotations

import functools
import os
import pickle
from typing import Any

from sparkcoord.core.ids import SubtaskId
from sparkcoord.examples.numbers import SCHEMA, NumberCollector, NumbersCoordinator
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.spark import CoordinatedJob


def sink_rows(spark: Any, path: str) -> list[Any]:
    if not os.path.exists(os.path.join(path, "_spark_metadata")):
        return []
    try:
        return spark.read.parquet(path).collect()
    except Exception:  # noqa: BLE001 - nothing committed yet
        return []


def values_by_subtask(rows: list[Any]) -> dict[tuple[str, int], list[int]]:
    """Each subtask's values in the order it received them (by the position it recorded)."""
    out: dict[tuple[str, int], list[int]] = {}
    for r in sorted(rows, key=lambda r: (r.operator, r.subtask, r.position, r.epoch)):
        out.setdefault((r.operator, r.subtask), []).append(r.value)
    return out


def numbers_job(spark: Any, root: str, *, total: int, parallelism: int = 2,
                fail_job_at: int | None = None, fail_task_at: int | None = None,
                fail_times: int = 1, name: str = "numbers", **job_options: Any) -> tuple[CoordinatedJob, Any]:
    markers = os.path.join(root, "markers")
    job = CoordinatedJob(spark, os.path.join(root, "ckpt"), **job_options)
    coordinator = functools.partial(NumbersCoordinator, total=total, per_tick=3, interval_s=0.02,
                                    fail_job_at=fail_job_at, marker_dir=markers)
    operator = functools.partial(NumberCollector, fail_task_at=fail_task_at, marker_dir=markers,
                                 fail_times=fail_times)
    df = job.source(operator, coordinator, parallelism, SCHEMA, name=name)
    return job, df


def run_until_rows(spark: Any, job: CoordinatedJob, df: Any, out: str, expected: int,
                   **run_options: Any) -> Any:
    writer = (df.writeStream.format("parquet").option("path", out)
              .trigger(processingTime="0 seconds"))
    return job.run(writer, until=lambda: len(sink_rows(spark, out)) >= expected, poll_s=0.5,
                   timeout_s=240, **run_options)


def latest_state(job: CoordinatedJob, source: str, operator: str, subtask: int) -> Any:
    storage = CheckpointStorage(job.coordination_url(source))
    found = storage.read_subtask_state(SubtaskId(operator, subtask), 1 << 62)
    return pickle.loads(found[1]) if found else None


def checkpointed_reports(job: CoordinatedJob, source: str = "numbers",
                         operator: str = "numbers", parallelism: int = 2) -> list[list[int]]:
    """The numbers each subtask reported, as the newest checkpointed coordinator state holds them."""
    try:
        snap = latest_snapshot(job, source, operator)
    except (ValueError, FileNotFoundError):
        return [[] for _ in range(parallelism)]
    return [[v for _, v in snap["reports"][s]] for s in range(parallelism)]


def latest_snapshot(job: CoordinatedJob, source: str, operator: str) -> Any:
    storage = CheckpointStorage(job.coordination_url(source))
    epochs = storage.record_epochs()
    if not epochs:
        raise FileNotFoundError(f"no checkpoint record under {storage.root}")
    return pickle.loads(storage.read_record(epochs[-1]).snapshots[operator])
