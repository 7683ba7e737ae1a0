"""The PostgreSQL source's loud stops on real Spark and a real PostgreSQL 15: a column added to a
captured table while the stream runs stops the query naming the table and the change, with no
row of the new shape in the sink and every change before it in the sink; a captured table dropped while the stream runs stops the job
naming it, once every change it had before the drop is in the sink (enumerator.py rule 7).

Spark's processes connect with libpq's environment (decision 64): PGPASSWORD goes into the
session's executor environment for the test (tests/spark/conftest.py's ``executor_password``)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer, postgres_server

__all__ = ["postgres_server"]  # the session's server fixture


def _wait_for(what: str, ready: Callable[[], bool], handle: Any, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if handle.await_termination(timeout_s=0.2):
            raise AssertionError(f"the job ended before {what}")
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"


class Mirror:
    """A streaming job capturing ``tables`` of ``url`` into batch files (the sink keeps each
    committed batch's rows), started without restarts so a stop is the test's to see."""

    def __init__(self, spark: Any, url: str, workdir: str, tables: str) -> None:
        from pyspark.sql import functions as F

        from sparkcoord import FixedDelay
        from sparkcoord.examples.sinks import BatchFileSink
        from sparkcoord.sources.postgres import PostgresCDC
        from sparkcoord.spark import CoordinatedJob

        spark.dataSource.register(BatchFileSink)
        self.sink = os.path.join(workdir, "sink")
        self.job = CoordinatedJob(spark, os.path.join(workdir, "ckpt"))
        self.source = PostgresCDC(self.job).options(tables=tables, pollInterval="100ms")
        df = self.source.load(url)
        out = df.select("op", "table", "lsn", F.col("after.id").alias("id"),
                        F.col("before.id").alias("before_id"), F.col("after.v").alias("v"))
        self.handle = self.job.start(
            out.writeStream.format("sparkcoord-batchfiles").option("path", self.sink)
            .trigger(processingTime="0 seconds"), restart=FixedDelay(attempts=0, delay_s=0))

    def rows(self) -> list[dict[str, Any]]:
        from sparkcoord.examples.sinks import read_batch_files

        batches = read_batch_files(self.sink)
        return [row for batch in sorted(batches) for row in batches[batch]]

    def streaming(self) -> bool:
        try:
            status = self.job.request("postgres", "status", timeout_s=5)
        except Exception:  # noqa: BLE001 - no run answers right now: ask again
            return False
        return isinstance(status, dict) and status.get("phase") == "stream"

    def stop(self) -> None:
        """Stop the job if it still runs (a job that ended with an error raises it here
        again: the test has looked at it)."""
        try:
            running = not self.handle.await_termination(timeout_s=0)
        except Exception:  # noqa: BLE001 - the error the test asserted on
            running = False
        if running:
            self.handle.stop()


@contextlib.contextmanager
def streaming_mirror(spark: Any, postgres_server: PostgresServer, workdir: str, database: str,
                     tables: str, setup: list[str], rows: int) -> Iterator[tuple[Any, Mirror]]:
    """A fresh ``database`` set up by ``setup``, mirrored until the stream runs and the sink
    holds the snapshot's ``rows``; the job stopped and the slots dropped afterwards."""
    url = postgres_server.url(postgres_server.create_database(database), ADMIN_USER,
                              ADMIN_PASSWORD)
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in setup:
            conn.execute(sql)
        mirror = Mirror(spark, url, workdir, tables)
        try:
            _wait_for("the stream", lambda: mirror.streaming() and len(mirror.rows()) == rows,
                      mirror.handle)
            yield conn, mirror
        finally:
            mirror.stop()
            postgres_server.drop_slots(database)


def expect_stop(mirror: Mirror, message: str) -> None:
    """The job ends (within 240 s) with an error matching ``message``."""
    with pytest.raises(Exception, match=message):
        ended = mirror.handle.await_termination(timeout_s=240)
        raise AssertionError(f"the job went on (ended: {ended})")


def test_a_column_added_while_streaming_stops_the_query_naming_the_table_with_no_row_of_the_new_shape(
        spark: Any, postgres_server: PostgresServer, executor_password: None,
        tmp_path: Any) -> None:
    setup = ["CREATE TABLE items (id int PRIMARY KEY, v int)",
             "INSERT INTO items SELECT g, g FROM generate_series(1, 20) g"]
    with streaming_mirror(spark, postgres_server, str(tmp_path), "t_spark_cdc_alter",
                          "public.items", setup, rows=20) as (conn, mirror):
        conn.execute("INSERT INTO items VALUES (21, 21)")
        _wait_for("row 21", lambda: len(mirror.rows()) == 21, mirror.handle)
        conn.execute("ALTER TABLE items ADD COLUMN extra text")
        conn.execute("INSERT INTO items VALUES (22, 22, 'new shape')")
        expect_stop(mirror, r"table public\.items changed while it was captured "
                            r"\(column\(s\) added: extra\)")
    rows = mirror.rows()
    assert sorted(r["id"] for r in rows) == list(range(1, 22))  # nothing of the new shape
    assert [r["op"] for r in rows].count("r") == 20


def test_the_updates_committed_right_before_a_column_is_added_reach_the_sink_before_the_stop(
        spark: Any, postgres_server: PostgresServer, executor_password: None,
        tmp_path: Any) -> None:
    """Issue 43, finding 6: five updates committed milliseconds before ``ALTER TABLE ... ADD
    COLUMN``, read in the same batch as the first change after it, are in the sink when the
    job stops (reader.py rule 4, enumerator.py rule 7)."""
    setup = ["CREATE TABLE items (id int PRIMARY KEY, v int)",
             "INSERT INTO items SELECT g, 0 FROM generate_series(1, 10) g"]
    with streaming_mirror(spark, postgres_server, str(tmp_path), "t_spark_cdc_alter_before",
                          "public.items", setup, rows=10) as (conn, mirror):
        for i in range(1, 6):
            conn.execute(f"UPDATE items SET v = {100 + i} WHERE id = {i}")
        conn.execute("ALTER TABLE items ADD COLUMN extra text")
        conn.execute("INSERT INTO items VALUES (11, 11, 'new shape')")
        expect_stop(mirror, r"table public\.items changed while it was captured "
                            r"\(column\(s\) added: extra\).*new checkpoint location")
    rows = mirror.rows()
    assert sorted((r["id"], r["v"]) for r in rows if r["op"] == "u") == [
        (i, 100 + i) for i in range(1, 6)]
    assert 11 not in [r["id"] for r in rows]  # nothing of the new shape


def test_a_captured_table_dropped_while_streaming_stops_the_job_naming_it_after_its_last_changes(
        spark: Any, postgres_server: PostgresServer, executor_password: None,
        tmp_path: Any) -> None:
    setup = ["CREATE TABLE items (id int PRIMARY KEY, v int)",
             "CREATE TABLE kept (id int PRIMARY KEY, v int)",
             "INSERT INTO items SELECT g, g FROM generate_series(1, 10) g"]
    with streaming_mirror(spark, postgres_server, str(tmp_path), "t_spark_cdc_drop",
                          "public.items,public.kept", setup, rows=10) as (conn, mirror):
        # the last changes come right before the drop: they must reach the sink first
        conn.execute("INSERT INTO items SELECT g, g FROM generate_series(11, 15) g")
        conn.execute("DELETE FROM items WHERE id = 1")
        conn.execute("INSERT INTO kept VALUES (1, 1)")
        conn.execute("DROP TABLE items")
        expect_stop(mirror, r"captured table\(s\) public\.items are no longer published")
    rows = mirror.rows()
    items = [r for r in rows if r["table"] == "public.items"]
    assert sorted(r["id"] for r in items if r["op"] in ("r", "c")) == list(range(1, 16))
    assert [r["before_id"] for r in items if r["op"] == "d"] == [1]
    assert [(r["op"], r["id"]) for r in rows if r["table"] == "public.kept"] == [("c", 1)]
