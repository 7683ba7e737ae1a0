"""The file source against Spark's own file stream source: same files, same session, one run.

- throughput: 2M rows in 40 files (parquet, JSON lines, CSV), read once with
  ``Trigger.AvailableNow`` into the ``noop`` sink; ours bounded with 2 readers pulling splits.
  Rounds alternate Spark's and ours after a warm-up round. Throughput = rows / the time of
  the query's triggers (planning and reading, from its progress reports: what a running
  stream spends per batch). Also reported, without a target: the run from query start to its
  end, which adds a Python source's start-up (Spark starts its runner process once per query
  run: ~0.7 s here for a Python source started the Spark way, from PySpark's uncompiled zip;
  ~0.3 s for ours, started through ``sparkcoord-python``, decision 82).
- planning per trigger with N files present (1k and 10k; 100k in the full preset) and 5 new
  files per trigger: Spark's ``latestOffset`` (it lists the directory) against ours (it seals
  an epoch; discovery runs beside the batches), from each query's progress reports. Also our
  discovery cycle (lists only names after the marker: a scandir without stats of older names).
- skew: 20 JSON-lines files, one 50x larger than the others: the batch's time (addBatch), ours (the big
  file is split into byte ranges, ``maxSplitBytes`` 4m, that both readers pull) against
  Spark's (``spark.sql.files.maxPartitionBytes`` default 128 MB: one task reads the big file).
- discovery state after N files: our entries (the marker plus files newer than the last
  backfill; ``discoveryMode`` lexical) against Spark's seen-files log (``sources/0`` under
  its checkpoint, bytes); the default mode (listing) keeps a seen set like Spark's.

    python bench/run.py --only filesource
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from bench.common import figure

SCHEMA = "id long, name string, score double, category string, ts long"
ROWS, FILES = 2_000_000, 40
PYTHON_ROWS = 20  # the plain Python source's run: its start is measured, not its rows


def _table(start: int, rows: int) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pa.array(range(start, start + rows), pa.int64())
    return pa.table({
        "id": ids,
        "name": pc.binary_join_element_wise("n", pc.cast(ids, pa.string()), ""),
        "score": pc.multiply(pc.cast(ids, pa.float64()), 0.5),
        "category": pc.cast(pc.remainder(ids, 17), pa.string()),
        "ts": pc.add(ids, 1_700_000_000_000),
    })


def write_dataset(directory: str, fmt: str, files: int, rows_per_file: list[int] | int,
                  first_id: int = 0, prefix: str = "part") -> int:
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    sizes = rows_per_file if isinstance(rows_per_file, list) else [rows_per_file] * files
    start = first_id
    for rows in sizes:
        table = _table(start, rows)
        path = os.path.join(directory, f"{prefix}-{start:012d}.{fmt}")
        tmp = os.path.join(directory, f".tmp-{start}")
        if fmt == "parquet":
            pq.write_table(table, tmp)
        elif fmt == "csv":
            pcsv.write_csv(table, tmp)
        else:
            with open(tmp, "w") as out:
                for row in table.to_pylist():
                    out.write(json.dumps(row, separators=(",", ":")) + "\n")
        os.rename(tmp, path)
        start += rows
    return start - first_id


def _native(spark: Any, fmt: str, path: str, ckpt: str, **options: str) -> Any:
    reader = spark.readStream.format(fmt).schema(SCHEMA)
    if fmt == "csv":
        reader = reader.option("header", "true")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(path)


def _ours(spark: Any, fmt: str, path: str, root: str, **options: str) -> tuple[Any, Any]:
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
    stream = FileStream(job).format(fmt).schema(SCHEMA)
    if fmt == "csv":
        stream = stream.option("header", "true")
    return job, stream.options(**options).load(path)


def _available_now(spark: Any, side: str, fmt: str, data: str, root: str, rows: int,
                   **options: str) -> tuple[float, float, float, float]:
    """One availableNow run into the noop sink: (seconds from start to end, seconds of its
    triggers, seconds of its longest batch's addBatch, seconds from start to its first
    trigger). ``side`` ``python``: Spark's own Python streaming source of ``rows`` rows made
    in memory (sparkcoord.examples.plain, registered by :func:`run`): what every Python source
    pays to start."""
    t0 = time.perf_counter()
    wall = time.time()
    if side == "python":
        query = (spark.readStream.format("sparkcoord-plain").option("parallelism", "2")
                 .option("rows", str(rows // 2)).load().writeStream.format("noop")
                 .trigger(availableNow=True).option("checkpointLocation", root).start())
        query.awaitTermination()
    elif side == "native":
        query = (_native(spark, fmt, data, "").writeStream.format("noop")
                 .trigger(availableNow=True).option("checkpointLocation", root).start())
        query.awaitTermination()
    else:
        job, df = _ours(spark, fmt, data, root, bounded="true", **options)
        handle = job.start(df.writeStream.format("noop").trigger(availableNow=True),
                           timeout_s=600)
        handle.await_termination()
        query = handle.query
    elapsed = time.perf_counter() - t0
    progress = list(query.recentProgress)
    assert sum(p.numInputRows for p in progress) == rows, f"{side} read the wrong row count"
    triggers = sum(p.durationMs.get("triggerExecution", 0) for p in progress) / 1e3
    batch = max(p.durationMs.get("addBatch", 0) for p in progress) / 1e3
    first = datetime.datetime.fromisoformat(progress[0].timestamp.replace("Z", "+00:00"))
    return elapsed, triggers, batch, first.timestamp() - wall


def throughput(spark: Any, fmt: str, rounds: int) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix=f"bench-files-{fmt}-")
    try:
        data = os.path.join(root, "data")
        rows = write_dataset(data, fmt, FILES, ROWS // FILES)
        runs: dict[str, list[tuple[float, float, float, float]]] = {
            "ours": [], "native": [], "python": []}
        for r in range(rounds + 1):  # round 0 warms up both (JIT, caches) and is dropped
            for side in ("native", "ours", "python"):
                result = _available_now(spark, side, fmt, data,
                                        os.path.join(root, f"{side}-{r}"),
                                        PYTHON_ROWS if side == "python" else rows)
                if r:
                    runs[side].append(result)
        out: dict[str, Any] = {"rows": rows, "bytes": sum(
            os.path.getsize(os.path.join(data, f)) for f in os.listdir(data))}
        for side, results in runs.items():
            out[f"{side}_end_to_end_s"] = statistics.median(r[0] for r in results)
            out[f"{side}_first_trigger_s"] = statistics.median(r[3] for r in results)
            out[f"{side}_s"] = statistics.median(r[1] for r in results)
            out[f"{side}_all"] = [round(r[1], 3) for r in results]
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _tiny_files(directory: str, count: int, first: int) -> None:
    os.makedirs(directory, exist_ok=True)
    for i in range(first, first + count):
        tmp = os.path.join(directory, f".t{i}")
        with open(tmp, "w") as f:
            f.write(json.dumps({"id": i, "name": f"n{i}", "score": i * 0.5, "category": "c",
                                "ts": i}) + "\n")
        os.rename(tmp, os.path.join(directory, f"f-{i:09d}.json"))


def planning(spark: Any, n: int, triggers: int) -> dict[str, Any]:
    """Per-trigger planning with ``n`` files present, 5 new files per trigger."""
    root = tempfile.mkdtemp(prefix=f"bench-plan-{n}-")
    try:
        data = os.path.join(root, "data")
        _tiny_files(data, n, 0)
        time.sleep(1.5)  # older than the backfill's clock skew below
        out: dict[str, Any] = {"n": n}
        out.update(_discovery_cycles(data))
        for side in ("native", "ours"):
            out.update(_planning_side(spark, side, data, root, n, triggers))
            # the other side must not see this side's new files: remove them
            for f in os.listdir(data):
                if f.startswith("f-01"):
                    os.remove(os.path.join(data, f))
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _discovery_cycles(data: str) -> dict[str, Any]:
    """One discovery cycle over the directory in each mode, in this process: the first (every
    file is new) and a steady one (nothing new)."""
    from sparkcoord.sources.files.discovery import FileDiscovery
    from sparkcoord.sources.files.options import FileSourceOptions

    out: dict[str, Any] = {}
    for mode in ("lexical", "listing"):
        discovery = FileDiscovery(FileSourceOptions(url=data, format="json",
                                                    discovery_mode=mode,
                                                    max_files_per_discovery=10**9))
        t0 = time.perf_counter()
        _, state = discovery.discover(discovery.initial_state())
        t1 = time.perf_counter()
        discovery.discover(state)
        t2 = time.perf_counter()
        out[f"{mode}_first_cycle_ms"] = (t1 - t0) * 1e3
        out[f"{mode}_steady_cycle_ms"] = (t2 - t1) * 1e3
        out[f"{mode}_state_entries"] = discovery.size_of(state)
    return out


class _Progress:
    """The progress reports of a native query or of a job handle's current query."""

    def __init__(self, query: Any = None, handle: Any = None) -> None:
        self.query, self.handle = query, handle

    def reports(self) -> list[Any]:
        query = self.query if self.query is not None else self.handle.query
        return list(query.recentProgress) if query is not None else []

    def rows(self) -> int:
        return sum(p.numInputRows for p in self.reports())


def _planning_side(spark: Any, side: str, data: str, root: str, n: int,
                   triggers: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    handle: Any = None
    if side == "native":
        df = _native(spark, "json", data, "")
        query = (df.writeStream.format("noop").trigger(processingTime="0 seconds")
                 .option("checkpointLocation", os.path.join(root, "native")).start())
        progress = _Progress(query=query)
    else:
        job, df = _ours(spark, "json", data, os.path.join(root, "ours"), discoveryMode="lexical",
                        discoveryInterval="100ms", backfillInterval="2s", maxClockSkew="1s")
        handle = job.start(df.writeStream.format("noop").trigger(processingTime="0 seconds"),
                           timeout_s=1800)
        progress = _Progress(handle=handle)
    deadline = time.monotonic() + 1800
    while progress.rows() < n:  # the first batch(es) read the n files present
        if time.monotonic() > deadline:
            raise TimeoutError(f"{side}: {progress.rows()} of {n} files read")
        time.sleep(0.5)
    first_batches = len(progress.reports())
    added = n
    for t in range(triggers):
        _tiny_files(data, 5, 10_000_000 + t * 5 + (0 if side == "native" else 500_000))
        added += 5
        while progress.rows() < added:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{side}: trigger {t} did not read its files")
            time.sleep(0.05)
    reports = [p for p in progress.reports()[first_batches:] if p.numInputRows]
    out[f"{side}_latest_offset_ms"] = statistics.median(
        p.durationMs.get("latestOffset", 0) for p in reports)
    out[f"{side}_trigger_ms"] = statistics.median(
        p.durationMs.get("triggerExecution", 0) for p in reports)
    if side == "native":
        query.stop()
        log = os.path.join(root, "native", "sources", "0")
        out["native_seen_log_bytes"] = sum(
            os.path.getsize(os.path.join(log, f)) for f in os.listdir(log))
    else:
        time.sleep(2.5)  # let a backfill run and compact the recent set
        status = handle.request("files", "status")
        handle.stop()
        out["ours_state_entries"] = status["discovery_state_entries"]
        cycles = status["discovery_cycles_s"][-20:]
        out["ours_discovery_ms"] = statistics.median(cycles) * 1e3 if cycles else None
    return out


def skew(spark: Any, rounds: int) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="bench-skew-")
    try:
        data = os.path.join(root, "data")
        small = 10_000
        rows = write_dataset(data, "json", 20, [small] * 19 + [50 * small])
        ours, native = [], []
        for r in range(rounds + 1):  # round 0 warms up and is dropped
            n = _available_now(spark, "native", "json", data, os.path.join(root, f"n{r}"), rows)
            o = _available_now(spark, "ours", "json", data, os.path.join(root, f"o{r}"), rows,
                               maxSplitBytes="4m")
            if r:
                native.append(n[2])
                ours.append(o[2])
        return {"rows": rows, "ours_s": statistics.median(ours),
                "native_s": statistics.median(native), "ours_all": ours, "native_all": native}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(preset: str, spark: Any) -> dict[str, Any]:
    from sparkcoord.examples.plain import PlainSource

    spark.dataSource.register(PlainSource)
    rounds = 3 if preset == "full" else 2
    sizes = (1_000, 10_000, 100_000) if preset == "full" else (1_000, 10_000)
    raw: dict[str, Any] = {"throughput": {}, "planning": {}}
    figures, notes = [], []
    targets = {"parquet": 0.8, "json": 1.0, "csv": 1.0}
    for fmt in ("parquet", "json", "csv"):
        t = raw["throughput"][fmt] = throughput(spark, fmt, rounds)
        ours_rate, native_rate = t["rows"] / t["ours_s"], t["rows"] / t["native_s"]
        speed = ours_rate / native_rate
        figures.append(figure("filesource", f"throughput {fmt}, 2M rows in 40 files", ours_rate,
                              "rows/s", native_rate, f">= {targets[fmt]:.1f}x native",
                              speed >= targets[fmt]))
        end_to_end = t["ours_end_to_end_s"] / t["native_end_to_end_s"]
        figures.append(figure("filesource", f"availableNow run {fmt}, start to end",
                              t["ours_end_to_end_s"], "s", t["native_end_to_end_s"],
                              "<= 1.2x", end_to_end <= 1.2))
        # issue 29 item 2: what a Python streaming source pays before its first trigger
        # (Spark starts its Python source runner), ours (started through the launcher,
        # decision 82) and Spark's own Python source, against Spark's own file source
        figures.append(figure("filesource", f"availableNow run {fmt}: start to first trigger, "
                              "ours", t["ours_first_trigger_s"], "s",
                              t["native_first_trigger_s"]))
        figures.append(figure("filesource", f"availableNow run {fmt}: start to first trigger, "
                              "Spark's own Python streaming source (started the Spark way)",
                              t["python_first_trigger_s"], "s", t["native_first_trigger_s"]))
        notes.append(f"- {fmt}: triggers ours {t['ours_s']:.2f} s ({ours_rate:,.0f} rows/s), "
                     f"Spark {t['native_s']:.2f} s ({native_rate:,.0f} rows/s): {speed:.2f}x "
                     f"native ({t['bytes'] / 1e6:.0f} MB; rounds ours {t['ours_all']}, Spark "
                     f"{t['native_all']}); start to end ours {t['ours_end_to_end_s']:.2f} s, "
                     f"Spark {t['native_end_to_end_s']:.2f} s; start to first trigger ours "
                     f"{t['ours_first_trigger_s']:.2f} s, Spark's file source "
                     f"{t['native_first_trigger_s']:.2f} s, Spark's Python streaming source "
                     f"({PYTHON_ROWS} rows made in memory) {t['python_first_trigger_s']:.2f} s "
                     f"(start to end {t['python_end_to_end_s']:.2f} s)")
    for n in sizes:
        p = raw["planning"][n] = planning(spark, n, triggers=8 if preset == "full" else 5)
        notes.append(f"- {n:,} files present: latestOffset ours {p['ours_latest_offset_ms']:.0f} ms, "
                     f"Spark {p['native_latest_offset_ms']:.0f} ms; whole trigger ours "
                     f"{p['ours_trigger_ms']:.0f} ms, Spark {p['native_trigger_ms']:.0f} ms; our "
                     f"discovery cycle {p['ours_discovery_ms'] or 0:.1f} ms; state: ours "
                     f"{p['ours_state_entries']} entries, Spark's seen-files log "
                     f"{p['native_seen_log_bytes']:,} bytes; a discovery cycle with nothing "
                     f"new: lexical mode {p['lexical_steady_cycle_ms']:.1f} ms, listing mode "
                     f"{p['listing_steady_cycle_ms']:.1f} ms (seen set "
                     f"{p['listing_state_entries']:,} entries)")
    small, large = raw["planning"][sizes[0]], raw["planning"][sizes[-1]]
    # planning = Spark's latestOffset: where its file source lists the directory and ours seals
    # an epoch (our discovery runs beside the batches and is reported in the notes)
    flat = large["ours_latest_offset_ms"] / max(small["ours_latest_offset_ms"], 1e-9)
    figures.append(figure("filesource", f"planning per trigger (latestOffset), {sizes[-1]:,} vs "
                          f"{sizes[0]:,} files present (ours)", flat, "ratio", None, "<= 1.5",
                          flat <= 1.5))
    cheaper = large["native_latest_offset_ms"] / max(large["ours_latest_offset_ms"], 1e-9)
    figures.append(figure("filesource", f"planning per trigger (latestOffset), {sizes[-1]:,} "
                          "files present", large["ours_latest_offset_ms"], "ms",
                          large["native_latest_offset_ms"],
                          ">= 10x cheaper than native" if sizes[-1] >= 100_000 else None,
                          cheaper >= 10 if sizes[-1] >= 100_000 else None))
    figures.append(figure("filesource", f"whole trigger with {sizes[-1]:,} files present",
                          large["ours_trigger_ms"], "ms", large["native_trigger_ms"]))
    figures.append(figure("filesource", f"discovery state after {sizes[-1]:,} files (entries vs "
                          f"{sizes[0]:,})", large["ours_state_entries"], "entries",
                          small["ours_state_entries"], "flat (<= 1.5x)",
                          large["ours_state_entries"] <= 1.5 * max(small["ours_state_entries"], 1)))
    s = raw["skew"] = skew(spark, rounds)
    figures.append(figure("filesource", "skew: batch time, one file 50x larger (JSON lines)",
                          s["ours_s"], "s", s["native_s"]))
    notes.append(f"- skew: ours {s['ours_s']:.2f} s, Spark {s['native_s']:.2f} s "
                 f"({s['rows']:,} rows; rounds ours {s['ours_all']}, Spark {s['native_all']})")
    return {"figures": figures, "raw": raw, "notes": notes}
