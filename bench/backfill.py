"""Backfilling many small files (issue 25 item 4): small files packed into few splits
(``maxPartitionBytes``, ``openCostInBytes``; sources/files rule 8), members fetched ahead on S3.

- local: N tiny JSON-lines files (one line each; 20,000 in the quick preset, 100,000 in the
  full one) read once with ``Trigger.AvailableNow`` into the ``noop`` sink, by our bounded
  source and by Spark's own file stream source (``spark.readStream.format("json")``, whose
  first batch takes the whole backlog), same files, same session. Rate = files / the time of
  the query's triggers (from its progress reports), as bench/filesource.py measures; the
  start-to-end time of each run is in the notes. Target: ours >= 5x Spark's files/s.
- S3: small objects (one JSON line each; 5,000 quick, 20,000 full) on moto's S3 server on
  loopback (tests/s3_server.py), read by our source (availableNow, bounded) against plain
  concurrent fsspec reads of the same object list in the same run (the faster of s3fs's
  batched ``cat``, which gathers the requests concurrently, and 16 threads of ``cat_file``;
  only fetching, no parsing). Rows/s; target:
  ours >= 0.8x of the plain reads. Both are bound by the server (one moto process, in this
  Python process, on the same 2 cores).

    python bench/run.py --only backfill
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from bench.common import figure
from bench.filesource import SCHEMA, _native, _ours, _tiny_files

SIZES = {"quick": (20_000, 5_000), "full": (100_000, 20_000)}


def _available_now(spark: Any, side: str, data: str, root: str,
                   files: int) -> dict[str, Any]:
    """One availableNow run of ``side`` over ``data`` into the noop sink: seconds from start
    to end, of its triggers, and of each part of its triggers (summed over the batches)."""
    t0 = time.perf_counter()
    if side == "native":
        query = (_native(spark, "json", data, "").writeStream.format("noop")
                 .trigger(availableNow=True).option("checkpointLocation", root).start())
        query.awaitTermination()
    else:
        job, df = _ours(spark, "json", data, root, bounded="true")
        handle = job.start(df.writeStream.format("noop").trigger(availableNow=True),
                           timeout_s=1800)
        handle.await_termination()
        query = handle.query
    elapsed = time.perf_counter() - t0
    progress = list(query.recentProgress)
    assert sum(p.numInputRows for p in progress) == files, f"{side} read the wrong row count"
    parts: dict[str, float] = {}
    for p in progress:
        for key, ms in p.durationMs.items():
            parts[key] = parts.get(key, 0.0) + ms / 1e3
    return {"end_to_end_s": elapsed, "s": parts.get("triggerExecution", 0.0),
            "batches": sum(1 for p in progress if p.numInputRows), "parts": parts}


def local(spark: Any, n: int) -> dict[str, Any]:
    """Our source and Spark's over the same ``n`` tiny files, after a warm-up of both."""
    root = tempfile.mkdtemp(prefix="bench-backfill-")
    try:
        warm, data = os.path.join(root, "warm"), os.path.join(root, "data")
        _tiny_files(warm, 500, 0)
        _tiny_files(data, n, 0)
        for side in ("native", "ours"):  # JIT, caches, the Python worker
            _available_now(spark, side, warm, os.path.join(root, f"warm-{side}"), 500)
        out: dict[str, Any] = {"files": n}
        for side in ("native", "ours"):
            out[side] = _available_now(spark, side, data, os.path.join(root, side), n)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def s3(spark: Any, n: int) -> dict[str, Any]:
    """Our source against s3fs's concurrent ``cat`` over ``n`` small objects on moto."""
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    # ``python bench/run.py`` puts bench/ first on the path, where requests.py (a benchmark)
    # would stand for the ``requests`` package moto imports
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    from tests.s3_server import S3Server

    server = S3Server()
    root = tempfile.mkdtemp(prefix="bench-backfill-s3-")
    try:
        server.create_bucket("backfill")
        fs = server.filesystem()
        objects = {f"backfill/events/f-{i:09d}.json": (json.dumps(
            {"id": i, "name": f"n{i}", "score": i * 0.5, "category": "c", "ts": i}) + "\n").encode()
            for i in range(n)}
        t0 = time.perf_counter()
        fs.pipe(objects)
        out: dict[str, Any] = {"objects": n, "upload_s": time.perf_counter() - t0}
        paths = sorted(objects)
        fs.cat(paths[:200])  # warm the connection pool
        t0 = time.perf_counter()
        got = fs.cat(paths)
        out["batched_cat_s"] = time.perf_counter() - t0
        assert sum(body.count(b"\n") for body in got.values()) == n
        from concurrent.futures import ThreadPoolExecutor

        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            bodies = list(pool.map(fs.cat_file, paths))
        out["thread_pool_s"] = time.perf_counter() - t0
        assert sum(body.count(b"\n") for body in bodies) == n
        # the baseline: the faster of the two plain ways
        out["plain_s"] = min(out["batched_cat_s"], out["thread_pool_s"])
        job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
        df = (FileStream(job).format("json").schema(SCHEMA)
              .storage_options(**server.storage_options).option("bounded", "true")
              .load("s3://backfill/events"))
        t0 = time.perf_counter()
        handle = job.start(df.writeStream.format("noop").trigger(availableNow=True),
                           timeout_s=1800)
        handle.await_termination()
        out["ours_end_to_end_s"] = time.perf_counter() - t0
        progress = list(handle.query.recentProgress)
        assert sum(p.numInputRows for p in progress) == n, "ours read the wrong row count"
        out["ours_s"] = sum(p.durationMs.get("triggerExecution", 0) for p in progress) / 1e3
        return out
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def run(preset: str, spark: Any) -> dict[str, Any]:
    files, objects = SIZES[preset]
    raw: dict[str, Any] = {}
    figures, notes = [], []
    loc = raw["local"] = local(spark, files)
    o, n = loc["ours"], loc["native"]
    ours, native = files / o["s"], files / n["s"]
    speed = ours / native
    figures.append(figure("backfill", f"{files:,} tiny local files (JSON lines), availableNow",
                          ours, "files/s", native, ">= 5x Spark's file source", speed >= 5,
                          speedup=speed))

    def parts(run: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v:.1f} s" for k, v in sorted(run["parts"].items())
                         if k != "triggerExecution" and v >= 0.05)

    notes.append(f"- {files:,} tiny files: triggers ours {o['s']:.1f} s ({ours:,.0f} files/s, "
                 f"{o['batches']} batches with data), Spark {n['s']:.1f} s ({native:,.0f} "
                 f"files/s, {n['batches']}): {speed:.2f}x Spark; start to end ours "
                 f"{o['end_to_end_s']:.1f} s, Spark {n['end_to_end_s']:.1f} s. Parts of the "
                 f"triggers: ours {parts(o)}; Spark {parts(n)}")
    remote = raw["s3"] = s3(spark, objects)
    ours, plain = objects / remote["ours_s"], objects / remote["plain_s"]
    share = ours / plain
    figures.append(figure("backfill", f"{objects:,} small objects on S3 (moto), availableNow",
                          ours, "rows/s", plain, ">= 0.8x plain concurrent fsspec reads",
                          share >= 0.8, speedup=share))
    notes.append(f"- {objects:,} objects on S3 (moto on loopback): ours {remote['ours_s']:.1f} s "
                 f"of triggers ({ours:,.0f} rows/s; start to end {remote['ours_end_to_end_s']:.1f}"
                 f" s, {objects / remote['ours_end_to_end_s']:,.0f} rows/s), plain reads "
                 f"{remote['plain_s']:.1f} s ({plain:,.0f} rows/s; s3fs batched cat "
                 f"{remote['batched_cat_s']:.1f} s, 16 threads of cat_file "
                 f"{remote['thread_pool_s']:.1f} s): {share:.2f}x; upload took "
                 f"{remote['upload_s']:.1f} s")
    return {"figures": figures, "raw": raw, "notes": notes}
