"""Watermark alignment: two directories of a backlog whose event times advance at 1x and 20x,
read by one file source into a windowed aggregation with a watermark (``noop`` sink, update
mode, ``availableNow``), aligned against unaligned in the same run.

- state: the aggregation's state rows (``stateOperators.numRowsTotal``, the largest over the
  run). Aligned, the watermark delay needs only max drift + one file's event-time span to lose
  no row; unaligned, it needs the whole spread (the fast directory runs ahead), so the
  unaligned run uses a delay that covers everything, as a user without alignment must.
- batch time: median ``triggerExecution`` of the runs' batches.
- cost when already aligned: both directories at 1x, no aggregation, alignment on vs off:
  the time of all triggers, rounds alternating after a warm-up (target <= 1.05x).

    python bench/run.py --only alignment
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from bench.common import figure

ROWS = 2_000
SLOW_STEP_MS = 10


def write_lane(directory: str, lane: str, files: int, step_ms: int) -> None:
    os.makedirs(directory, exist_ok=True)
    for f in range(files):
        tmp = os.path.join(directory, f".tmp-{f}")
        with open(tmp, "w") as out:
            for r in range(ROWS):
                i = f * ROWS + r
                out.write(json.dumps({"id": i, "lane": lane, "ts": i * step_ms}) + "\n")
        os.rename(tmp, os.path.join(directory, f"part-{f:04d}.json"))


def one_run(spark: Any, root: str, data: str, aligned: bool, *, aggregate: bool,
            delay_s: int, drift_s: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
    options = {"recursiveFileLookup": "true", "maxFilesPerTrigger": "2", "parallelism": "2",
               "bounded": "true"}
    if aligned:
        options.update(maxDrift=f"{drift_s}s", eventTimeColumn="ts", idleTimeout="5s")
    df = (FileStream(job).format("json").schema("id long, lane string, ts long")
          .options(**options).load(data))
    if aggregate:
        df = (df.withColumn("event_time", F.timestamp_millis("ts"))
              .withWatermark("event_time", f"{delay_s} seconds")
              .groupBy(F.window("event_time", "20 seconds"), "lane").count())
    t0 = time.perf_counter()
    handle = job.start(df.writeStream.outputMode("update").format("noop")
                       .trigger(availableNow=True), timeout_s=900)
    handle.await_termination()
    elapsed = time.perf_counter() - t0
    progress = list(handle.query.recentProgress)
    rows = sum(p.numInputRows for p in progress)
    state = [p.stateOperators[0].numRowsTotal for p in progress if p.stateOperators]
    batches = [p.durationMs.get("triggerExecution", 0) for p in progress if p.numInputRows]
    return {"rows": rows, "max_state_rows": max(state) if state else 0,
            "batch_ms": statistics.median(batches) if batches else 0.0,
            "triggers_s": sum(p.durationMs.get("triggerExecution", 0) for p in progress) / 1e3,
            "batches": len(batches), "elapsed_s": elapsed}


def run(preset: str, spark: Any) -> dict[str, Any]:
    files = 12 if preset == "full" else 8
    # the cost figure compares two ~2 s runs: rounds alternate, and enough of them that the
    # median is not one noisy run (the full preset's first reference run, 3 rounds, spread
    # 2.06-2.25 s on one side)
    rounds = 7 if preset == "full" else 5
    drift_s = 60
    fast_step_ms = 20 * SLOW_STEP_MS
    root = tempfile.mkdtemp(prefix="bench-alignment-")
    try:
        skewed = os.path.join(root, "skewed")
        write_lane(os.path.join(skewed, "fast"), "fast", files, fast_step_ms)
        write_lane(os.path.join(skewed, "slow"), "slow", files, SLOW_STEP_MS)
        total = 2 * files * ROWS
        # the delay that loses no row: aligned, max drift + one file's span + a margin;
        # unaligned, the whole event-time range of the fast directory
        file_span_s = ROWS * fast_step_ms // 1000
        aligned = one_run(spark, os.path.join(root, "a"), skewed, True, aggregate=True,
                          delay_s=drift_s + 2 * file_span_s, drift_s=drift_s)
        unaligned = one_run(spark, os.path.join(root, "u"), skewed, False, aggregate=True,
                            delay_s=files * file_span_s + 60, drift_s=drift_s)
        for name, r in (("aligned", aligned), ("unaligned", unaligned)):
            assert r["rows"] == total, f"{name} read {r['rows']} of {total} rows"
        even = os.path.join(root, "even")
        write_lane(os.path.join(even, "a"), "a", files, SLOW_STEP_MS)
        write_lane(os.path.join(even, "b"), "b", files, SLOW_STEP_MS)
        cost: dict[str, list[float]] = {"on": [], "off": []}
        batch_counts: dict[str, list[int]] = {"on": [], "off": []}
        for r in range(rounds + 1):  # round 0 warms up and is dropped
            for side in ("off", "on"):
                result = one_run(spark, os.path.join(root, f"even-{side}-{r}"), even,
                                 side == "on", aggregate=False, delay_s=0, drift_s=drift_s)
                assert result["rows"] == total
                if r:
                    cost[side].append(result["triggers_s"])
                    batch_counts[side].append(result["batches"])
        on, off = statistics.median(cost["on"]), statistics.median(cost["off"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    state_ratio = aligned["max_state_rows"] / max(unaligned["max_state_rows"], 1)
    figures = [
        figure("alignment", "aggregation state rows (largest), aligned vs unaligned at 1x/20x",
               aligned["max_state_rows"], "rows", unaligned["max_state_rows"]),
        figure("alignment", "median batch time, aligned vs unaligned at 1x/20x",
               aligned["batch_ms"], "ms", unaligned["batch_ms"]),
        figure("alignment", "all triggers when already aligned (1x/1x), alignment on vs off",
               on, "s", off, "<= 1.05x", on <= 1.05 * off),
    ]
    notes = [
        f"- 1x/20x backlog, {total:,} rows in {2 * files} files, maxFilesPerTrigger 2: aligned "
        f"{aligned['max_state_rows']} state rows at most (watermark delay "
        f"{drift_s + 2 * file_span_s} s), {aligned['batches']} batches of "
        f"{aligned['batch_ms']:.0f} ms, {aligned['elapsed_s']:.1f} s in all; unaligned "
        f"{unaligned['max_state_rows']} state rows (delay {files * file_span_s + 60} s, the "
        f"least that loses no row), {unaligned['batches']} batches of "
        f"{unaligned['batch_ms']:.0f} ms, {unaligned['elapsed_s']:.1f} s "
        f"(state ratio {state_ratio:.2f})",
        f"- already aligned (1x/1x): triggers {on:.2f} s with alignment, {off:.2f} s without "
        f"({on / off:.3f}x; rounds on {[round(x, 2) for x in cost['on']]}, off "
        f"{[round(x, 2) for x in cost['off']]}; batches with data on {batch_counts['on']}, "
        f"off {batch_counts['off']})",
    ]
    return {"figures": figures, "raw": {"aligned": aligned, "unaligned": unaligned,
                                        "cost": cost}, "notes": notes}
