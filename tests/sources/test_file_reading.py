"""Reading file splits: line-aligned byte ranges (a property test), parquet row groups, CSV and
JSON lines into record batches of exactly the source's Arrow schema, resuming from a position,
and a file changed after discovery."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkcoord.sources import Split, SplitReader
from sparkcoord.sources.files.discovery import plan_splits
from sparkcoord.sources.files.listing import FileEntry, filesystem
from sparkcoord.sources.files.options import FileSourceOptions
from sparkcoord.sources.files.reading import FileChangedError, FileReader, read_line_range
from sparkcoord.testing import SplitReaderContract

SCHEMA_JSON = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "name", "type": "string", "nullable": True, "metadata": {}},
    {"name": "score", "type": "double", "nullable": True, "metadata": {}}]})


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"x")), max_size=30),
       trailing_newline=st.booleans(), step=st.integers(1, 40))
def test_line_ranges_of_a_file_hold_every_line_exactly_once(lines, trailing_newline, step) -> None:
    content = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
    f = io.BytesIO(content)
    size = len(content)
    parts = [read_line_range(f, start, min(size, start + step), size, chunk=7)
             for start in range(0, size, step)]
    assert b"".join(parts) == content
    for part in parts:  # every range holds whole lines
        assert part == b"" or part.endswith(b"\n") or part == content[-len(part):]


def table(start: int, rows: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + rows), pa.int64()),
                     "name": [f"n{i}" for i in range(start, start + rows)],
                     "score": [i * 0.5 for i in range(start, start + rows)]})


def write(path: str, fmt: str, t: pa.Table) -> FileEntry:
    if fmt == "parquet":
        pq.write_table(t, path, row_group_size=40)
    elif fmt == "csv":
        pacsv.write_csv(t, path)
    else:
        with open(path, "w") as out:
            out.writelines(json.dumps(r) + "\n" for r in t.to_pylist())
    st_ = os.stat(path)
    return FileEntry(path, st_.st_size, st_.st_mtime)


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_the_splits_of_a_file_read_back_every_row_once_in_order_with_the_exact_schema(
        tmp_path, fmt) -> None:
    options = FileSourceOptions(url=str(tmp_path), format=fmt, header=True, max_split_bytes=300,
                                batch_rows=16)
    entry = write(str(tmp_path / f"f.{fmt}"), fmt, table(0, 100))
    fs, _ = filesystem(str(tmp_path))
    splits = plan_splits(fs, entry, options)
    assert len(splits) > 2  # row groups of 40 rows / ranges of 300 bytes
    reader = FileReader(options, SCHEMA_JSON)
    batches = [b for s in splits for b, _ in reader.read_split(s, None)]
    assert all(b.schema.equals(reader.arrow_schema) for b in batches)
    got = pa.Table.from_batches(batches)
    assert got.column("id").to_pylist() == list(range(100))
    assert got.column("name").to_pylist() == [f"n{i}" for i in range(100)]


def test_a_split_read_from_a_position_gives_only_the_rows_after_it(tmp_path) -> None:
    options = FileSourceOptions(url=str(tmp_path), format="json", batch_rows=10)
    entry = write(str(tmp_path / "f.json"), "json", table(0, 35))
    fs, _ = filesystem(str(tmp_path))
    (one,) = plan_splits(fs, entry, options)
    reader = FileReader(options, SCHEMA_JSON)
    first = next(iter(reader.read_split(one, None)))
    assert first[1] == 10
    rest = [b for b, _ in reader.read_split(one, 13)]
    assert pa.Table.from_batches(rest).column("id").to_pylist() == list(range(13, 35))


def test_a_file_that_changed_after_discovery_is_refused_naming_it_and_both_sizes(tmp_path) -> None:
    options = FileSourceOptions(url=str(tmp_path), format="json")
    path = str(tmp_path / "f.json")
    entry = write(path, "json", table(0, 5))
    fs, _ = filesystem(str(tmp_path))
    (one,) = plan_splits(fs, entry, options)
    with open(path, "a") as f:
        f.write(json.dumps({"id": 99, "name": "n99", "score": 1.0}) + "\n")
    reader = FileReader(options, SCHEMA_JSON)
    with pytest.raises(FileChangedError, match=rf"{path} changed .* had {entry.size} bytes, now "
                                              rf"{os.path.getsize(path)}"):
        list(reader.read_split(one, None))


class FileReaderContract(SplitReaderContract):
    """The reader test base (sparkcoord.testing) on the file source's reader: two files of a
    format, several splits each (row groups of 40 rows, byte ranges of 300 bytes)."""

    fmt = "json"
    stop_after_rows = 7

    @pytest.fixture(autouse=True)
    def _files(self, tmp_path: Any) -> None:
        self.options = FileSourceOptions(url=str(tmp_path), format=self.fmt, header=True,
                                         max_split_bytes=300, batch_rows=4)
        fs, _ = filesystem(str(tmp_path))
        self._splits = [split for start in (0, 100) for split in plan_splits(
            fs, write(str(tmp_path / f"f{start}.{self.fmt}"), self.fmt, table(start, 60)),
            self.options)]
        # the ground truth: every split read whole, in order, is each file's rows once
        whole = [row for split in self._splits for row in self.expected_rows(split)]
        assert [row["id"] for row in whole] == [*range(0, 60), *range(100, 160)]

    def make_reader(self) -> SplitReader:
        return FileReader(self.options, SCHEMA_JSON)

    def splits(self) -> list[Split]:
        return list(self._splits)

    def expected_rows(self, split: Split) -> list[dict[str, Any]]:
        batches = [b for b, _ in self.make_reader().read_split(split, None)]
        return [row for b in batches for row in b.to_pylist()]


class TestJsonFilesKeepTheReaderContract(FileReaderContract):
    fmt = "json"


class TestCsvFilesKeepTheReaderContract(FileReaderContract):
    fmt = "csv"


class TestParquetFilesKeepTheReaderContract(FileReaderContract):
    fmt = "parquet"
