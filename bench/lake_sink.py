"""The lake sink (issue 28) against Spark's own parquet file sink, on the same stream.

- throughput: an ``availableNow`` run of the file source over parquet files (quick: 1,000,000
  rows in 20 files; full: 2,000,000 in 40; five columns), start to end, written by Spark's
  parquet file sink (the baseline: ``writeStream.format("parquet")``) and by ``LakeSink`` into
  a Delta table and into an Iceberg table (pyiceberg's SQL catalog on sqlite), 2 files per
  trigger, the default ``parallelism``; each side's rows counted in what it wrote (not
  timed). Target: at least 0.9x the parquet sink's rate (cost ratio <= 1.11x).
- commit time per batch: a continuous run at one batch per second (``processingTime`` 1 s, one
  file of 10,000 rows per trigger) into Delta and into Iceberg; the sink's own commit times
  (``job.request("sink", "status")``: the table transaction and the cleanup after it) against
  the interval between batches. Target: <= 10% of it.
- compaction: an ``availableNow`` run of 100 small batches (one parquet file of 1,000 rows per
  trigger) into Delta and into Iceberg with ``compaction`` on and ``targetFileSize`` 64k, and
  the same into Delta with it off (the baseline). Target: the median size of the table's
  current data files with compaction on >= 50% of the target file size; the file counts and
  the run times with it on and off are reported beside it.

    python bench/run.py --only lake_sink
"""

from __future__ import annotations

import datetime
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from bench.common import figure
from bench.filesource import write_dataset

KINDS = ("delta", "iceberg")


def _catalog(root: str) -> dict[str, str]:
    return {"catalog.uri": f"sqlite:///{root}/catalog.db",
            "catalog.warehouse": f"file://{root}/warehouse"}


def _namespace(root: str) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    os.makedirs(root, exist_ok=True)  # the catalog's sqlite file goes there
    options = _catalog(root)
    SqlCatalog("default", uri=options["catalog.uri"],
               warehouse=options["catalog.warehouse"]).create_namespace_if_not_exists("lake")


def _rows_written(side: str, root: str) -> int:
    if side == "parquet":
        import pyarrow.dataset as ds

        return ds.dataset(os.path.join(root, "out"), format="parquet",
                          exclude_invalid_files=True).count_rows()
    if side == "delta":
        from deltalake import DeltaTable

        return DeltaTable(os.path.join(root, "delta")).to_pyarrow_dataset().count_rows()
    from pyiceberg.catalog.sql import SqlCatalog

    options = _catalog(root)
    catalog = SqlCatalog("default", uri=options["catalog.uri"],
                         warehouse=options["catalog.warehouse"])
    return catalog.load_table("lake.bench").scan().to_arrow().num_rows


def _sink(job: Any, side: str, root: str) -> Any:
    from sparkcoord.sinks import LakeSink

    sink = LakeSink(job).format(side)
    if side == "iceberg":
        _namespace(root)
        sink = sink.options(**_catalog(root))
    return sink


def _run(spark: Any, side: str, data: str, root: str) -> float:
    """One availableNow run of the file source into ``side``: seconds from start to end."""
    from bench.filesource import SCHEMA
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    t0 = time.perf_counter()
    job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
    df = (FileStream(job).format("parquet").schema(SCHEMA)
          .options(bounded="true", maxFilesPerTrigger="2").load(data))
    if side == "parquet":
        writer = df.writeStream.format("parquet").option("path", os.path.join(root, "out"))
    else:
        table = os.path.join(root, "delta") if side == "delta" else "lake.bench"
        writer = _sink(job, side, root).writer(df, table)
    report = job.run(writer.trigger(availableNow=True), timeout_s=900)
    elapsed = time.perf_counter() - t0
    assert report.failures == [], report.failures
    return elapsed


def throughput(spark: Any, files: int, rows: int, rounds: int) -> dict[str, Any]:
    top = tempfile.mkdtemp(prefix="bench-lake-")
    try:
        data = os.path.join(top, "data")
        written = write_dataset(data, "parquet", files, rows // files)
        times: dict[str, list[float]] = {side: [] for side in ("parquet", *KINDS)}
        for r in range(rounds + 1):  # round 0 warms up every side and is dropped
            for side in times:
                root = os.path.join(top, f"{side}-{r}")
                elapsed = _run(spark, side, data, root)
                got = _rows_written(side, root)
                assert got == written, f"{side} wrote {got} rows of {written}"
                if r:
                    times[side].append(elapsed)
                shutil.rmtree(root, ignore_errors=True)
        return {"rows": written, "files": files,
                **{f"{side}_s": statistics.median(t) for side, t in times.items()},
                **{f"{side}_all": [round(x, 2) for x in t] for side, t in times.items()}}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def commit_time(spark: Any, side: str, batches: int) -> dict[str, Any]:
    from bench.filesource import SCHEMA
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    top = tempfile.mkdtemp(prefix=f"bench-lake-commit-{side}-")
    try:
        data = os.path.join(top, "data")
        write_dataset(data, "parquet", batches + 2, 10_000)
        job = CoordinatedJob(spark, os.path.join(top, "ckpt"))
        df = (FileStream(job).format("parquet").schema(SCHEMA)
              .options(maxFilesPerTrigger="1").load(data))
        table = os.path.join(top, "delta") if side == "delta" else "lake.bench"
        writer = _sink(job, side, top).writer(df, table).trigger(processingTime="1 second")
        status: dict[str, Any] = {}

        def until() -> bool:
            status.update(job.request("sink", "status"))
            return int(status["commits"]) >= batches

        handle = job.start(writer, until=until, poll_s=0.5, timeout_s=600)
        handle.await_termination()
        stamps = sorted(datetime.datetime.fromisoformat(p.timestamp.replace("Z", "+00:00"))
                        for p in handle.recentProgress if p.numInputRows)
        intervals = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:], strict=False)]
        commits = list(status["commit_s"])[1:]  # the first opens the table: not steady state
        return {"commit_s": statistics.median(commits), "commit_p90_s": sorted(commits)[
            int(0.9 * (len(commits) - 1))], "interval_s": statistics.median(intervals),
            "commits": len(commits)}
    finally:
        shutil.rmtree(top, ignore_errors=True)


COMPACT_TARGET = 64 * 1024


def _current_sizes(side: str, root: str) -> list[int]:
    """The sizes of the table's current data files."""
    import pyarrow as pa

    if side == "delta":
        from deltalake import DeltaTable

        adds = pa.table(DeltaTable(os.path.join(root, "delta")).get_add_actions())
        return [int(x) for x in adds.column("size_bytes").to_pylist()]
    from pyiceberg.catalog.sql import SqlCatalog

    options = _catalog(root)
    catalog = SqlCatalog("default", uri=options["catalog.uri"],
                         warehouse=options["catalog.warehouse"])
    files = catalog.load_table("lake.bench").inspect.files()
    return [int(x) for x in files.column("file_size_in_bytes").to_pylist()]


def compaction(spark: Any, side: str, on: bool, batches: int) -> dict[str, Any]:
    """``batches`` small batches into ``side`` with compaction ``on`` or off: the current
    files' sizes, the rows and the run's time."""
    from bench.filesource import SCHEMA
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    top = tempfile.mkdtemp(prefix=f"bench-lake-compact-{side}-")
    try:
        data = os.path.join(top, "data")
        written = write_dataset(data, "parquet", batches, 1_000)
        t0 = time.perf_counter()
        job = CoordinatedJob(spark, os.path.join(top, "ckpt"))
        df = (FileStream(job).format("parquet").schema(SCHEMA)
              .options(bounded="true", maxFilesPerTrigger="1").load(data))
        table = os.path.join(top, "delta") if side == "delta" else "lake.bench"
        sink = _sink(job, side, top).options(targetFileSize=str(COMPACT_TARGET),
                                             compaction=on)
        report = job.run(sink.writer(df, table).trigger(availableNow=True), timeout_s=900)
        elapsed = time.perf_counter() - t0
        assert report.failures == [], report.failures
        got = _rows_written(side, top)
        assert got == written, f"{side} wrote {got} rows of {written}"
        sizes = sorted(_current_sizes(side, top))
        return {"files": len(sizes), "median_bytes": statistics.median(sizes),
                "seconds": elapsed, "rows": got}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def run(preset: str, spark: Any) -> dict[str, Any]:
    files, rows = (40, 2_000_000) if preset == "full" else (20, 1_000_000)
    rounds = 3 if preset == "full" else 2
    got = throughput(spark, files, rows, rounds)
    figures, notes = [], []
    base = got["parquet_s"]
    for side in KINDS:
        ours = got[f"{side}_s"]
        figures.append(figure("lake_sink", f"availableNow run into {side} vs Spark's parquet sink, "
                              f"{rows:,} rows", rows / ours, "rows/s", rows / base,
                              "<= 1.11x (at least 0.9x its rate)", ours <= base * 1.11))
    notes.append(f"- {rows:,} rows in {files} parquet files, start to end (medians of "
                 f"{rounds}): Spark's parquet sink {base:.1f} s {got['parquet_all']}, Delta "
                 f"{got['delta_s']:.1f} s {got['delta_all']}, Iceberg {got['iceberg_s']:.1f} s "
                 f"{got['iceberg_all']}")
    batches = 30 if preset == "full" else 15
    for side in KINDS:
        c = commit_time(spark, side, batches)
        figures.append(figure("lake_sink", f"{side} commit per batch at one batch per second",
                              c["commit_s"], "s", c["interval_s"], "<= 10% of the batch interval",
                              c["commit_s"] <= 0.1 * c["interval_s"]))
        notes.append(f"- {side}: commit median {c['commit_s'] * 1000:.0f} ms (p90 "
                     f"{c['commit_p90_s'] * 1000:.0f} ms) over {c['commits']} commits of one "
                     f"10,000-row file each; batches every {c['interval_s']:.2f} s (median)")
    small = 100  # the figure: after 100 small batches, whatever the preset
    off = compaction(spark, "delta", False, small)
    for side in KINDS:
        on = compaction(spark, side, True, small)
        median = on["median_bytes"]
        figures.append(figure(
            "lake_sink", f"{side} median data file after {small} small batches, compaction on "
            f"(baseline: Delta, compaction off)", median, "bytes", off["median_bytes"],
            f">= 50% of targetFileSize ({COMPACT_TARGET:,} bytes)",
            median >= 0.5 * COMPACT_TARGET, files=on["files"], files_off=off["files"]))
        notes.append(f"- {side}, {small} batches of one 1,000-row file, targetFileSize "
                     f"{COMPACT_TARGET:,}: compaction on {on['files']} current files, median "
                     f"{median:,.0f} bytes ({median / COMPACT_TARGET:.0%} of the target), run "
                     f"{on['seconds']:.1f} s; off (Delta): {off['files']} files, median "
                     f"{off['median_bytes']:,.0f} bytes, run {off['seconds']:.1f} s")
    return {"figures": figures, "notes": notes, "raw": got}
