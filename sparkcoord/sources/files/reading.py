"""Reading a file source's splits into record batches (rules 1, 3, 6, 7, 8 of
:mod:`sparkcoord.sources.files`).

Runs in Spark's Python workers on the executors: a :class:`FileReader` is made and used by one
Spark task (one subtask of one batch), on the task's thread. The user's driver program uses
:func:`read_line_range` too, to infer a schema from a file's first lines (:mod:`.schema`).

A text split's lines by byte range are :mod:`.lines`' (rule 1); a packed split's members
fetched ahead, counted and joined are :mod:`.packed`' (rule 8); their names are importable
from here as before.

Thread model: the task's thread does everything (open, check, parse, convert, yield) except,
for a packed split on a remote filesystem, fetching its next members: a
:class:`~.packed.MemberFetcher` runs ``cat_file`` on a small thread pool
(``sparkcoord-fetch``) of its own (:mod:`.packed`).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

from sparkcoord.core.errors import MalformedRecord, SparkCoordError
from sparkcoord.sources.alignment import AlignmentOptions
from sparkcoord.sources.files.lines import line_range as line_range
from sparkcoord.sources.files.lines import lines_before as lines_before
from sparkcoord.sources.files.lines import read_line_range as read_line_range
from sparkcoord.sources.files.listing import filesystem
from sparkcoord.sources.files.metadata import (
    METADATA_COLUMN,
    SplitMetadata,
    file_url,
    metadata_field,
    row_group_bytes,
)
from sparkcoord.sources.files.options import FileSourceOptions
from sparkcoord.sources.files.packed import BLANK_LINE, cumulative, joined_tables, record_count
from sparkcoord.sources.files.packed import MemberFetcher as MemberFetcher
from sparkcoord.sources.files.parsing import Parsed, RecordParser
from sparkcoord.sources.files.split import FileSplit, Member
from sparkcoord.sources.reader import SplitReader
from sparkcoord.sources.splits import Split

log = logging.getLogger("sparkcoord.sources")

#: rule 8: consecutive members of a packed split parsed in one call, up to these many bytes
PARSE_GROUP_BYTES = 8 << 20
#: rule 8: the bytes of members a reader fetches ahead of the one it parses (a bigger member
#: is fetched alone)
PREFETCH_BYTES = 16 << 20
#: the names these had here before they moved to :mod:`.packed` (the same objects)
_BLANK_LINE, _record_count, _joined_tables, _cumulative = (BLANK_LINE, record_count,
                                                          joined_tables, cumulative)


class FileChangedError(RuntimeError):
    """A file changed after it was discovered (its split no longer describes it)."""


class FileReadError(SparkCoordError):
    """A split could not be read: the file is gone, its store failed, a parquet row group is
    damaged or lacks a column, ... Raised by :class:`FileReader` in a Spark task; the message
    names the file (as :func:`display_path` writes it), what was read (a row group, a byte
    range) and the original exception, which is also the ``__cause__`` (Spark's task failure
    text drops a cause, so the message repeats it)."""


def display_path(url: str, path: str) -> str:
    """``path`` (as fsspec gives it, without a scheme) written as the user wrote the source's
    ``url``: with its scheme (``s3://bucket/key``), a local path as it is. Only the scheme of
    ``url`` is taken, so credentials in a URL never reach a message."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return path if scheme in ("", "file", "local") else f"{scheme}://{path}"


class FileReader(SplitReader):
    """Reads :class:`FileSplit` objects into record batches of the source's schema.

    CSV and JSON lines go through a :class:`~sparkcoord.sources.files.parsing.RecordParser` with the
    source's ``mode`` (malformed records: a row of nulls, dropped, or :class:`MalformedRecord`;
    one warning per split that had any). Every other failure to read a split is a
    :class:`FileReadError` naming the file.

    ``schema_json`` is the rows' ``StructType`` as JSON; with ``options.include_metadata``
    (rule 7) the reader adds the ``_metadata`` column to each batch (at its place in
    ``schema_json``, or last if a wrapper gave the schema without it).
    """

    def __init__(self, options: FileSourceOptions, schema_json: str,
                 alignment: AlignmentOptions | None = None) -> None:
        self.options = options
        self.schema_json = schema_json
        # keyed by lane, the file's directory (docs/decisions/043-watermark-alignment.md)
        self.alignment = alignment
        self._arrow_schema: Any = None
        self._data_schema: Any = None
        self._parser: RecordParser | None = None

    @property
    def arrow_schema(self) -> Any:
        """The Arrow schema of the record batches :meth:`read_split` yields (task thread)."""
        if self._arrow_schema is None:
            from pyspark.sql.pandas.types import to_arrow_schema
            from pyspark.sql.types import StructType

            struct = StructType.fromJson(json.loads(self.schema_json))
            if self.options.include_metadata and METADATA_COLUMN not in struct.fieldNames():
                struct = StructType([*struct.fields, metadata_field()])
            self._arrow_schema = to_arrow_schema(struct, timezone="UTC")
        return self._arrow_schema

    @property
    def data_schema(self) -> Any:
        """What is read from the files: :attr:`arrow_schema` without the ``_metadata``
        column of rule 7 (the same schema without ``includeMetadata``)."""
        if self._data_schema is None:
            schema = self.arrow_schema
            index = schema.get_field_index(METADATA_COLUMN)
            self._data_schema = (schema.remove(index)
                                 if self.options.include_metadata and index >= 0 else schema)
        return self._data_schema

    @property
    def parser(self) -> RecordParser:
        """The CSV or JSON parser of this reader (made once; task thread). A bad
        corrupt-record column is a ``ValueError`` (the driver checked it already)."""
        if self._parser is None:
            o = self.options
            self._parser = RecordParser(o.format, self.data_schema, mode=o.mode,
                                        corrupt_column=o.corrupt_column, sep=o.sep)
        return self._parser

    def read_split(self, split: Split, position: Any) -> Iterator[tuple[Any, Any]]:
        """Task thread. ``position``: the rows of the split read so far (an int), or for a
        packed split (rule 8) a pair (index of the member file, rows of it read)."""
        assert isinstance(split, FileSplit)
        if split.files:
            yield from self._read_packed(split, position)
            return
        try:
            yield from self._read_file(split, int(position or 0))
        except (SparkCoordError, FileChangedError):
            raise  # named already
        except Exception as exc:
            where = display_path(self.options.url, split.path)
            what = (f"row group {split.row_group}" if split.row_group is not None
                    else f"bytes [{split.start}, {split.end})")
            raise FileReadError(f"cannot read {where} ({what}): {type(exc).__name__}: "
                                f"{exc}") from exc

    def _read_file(self, split: FileSplit, skip: int) -> Iterator[tuple[Any, Any]]:
        fs, _ = filesystem(self.options.url, self.options.storage_options)
        emitted = 0
        with fs.open(split.path, "rb") as f:
            size = getattr(f, "size", None)
            if size is None:
                size = fs.size(split.path)
            if size != split.file_size:
                raise FileChangedError(
                    f"file {split.path} changed after it was discovered: it had "
                    f"{split.file_size} bytes, now {size} (split {split.split_id})")
            if self.options.format == "parquet":
                import pyarrow.parquet as pq

                source: Any = pq.ParquetFile(f)  # the footer, read once for both uses
            else:
                source = f
            metadata = (self._split_metadata(split, source)
                        if self.options.include_metadata else None)
            for batch in self._batches(source, split):
                n = batch.num_rows
                if emitted + n <= skip:
                    emitted += n
                    continue
                if emitted < skip:
                    batch = batch.slice(skip - emitted)
                    emitted = skip
                emitted += batch.num_rows
                out = self._conform(batch)
                if metadata is not None:
                    out = self._with_metadata(out, metadata)
                yield out, emitted

    def _batches(self, source: Any, split: FileSplit) -> Iterator[Any]:
        """The split's rows from ``source``: a ``pyarrow.parquet.ParquetFile`` for parquet,
        else the open file."""
        o = self.options
        if o.format == "parquet":
            yield from source.iter_batches(batch_size=o.batch_rows,
                                           row_groups=[split.row_group],
                                           columns=self.data_schema.names)
            return
        f = source
        first, data = line_range(f, split.start, split.end, split.file_size)
        if not data:
            return
        # the header is the file's first line, so only the split at byte 0 has it
        parsed = self.parser.parse(data, header=o.header and split.start == 0)
        if parsed.malformed:
            self._malformed(f, split.path, split.start, split.end, first, parsed)
        yield from parsed.table.to_batches(max_chunksize=o.batch_rows)

    def _malformed(self, f: Any, file: str, start: int, end: int, first: int,
                   parsed: Parsed) -> None:
        """Name the malformed records of bytes ``[start, end)`` of ``file`` (a split, or a
        member of a packed split): raise for the first one when parsing stopped there, else
        one warning for the range (not one per record)."""
        bad = parsed.first
        assert bad is not None
        path = display_path(self.options.url, file)
        line = (lines_before(f, first) if first else 0) + bad.line + 1
        offset = first + bad.offset
        where = f"{path} line {line} (byte offset {offset})"
        mode, column = self.parser.mode, self.parser.corrupt_column
        if parsed.table is None:
            if mode == "FAILFAST":
                hint = "mode FAILFAST; mode PERMISSIVE or DROPMALFORMED reads past it"
            else:
                hint = (f"mode PERMISSIVE cannot read it as a row of nulls: column "
                        f"{self.parser.not_null!r} is NOT NULL in the schema; make it "
                        f"nullable, or use mode DROPMALFORMED")
            raise MalformedRecord(f"malformed record in {where}: {bad.reason}; the record: "
                                  f"{bad.excerpt()!r} ({hint})",
                                  path=path, line=line, offset=offset)
        if mode == "DROPMALFORMED":
            became = "dropped (mode DROPMALFORMED)"
        elif column is not None:
            became = f"read as rows of nulls with their text in column {column!r}"
        else:
            became = "read as rows of nulls (mode PERMISSIVE; the schema has no " \
                     f"{self.options.corrupt_column!r} column for their text)"
        log.warning("%d malformed record(s) in %s bytes [%d, %d), %s; the first at line %d "
                    "(byte offset %d): %s", parsed.malformed, path, start, end,
                    became, line, offset, bad.reason)

    def _split_metadata(self, split: FileSplit, source: Any) -> SplitMetadata:
        """Rule 7's value for ``split``; ``source`` is the parquet footer (``ParquetFile``) or
        the open text file."""
        if split.row_group is not None:
            start, length = row_group_bytes(source.metadata.row_group(split.row_group))
        else:
            start, length = split.start, split.end - split.start
        return self._file_metadata((split.path, split.file_size, split.mtime), start, length,
                                   split.row_group)

    def _file_metadata(self, file: Member, start: int, length: int,
                       row_group: int | None) -> SplitMetadata:
        """Rule 7's value for bytes ``[start, start + length)`` of ``file`` (path, size and
        modification time as discovered)."""
        arrow_type = self.arrow_schema.field(METADATA_COLUMN).type
        return SplitMetadata(arrow_type, self._metadata_value(file, start, length, row_group))

    def _metadata_value(self, file: Member, start: int, length: int,
                        row_group: int | None) -> dict[str, Any]:
        path, size, mtime = file
        return {
            "file_path": file_url(self.options.url, path),
            "file_name": path.rstrip("/").rsplit("/", 1)[-1],
            "file_size": size,
            "file_block_start": start,
            "file_block_length": length,
            # as discovery recorded it (and the reader checked the size against), in
            # microseconds: Spark's timestamp precision
            "file_modification_time": round(mtime * 1_000_000),
            "row_group": row_group,
        }

    def _read_packed(self, split: FileSplit, position: Any) -> Iterator[tuple[Any, Any]]:
        """A packed split (rule 8): its members in order (a member is one whole CSV or
        JSON-lines file, at most ``maxSplitBytes``), their rows joined into record batches
        of ``batchRows`` (the last may be shorter). Each batch yields the position after its
        last row, (member index, rows of that member read), so a resumed split starts in the
        right member at the right row (members before it are not read again). Consecutive
        members are parsed together, in groups of up to :data:`PARSE_GROUP_BYTES`
        (:meth:`_parse_members`)."""
        import bisect

        o = self.options
        index, skip = position if position else (0, 0)
        fs, _ = filesystem(o.url, o.storage_options)
        fetcher = MemberFetcher(fs, split.files, index, ahead=o.prefetch_files,
                                max_bytes=PREFETCH_BYTES)
        pending: list[Any] = []
        rows = 0
        after = (index, skip)
        i = index
        try:
            while i < len(split.files):
                group: list[tuple[int, bytes]] = []
                held = 0
                while i < len(split.files) and (not group or held + split.files[i][1]
                                                <= PARSE_GROUP_BYTES):
                    data = self._member_data(split, i, fetcher)
                    group.append((i, data))
                    held += len(data)
                    i += 1
                table, counts = self._parse_members(split, group)
                first = group[0][0]
                done_before = skip if first == index else 0  # rows of the first member read
                if done_before:
                    table = table.slice(min(done_before, table.num_rows))
                    counts[0] = max(0, counts[0] - done_before)
                if o.include_metadata:
                    table = self._with_member_metadata(split, group, counts, table)
                ends = list(cumulative(counts))
                offset, total = 0, table.num_rows
                while offset < total:
                    take = min(total - offset, o.batch_rows - rows)
                    pending.append(table.slice(offset, take))
                    offset += take
                    rows += take
                    # the member of the last row taken, and its rows read
                    k = bisect.bisect_left(ends, offset)
                    before = ends[k - 1] if k else -done_before  # rows of it before the table
                    after = (group[k][0], offset - before)
                    if rows >= o.batch_rows:
                        yield joined_tables(pending), after
                        pending, rows = [], 0
            if pending:
                yield joined_tables(pending), after
        finally:
            fetcher.close()

    def _member_data(self, split: FileSplit, i: int, fetcher: MemberFetcher) -> bytes:
        """Member ``i``'s bytes, checked against its size as discovered (rule 3)."""
        path, size, _ = split.files[i]
        try:
            data = fetcher.get(i)
        except Exception as exc:
            raise self._member_error(split, i, exc) from exc
        if len(data) != size:
            raise FileChangedError(
                f"file {path} changed after it was discovered: it had {size} bytes, now "
                f"{len(data)} (file {i + 1} of {len(split.files)} of split {split.split_id})")
        return data

    def _member_error(self, split: FileSplit, i: int, exc: BaseException) -> FileReadError:
        path, size, _ = split.files[i]
        return FileReadError(f"cannot read {display_path(self.options.url, path)} (bytes "
                             f"[0, {size}), file {i + 1} of {len(split.files)} of split "
                             f"{split.split_id}): {type(exc).__name__}: {exc}")

    def _parse_members(self, split: FileSplit,
                       group: list[tuple[int, bytes]]) -> tuple[Any, list[int]]:
        """The rows of consecutive members (index, bytes) as one table of the data's schema,
        and how many rows each member gave. Fast path: the members' records (a CSV member
        without its header line) in one parse, when that parse finds no malformed record and
        the rows are as many as the members' non-blank lines. Otherwise each member on its
        own (:meth:`_member_table`), which names a malformed record's member, line and byte
        offset, as a file of its own would be (rule 6)."""
        o = self.options
        if len(group) > 1:
            bodies, counts = [], []
            for _, data in group:
                body = data
                if o.header:
                    cut = data.find(b"\n")
                    body = data[cut + 1:] if cut >= 0 else b""
                count = record_count(body)
                if count is None:
                    break
                counts.append(count)
                bodies.append(body if not body or body.endswith(b"\n") else body + b"\n")
            else:
                try:
                    parsed = self.parser.parse(b"".join(bodies), header=False)
                except Exception:  # noqa: BLE001 - each member again, named
                    parsed = None
                if (parsed is not None and not parsed.malformed and parsed.table is not None
                        and parsed.table.num_rows == sum(counts)):
                    return self._conform(parsed.table), counts
        tables = [self._member_table(split, i, data) for i, data in group]
        import pyarrow as pa

        return pa.concat_tables(tables), [t.num_rows for t in tables]

    def _member_table(self, split: FileSplit, i: int, data: bytes) -> Any:
        """Member ``i`` of packed ``split`` parsed alone (a file of its own: its header, its
        malformed records named with its path and line), in the data's schema."""
        path, size, _ = split.files[i]
        try:
            parsed = self.parser.parse(data, header=self.options.header)
            if parsed.malformed:
                self._malformed(io.BytesIO(data), path, 0, size, 0, parsed)
            return self._conform(parsed.table)
        except (SparkCoordError, FileChangedError):
            raise  # named already
        except Exception as exc:
            raise self._member_error(split, i, exc) from exc

    def _with_member_metadata(self, split: FileSplit, group: list[tuple[int, bytes]],
                              counts: list[int], table: Any) -> Any:
        """``table`` (the rows of ``group``'s members, ``counts`` each) with the
        ``_metadata`` column of rule 7: every row its own member's file."""
        import numpy as np
        import pyarrow as pa

        arrow_type = self.arrow_schema.field(METADATA_COLUMN).type
        values = pa.array([self._metadata_value(split.files[i], 0, split.files[i][1], None)
                           for i, _ in group], type=arrow_type)
        column = values.take(pa.array(np.repeat(np.arange(len(counts)), counts)))
        columns = [column if f.name == METADATA_COLUMN else table.column(f.name)
                   for f in self.arrow_schema]
        return pa.Table.from_arrays(columns, schema=self.arrow_schema)

    def _with_metadata(self, batch: Any, metadata: SplitMetadata) -> Any:
        """``batch`` (of :attr:`data_schema`) with the ``_metadata`` column at its place."""
        import pyarrow as pa

        schema = self.arrow_schema
        column = metadata.column(batch.num_rows)
        columns = [column if f.name == METADATA_COLUMN else batch.column(f.name)
                   for f in schema]
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def _conform(self, batch: Any) -> Any:
        """The record batch (or table: a parse of several packed members) with exactly the
        data's Arrow schema (column order, types, nullability), which Spark requires of a
        record batch; the ``_metadata`` column (rule 7) is added after."""
        schema = self.data_schema
        if batch.schema.equals(schema):
            return batch
        import pyarrow as pa

        columns = [batch.column(batch.schema.get_field_index(f.name)).cast(f.type)
                   for f in schema]
        kind = pa.Table if isinstance(batch, pa.Table) else pa.RecordBatch
        return kind.from_arrays(columns, schema=schema)
