"""The PostgreSQL source on real Spark and a real PostgreSQL 15 (tests/postgres_server.py): two
writer processes run transactions across two tables through the snapshot, the hand-over and the
stream, while a reader task fails in the middle of a batch, or the enumerator fails the job;
the job (tests/spark/cdc_job.py) ends only when the sink, applied by key, equals the tables, and
the judge then checks every logged transaction's rows are in the sink exactly once and in
commit order per key, and that the slot never confirmed what the sink did not hold.

Spark's processes connect with libpq's environment (decision 64): the test puts PGPASSWORD into
the session's executor environment (what ``spark.executorEnv.PGPASSWORD`` does) before the
job registers its source, and takes it out afterwards."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import psycopg
import pytest

from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer, postgres_server
from tests.spark import cdc_job

__all__ = ["postgres_server"]  # the session's server fixture

# writer processes of their own beside the job, and a PostgreSQL restarted (docs/testing.md)
pytestmark = [pytest.mark.spark, pytest.mark.own_processes]

@pytest.fixture(scope="module")
def database(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database("t_spark_cdc")


@pytest.mark.parametrize("failure", [
    "task",
    # a restore of the coordinator mid-run: the driver-kill tests restore too (default suite:
    # at a sink commit); this one with -m slow and in the soak's cdc scenario
    pytest.param("fail_job", marks=pytest.mark.slow),
])
def test_snapshot_and_stream_under_concurrent_writers_end_equal_to_the_tables_each_change_once(
        spark: Any, postgres_server: PostgresServer, database: str, executor_password: None,
        tmp_path: Any, failure: str) -> None:
    seed = random.randrange(1 << 30)
    print(f"cdc spark seed {seed} failure {failure}")
    url = postgres_server.url(database, ADMIN_USER, ADMIN_PASSWORD)
    workdir = str(tmp_path)
    with psycopg.connect(url, autocommit=True) as conn:
        cdc_job.create_tables(conn)
        writers: list[Any] = []

        def start() -> None:  # once the query runs: the writes meet the snapshot
            writers.extend(cdc_job.start_writers(url, workdir, [seed, seed + 1],
                                                 transactions=400, pause_s=0.04,
                                                 after_stream=150))
        try:
            report = cdc_job.run_job(spark, workdir, url, failure, seed, timeout_s=240,
                                     on_running=start)
        finally:
            for w in writers:
                w.wait(120)
        assert all(w.returncode == 0 for w in writers)
        verdict = cdc_job.judge(workdir, conn)
        with open(os.path.join(workdir, "slot")) as f:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (f.read(),))
    print(verdict, report.restarts, report.failures)
    assert {k: verdict[k] for k in cdc_job.CLEAN} == dict.fromkeys(cdc_job.CLEAN, 0), (
        f"seed {seed}: {verdict}")
    assert verdict["transactions"] > 300 and verdict["snapshot_rows"] >= 3000
    # the writers' second phase waits for the stream: both halves are exercised by
    # construction, however busy the machine
    assert verdict["transactions_streamed_whole"] > 20
    assert verdict["samples"] > 5
    markers = os.listdir(os.path.join(workdir, "markers"))
    assert failure in markers  # the failure happened
    if failure == "fail_job":
        assert report.restarts >= 1


def test_a_postgresql_restart_in_the_middle_of_the_stream_is_survived_each_change_once(
        spark: Any, postgres_server: PostgresServer, executor_password: None,
        tmp_path: Any) -> None:
    seed = random.randrange(1 << 30)
    print(f"cdc restart seed {seed}")
    database = postgres_server.create_database("t_spark_cdc_restart")
    url = postgres_server.url(database, ADMIN_USER, ADMIN_PASSWORD)
    workdir = str(tmp_path)
    restarted = threading.Event()

    def restart_once_streaming() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = cdc_job.sink_rows(workdir)
            highs = [r["lsn"] for r in rows if r["op"] == "r"]
            if highs and sum(1 for r in rows if r["op"] != "r" and r["lsn"] > max(highs)) > 20:
                postgres_server.restart(down_s=3.0)  # every session ends, connects are refused
                restarted.set()
                return
            time.sleep(0.3)

    writers: list[Any] = []

    def start() -> None:
        writers.extend(cdc_job.start_writers(url, workdir, [seed, seed + 1],
                                             transactions=400, pause_s=0.04,
                                             after_stream=150))
        threading.Thread(target=restart_once_streaming, daemon=True).start()

    with psycopg.connect(url, autocommit=True) as conn:
        cdc_job.create_tables(conn)
    try:
        report = cdc_job.run_job(spark, workdir, url, "none", seed, timeout_s=300,
                                 on_running=start)
    finally:
        for w in writers:
            w.wait(180)
    assert restarted.is_set()
    with psycopg.connect(url, autocommit=True) as conn:
        verdict = cdc_job.judge(workdir, conn)
        with open(os.path.join(workdir, "slot")) as f:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (f.read(),))
    print(verdict, report.restarts, report.failures)
    assert {k: verdict[k] for k in cdc_job.CLEAN} == dict.fromkeys(cdc_job.CLEAN, 0), (
        f"seed {seed}: {verdict}")
    assert verdict["transactions_streamed_whole"] > 20
