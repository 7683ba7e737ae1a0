"""Reading PostgreSQL tables as a coordinated change stream, the way PySpark reads a source.

    from sparkcoord.sources.postgres import PostgresCDC

    df = (PostgresCDC(job).option("tables", "public.orders,public.customers")
          .load("postgresql://cdc@db.example.com:5432/shop"))

Every row is one change: ``op`` ('r' a snapshot read, 'c' insert, 'u' update, 'd' delete, 't'
truncate), ``table``, ``lsn``/``seq`` (apply rows by key in this order), ``commit_lsn``,
``commit_time``, ``xid``, and ``key``, ``before`` and ``after`` structs (docs/cdc.md).

Options (strings, as every PySpark source's; names case-insensitive):

- ``tables`` (required): ``schema.table`` names separated by commas;
- ``startupMode``: ``initial`` (default: a snapshot of the tables, then the stream) or
  ``latest`` (the stream only, from the slot's position);
- ``chunkSize``: rows per snapshot chunk (default 10000);
- ``chunkKeyColumn``: ``schema.table:column`` pairs separated by commas, for tables whose
  chunk key is not the first primary key column;
- ``slot`` and ``publication``: names (default ``sparkcoord_<hash>``, one per checkpoint
  location and source name); created when missing;
- ``parallelism``: readers (default 2); ``maxChangesPerBatch`` (default 10000);
  ``maxChunksPerBatch`` (chunks one reader reads in a batch, held in its checkpointed state
  until the next batch emits them; default 16);
  ``pollInterval``: how often a streaming source looks for changes (default ``100ms``);
- any libpq connection keyword (``host``, ``port``, ``user``, ``password``, ``sslmode``...)
  overrides the URL's.

Credentials (connection.py rules 1-3): the URL, the options and libpq's environment (``PG*``
variables, the passfile) in the driver program, which reads the tables' shapes when ``load``
is called. A password given in the URL or the options stays in the driver program: the
coordinator (in Spark's source runner) and the readers (in Spark's Python workers) connect
with libpq's own environment there: ``PGPASSWORD`` exported before Spark starts (local mode:
Spark's processes inherit it), ``spark.executorEnv.PGPASSWORD``, a passfile, or certificate
or trust authentication (docs/cdc.md). Thread model: the user's driver program thread.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkcoord.sources.postgres.core.names import TableName, check_simple_name, parse_tables
from sparkcoord.sources.values import parse_int, parse_seconds

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sparkcoord.sources.postgres.io.connection import ConnectionOptions
    from sparkcoord.spark.job import CoordinatedJob
    from sparkcoord.spark.spec import OperatorSpec

#: the source's own options (lower case); every other option is a libpq connection keyword
SOURCE_OPTIONS = ("tables", "startupmode", "chunksize", "chunkkeycolumn", "slot", "publication",
                  "parallelism", "maxchangesperbatch", "maxchunksperbatch", "pollinterval")


@dataclass(frozen=True)
class CdcOptions:
    """The parsed options of a PostgreSQL source (driver program)."""

    tables: tuple[TableName, ...]
    startup: str = "initial"
    chunk_size: int = 10_000
    chunk_key_columns: tuple[tuple[TableName, str], ...] = ()
    slot: str | None = None
    publication: str | None = None
    parallelism: int = 2
    max_changes_per_batch: int = 10_000
    max_chunks_per_batch: int = 16
    poll_interval_s: float = 0.1


def parse_cdc_options(options: dict[str, str]) -> tuple[CdcOptions, dict[str, str]]:
    """The source's options and, apart, the connection keywords (any thread). An error names
    the option."""
    from sparkcoord.sources.postgres.enumerator import STARTUP_MODES

    ours = {k.lower(): v for k, v in options.items() if k.lower() in SOURCE_OPTIONS}
    connection = {k: v for k, v in options.items() if k.lower() not in SOURCE_OPTIONS}
    if "tables" not in ours:
        raise ValueError("option 'tables' is required: the tables to capture, as "
                         "schema.table names separated by commas")
    tables = parse_tables(ours["tables"])
    startup = ours.get("startupmode", "initial").strip().lower()
    if startup not in STARTUP_MODES:
        raise ValueError(f"option 'startupMode': use one of {', '.join(STARTUP_MODES)}, got "
                         f"{ours['startupmode']!r}")
    keys: list[tuple[TableName, str]] = []
    for pair in (p for p in ours.get("chunkkeycolumn", "").split(",") if p.strip()):
        name, sep, column = pair.rpartition(":")
        if not sep or not name.strip() or not column.strip():
            raise ValueError(f"option 'chunkKeyColumn': expected schema.table:column pairs "
                             f"separated by commas, got {pair!r}")
        table = TableName.parse(name)
        if table not in tables:
            raise ValueError(f"option 'chunkKeyColumn' names table {table}, which option "
                             "'tables' does not capture")
        keys.append((table, column.strip()))
    slot = ours.get("slot")
    publication = ours.get("publication")
    parsed = CdcOptions(
        tables=tables, startup=startup,
        chunk_size=parse_int("chunkSize", ours.get("chunksize", "10000")),
        chunk_key_columns=tuple(keys),
        slot=None if slot is None else check_simple_name("option 'slot': slot", slot.strip()),
        publication=None if publication is None else check_simple_name(
            "option 'publication': publication", publication.strip()),
        parallelism=parse_int("parallelism", ours.get("parallelism", "2")),
        max_changes_per_batch=parse_int("maxChangesPerBatch",
                                        ours.get("maxchangesperbatch", "10000")),
        max_chunks_per_batch=parse_int("maxChunksPerBatch", ours.get("maxchunksperbatch", "16")),
        poll_interval_s=parse_seconds("pollInterval", ours.get("pollinterval", "100ms")))
    if parsed.poll_interval_s <= 0:
        raise ValueError(f"option 'pollInterval': must be positive, got "
                         f"{ours['pollinterval']!r}")
    return parsed, connection


def with_table_shapes(struct: Any, shapes: Sequence[Any]) -> Any:
    """``struct`` (the rows' ``StructType``) with each captured table's columns and key on
    its ``after`` field (``core/changestream.py`` rule 1; driver program thread)."""
    from pyspark.sql.types import StructField, StructType

    from sparkcoord.core.changestream import TABLES_METADATA

    tables = {str(shape.table): {"columns": [c.name for c in shape.columns],
                                 "key": list(shape.key)} for shape in shapes}
    return StructType([
        StructField(f.name, f.dataType, f.nullable,
                    {**(f.metadata or {}), TABLES_METADATA: tables} if f.name == "after"
                    else f.metadata)
        for f in struct.fields])


def default_slot_name(checkpoint_dir: str, source: str) -> str:
    """``sparkcoord_`` and a hash of the job's checkpoint location and the source's name:
    stable across restarts of one job, different for two jobs (a slot serves one reader of
    its changes). Any thread."""
    digest = hashlib.sha256(f"{checkpoint_dir}\0{source}".encode()).hexdigest()[:16]
    return f"sparkcoord_{digest}"


class PostgresCDC:
    """Builds a PostgreSQL change-data-capture source on a
    :class:`~sparkcoord.spark.CoordinatedJob`, like ``spark.readStream``: ``option`` /
    ``options``, then ``load(url)`` (module docstring)."""

    def __init__(self, job: CoordinatedJob) -> None:
        self.job = job
        self._options: dict[str, str] = {}

    def option(self, key: str, value: Any) -> PostgresCDC:
        """Set one option (driver program thread); booleans as ``true``/``false``."""
        self._options[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return self

    def options(self, **options: Any) -> PostgresCDC:
        """Set several options (driver program thread)."""
        for key, value in options.items():
            self.option(key, value)
        return self

    def load(self, url: str | None = None, name: str = "postgres") -> DataFrame:
        """The streaming DataFrame of the changes of the tables named by option ``tables`` in
        the database at ``url`` (``postgresql://user@host:port/db``; None: libpq's
        environment). Connects from the driver program to read the tables' shapes (columns,
        key, types; a type values.py does not map comes as its text): an error names a
        missing table, a table without a primary key (name a unique NOT NULL
        ``chunkKeyColumn``), or the refused login. Its
        coordinated operator (and source) is called ``name`` (``job.request(name,
        "status")``). Driver program thread."""
        spec, struct = self.operator_spec(url, name)
        return self.job.sources([spec], struct, name=name)

    def operator_spec(self, url: str | None = None, name: str = "postgres"
                      ) -> tuple[OperatorSpec, Any]:
        """The coordinated operator :meth:`load` runs and the rows' ``StructType`` (driver
        program thread)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        from sparkcoord.sources.postgres.enumerator import (
            PostgresEnumerator,
            PostgresEnumeratorIO,
        )
        from sparkcoord.sources.postgres.io.connection import ConnectionOptions
        from sparkcoord.sources.postgres.reader import PostgresReader, ReaderConfig, arrow_schema
        from sparkcoord.spark.spec import OperatorSpec

        opts, connection = parse_cdc_options(self._options)
        conn_options = ConnectionOptions.parse(url, connection)
        shapes = self._shapes(conn_options, opts)
        slot = opts.slot or default_slot_name(self.job.checkpoint_dir, name)
        publication = opts.publication or slot
        schema = arrow_schema(shapes)
        # a timestamp without time zone is a TimestampNTZ, as Arrow and PostgreSQL see it; the
        # readers emit batches of exactly the Arrow schema Spark derives from this struct
        struct = with_table_shapes(from_arrow_schema(schema, prefer_timestamp_ntz=True),
                                   shapes)
        io = functools.partial(PostgresEnumeratorIO, conn_options, slot, publication,
                               opts.chunk_size, dict(opts.chunk_key_columns))
        # maxChunksPerBatch is a reader's (it bounds what its state holds,
        # docs/decisions/068-cdc-rerun-emits-same.md); the enumerator's limit is per batch for
        # all readers together
        enumerator = functools.partial(
            PostgresEnumerator, io=io, tables=opts.tables, startup=opts.startup,
            max_chunks_per_batch=opts.max_chunks_per_batch * opts.parallelism,
            poll_interval_s=opts.poll_interval_s)
        config = ReaderConfig(conn_options, slot, publication, shapes,
                              max_changes_per_batch=opts.max_changes_per_batch,
                              max_chunks_per_batch=opts.max_chunks_per_batch)
        reader = functools.partial(PostgresReader, config)
        return OperatorSpec(name, enumerator, reader, opts.parallelism), struct

    @staticmethod
    def _shapes(conn_options: ConnectionOptions, opts: CdcOptions) -> tuple[Any, ...]:
        """Each captured table's shape, read from the catalog now (driver program)."""
        from sparkcoord.sources.postgres.core.splits import TableShape
        from sparkcoord.sources.postgres.io import catalog

        keys = dict(opts.chunk_key_columns)
        conn = conn_options.connect(application_name="sparkcoord-cdc-driver", retry_s=0.0)
        try:
            return tuple(TableShape.of(catalog.table_info(conn, table), keys.get(table))
                         for table in opts.tables)
        finally:
            conn.close()
