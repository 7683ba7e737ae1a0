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
from tests.spark.files_kill_job import failing_enumerator, failing_reader

pytestmark = pytest.mark.spark

FILES, ROWS = 16, 40
SLOW_STEP_MS, FAST_STEP_MS = 250, 5_000  # a file spans 10 s of event time, or 200 s (20x)
DRIFT_S = 60
WINDOW_S, ALIGNED_DELAY_S = 20, 300


def write_lane(directory: str, lane: str, step_ms: int) -> None:
    os.makedirs(directory, exist_ok=True)
    for f in range(FILES):
        with open(os.path.join(directory, f".tmp-{f}"), "w") as out:
            for r in range(ROWS):
                i = f * ROWS + r
                out.write(json.dumps({"id": i, "lane": lane, "ts": i * step_ms}) + "\n")
        os.rename(os.path.join(directory, f".tmp-{f}"),
                  os.path.join(directory, f"part-{f:04d}.json"))


def run(spark: Any, root: str, aligned: bool, delay: str, fail_at: int | None = None,
        parallelism: int = 2, *, task_fails_in: str | None = None, bounded: bool = True,
        files_per_trigger: int = 2, batch_rows: int | None = None) -> dict[str, Any]:
    """An availableNow run of the two directories into a windowed count per lane (the
    driver program's thread). ``fail_at``: the enumerator fails the job once as it hands out
    split number ``fail_at``; ``task_fails_in``: a reader's task raises once in the middle of
    the first split whose id contains it. Also run by ``scripts/soak.py --scenario aligned``."""
    from pyspark.sql import functions as F

    data = os.path.join(root, "data")
    write_lane(os.path.join(data, "fast"), "fast", FAST_STEP_MS)  # listed first: "fast" < "slow"
    write_lane(os.path.join(data, "slow"), "slow", SLOW_STEP_MS)
    job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
    options = {"recursiveFileLookup": "true", "maxFilesPerTrigger": str(files_per_trigger),
               "parallelism": str(parallelism)}
    if bounded:
        options["bounded"] = "true"
    if batch_rows is not None:
        options["batchRows"] = str(batch_rows)
    if aligned:
        options.update(maxDrift=f"{DRIFT_S}s", eventTimeColumn="ts", idleTimeout="5s")
    spec, struct = (FileStream(job).format("json").schema("id long, lane string, ts long")
                    .options(**options).operator_spec(data))
    markers = os.path.join(root, "markers")
    if fail_at is not None:  # the enumerator fails the job once, while handing out splits
        spec = dataclasses.replace(spec, coordinator=functools.partial(
            failing_enumerator, marker_dir=markers, at=fail_at, **spec.coordinator.keywords))
    if task_fails_in is not None:
        spec = dataclasses.replace(spec, operator=functools.partial(
            failing_reader, *spec.operator.args, marker_dir=markers, at=0,
            needle=task_fails_in, **spec.operator.keywords))
    df = job.sources([spec], struct, name="files")
    counts = (df.withColumn("event_time", F.timestamp_millis("ts"))
              .withWatermark("event_time", delay)
              .groupBy(F.window("event_time", f"{WINDOW_S} seconds"), "lane")
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
            "batches": len(progress), "restarts": handle.restarts,
            "injected": sorted(os.listdir(markers)) if os.path.isdir(markers) else []}


def test_aligned_directories_stay_within_max_drift_and_keep_the_state_small(
        spark, tmp_path) -> None:
    one_file_ms = ROWS * FAST_STEP_MS
    # a delay of max drift + one file (a record batch) + a trigger's progress loses nothing;
    # the job fails once in the middle (a restart from the checkpoint keeps the pauses)
    aligned = run(spark, str(tmp_path / "aligned"), aligned=True,
                  delay=f"{ALIGNED_DELAY_S} seconds", fail_at=7)
    print("aligned", aligned)
    assert aligned["restarts"] == 1, aligned
    # no row lost (a late row is dropped by the watermark) or duplicated
    assert aligned["by_lane"] == {"fast": FILES * ROWS, "slow": FILES * ROWS}, aligned
    assert aligned["spreads"], aligned
    assert max(aligned["spreads"]) <= DRIFT_S * 1000 + one_file_ms, aligned

    # unaligned, only a delay as long as the fast directory's whole backlog loses nothing
    unaligned = run(spark, str(tmp_path / "unaligned"), aligned=False,
                    delay=f"{(FILES + 1) * one_file_ms // 1000} seconds")
    print("unaligned", unaligned)
    assert unaligned["by_lane"] == {"fast": FILES * ROWS, "slow": FILES * ROWS}, unaligned
    assert max(unaligned["spreads"]) > 3 * (DRIFT_S * 1000 + one_file_ms), unaligned
    # the aggregation keeps a window per lane and 20 s until the watermark (the greatest
    # event time read - the delay) passes it. Aligned, the fast lane is at most the delay and
    # one batch (two files) past the watermark and the slow lane within max drift and a file
    # of it: bounded, whatever the backlog. Unaligned, the fast lane's whole backlog is held.
    slow_span_s = FILES * ROWS * SLOW_STEP_MS / 1000
    bound = (ALIGNED_DELAY_S + 2 * one_file_ms / 1000) / WINDOW_S + slow_span_s / WINDOW_S + 2
    assert max(aligned["state_rows"]) <= bound, (bound, aligned)
    assert max(unaligned["state_rows"]) >= FILES * one_file_ms / 1000 / WINDOW_S, unaligned
    assert max(unaligned["state_rows"]) > 2 * bound, (bound, unaligned)

def test_three_readers_keep_the_spread_within_max_drift_plus_one_file_across_restarts(
        spark, tmp_path) -> None:
    # issue 24 item 3: in the first batch after a restart every reader took the fast
    # directory's next file before any reported (714 s against 420 s). A lane held back by
    # another now has one file in flight at a time, so the bound holds with any number of
    # readers; the job fails over once, in the middle of the hand-out
    one_file_ms = ROWS * FAST_STEP_MS
    result = run(spark, str(tmp_path / "three"), aligned=True,
                 delay=f"{ALIGNED_DELAY_S} seconds", fail_at=5, parallelism=3)
    print("three readers", result)
    assert result["restarts"] == 1, result
    assert result["by_lane"] == {"fast": FILES * ROWS, "slow": FILES * ROWS}, result
    assert result["spreads"], result
    assert max(result["spreads"]) <= DRIFT_S * 1000 + one_file_ms, result


def test_an_available_now_run_of_one_aligned_directory_reads_every_file(spark, tmp_path) -> None:
    # issue 24 item 2b: one flat directory (a single lane), three files of 20,000 rows and
    # 300 s of event time each, max drift 2 minutes, two files per trigger, two readers. The
    # run ended after two batches with 54,717 rows: the lane was held at its own watermark +
    # max drift inside a batch, and nothing asked for the batch that would resume it (record
    # batches of 1,000 rows, 15 s: a file is checked 20 times, so the lane can pause inside it)
    data = str(tmp_path / "data")
    os.makedirs(data)
    rows, step_ms = 20_000, 15  # 300 s per file
    for f in range(3):
        with open(os.path.join(data, f".tmp-{f}"), "w") as out:
            out.writelines(json.dumps({"id": i, "lane": "one", "ts": i * step_ms}) + "\n"
                           for i in range(f * rows, (f + 1) * rows))
        os.rename(os.path.join(data, f".tmp-{f}"), os.path.join(data, f"part-{f}.json"))
    got, report = read_all(spark, str(tmp_path), data,
                           {"maxDrift": "2 minutes", "maxFilesPerTrigger": "2",
                            "parallelism": "2", "batchRows": "1000"}, 3 * rows, bounded=True)
    assert (got, report.failures) == (3 * rows, []), (got, report)


def test_an_available_now_run_of_a_continuous_aligned_source_reads_every_file(
        spark, tmp_path) -> None:
    # a continuous source (no ``bounded``) in an availableNow run: the fast directory paused
    # behind the slow one kept its split and pending files when the run ended, and a
    # directory with nothing left held the minimum until an idle timeout (none set here).
    # It is bounded for the run now (decision 53): it lists as the run starts and reads all
    data = str(tmp_path / "data")
    write_lane(os.path.join(data, "fast"), "fast", FAST_STEP_MS)
    write_lane(os.path.join(data, "slow"), "slow", SLOW_STEP_MS)
    got, report = read_all(spark, str(tmp_path), data,
                           {"maxDrift": f"{DRIFT_S}s", "maxFilesPerTrigger": "2",
                            "parallelism": "2"}, 2 * FILES * ROWS, bounded=False,
                           available_now=True)
    assert (got, report.failures) == (2 * FILES * ROWS, []), (got, report)


def read_all(spark: Any, root: str, data: str, options: dict[str, str], expected: int,
             bounded: bool, write_later: Any = None,
             available_now: bool | None = None) -> tuple[int, Any]:
    """Run an aligned file source into a parquet sink until it holds ``expected`` rows (or,
    in an availableNow run, the default when bounded, until the run ends); the rows and the
    job's report."""
    available_now = bounded if available_now is None else available_now
    from tests.spark.helpers import sink_rows

    job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
    out = os.path.join(root, "out")
    df = (FileStream(job).format("json").schema("id long, lane string, ts long")
          .options(recursiveFileLookup="true", eventTimeColumn="ts", **options,
                   **({"bounded": "true"} if bounded else {})).load(data))
    writer = df.writeStream.format("parquet").option("path", out)
    if available_now:
        report = job.run(writer.trigger(availableNow=True), timeout_s=240)
    else:
        def until() -> bool:
            if write_later is not None:
                write_later(len(sink_rows(spark, out)))
            return len(sink_rows(spark, out)) >= expected
        report = job.run(writer.trigger(processingTime="0 seconds"), until=until,
                         timeout_s=240)
    ids = sorted((r.lane, r.id) for r in sink_rows(spark, out))
    return len(set(ids)) if len(ids) == len(set(ids)) else -len(ids), report


@pytest.mark.parametrize("case", ["readers without a split", "a single split"])
def test_an_aligned_source_with_idle_readers_or_one_split_reads_everything_and_ends(
        spark, tmp_path, case) -> None:
    # FLINK-32414 (a subtask with no split hung the group) and FLINK-36751 (one split
    # paused itself): four readers for two files, or one reader of one file
    data = str(tmp_path / "data")
    write_lane(os.path.join(data, "a"), "a", SLOW_STEP_MS)
    parallelism = "4"
    if case == "a single split":
        parallelism = "1"
    else:
        write_lane(os.path.join(data, "b"), "b", FAST_STEP_MS)
    expected = FILES * ROWS * (1 if case == "a single split" else 2)
    got, report = read_all(spark, str(tmp_path), data,
                           {"maxDrift": "10s", "parallelism": parallelism}, expected,
                           bounded=True)
    assert (got, report.failures) == (expected, []), (got, report)


def test_a_paused_directory_resumes_when_the_slow_one_goes_idle_and_a_late_file_still_reads(
        spark, tmp_path) -> None:
    # FLINK-32496 (alignment with idleness never resumed) and FLINK-40093 (a paused split that
    # went idle was not resumed): a continuous source; the slow directory has one file and
    # then nothing, so the fast one (200 s of event time per file, far past max drift) waits
    # until the slow one is idle; once everything is read a late file arrives in the slow
    # directory (far behind: it holds the minimum again) and is read too
    data = str(tmp_path / "data")
    os.makedirs(os.path.join(data, "slow"))
    with open(os.path.join(data, "slow", "part-0000.json"), "w") as f:
        f.writelines(json.dumps({"id": i, "lane": "slow", "ts": i * 250}) + "\n"
                     for i in range(ROWS))
    write_lane(os.path.join(data, "fast"), "fast", FAST_STEP_MS)
    before = ROWS + FILES * ROWS
    late: list[int] = []

    def write_later(rows: int) -> None:
        if rows >= before and not late:
            with open(os.path.join(data, "slow", ".tmp"), "w") as f:
                f.writelines(json.dumps({"id": ROWS + i, "lane": "slow", "ts": 20_000 + i})
                             + "\n" for i in range(ROWS))
            os.rename(os.path.join(data, "slow", ".tmp"),
                      os.path.join(data, "slow", "part-0001.json"))
            late.append(rows)

    got, report = read_all(spark, str(tmp_path), data,
                           {"maxDrift": "30s", "idleTimeout": "2s", "parallelism": "2",
                            "maxFilesPerTrigger": "2", "discoveryInterval": "200ms",
                            "alignmentUpdateInterval": "500ms"},
                           before + ROWS, bounded=False, write_later=write_later)
    assert late and (got, report.failures) == (before + ROWS, []), (got, report, late)
