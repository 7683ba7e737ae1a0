"""PostgreSQL to a lake table by key under kills: a job run as its own process by
tests/spark/test_cdc_lake_kill.py and scripts/soak.py's ``merge`` scenario.

    python -m tests.spark.cdc_lake_kill_job <workdir> <delta|iceberg>

It reads the database URL (with its password) from ``CDC_URL`` and exports the password as
``PGPASSWORD`` before Spark starts (docs/cdc.md), as tests/spark/cdc_job.py does.

The job captures ``public.orders`` of cdc_job's tables (:func:`cdc_job.create_tables`) with
the PostgreSQL source (small chunks, two readers) and merges the change stream by key
(``LakeSink`` mode ``merge``, 2 writing tasks, small staged files) into a Delta table
(``<workdir>/delta``) or an Iceberg table (``lake.events`` of pyiceberg's SQL catalog on
sqlite in ``<workdir>``: lake_kill_job's table helpers read it). cdc_job's writer processes
change both tables meanwhile (inserts, updates, deletes, key changes; where ``orders`` has
cdc_job.add_order_extras's columns, a TOASTed ``big`` most updates leave alone and an ``at``
at the timestamp range's ends, they change those too and the judge compares them); :data:`DOWN_MIXES`
are the bulk statements a test runs while the job is down. SPARKCOORD_TEST_KILL may kill it at
a lake kill point or ``mid-batch`` (sparkcoord.runtime.kills). The job stops once every
writer logged ``done``, the sink has no commit pending and the table equals the source table
(so the cleanup after the last commit ran too).

:func:`judge` compares the table read back (deltalake / pyiceberg) with the source table row
by row and looks at the files in the table's location: every data file the table does not
reference is an orphan, except the sink's staged change files, which must be gone for every
epoch the table holds (``sparkcoord/sinks/coordinator.py`` rule 7).
"""

from __future__ import annotations

import os
import posixpath
import sys
import time
from collections import Counter
from typing import Any

from tests.spark import cdc_job
from tests.spark.lake_kill_job import (
    TABLE,
    catalog_options,
    iceberg_table,
    referenced,
    table_data,
    table_location,
)

SOURCE_TABLE = "public.orders"
JOB_ID = "orders"
COLUMNS = ("id", "v", "note")
#: the optional columns cdc_job.add_order_extras adds, in their order in the table
EXTRA_COLUMNS = (cdc_job.BIG, cdc_job.AT)


def columns(conn: Any) -> tuple[str, ...]:
    """The columns both sides are compared on: :data:`COLUMNS` and the extras ``orders`` has."""
    extras = cdc_job.order_extras(conn)
    return COLUMNS + tuple(c for c in EXTRA_COLUMNS if c in extras)

#: what a test runs on the source while the job is down (one list of statements per mix)
DOWN_MIXES: dict[str, list[str]] = {
    "none": [],
    # many changes in one epoch: updates, deletes, inserts, a key updated twice
    "bulk": ["UPDATE orders SET v = v + 1000, note = 'bulk ' || id WHERE id % 7 = 3",
             "DELETE FROM orders WHERE id % 11 = 5",
             "INSERT INTO orders (v, note) SELECT g, 'down ' || g FROM generate_series(1, 300) g",
             "BEGIN; UPDATE orders SET note = 'twice-1' WHERE id % 97 = 1; "
             "UPDATE orders SET note = 'twice-2' WHERE id % 97 = 1; COMMIT"],
    # key changes in bulk: a delete of the old key and an insert of the new one each
    "keys": ["UPDATE orders SET id = id + 100000 WHERE id % 13 = 1 AND id < 100000",
             "DELETE FROM orders WHERE id % 17 = 2"],
    # a truncate, then the table filled again (merge's rule 2: the epoch's truncate)
    "truncate": ["BEGIN; TRUNCATE orders; INSERT INTO orders (v, note) SELECT g, 'refill ' || g "
                 "FROM generate_series(1, 1500) g; COMMIT",
                 "UPDATE orders SET v = -v WHERE id % 5 = 0"],
}


def run_down_mix(conn: Any, mix: str) -> None:
    """Run :data:`DOWN_MIXES` ``mix`` on ``conn`` (an autocommit connection)."""
    for statement in DOWN_MIXES[mix]:
        conn.execute(statement)


# -- reading both sides ----------------------------------------------------------------------


def source_rows(conn: Any, names: tuple[str, ...] = COLUMNS) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(f"SELECT {', '.join(names)} FROM orders ORDER BY id")]


def lake_rows(workdir: str, kind: str, names: tuple[str, ...] = COLUMNS) -> list[tuple[Any, ...]]:
    """The lake table's rows sorted (empty while the table does not exist yet)."""
    try:
        data = table_data(workdir, kind)
    except Exception:  # noqa: BLE001 - not created yet (Delta: by the first merge)
        return []
    return sorted(zip(*(data.column(c).to_pylist() for c in names), strict=True),
                  key=lambda r: r[0])


def table_epoch(workdir: str, kind: str) -> int:
    """The newest epoch the table holds for the sink's job (-1: none)."""
    if kind == "delta":
        from sparkcoord.sinks.delta import DeltaCommitter

        return DeltaCommitter(table_location(workdir, kind), JOB_ID, None).table_epoch()
    from sparkcoord.sinks.iceberg import IcebergCommitter

    catalog, name = iceberg_table(workdir)
    return IcebergCommitter(catalog, name, JOB_ID, None).table_epoch()


def table_files(workdir: str, kind: str) -> set[str]:
    """Every parquet file under the table's location but its log / metadata, relative to it
    (delta-rs writes the merge's files at the table's root, pyiceberg in ``data/``, the sink
    stages in ``data/``)."""
    location = table_location(workdir, kind)
    found = set()
    for directory, dirs, names in os.walk(location):
        dirs[:] = [d for d in dirs if d not in ("_delta_log", "metadata")]
        for name in names:
            if name.endswith(".parquet"):
                found.add(os.path.relpath(os.path.join(directory, name), location)
                          .replace(os.sep, "/"))
    return found


def staged_epoch(path: str) -> int | None:
    """The epoch of one of the sink's staged files (None: not one of this job's)."""
    from sparkcoord.sinks.files import parse_file_name

    name = parse_file_name(posixpath.basename(path))
    return None if name is None or name.job_id != JOB_ID else name.epoch


def judge(workdir: str, kind: str, conn: Any) -> dict[str, int]:
    """The verdict of a finished run (module docstring): keys missing from the table, extra
    in it, held twice, held with other values; orphans, referenced files missing, staged files
    left of epochs the table holds (and of later ones: ``staged_later``, for information)."""
    names = columns(conn)
    want = {r[0]: r[1:] for r in source_rows(conn, names)}
    rows = lake_rows(workdir, kind, names)
    counts = Counter(r[0] for r in rows)
    got = {r[0]: r[1:] for r in rows}
    held, present = referenced(workdir, kind), table_files(workdir, kind)
    newest = table_epoch(workdir, kind)
    staged = {p: staged_epoch(p) for p in present}
    ours = {p: e for p, e in staged.items() if e is not None}
    return {
        "source_rows": len(want), "rows": len(rows), "table_epoch": newest,
        "missing": sum(1 for k in want if k not in got),
        "extra": sum(1 for k in got if k not in want),
        "duplicated": sum(c - 1 for c in counts.values() if c > 1),
        "wrong": sum(1 for k, v in want.items() if k in got and got[k] != v),
        "orphans": len({p for p in present - held if p not in ours}),
        "missing files": len(held - present),
        "staged_left": sum(1 for e in ours.values() if e <= newest),
        "staged_later": sum(1 for e in ours.values() if e > newest),
    }


#: what :func:`judge` must find 0 of
CLEAN = ("missing", "extra", "duplicated", "wrong", "orphans", "missing files", "staged_left")


def when_running(workdir: str, kind: str, process: Any, timeout_s: float = 180.0) -> bool:
    """Wait until the job in ``process`` (a ``Popen`` of this module) staged its first file,
    so that writers started then meet its snapshot; False if the process ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if any(staged_epoch(p) is not None for p in table_files(workdir, kind)):
                return True
        except Exception:  # noqa: BLE001 - no table location yet (Iceberg: not created)
            pass
        if process.poll() is not None:
            return False
        time.sleep(0.2)
    raise TimeoutError(f"the job in {workdir} staged no file within {timeout_s} s")


# -- the job ---------------------------------------------------------------------------------


def run_job(spark: Any, workdir: str, url: str, kind: str, timeout_s: float = 300.0) -> Any:
    """Run the job until :func:`done` (the driver program's thread); its report."""
    import psycopg

    from sparkcoord.sinks import LakeSink
    from sparkcoord.sources.postgres import PostgresCDC
    from sparkcoord.spark import CoordinatedJob

    job = CoordinatedJob(spark, os.path.join(workdir, "ckpt"))
    df = PostgresCDC(job).options(
        tables=SOURCE_TABLE, chunkSize="250", parallelism="2", maxChunksPerBatch="2",
        maxChangesPerBatch="300", pollInterval="200ms").load(url)
    sink = LakeSink(job).format(kind).options(mode="merge", jobId=JOB_ID, parallelism="2",
                                              targetFileSize="8k")
    if kind == "iceberg":
        iceberg_table(workdir)  # the namespace
        sink = sink.options(**catalog_options(workdir))
    table = os.path.join(workdir, "delta") if kind == "delta" else TABLE
    writer = sink.writer(df, table).trigger(processingTime="0 seconds")
    with psycopg.connect(url, autocommit=True) as conn:
        return job.run(writer, until=lambda: done(job, workdir, kind, conn), poll_s=1.0,
                       timeout_s=timeout_s)


def done(job: Any, workdir: str, kind: str, conn: Any) -> bool:
    """Every writer is done, the sink has no commit pending (each commit's cleanup ran) and
    the table equals the source table."""
    _, seen, finished = cdc_job.writer_logs(workdir)
    if not seen or finished < seen:
        return False
    if job.request("sink", "status", timeout_s=10)["pending"]:
        return False
    names = columns(conn)
    return lake_rows(workdir, kind, names) == source_rows(conn, names)


def main() -> None:
    from bench.common import spark_session
    from sparkcoord.sources.postgres.io.connection import ConnectionOptions

    workdir, kind = sys.argv[1], sys.argv[2]
    url = os.environ["CDC_URL"]
    secrets = dict((k, s.reveal()) for k, s in ConnectionOptions.parse(url).secrets)
    os.environ["PGPASSWORD"] = secrets["password"]  # before Spark starts: its processes inherit it
    report = run_job(spark_session("sparkcoord-cdc-lake-kill-job"), workdir, url, kind)
    print("done", report.restarts, report.failures)


if __name__ == "__main__":
    main()
