"""The file source's ``_metadata`` column on real Spark (issue 25 item 2): bounded
``availableNow`` runs with ``includeMetadata`` over parquet files of two row groups (inferred
schema) and JSON-lines files split into byte ranges (a given schema): every row in the sink
names its file (URL and name), size, modification time, and byte range or row group; the
streaming DataFrame's schema has the column as Spark's hidden one; and a query that selects
``_metadata.file_name`` next to the data runs, a malformed record's row naming its file."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkcoord.sources import FileStream
from sparkcoord.sources.files.metadata import metadata_field
from sparkcoord.spark import CoordinatedJob
from tests.spark.helpers import sink_rows

pytestmark = pytest.mark.spark
FILES, ROWS, SPLIT_BYTES = 3, 100, 512
SPARK_FIELDS = ["file_path", "file_name", "file_size", "file_block_start", "file_block_length",
                "file_modification_time", "row_group"]


def write_parquet(directory: str) -> list[str]:
    """FILES files of ROWS ids, two row groups each."""
    os.makedirs(directory)
    paths = []
    for f in range(FILES):
        ids = range(f * ROWS, (f + 1) * ROWS)
        path = os.path.join(directory, f"part-{f}.parquet")
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                                 "name": [f"n{i}" for i in ids]}), path,
                       row_group_size=ROWS // 2)
        paths.append(path)
    return paths


def write_json(directory: str, bad: int | None = None) -> tuple[list[str], dict[int, int]]:
    """FILES files of ROWS lines; returns the paths and each id's line offset. With ``bad``,
    that id's line is cut short (a malformed record)."""
    os.makedirs(directory)
    paths, offsets = [], {}
    for f in range(FILES):
        path = os.path.join(directory, f"part-{f}.json")
        at = 0
        with open(path, "w") as out:
            for i in range(f * ROWS, (f + 1) * ROWS):
                line = json.dumps({"id": i, "name": f"n{i}"}) + "\n"
                if i == bad:
                    line = '{"id": 66, "na\n'
                offsets[i] = at
                at += len(line)
                out.write(line)
        paths.append(path)
    return paths, offsets


def run(spark: Any, tmp_path: Any, df: Any, job: CoordinatedJob) -> list[Any]:
    out = str(tmp_path / "out")
    writer = df.writeStream.format("parquet").option("path", out).trigger(availableNow=True)
    report = job.run(writer, timeout_s=180)
    assert report.failures == []
    return sink_rows(spark, out)


def as_us(value: Any) -> int:
    # Spark gives a timestamp as a naive local datetime; .timestamp() reads it as local too
    return round(value.timestamp() * 1_000_000)


def check_metadata(rows: list[Any], paths: list[str], offsets: dict[int, int]) -> None:
    """Every row's ``_metadata`` names its file (ids ``f * ROWS ...`` are in ``paths[f]``),
    its size and modification time, and its byte range (``offsets``: each id's line offset,
    JSON lines) or row group (parquet, ``offsets`` empty)."""
    blocks: dict[tuple[str, Any], set[tuple[int, int]]] = {}
    for r in rows:
        path = paths[r.id // ROWS]
        meta = r._metadata
        assert meta.file_path == "file:" + path
        assert meta.file_name == os.path.basename(path)
        assert meta.file_size == os.path.getsize(path)
        assert as_us(meta.file_modification_time) == round(os.stat(path).st_mtime * 1_000_000)
        if offsets:  # the byte range that holds the line's first byte
            start = offsets[r.id] // SPLIT_BYTES * SPLIT_BYTES
            assert meta.row_group is None
            assert (meta.file_block_start, meta.file_block_length) == (
                start, min(SPLIT_BYTES, meta.file_size - start))
        else:
            assert meta.row_group == r.id % ROWS // (ROWS // 2)
            blocks.setdefault((path, meta.row_group), set()).add(
                (meta.file_block_start, meta.file_block_length))
    for path in [] if offsets else paths:
        # one byte range per row group: after "PAR1", back to back
        [(start0, len0)], [(start1, len1)] = blocks[(path, 0)], blocks[(path, 1)]
        assert start0 == 4 and len0 > 0 and start1 == start0 + len0 and len1 > 0


def test_every_row_of_parquet_row_groups_names_its_file_size_time_and_row_group(
        spark, tmp_path) -> None:
    data = str(tmp_path / "data")
    paths = write_parquet(data)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = (FileStream(job).format("parquet")  # the schema inferred from the first file
          .options(includeMetadata="true", bounded="true", parallelism="2").load(data))
    assert df.schema.fieldNames() == ["id", "name", "_metadata"]
    assert df.schema["_metadata"] == metadata_field()  # Spark's fields, types, NOT NULL
    rows = run(spark, tmp_path, df, job)
    assert Counter(r.id for r in rows) == Counter(range(FILES * ROWS))  # every row, once
    assert all(r.name == f"n{r.id}" for r in rows)
    check_metadata(rows, paths, {})
    sink = spark.read.parquet(str(tmp_path / "out")).schema
    assert sink["_metadata"].dataType.fieldNames() == SPARK_FIELDS


def test_every_row_of_json_byte_ranges_names_its_range_and_a_query_selects_the_file_name(
        spark, tmp_path) -> None:
    data, bad = str(tmp_path / "data"), 150
    paths, offsets = write_json(data, bad=bad)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = (FileStream(job).format("json").schema("id long, name string, _corrupt_record string")
          .options(includeMetadata="true", bounded="true", parallelism="2",
                   maxSplitBytes=str(SPLIT_BYTES))
          .load(data))
    assert df.schema.fieldNames() == ["id", "name", "_corrupt_record", "_metadata"]
    rows = run(spark, tmp_path, df.select("*", "_metadata.file_name"), job)
    good = [r for r in rows if r.id is not None]
    assert Counter(r.id for r in good) == Counter(i for i in range(FILES * ROWS) if i != bad)
    assert all(r.name == f"n{r.id}" and r._corrupt_record is None for r in good)
    assert all(r.file_name == os.path.basename(paths[r.id // ROWS]) for r in good)
    check_metadata(good, paths, offsets)
    # PERMISSIVE: the bad line's row of nulls says which file and range to repair
    [row] = [r for r in rows if r.id is None]
    assert (row.file_name, row._corrupt_record) == (os.path.basename(paths[bad // ROWS]),
                                                    '{"id": 66, "na')
    assert row._metadata.file_block_start == offsets[bad] // SPLIT_BYTES * SPLIT_BYTES
