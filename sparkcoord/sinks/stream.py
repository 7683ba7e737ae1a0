"""Writing a coordinated streaming DataFrame into a Delta Lake or Iceberg table, exactly once.

    from sparkcoord.sinks import LakeSink

    df = FileStream(job).format("json").schema("id long, name string").load(path)
    writer = (LakeSink(job).format("delta").option("targetFileSize", "128m")
              .writer(df, "/lake/events"))
    job.run(writer.trigger(availableNow=True))

    # Iceberg, in any catalog pyiceberg can load (here its SQL catalog on sqlite)
    writer = (LakeSink(job).format("iceberg")
              .option("catalog.uri", "sqlite:////lake/catalog.db")
              .option("catalog.warehouse", "file:///lake/warehouse")
              .writer(df, "db.events"))

``writer`` is the query's ``DataStreamWriter``: set its trigger and query name as usual and
hand it to ``job.run`` or ``job.start``. The DataFrame must come from a coordinated source of
``job`` (``FileStream``, ``PostgresCDC``, ``job.sources``): the sink is a downstream operator of
that source (``job.attach``, ``job.apply``), whose coordinator, hosted by the source's
service, commits each epoch's files once the epoch's batch committed in Spark
(``coordinator.py``); its tasks write the files (``task.py``).

Options (strings, as Spark's):
  - ``jobId``: who writes, as the table records it (default ``sc`` and a hash of the job's
    checkpoint location and the table: one per checkpoint); a second query writing under the
    same job id is refused, and so is a checkpoint behind the table (``fencing.py``).
  - ``mode``: ``append`` (default: the rows are the table's) or ``merge`` (Delta: the rows are
    the PostgreSQL source's change stream of one captured table, applied to the table by key
    each epoch: ``changes.py``; the table's columns are those of ``after``).
  - ``sourceTable``: mode ``merge`` of a change stream capturing several tables: the one
    this sink mirrors (``schema.table``); its rows, key and columns only (:func:`one_table`).
  - ``targetFileSize``: roll to a new data file at this size (default ``128m``).
  - ``compaction``: ``true`` to rewrite small files of earlier epochs into files of the
    target size, swapped in with a later epoch's commit (mode ``append``; default ``false``:
    ``compaction.py``); ``compactionMaxFiles``: at most this many files into one (100).
  - ``parallelism``: at most how many tasks write (default: Spark's default parallelism):
    the DataFrame's partitions are coalesced to it, without a shuffle (as Spark's own file
    sinks write each partition where it is).
  - ``source``: the coordinated source of the DataFrame, when the job has several.
  - ``name``: the sink's operator name (default ``sink``); ``job.request`` takes it.
  - ``catalog``: Iceberg only, the catalog's name (default ``default``); ``catalog.<key>``:
    its properties for ``pyiceberg.catalog.load_catalog`` (pyiceberg's configuration file
    and environment apply too).
  - ``storage_options(**)``: options of the table's storage (an S3 endpoint, a region),
    each given to fsspec, delta-rs and pyiceberg's FileIO in its own names
    (``target.storage_options_for``; docs/sinks.md, "On S3").
No option may carry a credential (``target.py``): credentials come from each process's
environment. Thread model: the user's driver program thread.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Any

from sparkcoord.core.changestream import TABLES_METADATA, tables_of
from sparkcoord.core.text import parse_bytes
from sparkcoord.sinks.changes import key_names, table_schema
from sparkcoord.sinks.compaction import DEFAULT_MAX_FILES
from sparkcoord.sinks.coordinator import sink_coordinator
from sparkcoord.sinks.target import (
    FORMATS,
    SinkTarget,
    refuse_credentials,
    storage_options_for,
)
from sparkcoord.sinks.task import sink_subtask
from sparkcoord.spark.session import resolve_location
from sparkcoord.spark.spec import OperatorSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from sparkcoord.spark.job import CoordinatedJob

_OPTIONS = {"jobid", "targetfilesize", "parallelism", "source", "name", "catalog", "mode",
            "compaction", "compactionmaxfiles", "sourcetable"}


class LakeSink:
    """Builds a lake sink on a :class:`~sparkcoord.spark.CoordinatedJob`, like
    ``df.writeStream``: ``format``, ``option``/``options``, ``storage_options``, then
    :meth:`writer`."""

    def __init__(self, job: CoordinatedJob) -> None:
        self.job = job
        self._format = "delta"
        self._options: dict[str, str] = {}
        self._storage_options: dict[str, Any] = {}

    def format(self, fmt: str) -> LakeSink:
        """``delta`` or ``iceberg``."""
        self._format = fmt.lower()
        if self._format not in FORMATS:
            raise ValueError(f"a lake sink writes {' or '.join(FORMATS)}, not {fmt!r}")
        return self

    def option(self, key: str, value: Any) -> LakeSink:
        if not key.lower().startswith("catalog.") and key.lower() not in _OPTIONS:
            raise ValueError(f"unknown lake sink option {key!r}: use one of jobId, mode, "
                             f"sourceTable, targetFileSize, compaction, compactionMaxFiles, "
                             f"parallelism, source, name, catalog, catalog.<property>")
        refuse_credentials({key: value}, "lake sink")
        self._options[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return self

    def options(self, **options: Any) -> LakeSink:
        for key, value in options.items():
            self.option(key, value)
        return self

    def storage_options(self, **options: Any) -> LakeSink:
        """Options of the table's storage (an S3 endpoint, a region; driver program thread),
        handed to the coordinator and every task, each library's in its names
        (``target.storage_options_for``: the S3 settings by any of their names, ``fsspec.<k>``
        and ``delta.<k>`` for one library); no credentials (``target.py``)."""
        refuse_credentials(options, "storage")
        merged = {**self._storage_options, **options}
        for library in ("fsspec", "delta", "iceberg"):
            storage_options_for(library, merged)  # a conflict fails here, where it was made
        # values as given: fsspec takes bools and numbers (``anon=False`` as a string would be
        # true); delta-rs's strings are made by storage_options_for
        self._storage_options = merged
        return self

    def writer(self, df: DataFrame, table: str) -> DataStreamWriter:
        """The ``DataStreamWriter`` of a query that writes ``df`` into ``table`` (a Delta
        table's path or URL; an Iceberg table's identifier). Attaches the sink's operator to
        ``df``'s coordinated source (``job.attach``), so call it before the query starts.
        An Iceberg table is created here if missing (its tasks need the location the catalog
        gives it); a Delta table by its first commit."""
        if self._lowered().get("mode", "append").lower() == "merge":
            df = one_table(df, self._lowered().get("sourcetable"))
        return self.writer_of(df, self.operator_spec(df, table))

    def writer_of(self, df: DataFrame, spec: OperatorSpec) -> DataStreamWriter:
        """:meth:`writer` for an operator made by :meth:`operator_spec` and maybe wrapped (the
        tests' faults): attaches it to ``df``'s coordinated source and applies it."""
        source = self.job.attach(spec, self._lowered().get("source"))
        # no shuffle, as Spark's file sinks: each task writes the partitions it has
        written = self.job.apply(df, spec.name, "written long", source=source, shuffle=False)
        return written.writeStream.format("noop")

    def operator_spec(self, df: DataFrame, table: str) -> OperatorSpec:
        """The downstream operator :meth:`writer` attaches (driver program thread): to wrap its
        coordinator or subtask (the tests' faults) before attaching it yourself."""
        from pyspark.sql.pandas.types import to_arrow_schema

        lowered = self._lowered()
        # timestamps as UTC instants (Spark hands them in its session time zone: a cast of
        # the zone only); both table formats store UTC
        rows_schema = to_arrow_schema(df.schema, timezone="UTC")
        mode = lowered.get("mode", "append").lower()
        schema, keys = rows_schema, tuple[str, ...]()
        if mode == "merge":
            captured = tables_of(_after_metadata(df))
            if len(captured) > 1:  # core/changestream.py rule 2
                raise ValueError(_several_tables(captured))
            schema, keys = table_schema(rows_schema), tuple(key_names(rows_schema))
        if self._format == "delta":
            table = resolve_location(self.job.spark, table, "Delta table")
        catalog = {k[len("catalog."):]: v for k, v in self._options.items()
                   if k.lower().startswith("catalog.")}
        io = storage_options_for("iceberg", self._storage_options)
        for key, value in io.items() if self._format == "iceberg" else ():
            # the catalog's FileIO writes the table's metadata where the tasks write its data
            if str(catalog.setdefault(key, value)) != str(value):
                raise ValueError(f"storage option {key} is {value!r}, option catalog.{key} "
                                 f"{catalog[key]!r}: the table's metadata and its data files "
                                 "would go to different places; give one")
        target = SinkTarget(
            self._format, table, lowered.get("jobid") or self._default_job_id(table), schema,
            table, storage_options=storage_options_for("fsspec", self._storage_options),
            delta_options=storage_options_for("delta", self._storage_options),
            catalog_name=lowered.get("catalog", "default"), catalog=catalog,
            target_file_bytes=parse_bytes("targetFileSize",
                                          lowered.get("targetfilesize", "128m")),
            mode=mode, input_schema=rows_schema if mode == "merge" else None, keys=keys,
            compaction=_flag("compaction", lowered.get("compaction", "false")),
            compaction_max_files=int(lowered.get("compactionmaxfiles", DEFAULT_MAX_FILES)))
        if self._format == "iceberg":
            target = dataclasses.replace(target, location=target.committer().prepare_table())
        parallelism = int(lowered.get("parallelism") or
                          self.job.spark.sparkContext.defaultParallelism)
        if parallelism < 1:
            raise ValueError(f"option 'parallelism': must be >= 1, got {parallelism}")
        return OperatorSpec(lowered.get("name", "sink"), sink_coordinator(target),
                            sink_subtask(target), parallelism)

    def _lowered(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self._options.items()}

    def _default_job_id(self, table: str) -> str:
        digest = hashlib.sha256(f"{self.job.checkpoint_dir}\0{table}".encode()).hexdigest()
        return f"sc{digest[:16]}"


def one_table(df: DataFrame, source_table: str | None) -> DataFrame:
    """Mode ``merge``: ``df``'s rows of ``source_table`` (option ``sourceTable``), with the
    ``key``, ``before`` and ``after`` structs cut to that table's own columns and key
    (``core/changestream.py`` rule 2; driver program thread). A change stream of one table is
    returned as it is; one of several without ``source_table`` is refused, naming its tables
    and the way on, before anything is written."""
    from pyspark.sql import functions as F

    captured = tables_of(_after_metadata(df))
    if source_table is None:
        if len(captured) > 1:
            raise ValueError(_several_tables(captured))
        return df
    name = source_table if "." in source_table else f"public.{source_table}"
    if name not in captured:
        raise ValueError(
            f"lake sink option sourceTable {source_table!r}: the change stream carries "
            + (f"the tables {', '.join(sorted(captured))}" if captured else
               "no table names (it is not the PostgreSQL source's change stream)"))
    shape = captured[name]

    def cut(column: str, fields: list[str]) -> Any:
        cut = F.when(F.col(column).isNull(), F.lit(None)).otherwise(
            F.struct(*[F.col(column)[f].alias(f) for f in fields]))
        if column == "after":  # the cut stream still says which table it holds
            return cut.alias(column, metadata={TABLES_METADATA: {name: shape}})
        return cut.alias(column)

    fields = {"key": shape["key"], "before": shape["columns"], "after": shape["columns"]}
    return df.where(F.col("table") == F.lit(name)).select(*[
        cut(c, fields[c]) if c in fields else F.col(f"`{c}`") for c in df.columns])


def _after_metadata(df: DataFrame) -> dict[str, Any] | None:
    field = next((f for f in df.schema.fields if f.name == "after"), None)
    return None if field is None else field.metadata


def _several_tables(captured: dict[str, Any]) -> str:
    names = sorted(captured)
    return (f"lake sink mode 'merge': the change stream carries {len(names)} tables "
            f"({', '.join(names)}); a sink mirrors one table by its own key and columns. "
            f"Name it: LakeSink(job).option('mode', 'merge').option('sourceTable', "
            f"'{names[0]}').writer(changes, ...), one sink per table (a filter on the "
            f"'table' column alone keeps the other tables' key columns, and the merge would "
            f"join on them)")


def _flag(name: str, value: str) -> bool:
    if value.strip().lower() not in ("true", "false"):
        raise ValueError(f"lake sink option {name!r}: use true or false, not {value!r}")
    return value.strip().lower() == "true"
