"""A file source's options: named like Spark's file source where they mean the same, given as
strings to :class:`~sparkcoord.sources.files.stream.FileStream`, parsed into
:class:`FileSourceOptions` and checked against the rows' schema.

Runs in the user's driver program thread, when ``FileStream`` builds the source: an unknown
option or a bad value is an error there, naming the option, not in every task. The parsed
:class:`FileSourceOptions` is a frozen value; it travels pickled with the enumerator (Spark's
Python source runner process) and the reader (Spark's Python workers). Rule numbers are the
package's (:mod:`sparkcoord.sources.files`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkcoord.core.text import parse_bytes
from sparkcoord.sources.alignment import OPTION_NAMES, AlignmentOptions
from sparkcoord.sources.files.metadata import METADATA_COLUMN, metadata_field
from sparkcoord.sources.files.parsing import MODES, corrupt_column_problem
from sparkcoord.sources.values import parse_int, parse_seconds

FORMATS = ("parquet", "csv", "json")
DISCOVERY_MODES = ("listing", "lexical")


@dataclass(frozen=True)
class FileSourceOptions:
    """Parsed options of a file source (see :func:`parse_options` for the option names)."""

    url: str
    format: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    glob: str | None = None
    recursive: bool = False
    latest_first: bool = False
    bounded: bool = False
    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    max_split_bytes: int = 64 << 20
    max_files_per_discovery: int = 10_000
    discovery_interval_s: float = 1.0
    backfill_interval_s: float = 600.0
    max_clock_skew_s: float = 10.0
    discovery_mode: str = "listing"
    max_file_age_s: float = 7 * 86400.0
    parallelism: int = 2
    header: bool = False
    sep: str = ","
    batch_rows: int = 1 << 16
    #: CSV and JSON: what a malformed record becomes (sparkcoord.sources.files.parsing, rule 4)
    mode: str = "PERMISSIVE"
    #: CSV and JSON: the column that holds a malformed record's text, if the schema has it
    corrupt_column: str = "_corrupt_record"
    #: rule 7: the rows end with Spark's file metadata column ``_metadata``
    include_metadata: bool = False
    #: rule 8: the bytes of small files packed into one split, each counted at least
    #: ``open_cost_bytes`` (Spark's ``maxPartitionBytes`` and ``openCostInBytes``)
    max_partition_bytes: int = 128 << 20
    open_cost_bytes: int = 4 << 20
    #: rule 8: members of a packed split a reader fetches ahead (remote filesystems)
    prefetch_files: int = 8
    #: rule 8: small files are packed (off with watermark alignment: set by FileStream)
    packing: bool = True




def parse_bool(name: str, value: str) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name!r}: expected true or false, got {value!r}")


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


#: option name (lower case) -> (field of FileSourceOptions, parser)
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
