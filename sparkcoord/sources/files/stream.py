"""Reading files as a coordinated streaming DataFrame, the way PySpark reads them.

    from sparkcoord.sources import FileStream

    df = (FileStream(job).format("json").schema("id long, name string")
          .option("maxFilesPerTrigger", "10").load("s3://bucket/events/"))

Options are strings, named like Spark's file source where they mean the same (parsed and checked
in :mod:`sparkcoord.sources.files.options`). The file source reaches Spark through this builder:
no module of :mod:`sparkcoord.sources.files` imports the adapter (:mod:`sparkcoord.spark`).
Thread model: the user's driver program thread.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import TYPE_CHECKING, Any

from sparkcoord.committer import CommitFunction
from sparkcoord.sources.enumerator import SplitEnumerator
from sparkcoord.sources.files.discovery import FileDiscovery
from sparkcoord.sources.files.metadata import METADATA_COLUMN, metadata_field
from sparkcoord.sources.files.options import (
    FileSourceOptions,
    alignment_options,
    check_record_options,
    parse_options,
)
from sparkcoord.sources.files.reading import FileReader
from sparkcoord.sources.files.schema import infer_schema
from sparkcoord.sources.splits import ReadLimit
from sparkcoord.spark.session import resolve_location, struct_of
from sparkcoord.spark.spec import OperatorSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sparkcoord.spark.job import CoordinatedJob


class FileStream:
    """Builds a coordinated file source on a :class:`~sparkcoord.spark.CoordinatedJob`, like
    ``spark.readStream``: ``format``, ``schema``, ``option``/``options``, then ``load(path)``.
    """

    def __init__(self, job: CoordinatedJob) -> None:
        self.job = job
        self._format = "parquet"
        self._schema: Any = None
        self._options: dict[str, str] = {}
        self._storage_options: dict[str, Any] = {}
        self._committer: CommitFunction | None = None

    def format(self, fmt: str) -> FileStream:
        """``parquet``, ``csv`` or ``json`` (JSON lines)."""
        self._format = fmt.lower()
        return self

    def schema(self, schema: Any) -> FileStream:
        """A DDL string (``"id long, name string"``) or a ``StructType``; without one the schema
        is inferred from the first file."""
        self._schema = schema
        return self

    def option(self, key: str, value: Any) -> FileStream:
        self._options[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return self

    def options(self, **options: Any) -> FileStream:
        for key, value in options.items():
            self.option(key, value)
        return self

    def storage_options(self, **options: Any) -> FileStream:
        """fsspec options for the files' filesystem (credentials, ``client_kwargs``), handed to
        the enumerator and every reader."""
        self._storage_options.update(options)
        return self

    def committer(self, commit: CommitFunction) -> FileStream:
        """Call ``commit(epoch, splits)`` once the batch of ``epoch`` committed, with the
        splits its readers finished (docs/committer.md): on the driver host, in the source's
        process, on a thread of its own; retried until it returns, and again after a restart
        until it was seen done, so it must be idempotent per epoch. It is pickled with the
        source (driver program thread, before ``load``)."""
        self._committer = commit
        return self

    def load(self, path: str, name: str = "files") -> DataFrame:
        """The streaming DataFrame of the files under ``path``; its coordinated operator (and
        source) is called ``name`` (ask it ``job.request(name, "status")``)."""
        spec, struct = self.operator_spec(path, name)
        return self.job.sources([spec], struct, name=name)

    def operator_spec(self, path: str, name: str = "files") -> tuple[OperatorSpec, Any]:
        """The coordinated operator :meth:`load` runs and the rows' ``StructType`` (driver
        program thread): to combine a file source with other operators in one
        ``job.sources([...])``, or to wrap its enumerator or reader."""
        url = resolve_location(self.job.spark, path, "file source path")
        opts = parse_options(url, self._format, self._options, self._storage_options)
        data = self._data_struct(opts)
        struct = self._struct(opts, data)
        check_record_options(opts, data)
        aligned = alignment_options(self._options, struct, name)
        if aligned is not None or self._committer is not None:
            # sources/files rule 8: alignment keeps a lane within max drift plus one file, and a
            # split packing several files of a lane would move it several files at once; a
            # committer written before packing reads ``split.path`` (one file a split) and
            # would leave a pack's other files out of what it publishes
            opts = dataclasses.replace(opts, packing=False)
        limit = ReadLimit(opts.max_files_per_trigger, opts.max_bytes_per_trigger)
        enumerator = functools.partial(
            SplitEnumerator, discovery=FileDiscovery(opts), bounded=opts.bounded,
            discovery_interval_s=opts.discovery_interval_s, limit=limit,
            latest_first=opts.latest_first, alignment=aligned, committer=self._committer)
        # alignment by keyword: wrappers of the reader take (options, schema_json) positionally
        reader = functools.partial(FileReader, opts, json.dumps(struct.jsonValue()),
                                   alignment=aligned)
        return OperatorSpec(name, enumerator, reader, opts.parallelism), struct

    def _struct(self, opts: FileSourceOptions, data: Any = None) -> Any:
        """The rows' ``StructType``, as the source reports it to Spark: the columns of the
        files (``data``, :meth:`_data_struct` if not given), then with ``includeMetadata`` the
        ``_metadata`` column (sources/files rule 7). A schema (given or inferred) that already has
        a ``_metadata`` column is an error then: Spark's hidden column can step aside for a
        data column, this one cannot. Driver program thread, when the source is built."""
        from pyspark.sql.types import StructType

        if data is None:
            data = self._data_struct(opts)
        if not opts.include_metadata:
            return data
        if METADATA_COLUMN in data.fieldNames():
            given = ("the schema given" if self._schema is not None
                     else "the schema inferred from the first file")
            raise ValueError(f"option 'includeMetadata' adds a column {METADATA_COLUMN!r}, but "
                             f"{given} has one already; rename that column, or leave "
                             f"'includeMetadata' off")
        return StructType([*data.fields, metadata_field()])

    def _data_struct(self, opts: FileSourceOptions) -> Any:
        """The columns read from the files: the schema given, or inferred from the first
        file."""
        from pyspark.sql.types import StructType

        if isinstance(self._schema, StructType):
            return self._schema
        if self._schema is not None:
            return struct_of(self.job.spark, str(self._schema))
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(infer_schema(opts), prefer_timestamp_ntz=False)
