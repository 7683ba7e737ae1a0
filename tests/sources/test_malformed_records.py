"""Malformed records of CSV and JSON-lines files (issue 25 item 1), without Spark: Spark's reader
modes (PERMISSIVE with the corrupt-record column, DROPMALFORMED, FAILFAST) for each format,
errors that name the file, the line and the byte offset (also in a split that does not start
at byte 0, and after a CSV header), one warning per split, positions that mean the same rows
on a re-read, and every other read error named with its file."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pyarrow as pa
import pytest

from sparkcoord.core.errors import MalformedRecord
from sparkcoord.sources.files.discovery import plan_splits
from sparkcoord.sources.files.listing import FileEntry, filesystem
from sparkcoord.sources.files.options import FileSourceOptions, check_record_options, parse_options
from sparkcoord.sources.files.parsing import RecordParser
from sparkcoord.sources.files.reading import FileReader, FileReadError

FIELDS = [("id", "long"), ("name", "string")]


def schema_json(*, corrupt: str | None = "_corrupt_record", nullable: bool = True) -> str:
    fields = [{"name": n, "type": t, "nullable": nullable, "metadata": {}} for n, t in FIELDS]
    if corrupt is not None:
        fields.append({"name": corrupt, "type": "string", "nullable": True, "metadata": {}})
    return json.dumps({"type": "struct", "fields": fields})


def good(fmt: str, i: int) -> str:
    return json.dumps({"id": i, "name": f"n{i}"}) if fmt == "json" else f"{i},n{i}"


#: per format: a line that does not parse, and a value that does not fit its column's type
BAD = {"json": ('{"id": 3, "name": "broken"', '{"id": "three", "name": "n3"}'),
       "csv": ("3,n3,extra", "three,n3")}


def write_lines(path: str, lines: list[str], header: str | None = None) -> FileEntry:
    with open(path, "w") as f:
        if header is not None:
            f.write(header + "\n")
        f.writelines(line + "\n" for line in lines)
    return FileEntry(path, os.path.getsize(path), os.path.getmtime(path))


def read(directory: str, entry: FileEntry, fmt: str, *, schema: str | None = None,
         position_of: dict[str, int] | None = None, **options: Any) -> list[dict[str, Any]]:
    """Every row of the file's splits, in order (``position_of``: split id -> position)."""
    opts = FileSourceOptions(url=directory, format=fmt, **options)
    fs, _ = filesystem(directory)
    reader = FileReader(opts, schema or schema_json())
    rows: list[dict[str, Any]] = []
    for split in plan_splits(fs, entry, opts):
        position = (position_of or {}).get(split.split_id)
        for batch, _ in reader.read_split(split, position):
            assert batch.schema.equals(reader.arrow_schema)
            rows.extend(batch.to_pylist())
    return rows


def one_bad_file(tmp_path: Any, fmt: str, bad: str) -> tuple[FileEntry, list[str]]:
    lines = [good(fmt, i) for i in range(3)] + [bad] + [good(fmt, i) for i in range(4, 6)]
    return write_lines(str(tmp_path / f"f.{fmt}"), lines), lines


@pytest.mark.parametrize("fmt", ["json", "csv"])
@pytest.mark.parametrize("kind", [0, 1], ids=["unparseable", "type-change"])
def test_permissive_is_the_default_and_reads_a_malformed_record_as_nulls_with_its_raw_text(
        tmp_path, fmt, kind) -> None:
    entry, lines = one_bad_file(tmp_path, fmt, BAD[fmt][kind])
    rows = read(str(tmp_path), entry, fmt)
    assert [r["id"] for r in rows] == [0, 1, 2, None, 4, 5]
    assert rows[3] == {"id": None, "name": None, "_corrupt_record": BAD[fmt][kind]}
    assert all(r["_corrupt_record"] is None for i, r in enumerate(rows) if i != 3)
    assert [r["name"] for r in rows if r["id"] is not None] == ["n0", "n1", "n2", "n4", "n5"]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_permissive_without_a_corrupt_record_column_reads_the_record_as_a_row_of_nulls(
        tmp_path, fmt) -> None:
    entry, _ = one_bad_file(tmp_path, fmt, BAD[fmt][0])
    rows = read(str(tmp_path), entry, fmt, schema=schema_json(corrupt=None))
    assert rows[3] == {"id": None, "name": None}
    assert [r["id"] for r in rows] == [0, 1, 2, None, 4, 5]


@pytest.mark.parametrize("fmt", ["json", "csv"])
@pytest.mark.parametrize("kind", [0, 1], ids=["unparseable", "type-change"])
def test_dropmalformed_drops_the_malformed_record_and_keeps_the_rest_in_order(
        tmp_path, fmt, kind) -> None:
    entry, _ = one_bad_file(tmp_path, fmt, BAD[fmt][kind])
    rows = read(str(tmp_path), entry, fmt, mode="DROPMALFORMED")
    assert [r["id"] for r in rows] == [0, 1, 2, 4, 5]
    assert all(r["_corrupt_record"] is None for r in rows)


@pytest.mark.parametrize("fmt", ["json", "csv"])
@pytest.mark.parametrize("kind", [0, 1], ids=["unparseable", "type-change"])
def test_failfast_raises_an_error_naming_the_file_the_line_the_byte_offset_and_the_reason(
        tmp_path, fmt, kind) -> None:
    entry, lines = one_bad_file(tmp_path, fmt, BAD[fmt][kind])
    offset = sum(len(line) + 1 for line in lines[:3])
    with pytest.raises(MalformedRecord) as caught:
        read(str(tmp_path), entry, fmt, mode="FAILFAST")
    text = str(caught.value)
    assert text.startswith(f"malformed record in {entry.path} line 4 (byte offset {offset}): ")
    assert repr(BAD[fmt][kind]) in text and "mode FAILFAST" in text
    reason = {("json", 0): "JSON parse error: Missing a comma or '}' after an object member",
              ("json", 1): "column 'id': expected a number, got a string",
              ("csv", 0): "Expected 2 columns, got 3",
              ("csv", 1): "column 'id': CSV conversion error to int64: invalid value 'three'"}
    assert reason[fmt, kind] in text
    assert (caught.value.path, caught.value.line, caught.value.offset) == (entry.path, 4, offset)


def test_the_mode_is_read_in_any_case_and_an_unknown_mode_is_an_error_naming_the_option(
        tmp_path) -> None:
    assert parse_options(str(tmp_path), "json", {"mode": "dropMalformed"}).mode == "DROPMALFORMED"
    assert parse_options(str(tmp_path), "csv", {}).mode == "PERMISSIVE"
    with pytest.raises(ValueError, match="option 'mode': use one of PERMISSIVE, DROPMALFORMED, "
                                         "FAILFAST"):
        parse_options(str(tmp_path), "json", {"mode": "lenient"})
    with pytest.raises(ValueError, match="option 'mode' applies to csv and json"):
        parse_options(str(tmp_path), "parquet", {"mode": "FAILFAST"})
    named = parse_options(str(tmp_path), "json", {"columnNameOfCorruptRecord": "raw"})
    assert named.corrupt_column == "raw"


def test_a_corrupt_record_column_of_another_name_holds_the_text_and_the_default_name_is_data(
        tmp_path) -> None:
    entry, _ = one_bad_file(tmp_path, "json", BAD["json"][0])
    rows = read(str(tmp_path), entry, "json", schema=schema_json(corrupt="raw"),
                corrupt_column="raw")
    assert rows[3] == {"id": None, "name": None, "raw": BAD["json"][0]}


def test_a_corrupt_record_column_that_is_not_a_nullable_string_is_refused_when_built() -> None:
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    opts = FileSourceOptions(url="/data", format="json")
    base = [StructField("id", LongType())]
    check_record_options(opts, StructType([*base, StructField("_corrupt_record", StringType())]))
    with pytest.raises(ValueError, match="column '_corrupt_record' for corrupt records .* must "
                                         "be a nullable string, as in Spark; the schema has it "
                                         "as int32"):
        check_record_options(opts, StructType([*base, StructField("_corrupt_record",
                                                                  IntegerType())]))
    with pytest.raises(ValueError, match="has it NOT NULL"):
        check_record_options(opts, StructType([*base, StructField("_corrupt_record",
                                                                  StringType(), False)]))
    with pytest.raises(ValueError, match="holds only the corrupt-record column"):
        check_record_options(opts, StructType([StructField("_corrupt_record", StringType())]))


def test_a_csv_header_is_no_record_and_counts_as_the_files_first_line(tmp_path) -> None:
    lines = ["0,n0", "1,n1", "oops,n2", "3,n3"]
    entry = write_lines(str(tmp_path / "h.csv"), lines, header="id,name")
    rows = read(str(tmp_path), entry, "csv", header=True)
    assert [r["id"] for r in rows] == [0, 1, None, 3]  # the header is neither a row nor bad
    assert rows[2]["_corrupt_record"] == "oops,n2"
    with pytest.raises(MalformedRecord, match=r"h\.csv line 4 \(byte offset 18\)"):
        read(str(tmp_path), entry, "csv", header=True, mode="FAILFAST")


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_a_malformed_record_in_a_split_that_does_not_start_at_byte_0_is_named_by_its_file_line(
        tmp_path, fmt) -> None:
    lines = [good(fmt, i) for i in range(200)]
    lines[150] = BAD[fmt][0]
    entry = write_lines(str(tmp_path / f"big.{fmt}"), lines)
    content = open(entry.path, "rb").read()
    offset = content.index((BAD[fmt][0] + "\n").encode())
    opts = FileSourceOptions(url=str(tmp_path), format=fmt, max_split_bytes=500)
    splits = plan_splits(filesystem(str(tmp_path))[0], entry, opts)
    holder = next(s for s in splits if s.start <= offset < s.end)
    assert holder.start > 0 and not content[holder.start - 1:holder.start].endswith(b"\n")
    with pytest.raises(MalformedRecord) as caught:
        read(str(tmp_path), entry, fmt, mode="FAILFAST", max_split_bytes=500)
    assert (caught.value.line, caught.value.offset) == (151, offset)
    assert f"{entry.path} line 151 (byte offset {offset})" in str(caught.value)
    rows = read(str(tmp_path), entry, fmt, max_split_bytes=500)
    assert [r["id"] for r in rows] == [*range(150), None, *range(151, 200)]


def test_one_warning_per_split_counts_its_malformed_records_and_names_the_first(
        tmp_path, caplog) -> None:
    lines = [good("json", i) for i in range(40)]
    for i in (5, 6, 30):
        lines[i] = f"not json {i}"
    entry = write_lines(str(tmp_path / "w.json"), lines)
    content = open(entry.path, "rb").read()
    with caplog.at_level(logging.WARNING, logger="sparkcoord.sources"):
        rows = read(str(tmp_path), entry, "json", mode="DROPMALFORMED")
    assert len(rows) == 37
    (warning,) = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert warning.startswith(f"3 malformed record(s) in {entry.path} bytes [0, {entry.size}), "
                              f"dropped (mode DROPMALFORMED); the first at line 6 (byte offset "
                              f"{content.index(b'not json 5')}): JSON parse error: Invalid value")


def test_a_split_read_from_a_position_gives_the_same_rows_as_the_rest_of_a_whole_read(
        tmp_path) -> None:
    lines = [good("json", i) for i in range(50)]
    for i in (3, 17, 18, 40):
        lines[i] = BAD["json"][i % 2]
    entry = write_lines(str(tmp_path / "p.json"), lines)
    for mode in ("PERMISSIVE", "DROPMALFORMED"):
        whole = read(str(tmp_path), entry, "json", mode=mode, batch_rows=7)
        split_id = f"{entry.path}#0"
        for position in (0, 5, 16, 20, len(whole)):
            again = read(str(tmp_path), entry, "json", mode=mode, batch_rows=7,
                         position_of={split_id: position})
            assert again == whole[position:], (mode, position)


def test_permissive_with_a_column_that_cannot_be_null_fails_saying_why(tmp_path) -> None:
    entry, _ = one_bad_file(tmp_path, "json", BAD["json"][0])
    with pytest.raises(MalformedRecord, match="mode PERMISSIVE cannot read it as a row of nulls: "
                                              "column 'id' is NOT NULL"):
        read(str(tmp_path), entry, "json", schema=schema_json(nullable=False))
    dropped = read(str(tmp_path), entry, "json", schema=schema_json(nullable=False),
                   mode="DROPMALFORMED")
    assert [r["id"] for r in dropped] == [0, 1, 2, 4, 5]


def test_json_records_that_are_no_objects_are_malformed_and_null_does_not_crash_pyarrow() -> None:
    # pyarrow 26 dies with SIGSEGV on a record null that starts a block (apache/arrow#47409)
    schema = pa.schema([("id", pa.int64()), ("_corrupt_record", pa.string())])
    data = b'null\n{"id": 1}\n  null\n[1, 2]\n7\n\n{"id": 2}\n'
    parsed = RecordParser("json", schema).parse(data)
    assert parsed.table.to_pylist() == [
        {"id": None, "_corrupt_record": "null"}, {"id": 1, "_corrupt_record": None},
        {"id": None, "_corrupt_record": "  null"}, {"id": None, "_corrupt_record": "[1, 2]"},
        {"id": None, "_corrupt_record": "7"}, {"id": 2, "_corrupt_record": None}]
    assert parsed.malformed == 4
    assert parsed.first is not None and parsed.first.reason == (
        "a JSON record must be an object, not null")


def test_invalid_utf8_in_a_json_string_is_a_malformed_record_not_a_bad_string_for_spark() -> None:
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    data = b'{"id": 1, "name": "a"}\n{"id": 2, "name": "\xff"}\n'
    parsed = RecordParser("json", schema, mode="DROPMALFORMED").parse(data)
    assert parsed.table.to_pylist() == [{"id": 1, "name": "a"}]
    assert parsed.first is not None and parsed.first.line == 1
    assert "column 'name': Invalid UTF8" in parsed.first.reason


def test_a_json_line_longer_than_pyarrows_block_is_read_not_taken_for_malformed() -> None:
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    long_name = "x" * (3 << 20)
    data = (json.dumps({"id": 1, "name": long_name}) + "\n" + '{"id": 2}\n').encode()
    parsed = RecordParser("json", schema, mode="FAILFAST").parse(data)
    assert parsed.malformed == 0
    assert parsed.table.column("id").to_pylist() == [1, 2]
    assert parsed.table.column("name")[0].as_py() == long_name


def test_a_csv_separator_is_one_character_and_delimiter_is_its_alias(tmp_path) -> None:
    assert parse_options(str(tmp_path), "csv", {"delimiter": ";"}).sep == ";"
    assert parse_options(str(tmp_path), "csv", {"sep": "\\t"}).sep == "\t"
    with pytest.raises(ValueError, match="option 'sep': expected one character"):
        parse_options(str(tmp_path), "csv", {"sep": "::"})
    entry = write_lines(str(tmp_path / "s.csv"), ["1;a", "2;b;c", "3;c"])
    rows = read(str(tmp_path), entry, "csv", sep=";")
    assert [(r["id"], r["_corrupt_record"]) for r in rows] == [(1, None), (None, "2;b;c"),
                                                                (3, None)]


def test_a_file_gone_before_it_was_read_is_an_error_naming_it_with_the_cause_kept(
        tmp_path) -> None:
    entry = write_lines(str(tmp_path / "gone.json"), [good("json", 0)])
    opts = FileSourceOptions(url=str(tmp_path), format="json")
    (split,) = plan_splits(filesystem(str(tmp_path))[0], entry, opts)
    os.remove(entry.path)
    with pytest.raises(FileReadError) as caught:
        list(FileReader(opts, schema_json()).read_split(split, None))
    assert str(caught.value).startswith(f"cannot read {entry.path} (bytes [0, {entry.size})): "
                                        f"FileNotFoundError")
    assert isinstance(caught.value.__cause__, FileNotFoundError)


def test_a_damaged_parquet_row_group_is_an_error_naming_the_file_and_the_row_group(
        tmp_path) -> None:
    import pyarrow.parquet as pq

    path = str(tmp_path / "d.parquet")
    pq.write_table(pa.table({"id": pa.array(range(100), pa.int64()),
                             "name": [f"n{i}" for i in range(100)]}), path, row_group_size=50,
                   compression="none")
    entry = FileEntry(path, os.path.getsize(path), os.path.getmtime(path))
    opts = FileSourceOptions(url=str(tmp_path), format="parquet")
    splits = plan_splits(filesystem(str(tmp_path))[0], entry, opts)
    meta = pq.ParquetFile(path).metadata.row_group(1).column(0)
    with open(path, "r+b") as f:  # overwrite the second row group's first column chunk
        f.seek(meta.data_page_offset)
        f.write(b"\xff" * meta.total_compressed_size)
    with pytest.raises(FileReadError, match=rf"^cannot read {path} \(row group 1\): ") as caught:
        list(FileReader(opts, schema_json(corrupt=None)).read_split(splits[1], None))
    assert caught.value.__cause__ is not None
    assert len(list(FileReader(opts, schema_json(corrupt=None)).read_split(splits[0], None))) == 1


def test_a_zero_byte_file_has_no_split_so_it_gives_no_rows_as_in_spark(tmp_path) -> None:
    entry = write_lines(str(tmp_path / "empty.json"), [])
    for fmt in ("json", "csv"):
        opts = FileSourceOptions(url=str(tmp_path), format=fmt)
        assert plan_splits(filesystem(str(tmp_path))[0], entry, opts) == []



def test_schema_inference_skips_null_lines_and_names_the_file_it_cannot_read(tmp_path) -> None:
    from sparkcoord.sources.files.options import parse_options
    from sparkcoord.sources.files.schema import infer_schema

    data = tmp_path / "data"
    data.mkdir()
    (data / "a.json").write_text('null\n{"id": 1, "name": "x"}\n')  # null crashed pyarrow
    schema = infer_schema(parse_options(str(data), "json", {}))
    assert schema.names == ["id", "name"]
    (data / "a.json").write_text('{"id": 1\n')
    with pytest.raises(ValueError, match=r"from its first file .*a\.json: ArrowInvalid"):
        infer_schema(parse_options(str(data), "json", {}))
