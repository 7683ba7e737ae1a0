"""The data files a sink's tasks write, and what a task reports for each one.

A task of a lake sink writes parquet files into the table's location and reports each file to
the coordinator; the coordinator commits an epoch's reported files in one table transaction
(``formats/delta/``, ``formats/iceberg/``). The report carries everything both table formats
need to add the file without opening it again on the driver: the path relative to the table,
the row count, the size, and per-column statistics (Delta's ``minValues``/``maxValues``/
``nullCount`` in an add action's ``stats``; Iceberg's ``lower_bounds``/``upper_bounds``/
``null_value_counts``/``value_counts``/``column_sizes`` of a ``DataFile``).

Rules:
  1. A data file's name says who wrote it: the job id, the epoch, the subtask, Spark's task
     attempt number and a token drawn once per writer, then a sequence number
     (:func:`data_file_name`). So the files of a failed attempt, or of an earlier run's attempt
     at the same epoch, are told apart from the reported ones by name alone, and a file that
     does not parse as ours (another writer's) is never ours to delete (``cleanup.py``).
  2. A file is reported only once it is closed: its footer is written, so its size and
     statistics are final. A task that dies before closing leaves a file nobody reported,
     which cleanup deletes.
  3. Statistics are exact or absent. Parquet omits min/max for some columns (all nulls, NaN
     floats, some types); a value we cannot represent exactly (a string longer than
     :data:`MAX_BOUND_CHARS`, binary, nested columns) is left out rather than truncated,
     because a truncated max is below the real one and a table's data skipping would then
     skip rows that match. Null counts are always kept.
  4. A writer rolls to a new file once the current one reached ``target_file_bytes`` (checked
     after each row group, so a file overshoots by at most one row group).

Thread model: :class:`TaskFileWriter` is used from one Spark task thread; the reports are
immutable values (pickled to the coordinator as events).
"""

from __future__ import annotations

import datetime
import decimal
import posixpath
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkcoord.core.encoding import encoded

#: Bounds of string columns longer than this are left out (rule 3): Delta's readers compare
#: prefixes of 32 characters, Iceberg's of 16; we keep exact values of modest length.
MAX_BOUND_CHARS = 64

#: Python types a bound may have (rule 3); anything else is dropped.
_BOUND_TYPES = (bool, int, float, str, datetime.date, datetime.datetime, decimal.Decimal)

_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,100}")
_NAME = re.compile(r"sc-(?P<job>[A-Za-z0-9_-]{1,100})\.e(?P<epoch>\d+)\.s(?P<subtask>\d+)"
                   r"\.a(?P<attempt>\d+)\.(?P<token>[0-9a-f]{12})\.(?P<seq>\d+)\.parquet")

#: Where, inside the table's location, the sink's data files go (both formats allow any path
#: under the table; Iceberg's own writers use ``data/``).
DATA_DIR = "data"


@encoded("sinks.ColumnStats")
@dataclass(frozen=True, slots=True)
class ColumnStats:
    """One column's statistics over a whole file; ``None`` where unknown (rule 3)."""

    null_count: int | None
    min: Any = None
    max: Any = None
    #: bytes of the column's chunks in the file (compressed), for Iceberg's column_sizes
    size: int = 0


@encoded("sinks.DataFile")
@dataclass(frozen=True, slots=True)
class DataFile:
    """What a task reports for one data file it wrote and closed (rule 2)."""

    #: relative to the table's location, posix style (``data/sc-....parquet``)
    path: str
    rows: int
    bytes: int
    #: per top-level column, in the file's column order: (name, statistics)
    columns: tuple[tuple[str, ColumnStats], ...]

    @property
    def stats(self) -> Mapping[str, ColumnStats]:
        return dict(self.columns)

    @property
    def name(self) -> FileName | None:
        """Who wrote it, from its name (rule 1)."""
        return parse_file_name(posixpath.basename(self.path))


@dataclass(frozen=True, slots=True)
class FileName:
    """The parts of one of our data files' names (rule 1)."""

    job_id: str
    epoch: int
    subtask: int
    attempt: int
    token: str
    seq: int


def check_job_id(job_id: str) -> str:
    """``job_id`` if it can stand in file names and table properties; ValueError otherwise."""
    if not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"a sink's job id must be 1-100 characters of letters, digits, '_' "
                         f"and '-', got {job_id!r}")
    return job_id


def data_file_name(job_id: str, epoch: int, subtask: int, attempt: int, token: str,
                   seq: int) -> str:
    """The base name of a data file (rule 1)."""
    return (f"sc-{check_job_id(job_id)}.e{epoch}.s{subtask}.a{attempt}.{token}.{seq}"
            f".parquet")


def parse_file_name(name: str) -> FileName | None:
    """The parts of ``name`` if it is one of our data files' base names, else ``None``."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    return FileName(m["job"], int(m["epoch"]), int(m["subtask"]), int(m["attempt"]),
                    m["token"], int(m["seq"]))


def report_from_metadata(path: str, size: int, metadata: Any) -> DataFile:
    """The report of the file at ``path`` (relative to the table) of ``size`` bytes, from its
    ``pyarrow.parquet.FileMetaData`` (rule 3). Called wherever the footer is at hand: by the
    writer that just closed the file, or by a test."""
    leaves: dict[str, list[Any]] = {}
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            leaves.setdefault(chunk.path_in_schema, []).append(chunk)
    columns = []
    for name in metadata.schema.to_arrow_schema().names:
        chunks = leaves.get(name)
        if chunks is None:
            continue  # a nested column: its leaves are named "name.child" (rule 3)
        columns.append((name, _column_stats(chunks)))
    return DataFile(path, metadata.num_rows, size, tuple(columns))


def _column_stats(chunks: list[Any]) -> ColumnStats:
    nulls, size = 0, 0
    # plain Any: parquet's bounds are ints, strings, dates... compared within one column
    low: Any = None
    high: Any = None
    exact = True
    for chunk in chunks:
        size += chunk.total_compressed_size
        s = chunk.statistics
        if s is None or not s.has_null_count:
            # without a null count nothing is known of the column in this file (rule 3);
            # pyarrow always writes them, other writers may not
            return ColumnStats(None, None, None, sum(c.total_compressed_size for c in chunks))
        nulls += s.null_count
        if s.num_values == 0:
            continue  # all nulls in this row group: no bounds, and no bound needed
        if not s.has_min_max or not _exact_bound(s.min) or not _exact_bound(s.max):
            exact = False
            continue
        low = s.min if low is None or s.min < low else low
        high = s.max if high is None or s.max > high else high
    if not exact:
        low = high = None
    return ColumnStats(nulls, low, high, size)


def _exact_bound(value: Any) -> bool:
    if isinstance(value, float) and value != value:
        return False  # NaN: no order
    if isinstance(value, str):
        return len(value) <= MAX_BOUND_CHARS
    return isinstance(value, _BOUND_TYPES)


class TaskFileWriter:
    """Writes one task attempt's rows into parquet files under the table's location.

    Created by a sink's task (Spark task thread) for its epoch; :meth:`write` takes pyarrow
    Tables or RecordBatches of ``schema``; :meth:`close` closes the open file and returns the
    reports of every file written, in order, to be sent to the coordinator (rule 2).
    """

    def __init__(self, location: str, job_id: str, epoch: int, subtask: int, attempt: int,
                 schema: Any, *, target_file_bytes: int = 128 << 20,
                 row_group_rows: int = 64 * 1024,
                 storage_options: Mapping[str, Any] | None = None,
                 filesystem: Any = None, compression: str = "zstd") -> None:
        """``location``: the table's root (a local path or an fsspec URL such as
        ``s3://bucket/table``); ``filesystem``: an fsspec filesystem to use instead of one
        made from ``location`` and ``storage_options``."""
        if target_file_bytes <= 0 or row_group_rows <= 0:
            raise ValueError(f"target_file_bytes and row_group_rows must be > 0, got "
                             f"{target_file_bytes} and {row_group_rows}")
        self.job_id = check_job_id(job_id)
        self.epoch, self.subtask, self.attempt = epoch, subtask, attempt
        self.schema = schema
        self.target_file_bytes = target_file_bytes
        self.row_group_rows = row_group_rows
        self.compression = compression
        if filesystem is None:
            from fsspec.core import url_to_fs

            filesystem, root = url_to_fs(location, **dict(storage_options or {}))
        else:
            root = filesystem._strip_protocol(location)
        self._fs = filesystem
        self._root = root.rstrip("/")
        #: one token per writer: a retry of the same attempt number (a replayed batch after a
        #: driver restart starts again at attempt 0) never reuses a name (rule 1)
        self._token = uuid.uuid4().hex[:12]
        self._seq = 0
        self._reports: list[DataFile] = []
        self._file: Any = None
        self._writer: Any = None
        self._relative = ""
        self._closed = False

    def write(self, data: Any) -> None:
        """Append a pyarrow Table or RecordBatch of the writer's schema."""
        import pyarrow as pa

        if self._closed:
            raise ValueError("TaskFileWriter.write after close")
        table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
        if table.schema != self.schema:
            table = table.cast(self.schema)  # raises naming the columns that do not fit
        offset = 0
        while offset < table.num_rows:
            chunk = table.slice(offset, self.row_group_rows)
            offset += chunk.num_rows
            if self._writer is None:
                self._open_next()
            self._writer.write_table(chunk, row_group_size=self.row_group_rows)
            if self._file.tell() >= self.target_file_bytes:
                self._finish_file()  # rule 4

    def write_all(self, batches: Iterable[Any]) -> list[DataFile]:
        """Write every batch and close: the reports."""
        for batch in batches:
            self.write(batch)
        return self.close()

    def close(self) -> list[DataFile]:
        """Close the open file; the reports of every file written (rule 2)."""
        if not self._closed:
            self._closed = True
            if self._writer is not None:
                self._finish_file()
        return list(self._reports)

    def abort(self) -> None:
        """The task failed: close and delete what this writer wrote (best effort; what is
        left is cleanup's, by name)."""
        self._closed = True
        try:
            if self._writer is not None:
                self._writer.close()
                self._file.close()
        finally:
            self._writer = None
            for report in self._reports:
                self._fs.rm(f"{self._root}/{report.path}")
            if self._relative:
                try:
                    self._fs.rm(f"{self._root}/{self._relative}")
                except FileNotFoundError:
                    pass

    @property
    def reports(self) -> list[DataFile]:
        return list(self._reports)

    def _open_next(self) -> None:
        import pyarrow.parquet as pq

        name = data_file_name(self.job_id, self.epoch, self.subtask, self.attempt,
                              self._token, self._seq)
        self._seq += 1
        self._relative = f"{DATA_DIR}/{name}"
        self._fs.makedirs(f"{self._root}/{DATA_DIR}", exist_ok=True)
        self._file = self._fs.open(f"{self._root}/{self._relative}", "wb")
        self._writer = pq.ParquetWriter(self._file, self.schema, compression=self.compression)

    def _finish_file(self) -> None:
        writer, file = self._writer, self._file
        self._writer = self._file = None
        writer.close()
        metadata = writer.writer.metadata  # the footer just written (pyarrow keeps it)
        size = file.tell()
        file.close()
        self._reports.append(report_from_metadata(self._relative, size, metadata))
        self._relative = ""


def read_files(location: str, files: Iterable[DataFile], *,
               storage_options: Mapping[str, Any] | None = None) -> Any:
    """The rows of ``files`` (reported by tasks, relative to the table at ``location``) as one
    ``pyarrow.Table``, in order: a merge's staged changes (coordinator's commit worker)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(location, **dict(storage_options or {}))
    tables = []
    for f in files:
        with fs.open(f"{str(root).rstrip('/')}/{f.path}", "rb") as handle:
            tables.append(pq.read_table(handle))
    return pa.concat_tables(tables) if tables else None
