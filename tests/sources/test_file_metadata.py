"""The file source's ``_metadata`` column (issue 25 item 2, sources/files rule 7): option
``includeMetadata`` appends Spark's file metadata fields, plus the parquet row group, to every
row; every row of a split names its file, size, modification time and byte range or row
group; it works with a given and an inferred schema, with the reader modes and their corrupt
record column, and with watermark alignment; conflicts are errors when the source is built;
credentials never reach ``file_path``."""

from __future__ import annotations

import json
import os
import types
from datetime import timezone
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from sparkcoord.sources import FileStream
from sparkcoord.sources.alignment import AlignmentOptions
from sparkcoord.sources.files.discovery import plan_splits
from sparkcoord.sources.files.listing import FileEntry, filesystem
from sparkcoord.sources.files.metadata import METADATA_COLUMN, file_url, metadata_field
from sparkcoord.sources.files.options import FileSourceOptions, parse_options
from sparkcoord.sources.files.reading import FileReader

DATA = StructType([StructField("id", LongType()), StructField("name", StringType())])
#: Spark's _metadata fields, in Spark's order, then the row group
SPARK_FIELDS = ["file_path", "file_name", "file_size", "file_block_start", "file_block_length",
                "file_modification_time", "row_group"]


def with_metadata(struct: StructType) -> StructType:
    return StructType([*struct.fields, metadata_field()])


def entry(path: str) -> FileEntry:
    st = os.stat(path)
    return FileEntry(path, st.st_size, st.st_mtime)


def write_json(path: str, ids: range, bad_line: int | None = None) -> list[int]:
    """JSON lines, one per id; returns each line's byte offset. Line ``bad_line`` (0-based)
    is cut short, as a writer that died leaves it."""
    offsets, at = [], 0
    with open(path, "w") as out:
        for n, i in enumerate(ids):
            line = json.dumps({"id": i, "name": f"n{i}"}) + "\n"
            if n == bad_line:
                line = '{"id": 66, "na\n'
            offsets.append(at)
            at += len(line)
            out.write(line)
    return offsets


def read_rows(reader: FileReader, splits: list[Any], position: Any = None) -> list[dict]:
    batches = [b for s in splits for b, _ in reader.read_split(s, position)]
    # Spark's worker compares the first batch's schema with the declared one, nullability too
    assert all(b.schema.equals(reader.arrow_schema) for b in batches)
    return pa.Table.from_batches(batches, schema=reader.arrow_schema).to_pylist()


def mtime_us(path: str) -> int:
    return round(os.stat(path).st_mtime * 1_000_000)


def as_us(value: Any) -> int:
    assert value.tzinfo is not None and value.utcoffset() == timezone.utc.utcoffset(None)
    return round(value.timestamp() * 1_000_000)


def test_every_row_of_a_json_byte_range_names_its_file_size_time_and_range(tmp_path) -> None:
    directory = tmp_path / "in dir"  # a space: file_path is percent-encoded, file_name is not
    directory.mkdir()
    path = str(directory / "part 1.json")
    offsets = write_json(path, range(60))
    opts = FileSourceOptions(url=str(directory), format="json", max_split_bytes=300,
                             batch_rows=7, include_metadata=True)
    fs, _ = filesystem(opts.url)
    splits = plan_splits(fs, entry(path), opts)
    assert len(splits) > 3
    reader = FileReader(opts, json.dumps(with_metadata(DATA).jsonValue()))
    assert reader.arrow_schema.equals(to_arrow_schema(with_metadata(DATA), timezone="UTC"))
    assert reader.arrow_schema.field(METADATA_COLUMN).type.names == SPARK_FIELDS
    rows = read_rows(reader, splits)
    assert [r["id"] for r in rows] == list(range(60))  # the data is what it was
    size = os.path.getsize(path)
    url = "file:" + path.replace(" ", "%20")
    for r in rows:
        start = offsets[r["id"]] // 300 * 300  # the range that holds the line's first byte
        meta = r[METADATA_COLUMN]
        assert meta["file_path"] == url and meta["file_name"] == "part 1.json"
        assert meta["file_size"] == size and meta["row_group"] is None
        assert (meta["file_block_start"], meta["file_block_length"]) == (
            start, min(300, size - start))
        assert as_us(meta["file_modification_time"]) == mtime_us(path)


def test_a_resumed_split_still_carries_its_metadata(tmp_path) -> None:
    path = str(tmp_path / "a.json")
    write_json(path, range(40))
    opts = FileSourceOptions(url=str(tmp_path), format="json", batch_rows=8,
                             include_metadata=True)
    fs, _ = filesystem(opts.url)
    [split] = plan_splits(fs, entry(path), opts)
    rows = read_rows(FileReader(opts, json.dumps(with_metadata(DATA).jsonValue())), [split], 13)
    assert [r["id"] for r in rows] == list(range(13, 40))
    assert {r[METADATA_COLUMN]["file_name"] for r in rows} == {"a.json"}


def test_every_row_of_a_parquet_row_group_names_the_row_group_and_its_bytes(tmp_path) -> None:
    path = str(tmp_path / "p.parquet")
    pq.write_table(pa.table({"id": pa.array(range(100), pa.int64()),
                             "name": [f"n{i}" for i in range(100)]}), path, row_group_size=50)
    opts = FileSourceOptions(url=str(tmp_path), format="parquet", batch_rows=16,
                             include_metadata=True)
    fs, _ = filesystem(opts.url)
    splits = plan_splits(fs, entry(path), opts)
    assert [s.row_group for s in splits] == [0, 1]
    rows = read_rows(FileReader(opts, json.dumps(with_metadata(DATA).jsonValue())), splits)
    assert [r["id"] for r in rows] == list(range(100))
    blocks = {}
    for r in rows:
        meta = r[METADATA_COLUMN]
        assert meta["row_group"] == r["id"] // 50
        assert meta["file_path"] == "file:" + path and meta["file_name"] == "p.parquet"
        assert meta["file_size"] == os.path.getsize(path)
        assert as_us(meta["file_modification_time"]) == mtime_us(path)
        blocks.setdefault(meta["row_group"], set()).add(
            (meta["file_block_start"], meta["file_block_length"]))
    [(start0, len0)], [(start1, len1)] = blocks[0], blocks[1]
    # pyarrow writes "PAR1", the row groups' column chunks back to back, then the footer
    assert start0 == 4 and len0 > 0 and start1 == start0 + len0 and len1 > 0
    footer = pq.ParquetFile(path).metadata.serialized_size
    assert start1 + len1 == os.path.getsize(path) - footer - 8


def test_a_malformed_record_kept_in_permissive_mode_names_its_file_too(tmp_path) -> None:
    path = str(tmp_path / "bad.json")
    write_json(path, range(10), bad_line=4)
    struct = StructType([*DATA.fields, StructField("_corrupt_record", StringType())])
    opts = FileSourceOptions(url=str(tmp_path), format="json", include_metadata=True)
    fs, _ = filesystem(opts.url)
    rows = read_rows(FileReader(opts, json.dumps(with_metadata(struct).jsonValue())),
                     plan_splits(fs, entry(path), opts))
    bad = [r for r in rows if r["_corrupt_record"] is not None]
    assert [(r["id"], r["_corrupt_record"]) for r in bad] == [(None, '{"id": 66, "na')]
    assert bad[0][METADATA_COLUMN]["file_name"] == "bad.json"
    assert len(rows) == 10 and all(r[METADATA_COLUMN]["file_name"] == "bad.json" for r in rows)


def test_the_event_time_of_an_aligned_reader_is_read_next_to_the_metadata(tmp_path) -> None:
    path = str(tmp_path / "t.json")
    with open(path, "w") as out:
        out.writelines(json.dumps({"id": i, "ts": f"2026-01-01T00:00:0{i}"}) + "\n"
                       for i in range(5))
    struct = StructType([StructField("id", LongType()), StructField("ts", TimestampType())])
    opts = FileSourceOptions(url=str(tmp_path), format="json", include_metadata=True)
    aligned = AlignmentOptions(group="files", max_drift_ms=1000, event_time_column="ts")
    reader = FileReader(opts, json.dumps(with_metadata(struct).jsonValue()), alignment=aligned)
    fs, _ = filesystem(opts.url)
    [split] = plan_splits(fs, entry(path), opts)
    [(batch, _)] = list(reader.read_split(split, None))
    assert batch.schema.names == ["id", "ts", METADATA_COLUMN]
    assert reader.event_time_ms(split, batch) == 1767225604000  # 2026-01-01T00:00:04Z


def test_without_the_option_the_rows_have_no_metadata_column(tmp_path) -> None:
    path = str(tmp_path / "a.json")
    write_json(path, range(3))
    opts = parse_options(str(tmp_path), "json", {})
    assert opts.include_metadata is False
    fs, _ = filesystem(opts.url)
    [split] = plan_splits(fs, entry(path), opts)
    [(batch, _)] = list(FileReader(opts, json.dumps(DATA.jsonValue())).read_split(split, None))
    assert batch.schema.names == ["id", "name"]


# ----------------------------------------------------------------------------- building
def stream(**options: str) -> FileStream:
    # operator_spec needs the job's session only for a DDL schema or a relative path
    return FileStream(types.SimpleNamespace(spark=None)).options(**options)  # type: ignore[arg-type]


def reader_struct(spec: Any) -> StructType:
    return StructType.fromJson(json.loads(spec.operator.args[1]))


def test_the_struct_spark_sees_ends_with_the_metadata_column_for_a_given_schema(
        tmp_path) -> None:
    spec, struct = (stream(includeMetadata="true").format("json").schema(DATA)
                    .operator_spec(str(tmp_path)))
    assert struct == with_metadata(DATA) and reader_struct(spec) == struct
    assert struct[METADATA_COLUMN].nullable is False  # as Spark's _metadata
    assert struct[METADATA_COLUMN].dataType.fieldNames() == SPARK_FIELDS


def test_the_struct_spark_sees_ends_with_the_metadata_column_for_an_inferred_schema(
        tmp_path) -> None:
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}),
                   str(tmp_path / "p.parquet"))
    spec, struct = stream(includeMetadata="TRUE").format("parquet").operator_spec(str(tmp_path))
    assert struct.fieldNames() == ["id", "name", METADATA_COLUMN]
    assert reader_struct(spec) == struct


def test_a_given_schema_with_a_metadata_column_is_refused_when_the_source_is_built(
        tmp_path) -> None:
    schema = StructType([*DATA.fields, StructField("_metadata", StringType())])
    with pytest.raises(ValueError, match="'includeMetadata' adds a column '_metadata', but "
                                         "the schema given has one already"):
        stream(includeMetadata="true").format("json").schema(schema).operator_spec(
            str(tmp_path))
    # without the option it is an ordinary column of the records
    _, struct = stream().format("json").schema(schema).operator_spec(str(tmp_path))
    assert struct == schema


def test_files_with_a_metadata_column_are_refused_with_include_metadata(tmp_path) -> None:
    (tmp_path / "a.json").write_text('{"id": 1, "_metadata": "x"}\n')
    with pytest.raises(ValueError, match="the schema inferred from the first file"):
        stream(includeMetadata="true").format("json").operator_spec(str(tmp_path))


def test_the_metadata_column_is_no_event_time_and_no_corrupt_record_column(tmp_path) -> None:
    with pytest.raises(ValueError, match="'eventTimeColumn': '_metadata' is the file metadata"):
        (stream(includeMetadata="true", maxDrift="1 minute", eventTimeColumn="_metadata")
         .format("json").schema(DATA).operator_spec(str(tmp_path)))
    with pytest.raises(ValueError, match="'columnNameOfCorruptRecord' cannot be '_metadata'"):
        (stream(includeMetadata="true", columnNameOfCorruptRecord="_metadata")
         .format("json").schema(DATA).operator_spec(str(tmp_path)))


def test_an_aligned_source_with_metadata_and_a_corrupt_record_column_builds(tmp_path) -> None:
    struct = StructType([StructField("ts", TimestampType()),
                         StructField("_corrupt_record", StringType())])
    spec, out = (stream(includeMetadata="true", maxDrift="1 minute", eventTimeColumn="ts",
                        mode="dropmalformed")
                 .format("json").schema(struct).operator_spec(str(tmp_path)))
    assert out.fieldNames() == ["ts", "_corrupt_record", METADATA_COLUMN]
    assert spec.operator.keywords["alignment"].event_time_column == "ts"


def test_a_schema_of_only_the_corrupt_record_column_is_still_refused(tmp_path) -> None:
    schema = StructType([StructField("_corrupt_record", StringType())])
    with pytest.raises(ValueError, match="holds only the corrupt-record column"):
        stream(includeMetadata="true").format("json").schema(schema).operator_spec(
            str(tmp_path))


# ----------------------------------------------------------------------------- file_path
@pytest.mark.parametrize(("url", "path", "expected"), [
    ("/data", "/data/a b%.json", "file:/data/a%20b%25.json"),
    ("file:///data", "/data/x=1/a.json", "file:/data/x=1/a.json"),
    ("s3://bucket/events", "bucket/events/a.json", "s3://bucket/events/a.json"),
    ("s3a://bucket/events", "bucket/events/a.json", "s3a://bucket/events/a.json"),
    ("s3://KEY:SECRET@bucket/events", "KEY:SECRET@bucket/events/a.json",
     "s3://bucket/events/a.json"),
    ("sftp://user:pw@host:2222/data", "/data/a.json", "sftp://host:2222/data/a.json"),
    ("https://user:pw@example.com/d", "https://user:pw@example.com/d/a.json",
     "https://example.com/d/a.json"),
])
def test_file_path_is_the_files_url_as_spark_writes_it_without_credentials(
        url, path, expected) -> None:
    got = file_url(url, path)
    assert got == expected
    assert "SECRET" not in got and "pw" not in got
