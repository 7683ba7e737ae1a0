"""What a task writes and reports (sparkcoord/sinks/files.py), on local disk and on S3."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sparkcoord.sinks.files import (
    MAX_BOUND_CHARS,
    TaskFileWriter,
    data_file_name,
    parse_file_name,
)
from tests.sinks.conftest import SCHEMA, rows


def test_a_writer_rolls_files_at_the_target_size_and_reports_what_each_file_holds(
        tmp_path: Any) -> None:
    data = rows(3, 5000)
    writer = TaskFileWriter(str(tmp_path), "job-a", 3, 2, 1, SCHEMA,
                            target_file_bytes=20_000, row_group_rows=1000)
    reports = writer.write_all([data.slice(0, 2500), data.slice(2500).to_batches()[0]])
    assert len(reports) > 1
    assert sum(r.rows for r in reports) == 5000
    read = []
    for r in reports:
        on_disk = tmp_path / r.path
        assert r.bytes == on_disk.stat().st_size
        table = pq.read_table(on_disk)
        read.append(table)
        stats = r.stats
        ids = table.column("id").to_pylist()
        assert (stats["id"].min, stats["id"].max, stats["id"].null_count) == (
            min(ids), max(ids), 0)
        names = table.column("name").to_pylist()
        assert stats["name"].null_count == names.count(None)
        assert stats["name"].min == min(n for n in names if n is not None)
        assert stats["at"].max == max(table.column("at").to_pylist())
    assert pa.concat_tables(read).equals(data)


def test_file_names_say_job_epoch_subtask_and_attempt_and_no_other_name_parses() -> None:
    name = data_file_name("job-a", 12, 3, 2, "0123456789ab", 7)
    parsed = parse_file_name(name)
    assert parsed is not None
    assert (parsed.job_id, parsed.epoch, parsed.subtask, parsed.attempt, parsed.seq) == (
        "job-a", 12, 3, 2, 7)
    for other in ("part-00000-abc.c000.snappy.parquet", name + ".tmp", "00000.json",
                  name.replace("sc-", "xx-")):
        assert parse_file_name(other) is None


def test_a_column_whose_bounds_cannot_be_exact_has_none_but_keeps_its_null_count(
        tmp_path: Any) -> None:
    schema = pa.schema([("long", pa.string()), ("f", pa.float64())])
    table = pa.table({"long": ["x" * (MAX_BOUND_CHARS + 1), None, "a"],
                      "f": [1.0, float("nan"), None]}, schema=schema)
    (report,) = TaskFileWriter(str(tmp_path), "j", 0, 0, 0, schema).write_all([table])
    assert report.stats["long"].min is None and report.stats["long"].max is None
    assert report.stats["long"].null_count == 1
    assert report.stats["f"].null_count == 1


def test_a_writer_writes_to_s3_and_reports_the_same(s3: Any) -> None:
    s3.create_bucket("files")
    writer = TaskFileWriter("s3://files/table", "job-a", 0, 0, 0, SCHEMA,
                            storage_options=s3.storage_options)
    (report,) = writer.write_all([rows(0, 100)])
    fs = s3.filesystem()
    assert fs.size(f"files/table/{report.path}") == report.bytes
    with fs.open(f"files/table/{report.path}", "rb") as f:
        assert pq.read_table(f).equals(rows(0, 100))


def test_an_aborted_writer_deletes_what_it_wrote(tmp_path: Any) -> None:
    writer = TaskFileWriter(str(tmp_path), "j", 0, 0, 0, SCHEMA, target_file_bytes=5000,
                            row_group_rows=100)
    writer.write(rows(0, 1000))
    writer.abort()
    assert list((tmp_path / "data").iterdir()) == []
