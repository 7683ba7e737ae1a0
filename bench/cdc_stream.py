"""The PostgreSQL source's stream: commit-to-sink latency at a steady 5,000 changes/s, the rate
it keeps up with, and the WAL its slot holds once the captured table is idle and another table
of the database is busy (issue 27's stream targets).

Runs in a subprocess with a Spark session of its own (local[2,4]) and a PostgreSQL 15 it starts
(tests/postgres_server.py), with PGPASSWORD exported before Spark starts (docs/cdc.md). The
source captures one table from the stream only (``startupMode=latest``, the default poll
interval) into the batch-file sink; a watcher thread notes when each batch file appears.
- latency: a writer process commits transactions of 50 inserts at 100 per second (5,000
  changes/s) for the run's length; a row's latency is the moment its batch file appeared minus
  its transaction's commit time (the server's, same clock); p50 and p99 against the targets
  (<= 1 s, <= 3 s). Baseline, same run: the time Spark takes for one micro-batch of the same
  query (median batch duration from its progress reports), the least a row can wait.
- sustained rate: the changes delivered over the span of their commits, against the rate
  offered; met when every change arrived (the sink kept up: latency did not grow without
  bound).
- WAL held: the writes to the captured table stop, another table of the database gets 30 MB of
  inserts; the slot's held WAL (current position minus its restart position) after a CHECKPOINT
  is reported, against the WAL a slot nobody confirms would hold (the WAL written since the
  stop); target < 16 MB.

    python bench/run.py --only cdc_stream
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from bench.common import REPO, figure, stats


def run(preset: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.cdc_stream", preset], cwd=REPO,
                         capture_output=True, text=True, timeout=1800,
                         env=dict(os.environ, PYTHONPATH=REPO))
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"bench.cdc_stream exited {out.returncode}: {out.stderr[-3000:]}")
    raw = json.loads(lines[-1][len("RESULT "):])
    lat = stats(raw["latencies_s"])
    rate, offered = raw["delivered"] / raw["seconds"], raw["offered_rate"]
    batch = raw["batch_s"]
    figures = [
        figure("cdc_stream", f"commit -> row committed by Spark, p50, at {offered:,.0f} "
               "changes/s", lat["median"], "s", batch, "<= 1 s", lat["median"] <= 1.0),
        figure("cdc_stream", f"commit -> row committed by Spark, p99, at {offered:,.0f} "
               "changes/s", lat["p99"], "s", batch, "<= 3 s", lat["p99"] <= 3.0),
        figure("cdc_stream", "changes delivered per second over the writes, all delivered",
               rate, "changes/s", offered, "every change, at the rate offered",
               raw["delivered"] == raw["total"] and rate >= 0.97 * offered),
        figure("cdc_stream", "WAL held by the slot, captured table idle, another busy",
               raw["held_mb"], "MB", raw["unconfirmed_mb"], "< 16 MB", raw["held_mb"] < 16),
    ]
    notes = [f"- {raw['delivered']:,} changes in {raw['seconds']:.0f} s ({rate:,.0f}/s, offered "
             f"{offered:,.0f}/s); latency p50 {lat['median']:.2f} s, p90 {lat['p90']:.2f} s, "
             f"p99 {lat['p99']:.2f} s; Spark's median batch {batch:.2f} s; WAL held after the "
             f"writes moved to another table: {raw['held_mb']:.1f} MB (unconfirmed it would be "
             f"{raw['unconfirmed_mb']:.1f} MB)",
             f"- a batch with rows (median {raw.get('rows_per_batch', 0):,.0f} rows), Spark's "
             "parts of its trigger, median ms: " + ", ".join(
                 f"{k} {v:.0f}" for k, v in raw.get("parts_ms", {}).items())]
    return {"figures": figures, "notes": notes, "raw": raw}


# ------------------------------------------------------------------- inside the subprocess
def _writer(url: str, seconds: float, per_second: int, per_tx: int) -> None:
    """Commit ``per_second / per_tx`` transactions of ``per_tx`` inserts a second (its own
    process)."""
    import time

    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        start = time.monotonic()
        n = 0
        while (now := time.monotonic() - start) < seconds:
            due = int(now * per_second / per_tx)
            while n < due:
                with conn.transaction():
                    conn.execute("INSERT INTO events (v) SELECT g FROM generate_series(1, %s) g",
                                 (per_tx,))
                n += 1
            time.sleep(0.002)


def _main(preset: str) -> None:  # noqa: PLR0915 - one measured scenario, in order
    import threading
    import time

    import psycopg

    from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer

    seconds = 30.0 if preset == "quick" else 90.0
    per_second, per_tx = 5_000, 50
    os.environ["PGPASSWORD"] = ADMIN_PASSWORD  # before Spark starts: its processes inherit it
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    server = PostgresServer()
    server.start()
    work = None
    try:
        import tempfile

        from bench.common import spark_session
        from sparkcoord.examples.sinks import BatchFileSink
        from sparkcoord.sources.postgres import PostgresCDC
        from sparkcoord.spark import CoordinatedJob

        url = server.url(server.create_database("bench_cdc"), ADMIN_USER, ADMIN_PASSWORD)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE events (id bigserial PRIMARY KEY, v int, "
                         "at timestamptz DEFAULT clock_timestamp())")
            conn.execute("CREATE TABLE busy (id bigserial PRIMARY KEY, pad text)")
        work = tempfile.mkdtemp(prefix="bench-cdc-")
        sink = os.path.join(work, "sink")
        spark = spark_session("sparkcoord-bench-cdc")
        spark.dataSource.register(BatchFileSink)
        job = CoordinatedJob(spark, os.path.join(work, "ckpt"))
        df = PostgresCDC(job).options(tables="public.events", startupMode="latest").load(url)
        from pyspark.sql import functions as F

        out = df.select("lsn", F.unix_micros("commit_time").alias("commit_us"))
        seen: dict[str, float] = {}
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                if os.path.isdir(sink):
                    for name in os.listdir(sink):
                        if name.endswith(".json") and name not in seen:
                            seen[name] = time.time()
                time.sleep(0.01)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        handle = job.start(out.writeStream.format("sparkcoord-batchfiles")
                           .option("path", sink).trigger(processingTime="0 seconds"))
        deadline = time.monotonic() + 120
        while not seen and time.monotonic() < deadline:  # the stream is out, batches run
            time.sleep(0.2)
        time.sleep(3)
        writer = subprocess.Popen([sys.executable, "-c", (
            "import sys; from bench.cdc_stream import _writer; "
            f"_writer({url!r}, {seconds}, {per_second}, {per_tx})")], cwd=REPO,
            env=dict(os.environ, PYTHONPATH=REPO))
        writer.wait(seconds + 120)
        with psycopg.connect(url, autocommit=True) as conn:
            total = conn.execute("SELECT count(*) FROM events").fetchone()[0]

            def delivered() -> int:
                rows = 0
                for name in list(seen):
                    with open(os.path.join(sink, name)) as f:
                        rows += len(json.load(f))
                return rows

            deadline = time.monotonic() + 120
            while delivered() < total and time.monotonic() < deadline:
                time.sleep(0.5)
            latencies: list[float] = []
            first_commit, last_commit = float("inf"), 0.0
            for name, at in list(seen.items()):
                with open(os.path.join(sink, name)) as f:
                    for row in json.load(f):
                        commit = row["commit_us"] / 1e6
                        latencies.append(at - commit)
                        first_commit = min(first_commit, commit)
                        last_commit = max(last_commit, commit)
            with_rows = [p for p in handle.recentProgress if p.numInputRows]
            batches = [p.batchDuration / 1e3 for p in with_rows] or [0.0]
            # where a batch's time goes (Spark's own parts of a trigger), medians in ms
            parts = {key: stats([p.durationMs.get(key, 0) for p in with_rows])["median"]
                     for key in sorted({k for p in with_rows for k in p.durationMs})}
            rows_per_batch = stats([p.numInputRows for p in with_rows])["median"]
            # the WAL a quiet publication holds while another table is busy
            from sparkcoord.sources.postgres.core.pgoutput import lsn_from_text

            def position() -> int:
                return lsn_from_text(conn.execute(
                    "SELECT pg_current_wal_lsn()::text").fetchone()[0])

            stopped_at = position()
            for _ in range(30):
                conn.execute("INSERT INTO busy (pad) SELECT repeat('x', 1000) "
                             "FROM generate_series(1, 1000)")
                time.sleep(0.2)
            conn.execute("CHECKPOINT")
            time.sleep(3)  # two polls and batches: the idle reader reports, the slot follows
            conn.execute("CHECKPOINT")
            time.sleep(2)
            held = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) FROM "
                "pg_replication_slots").fetchone()[0]
            unconfirmed = position() - stopped_at
        handle.stop()
        stop.set()
        spark.stop()
        result = {"latencies_s": latencies, "delivered": len(latencies),
                  "seconds": max(1e-9, last_commit - first_commit), "offered_rate": per_second,
                  "batch_s": stats(batches)["median"], "parts_ms": parts,
                  "rows_per_batch": rows_per_batch, "held_mb": float(held) / 1e6,
                  "unconfirmed_mb": unconfirmed / 1e6, "total": total}
        print("RESULT " + json.dumps(result))
    finally:
        server.stop()
        if work is not None:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    _main(sys.argv[1] if len(sys.argv) > 1 else "quick")
