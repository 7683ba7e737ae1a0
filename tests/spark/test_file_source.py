"""The file source on real Spark (local[2,4]): parquet, CSV and JSON lines read exactly once,
bounded runs that end by themselves (availableNow), files arriving while a continuous source
runs, rate limits, and failures (a task retry in the middle of a split, fail_job)."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from sparkcoord.sources import FileStream
from sparkcoord.spark import CoordinatedJob
from tests.spark.helpers import sink_rows

pytestmark = pytest.mark.spark
SCHEMA = "id long, name string, score double"


def write_files(directory: str, fmt: str, files: int, rows: int, first_id: int = 0,
                prefix: str = "part") -> list[int]:
    """``files`` files of ``rows`` rows each, ids consecutive from ``first_id``."""
    os.makedirs(directory, exist_ok=True)
    ids: list[int] = []
    for f in range(files):
        start = first_id + f * rows
        table = pa.table({"id": pa.array(range(start, start + rows), pa.int64()),
                          "name": [f"n{i}" for i in range(start, start + rows)],
                          "score": [i * 0.5 for i in range(start, start + rows)]})
        path = os.path.join(directory, f"{prefix}-{start:08d}.{fmt}")
        tmp = os.path.join(directory, f".tmp-{start}")
        if fmt == "parquet":
            pq.write_table(table, tmp, row_group_size=max(1, rows // 3))
        elif fmt == "csv":
            pacsv.write_csv(table, tmp)
        else:
            with open(tmp, "w") as out:
                for row in table.to_pylist():
                    out.write(json.dumps(row) + "\n")
        os.rename(tmp, path)  # appear whole, as a writer dropping files does
        ids.extend(range(start, start + rows))
    return ids


def file_stream(job: CoordinatedJob, fmt: str, **options: Any) -> FileStream:
    stream = FileStream(job).format(fmt).schema(SCHEMA)
    if fmt == "csv":
        stream.option("header", "true")
    return stream.options(**options)


def assert_exactly_once(rows: list[Any], ids: list[int]) -> None:
    counts = Counter(r.id for r in rows)
    missing = set(ids) - set(counts)
    assert not missing, f"{len(missing)} rows lost, e.g. {sorted(missing)[:5]}"
    twice = {i: c for i, c in counts.items() if c > 1}
    assert not twice, f"{len(twice)} rows duplicated, e.g. {sorted(twice.items())[:5]}"
    assert set(counts) == set(ids)
    assert all(r.name == f"n{r.id}" and r.score == r.id * 0.5 for r in rows)


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_a_bounded_source_reads_every_row_once_and_ends_an_available_now_run(
        spark, tmp_path, fmt) -> None:
    data, out = str(tmp_path / "data"), str(tmp_path / "out")
    ids = write_files(data, fmt, files=6, rows=500)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = file_stream(job, fmt, bounded="true", maxSplitBytes="4k", parallelism=2).load(data)
    report = job.run(df.writeStream.format("parquet").option("path", out)
                     .trigger(availableNow=True), timeout_s=180)
    assert report.failures == []
    assert_exactly_once(sink_rows(spark, out), ids)
