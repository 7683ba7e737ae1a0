"""The PostgreSQL source's builder (sparkcoord/sources/postgres/stream.py) without a Spark session:
its options (each error names the option), the tables' shapes read from a real server when the
source is built, the Spark schema, the slot's default name, and a refused login that never shows
the password."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import pytest

from sparkcoord.sources.postgres import PostgresCDC
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.enumerator import INITIAL, LATEST
from sparkcoord.sources.postgres.stream import default_slot_name, parse_cdc_options
from tests.postgres_server import ADMIN_PASSWORD, ADMIN_USER, PostgresServer


@dataclass
class StubJob:
    """What the builder reads of a CoordinatedJob before it hands the source to Spark."""

    checkpoint_dir: str = "file:///tmp/jobs/orders-mirror"


def test_options_are_parsed_with_defaults_and_each_error_names_its_option() -> None:
    opts, connection = parse_cdc_options({"tables": "public.a, b", "sslmode": "disable",
                                          "ChunkSize": "500"})
    assert opts.tables == (TableName("public", "a"), TableName("public", "b"))
    assert (opts.startup, opts.chunk_size, opts.parallelism, opts.max_chunks_per_batch,
            opts.max_changes_per_batch, opts.poll_interval_s) == (INITIAL, 500, 2, 16, 10_000, 0.1)
    assert connection == {"sslmode": "disable"}  # everything else is a libpq keyword
    assert parse_cdc_options({"tables": "a", "startupMode": "LATEST"})[0].startup == LATEST
    for options, named in [({}, "'tables'"), ({"tables": "a", "startupMode": "earliest"},
                                              "'startupMode'"),
                           ({"tables": "a", "chunkSize": "0"}, "'chunkSize'"),
                           ({"tables": "a", "pollInterval": "soon"}, "'pollInterval'"),
                           ({"tables": "a", "slot": "Bad-Name"}, "option 'slot'"),
                           ({"tables": "a", "chunkKeyColumn": "public.b:id"}, "'chunkKeyColumn'"),
                           ({"tables": "a, a"}, "named twice")]:
        with pytest.raises(ValueError, match=named):
            parse_cdc_options(options)


def test_the_default_slot_is_one_per_checkpoint_location_and_source_and_a_valid_name() -> None:
    a = default_slot_name("file:///jobs/a", "postgres")
    assert a == default_slot_name("file:///jobs/a", "postgres")  # a restart finds its slot
    assert a != default_slot_name("file:///jobs/b", "postgres")
    assert a != default_slot_name("file:///jobs/a", "other")
    assert a.startswith("sparkcoord_") and len(a) <= 63 and a == a.lower()


def test_building_the_source_reads_the_shapes_and_ships_no_password(
        postgres_server: PostgresServer, database: str, admin: Any) -> None:
    admin.execute("CREATE TABLE built (id bigint PRIMARY KEY, amount numeric(9,3), "
                  "at timestamp, seen timestamptz, tags text)")
    url = postgres_server.url(database, ADMIN_USER, ADMIN_PASSWORD)
    spec, struct = PostgresCDC(StubJob()).option("tables", "public.built").operator_spec(url)
    after = struct["after"].dataType
    assert [f.name for f in after.fields] == ["id", "amount", "at", "seen", "tags"]
    assert after["amount"].dataType.simpleString() == "decimal(9,3)"
    assert after["at"].dataType.simpleString() == "timestamp_ntz"
    assert after["seen"].dataType.simpleString() == "timestamp"
    assert struct["op"].nullable is False
    config = spec.operator.args[0]
    # maxChunksPerBatch (16) is each reader's: the enumerator hands out 16 per reader a batch
    assert config.max_chunks_per_batch == 16
    assert spec.coordinator.keywords["max_chunks_per_batch"] == 16 * spec.parallelism == 32
    assert config.slot == default_slot_name(StubJob.checkpoint_dir, "postgres")
    assert config.publication == config.slot
    # what Spark pickles and ships to its processes holds no password
    shipped = pickle.dumps((spec.coordinator, spec.operator))
    assert ADMIN_PASSWORD.encode() not in shipped


def test_a_refused_login_names_the_server_and_user_and_never_the_password(
        postgres_server: PostgresServer, database: str) -> None:
    url = postgres_server.url(database, ADMIN_USER, "not-" + ADMIN_PASSWORD)
    with pytest.raises(Exception) as refused:
        PostgresCDC(StubJob()).option("tables", "public.built").load(url)
    text = str(refused.value)
    assert ADMIN_USER in text and str(postgres_server.port) in text
    assert ADMIN_PASSWORD not in text


def test_a_missing_table_is_an_error_naming_it(postgres_server: PostgresServer,
                                               database: str) -> None:
    url = postgres_server.url(database, ADMIN_USER, ADMIN_PASSWORD)
    with pytest.raises(Exception, match=r"table public\.nowhere does not exist"):
        PostgresCDC(StubJob()).option("tables", "public.nowhere").operator_spec(url)


def test_a_table_without_a_primary_key_is_taken_only_by_a_unique_not_null_chunk_key(
        postgres_server: PostgresServer, database: str, admin: Any) -> None:
    """Without a primary key the chunk key column is the row key: equal values would collapse
    into one row, so it must be unique and NOT NULL."""
    admin.execute("CREATE TABLE nokey (n int NOT NULL, u int NOT NULL, w int, note text)")
    admin.execute("CREATE UNIQUE INDEX nokey_u ON nokey (u)")
    admin.execute("CREATE UNIQUE INDEX nokey_w ON nokey (w)")
    url = postgres_server.url(database, ADMIN_USER, ADMIN_PASSWORD)

    def build(column: str) -> Any:
        return (PostgresCDC(StubJob()).options(tables="public.nokey", chunkKeyColumn=
                                               f"public.nokey:{column}").operator_spec(url))

    for column in ("n", "w"):  # not unique; unique but nullable
        with pytest.raises(Exception, match=rf"table public.nokey has no primary key, and its "
                                            rf"chunk key column '{column}' is not a unique NOT NULL"):
            build(column)
    spec, _ = build("u")
    assert spec.operator.args[0].shape(TableName("public", "nokey")).key == ("u",)
