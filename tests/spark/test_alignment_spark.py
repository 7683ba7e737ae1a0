"""Watermark alignment on real Spark (issue 15 item 3): a backlog of two directories whose event
times advance at 1x and 20x, read by one file source into a windowed aggregation with a
watermark. Aligned, the event-time spread between the directories stays within max drift plus
one file, the aggregation's state stays small and a small watermark delay loses no row;
unaligned, the fast directory runs ahead and the state grows (with a delay large enough to
lose nothing). The aligned run fails over once in the middle and ends exactly-once, its
pauses as consistent after the restart as before."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

import pytest

from sparkcoord.sources import FileStream
from sparkcoord.spark import CoordinatedJob
from tests.spark.files_kill_job import failing_enumerator

pytestmark = pytest.mark.spark

FILES, ROWS = 10, 40
SLOW_STEP_MS, FAST_STEP_MS = 250, 5_000  # a file spans 10 s of event time, or 200 s (20x)
DRIFT_S = 60


def write_lane(directory: str, lane: str, step_ms: int) -> None:
    os.makedirs(directory, exist_ok=True)
    for f in range(FILES):
        with open(os.path.join(directory, f".tmp-{f}"), "w") as out:
            for r in range(ROWS):
                i = f * ROWS + r
                out.write(json.dumps({"id": i, "lane": lane, "ts": i * step_ms}) + "\n")
        os.rename(os.path.join(directory, f".tmp-{f}"),
                  os.path.join(directory, f"part-{f:04d}.json"))


def run(spark: Any, root: str, aligned: bool, delay: str, fail_at: int | None = None
        ) -> dict[str, Any]:
    from pyspark.sql import functions as F

    data = os.path.join(root, "data")
    write_lane(os.path.join(data, "fast"), "fast", FAST_STEP_MS)  # listed first: "fast" < "slow"
    write_lane(os.path.join(data, "slow"), "slow", SLOW_STEP_MS)
    job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
    options = {"recursiveFileLookup": "true", "maxFilesPerTrigger": "2", "parallelism": "2",
               "bounded": "true"}
    if aligned:
        options.update(maxDrift=f"{DRIFT_S}s", eventTimeColumn="ts", idleTimeout="5s")
    spec, struct = (FileStream(job).format("json").schema("id long, lane string, ts long")
                    .options(**options).operator_spec(data))
    if fail_at is not None:  # the enumerator fails the job once, while handing out splits
        spec = dataclasses.replace(spec, coordinator=functools.partial(
            failing_enumerator, marker_dir=os.path.join(root, "markers"), at=fail_at,
            **spec.coordinator.keywords))
    df = job.sources([spec], struct, name="files")
    counts = (df.withColumn("event_time", F.timestamp_millis("ts"))
              .withWatermark("event_time", delay)
              .groupBy(F.window("event_time", "20 seconds"), "lane")
              .agg(F.count("*").alias("rows"), F.max("ts").alias("latest")))
    windows: dict[tuple[Any, str], int] = {}
    latest: dict[str, int] = {}
    spreads: list[int] = []

    def each_batch(batch: Any, batch_id: int) -> None:  # the driver program, per batch
        for row in batch.collect():
            windows[(row.window.start, row.lane)] = row.rows  # update mode: the new count
            latest[row.lane] = max(latest.get(row.lane, 0), row.latest)
        if len(latest) == 2 and latest["slow"] < (FILES * ROWS - 1) * SLOW_STEP_MS:
            spreads.append(latest["fast"] - latest["slow"])  # while both lanes have data

    handle = job.start(counts.writeStream.outputMode("update").foreachBatch(each_batch)
                       .trigger(availableNow=True), timeout_s=300)
    handle.await_termination()
    progress = list(handle.query.recentProgress)
    state_rows = [p.stateOperators[0].numRowsTotal for p in progress if p.stateOperators]
    by_lane = {lane: sum(c for (_, w_lane), c in windows.items() if w_lane == lane)
               for lane in ("fast", "slow")}
    return {"by_lane": by_lane, "spreads": spreads, "state_rows": state_rows,
            "batches": len(progress), "restarts": handle.restarts}


def test_aligned_directories_stay_within_max_drift_and_keep_the_state_small(
        spark, tmp_path) -> None:
    one_file_ms = ROWS * FAST_STEP_MS
    # a delay of max drift + one file (a record batch) + a trigger's progress loses nothing;
    # the job fails once in the middle (a restart from the checkpoint keeps the pauses)
    aligned = run(spark, str(tmp_path / "aligned"), aligned=True, delay="300 seconds",
                  fail_at=7)
    print("aligned", aligned)
    assert aligned["restarts"] == 1, aligned
    # no row lost (a late row is dropped by the watermark) or duplicated
    assert aligned["by_lane"] == {"fast": FILES * ROWS, "slow": FILES * ROWS}, aligned
    assert aligned["spreads"], aligned
    assert max(aligned["spreads"]) <= DRIFT_S * 1000 + one_file_ms, aligned

    unaligned = run(spark, str(tmp_path / "unaligned"), aligned=False, delay="3000 seconds")
    print("unaligned", unaligned)
    assert unaligned["by_lane"] == {"fast": FILES * ROWS, "slow": FILES * ROWS}, unaligned
    assert max(unaligned["spreads"]) > 3 * (DRIFT_S * 1000 + one_file_ms), unaligned
    # the aggregation keeps a window per lane and 20 s until the watermark passes it
    assert max(aligned["state_rows"]) * 3 < max(unaligned["state_rows"]), (aligned, unaligned)
