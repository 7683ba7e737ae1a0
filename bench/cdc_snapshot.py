"""The PostgreSQL source's snapshot of a 2M-row table against Spark's own JDBC read of the same
table partitioned on its key (issue 27: a cost ratio <= 1.0x). The quick preset reads 500,000
rows, the full preset the issue's 2,000,000.

Runs in a subprocess with a Spark session of its own (local[2,4], the PostgreSQL JDBC driver
from Debian's ``libpostgresql-jdbc-java`` on its class path: ``/usr/share/java/postgresql.jar``;
the benchmark fails naming the package when the jar is missing) and a PostgreSQL 15 it starts
(tests/postgres_server.py), PGPASSWORD exported before Spark starts.
- ours: ``PostgresCDC`` with ``startupMode=initial`` in an ``availableNow`` run, each batch
  counted by ``foreachBatch``, from the query's start to its end (the snapshot, the hand-over,
  the stream up to where the run started), two readers, the default chunk size; the notes list
  each batch's rows and when its count ran (the run's batch structure);
- Spark's: ``spark.read.jdbc`` with ``partitionColumn`` on the key, ``numPartitions`` 2 (the
  cores), the bounds the key's min and max, into the ``noop`` sink, start to end.
Both read every column of every row; the table has an integer key, an integer, a numeric, a
text and a timestamptz column.

    python bench/run.py --only cdc_snapshot
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from bench.common import REPO, figure

JDBC_JAR = "/usr/share/java/postgresql.jar"


def run(preset: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.cdc_snapshot", preset], cwd=REPO,
                         capture_output=True, text=True, timeout=3600,
                         env=dict(os.environ, PYTHONPATH=REPO))
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"bench.cdc_snapshot exited {out.returncode}: {out.stderr[-3000:]}")
    raw = json.loads(lines[-1][len("RESULT "):])
    rows = raw["rows"]
    ours, spark = raw["ours_s"], raw["jdbc_s"]
    figures = [figure("cdc_snapshot", f"snapshot of a {rows:,}-row table, start to end",
                      rows / ours, "rows/s", rows / spark, "<= 1.0x (at least Spark's JDBC rate)",
                      ours <= spark)]
    notes = [f"- {rows:,} rows, {raw['chunks']} chunks: ours {ours:.1f} s ({rows / ours:,.0f} "
             f"rows/s, {raw['ours_rows']:,} rows read), Spark's JDBC read partitioned on the key "
             f"{spark:.1f} s ({rows / spark:,.0f} rows/s, {raw['jdbc_rows']:,} rows)"]
    if raw.get("batches"):
        notes.append(f"- ours in {len(raw['batches'])} batches (id, rows, the batch's count "
                     f"from-to, s since the start): {raw['batches']}")
    return {"figures": figures, "notes": notes, "raw": raw}


# ------------------------------------------------------------------- inside the subprocess
def _main(preset: str) -> None:
    import tempfile
    import time

    import psycopg

    from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer

    if not os.path.exists(JDBC_JAR):
        raise SystemExit(f"{JDBC_JAR} is missing: install Debian's libpostgresql-jdbc-java")
    rows = 2_000_000 if preset == "full" else 500_000
    os.environ["PGPASSWORD"] = ADMIN_PASSWORD  # before Spark starts: its processes inherit it
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    server = PostgresServer()
    server.start()
    work = tempfile.mkdtemp(prefix="bench-cdc-snapshot-")
    try:
        from pyspark.sql import SparkSession

        from sparkcoord.sources.postgres import PostgresCDC
        from sparkcoord.spark import CoordinatedJob

        database = server.create_database("bench_snapshot")
        url = server.url(database, ADMIN_USER, ADMIN_PASSWORD)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, v int, amount numeric(12,2), "
                         "note text, at timestamptz)")
            conn.execute("INSERT INTO big SELECT g, g %% 1000, g * 0.01, 'row ' || g, "
                         "timestamptz '2026-01-01' + g * interval '1 second' "
                         "FROM generate_series(1, %s) g", (rows,))
            conn.execute("VACUUM ANALYZE big")
        spark = (SparkSession.builder.master("local[2,4]").appName("sparkcoord-bench-snapshot")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.jars", JDBC_JAR).getOrCreate())
        spark.sparkContext.setLogLevel("FATAL")
        spark.range(1000).count()  # the session's first job pays for starting up
        # Spark's own: a JDBC read partitioned on the key, into the noop sink
        started = time.perf_counter()
        jdbc = (spark.read.format("jdbc")
                .option("url", f"jdbc:postgresql://{server.host}:{server.port}/{database}")
                .option("driver", "org.postgresql.Driver")
                .option("dbtable", "big").option("user", ADMIN_USER)
                .option("password", ADMIN_PASSWORD).option("partitionColumn", "id")
                .option("lowerBound", "1").option("upperBound", str(rows))
                .option("numPartitions", "2").option("fetchsize", "10000").load())
        jdbc.write.format("noop").mode("overwrite").save()
        jdbc_s = time.perf_counter() - started
        jdbc_rows = jdbc.count()  # not timed: that every row was there
        # ours: the snapshot in an availableNow run
        job = CoordinatedJob(spark, os.path.join(work, "ckpt"))
        df = PostgresCDC(job).options(tables="public.big").load(url)
        counted: list[int] = []
        #: per batch: (id, rows, start and end of its foreachBatch count, s since the start)
        batches: list[tuple[int, int, float, float]] = []

        def count(batch: Any, batch_id: int) -> None:
            begin = time.perf_counter() - started
            counted.append(batch.count())
            batches.append((batch_id, counted[-1], round(begin, 3),
                            round(time.perf_counter() - started, 3)))

        started = time.perf_counter()
        job.run(df.writeStream.foreachBatch(count).trigger(availableNow=True))
        ours_s = time.perf_counter() - started
        spark.stop()
        print("RESULT " + json.dumps({"rows": rows, "ours_s": ours_s, "jdbc_s": jdbc_s,
                                      "ours_rows": sum(counted), "jdbc_rows": jdbc_rows,
                                      "chunks": -(-rows // 10_000), "batches": batches}))
    finally:
        server.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    _main(sys.argv[1] if len(sys.argv) > 1 else "quick")
