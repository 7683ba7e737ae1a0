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


def sink_options(kind: str, root: Any) -> dict[str, str]:
    """The Iceberg sink's catalog options (none for Delta); the namespace made."""
    if kind == "delta":
        return {}
    catalog(root).create_namespace_if_not_exists("lake")
    return {"catalog.uri": f"sqlite:///{root}/catalog.db",
            "catalog.warehouse": f"file://{root}/warehouse"}


def read_lake(kind: str, root: Any, table: str) -> Any:
    """A Delta table at path ``table`` or the Iceberg table ``table``, as Arrow."""
    if kind == "delta":
        from deltalake import DeltaTable

        return DeltaTable(table).to_pyarrow_table()
    return catalog(root).load_table(table).scan().to_arrow()


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


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_one_table_of_a_stream_capturing_two_is_mirrored_by_its_own_key_and_columns(
        spark: Any, postgres_server: PostgresServer, executor_password: None,
        tmp_path: Any, kind: str) -> None:
    """Issue 43 finding 2: docs/sinks.md's recipe for a stream of several tables, as written.
    A filter on ``table`` alone once merged on the union key (``id``, ``code``), ``code`` null
    for mt_a's rows: updates duplicated keys and deletes left rows behind, silently."""
    from sparkcoord.sinks import LakeSink
    from sparkcoord.sources.postgres import PostgresCDC
    from sparkcoord.spark import CoordinatedJob

    database = postgres_server.create_database(f"t_cdc_two_{kind}")
    url = postgres_server.url(database, ADMIN_USER, ADMIN_PASSWORD)
    table = str(tmp_path / "mt_a") if kind == "delta" else "lake.mt_a"
    options = sink_options(kind, tmp_path)

    def mirrored() -> list[tuple[Any, ...]]:
        data = read_lake(kind, tmp_path, table)
        assert data.schema.names == ["id", "name"]  # mt_a's columns, not mt_b's code
        return sorted(zip(data.column("id").to_pylist(), data.column("name").to_pylist(),
                          strict=True))

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE mt_a (id bigint PRIMARY KEY, name text)")
            conn.execute("CREATE TABLE mt_b (code text PRIMARY KEY, qty int)")
            conn.execute("INSERT INTO mt_a SELECT g, 'a' || g FROM generate_series(1, 200) g")
            conn.execute("INSERT INTO mt_b SELECT 'b' || g, g FROM generate_series(1, 50) g")
            for run, writes in enumerate([[
                    "UPDATE mt_a SET name = 'updated' WHERE id <= 20",
                    "DELETE FROM mt_a WHERE id BETWEEN 21 AND 30",
                    "UPDATE mt_a SET id = id + 1000 WHERE id BETWEEN 31 AND 35",
                    "UPDATE mt_b SET qty = qty + 1", "DELETE FROM mt_b WHERE qty < 10"], []]):
                job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
                changes = PostgresCDC(job).options(tables="public.mt_a,public.mt_b").load(url)
                if run == 0:  # the old recipe: a filter on `table` alone is refused at once
                    with pytest.raises(ValueError, match=r"2 tables \(public\.mt_a, "
                                       r"public\.mt_b\).*sourceTable"):
                        (LakeSink(job).format(kind).options(mode="merge", **options)
                         .writer(changes.where("`table` = 'public.mt_a'"), table))
                    if kind == "delta":
                        assert not (tmp_path / "mt_a").exists()  # nothing written
                    else:
                        assert not catalog(tmp_path).table_exists(table)
                writer = (LakeSink(job).format(kind)
                          .options(mode="merge", sourceTable="public.mt_a", **options)
                          .writer(changes, table))
                report = job.run(writer.trigger(availableNow=True), timeout_s=300)
                assert report.failures == []
                expected = [tuple(r) for r in conn.execute(
                    "SELECT id, name FROM mt_a ORDER BY id")]
                assert mirrored() == expected, f"after run {run}"
                for statement in writes:
                    conn.execute(statement)
    finally:
        postgres_server.drop_slots(database)


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_large_toasted_values_an_update_leaves_untouched_are_kept_under_the_default_identity(
        spark: Any, postgres_server: PostgresServer, executor_password: None,
        tmp_path: Any, kind: str) -> None:
    """Issue 43 finding 3: with REPLICA IDENTITY DEFAULT an update that leaves a TOASTed
    column alone does not send it; the merge keeps the table's value (it once failed the
    job). A key the target lacks is refused naming the PostgreSQL table."""
    from sparkcoord.sinks import LakeSink
    from sparkcoord.sources.postgres import PostgresCDC
    from sparkcoord.spark import CoordinatedJob, JobGaveUp

    database = postgres_server.create_database(f"t_cdc_toast_{kind}")
    url = postgres_server.url(database, ADMIN_USER, ADMIN_PASSWORD)
    table = str(tmp_path / "docs") if kind == "delta" else "lake.docs"
    options = sink_options(kind, tmp_path)
    big = "(SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, 300) g)"

    def mirrored() -> list[tuple[Any, ...]]:
        data = read_lake(kind, tmp_path, table)
        return sorted(zip(*(data.column(c).to_pylist() for c in ("id", "qty", "body")),
                          strict=True))

    def run(checkpoint: str, **source: str) -> Any:
        job = CoordinatedJob(spark, str(tmp_path / checkpoint))
        changes = PostgresCDC(job).options(tables="public.docs", **source).load(url)
        writer = (LakeSink(job).format(kind).options(mode="merge", **options)
                  .writer(changes, table))
        return job.run(writer.trigger(availableNow=True), timeout_s=300)

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE docs (id bigint PRIMARY KEY, qty int, body text)")
            conn.execute(f"INSERT INTO docs SELECT i, 0, {big} FROM generate_series(1, 40) i")
            stored = conn.execute("SELECT pg_column_size(body) FROM docs WHERE id = 1").fetchone()
            assert stored is not None and stored[0] > 2032  # kept out of line (TOASTed)
            assert run("ckpt").failures == []
            conn.execute("UPDATE docs SET qty = qty + 1 WHERE id <= 30")  # body not sent
            conn.execute(f"UPDATE docs SET body = {big} WHERE id BETWEEN 21 AND 25")  # sent
            conn.execute("UPDATE docs SET qty = qty + 10 WHERE id BETWEEN 21 AND 25")  # not
            conn.execute(f"INSERT INTO docs SELECT i, 5, {big} FROM generate_series(41, 45) i")
            conn.execute("UPDATE docs SET qty = 7 WHERE id >= 41")  # in one batch with its put
            conn.execute("UPDATE docs SET id = id + 1000 WHERE id BETWEEN 36 AND 38")  # key
            assert run("ckpt").failures == []
            expected = [tuple(r) for r in conn.execute(
                "SELECT id, qty, body FROM docs ORDER BY id")]
            assert mirrored() == expected
            # a capture starting from the stream only: the target has no row to keep from
            table = str(tmp_path / "docs2") if kind == "delta" else "lake.docs2"
            assert run("ckpt2", startupMode="latest").failures == []
            conn.execute("UPDATE docs SET qty = 100 WHERE id = 3")
            with pytest.raises(JobGaveUp, match=r"table public\.docs: .*key id = 3.*body"):
                run("ckpt2", startupMode="latest")
    finally:
        postgres_server.drop_slots(database)
