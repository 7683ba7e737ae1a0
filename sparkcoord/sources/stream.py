"""Reading files as a coordinated streaming DataFrame, the way PySpark reads them.

    from sparkcoord.sources import FileStream

    df = (FileStream(job).format("json").schema("id long, name string")
          .option("maxFilesPerTrigger", "10").load("s3://bucket/events/"))

Options are strings, named like Spark's file source where they mean the same. Thread model: the
user's driver program thread.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import TYPE_CHECKING, Any

from sparkcoord.committer import CommitFunction
from sparkcoord.sources.alignment import OPTION_NAMES, AlignmentOptions
from sparkcoord.sources.enumerator import SplitEnumerator
from sparkcoord.sources.files import (
    DISCOVERY_MODES,
    FORMATS,
    METADATA_COLUMN,
    FileDiscovery,
    FileReader,
    FileSourceOptions,
    infer_schema,
    metadata_field,
)
from sparkcoord.sources.parsing import MODES, corrupt_column_problem
from sparkcoord.sources.splits import ReadLimit
from sparkcoord.sources.values import parse_seconds
from sparkcoord.spark.session import resolve_location
from sparkcoord.spark.spec import OperatorSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sparkcoord.spark.job import CoordinatedJob

#: option name (lower case) -> (field of FileSourceOptions, parser)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*$", re.IGNORECASE)


def parse_bool(name: str, value: str) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name!r}: expected true or false, got {value!r}")


def parse_int(name: str, value: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"option {name!r}: expected an integer, got {value!r}") from None
    if number < 1:
        raise ValueError(f"option {name!r}: must be >= 1, got {value!r}")
    return number


def parse_bytes(name: str, value: str) -> int:
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"option {name!r}: expected a size like 1048576, 64m or 1g, got {value!r}")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[match[2].lower()]
    number = int(float(match[1]) * scale)
    if number < 1:
        raise ValueError(f"option {name!r}: must be at least 1 byte, got {value!r}")
    return number


def parse_mode(name: str, value: str) -> str:
    """Spark's reader mode, in any case (Spark takes an unknown one for PERMISSIVE with a
    warning; here it is an error naming the option)."""
    mode = str(value).strip().upper()
    if mode not in MODES:
        raise ValueError(f"option {name!r}: use one of {', '.join(MODES)} (any case), got "
                         f"{value!r}")
    return mode


def parse_column_name(name: str, value: str) -> str:
    text = str(value)
    if not text.strip():
        raise ValueError(f"option {name!r}: expected a column name, got {value!r}")
    return text


def parse_separator(name: str, value: str) -> str:
    """CSV's delimiter: one character (pyarrow reads no longer one), or ``\\t`` for a tab."""
    text = "\t" if str(value) == "\\t" else str(value)
    if len(text) != 1:
        raise ValueError(f"option {name!r}: expected one character (or \\t for a tab), got "
                         f"{value!r}")
    return text


OPTIONS: dict[str, tuple[str, Any]] = {
    "pathglobfilter": ("glob", lambda n, v: str(v)),
    "recursivefilelookup": ("recursive", parse_bool),
    "latestfirst": ("latest_first", parse_bool),
    "bounded": ("bounded", parse_bool),
    "maxfilespertrigger": ("max_files_per_trigger", parse_int),
    "maxbytespertrigger": ("max_bytes_per_trigger", parse_bytes),
    "maxsplitbytes": ("max_split_bytes", parse_bytes),
    "maxfilesperdiscovery": ("max_files_per_discovery", parse_int),
    "discoveryinterval": ("discovery_interval_s", parse_seconds),
    "backfillinterval": ("backfill_interval_s", parse_seconds),
    "maxclockskew": ("max_clock_skew_s", parse_seconds),
    "discoverymode": ("discovery_mode", lambda n, v: str(v).lower()),
    "maxfileage": ("max_file_age_s", parse_seconds),
    "parallelism": ("parallelism", parse_int),
    "header": ("header", parse_bool),
    "sep": ("sep", parse_separator),
    "delimiter": ("sep", parse_separator),
    "batchrows": ("batch_rows", parse_int),
    "mode": ("mode", parse_mode),
    "columnnameofcorruptrecord": ("corrupt_column", parse_column_name),
    "includemetadata": ("include_metadata", parse_bool),
    "maxpartitionbytes": ("max_partition_bytes", parse_bytes),
    "opencostinbytes": ("open_cost_bytes", parse_bytes),
    "prefetchfiles": ("prefetch_files", parse_int),
}
#: options of the text formats only (a parquet file has no records to be malformed)
TEXT_OPTIONS = ("mode", "columnnameofcorruptrecord")


def parse_options(url: str, fmt: str, options: dict[str, str],
                  storage_options: dict[str, Any] | None = None) -> FileSourceOptions:
    """The options of a file source, parsed; an unknown option or a bad value is an error that
    names it."""
    if fmt not in FORMATS:
        raise ValueError(f"file format {fmt!r} is not supported; use one of {', '.join(FORMATS)}")
    fields: dict[str, Any] = {}
    for name, value in options.items():
        if name.lower() in OPTION_NAMES:
            continue  # watermark alignment's: alignment_options() reads them
        known = OPTIONS.get(name.lower())
        if known is None:
            raise ValueError(f"unknown file source option {name!r}; known options: "
                             f"{', '.join(sorted([*OPTIONS, *OPTION_NAMES]))}")
        if fmt == "parquet" and name.lower() in TEXT_OPTIONS:
            raise ValueError(f"option {name!r} applies to csv and json; a parquet file that "
                             f"cannot be read fails its reader, naming the file and row group")
        fields[known[0]] = known[1](name, value)
    parsed = FileSourceOptions(url=url, format=fmt, storage_options=dict(storage_options or {}),
                               **fields)
    if parsed.discovery_mode not in DISCOVERY_MODES:
        raise ValueError(f"option 'discoveryMode': use one of {', '.join(DISCOVERY_MODES)}, got "
                         f"{parsed.discovery_mode!r}")
    return parsed


def check_record_options(opts: FileSourceOptions, struct: Any) -> None:
    """The corrupt-record column of a CSV or JSON source (option ``columnNameOfCorruptRecord``,
    default ``_corrupt_record``), if the rows' ``StructType`` has it, is a nullable string and
    not the only column (Spark's rule). ``struct``: the columns read from the files (without
    ``_metadata``). Driver program thread, when the source is built: an error here rather
    than in every task."""
    if opts.format not in ("csv", "json"):
        return
    if opts.include_metadata and opts.corrupt_column == METADATA_COLUMN:
        raise ValueError(f"option 'columnNameOfCorruptRecord' cannot be {METADATA_COLUMN!r} "
                         f"with 'includeMetadata': that column holds the file metadata")
    from pyspark.sql.pandas.types import to_arrow_schema

    problem = corrupt_column_problem(to_arrow_schema(struct, timezone="UTC"),
                                     opts.corrupt_column)
    if problem is not None:
        raise ValueError(problem)


def alignment_options(options: dict[str, str], struct: Any,
                      name: str) -> AlignmentOptions | None:
    """The watermark alignment of a file source (docs/alignment.md), or ``None`` without
    ``maxDrift``. Driver program thread, when the source is built. ``struct`` is the rows'
    ``StructType``: ``eventTimeColumn`` is required (a file reader takes event times from a
    column) and must name a timestamp, date or integer (epoch ms) column of it; any problem is
    an error naming the option."""
    aligned = AlignmentOptions.from_options(options, default_group=name)
    if aligned is None:
        return None
    column = aligned.event_time_column
    if not column:
        raise ValueError("option 'eventTimeColumn' is needed with 'maxDrift': a file source "
                         "aligns splits by the greatest value of that column it has read")
    fields = {f.name: f for f in struct.fields}
    if column in fields and fields[column] == metadata_field():  # includeMetadata's column
        raise ValueError(f"option 'eventTimeColumn': {column!r} is the file metadata column "
                         f"(a struct); align by an event time column of the records")
    if column not in fields:
        raise ValueError(f"option 'eventTimeColumn': {column!r} is not a column of the source "
                         f"({', '.join(fields)})")
    kind = fields[column].dataType.typeName()
    if kind not in ("timestamp", "timestamp_ntz", "date", "long", "integer"):
        raise ValueError(f"option 'eventTimeColumn': column {column!r} is a {kind}; use a "
                         f"timestamp, a date or a long of epoch milliseconds")
    return aligned


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
            # files.py rule 8: alignment keeps a lane within max drift plus one file, and a
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
        ``_metadata`` column (files.py rule 7). A schema (given or inferred) that already has
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
            return self.job.spark.createDataFrame([], str(self._schema)).schema
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(infer_schema(opts), prefer_timestamp_ntz=False)
