"""PostgreSQL to a lake table as one pipeline (issue 28 item 6): the PostgreSQL source's change
stream of a table merged into a Delta table, or an Iceberg table (pyiceberg's SQL catalog on
sqlite), by key (``LakeSink`` mode ``merge``) equals the source table, row by row, after the snapshot and after a run that streamed inserts, updates (one of
them twice in a transaction, one of them changing the primary key), deletes and a truncate."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer, postgres_server

__all__ = ["postgres_server"]  # the session's server fixture
pytestmark = pytest.mark.spark


def lake_rows(kind: str, root: Any) -> list[tuple[Any, ...]]:
    if kind == "delta":
        from deltalake import DeltaTable

        data = DeltaTable(str(root / "items")).to_pyarrow_table()
    else:
        data = catalog(root).load_table("lake.items").scan().to_arrow()
    return sorted(zip(*(data.column(c).to_pylist() for c in ("id", "name", "qty")),
                      strict=True))


def catalog(root: Any) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("default", uri=f"sqlite:///{root}/catalog.db",
                      warehouse=f"file://{root}/warehouse")


def source_rows(conn: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute("SELECT id, name, qty FROM items ORDER BY id")]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_table_mirrored_into_a_lake_table_by_key_equals_the_source_after_every_run(
        spark: Any, postgres_server: PostgresServer, executor_password: None,
        tmp_path: Any, kind: str) -> None:
    from sparkcoord.sinks import LakeSink
    from sparkcoord.sources.postgres import PostgresCDC
    from sparkcoord.spark import CoordinatedJob

    database = postgres_server.create_database(f"t_cdc_{kind}")
    url = postgres_server.url(database, ADMIN_USER, ADMIN_PASSWORD)
    table = str(tmp_path / "items") if kind == "delta" else "lake.items"
    if kind == "iceberg":
        catalog(tmp_path).create_namespace_if_not_exists("lake")
    changes = [
        # inserts, updates, deletes across transactions; a row updated twice in one
        "INSERT INTO items SELECT g, 'new ' || g, 0 FROM generate_series(3001, 3200) g",
        "UPDATE items SET qty = qty + 100 WHERE id % 10 = 0",
        "BEGIN; UPDATE items SET name = 'twice-1' WHERE id = 7; "
        "UPDATE items SET name = 'twice-2' WHERE id = 7; COMMIT",
        "DELETE FROM items WHERE id BETWEEN 100 AND 400",
        # a key change: a delete of the old key and an insert of the new one
        "UPDATE items SET id = 9001 WHERE id = 5",
        "DELETE FROM items WHERE id = 3001",
    ]
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int)")
            conn.execute("INSERT INTO items SELECT g, 'item ' || g, g % 7 "
                         "FROM generate_series(1, 3000) g")
            for run, writes in enumerate([changes, ["TRUNCATE items",
                                                    "INSERT INTO items VALUES (1, 'after', 1)"],
                                          []]):
                job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
                df = PostgresCDC(job).options(tables="public.items").load(url)
                sink = LakeSink(job).format(kind).options(mode="merge", jobId="items")
                if kind == "iceberg":
                    sink = sink.options(**{"catalog.uri": f"sqlite:///{tmp_path}/catalog.db",
                                           "catalog.warehouse": f"file://{tmp_path}/warehouse"})
                writer = sink.writer(df, table)
                report = job.run(writer.trigger(availableNow=True), timeout_s=300)
                assert report.failures == []
                assert lake_rows(kind, tmp_path) == source_rows(conn), f"after run {run}"
                for statement in writes:
                    conn.execute(statement)
            assert source_rows(conn) == [(1, "after", 1)]
    finally:
        postgres_server.drop_slots(database)
