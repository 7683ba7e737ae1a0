"""The file source reading from a real S3-compatible server (moto's standalone server on
loopback, started here): a bounded parquet run and a continuous JSON-lines run with files
arriving while it runs, every row exactly once; discovery lists only names after its marker."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkcoord.sources import FileStream
from sparkcoord.spark import CoordinatedJob
from tests.s3_server import S3Server
from tests.spark.helpers import sink_rows
from tests.spark.test_file_source import SCHEMA, assert_exactly_once

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    yield server
    server.stop()


def put_files(s3: S3Server, prefix: str, fmt: str, files: int, rows: int,
              first_id: int = 0) -> list[int]:
    fs = s3.filesystem()
    ids: list[int] = []
    for f in range(files):
        start = first_id + f * rows
        table = pa.table({"id": pa.array(range(start, start + rows), pa.int64()),
                          "name": [f"n{i}" for i in range(start, start + rows)],
                          "score": [i * 0.5 for i in range(start, start + rows)]})
        if fmt == "parquet":
            buffer = io.BytesIO()
            pq.write_table(table, buffer, row_group_size=max(1, rows // 2))
            body = buffer.getvalue()
        else:
            body = "".join(json.dumps(r) + "\n" for r in table.to_pylist()).encode()
        fs.pipe(f"{prefix}/part-{start:08d}.{fmt}", body)
        ids.extend(range(start, start + rows))
    return ids


def test_a_bounded_parquet_source_on_s3_reads_every_row_once(spark, tmp_path, s3) -> None:
    s3.create_bucket("bounded")
    ids = put_files(s3, "bounded/events", "parquet", files=5, rows=400)
    out = str(tmp_path / "out")
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = (FileStream(job).format("parquet").storage_options(**s3.storage_options)
          .option("bounded", "true").load("s3://bounded/events"))  # schema inferred
    report = job.run(df.writeStream.format("parquet").option("path", out)
                     .trigger(availableNow=True), timeout_s=180)
    assert report.failures == []
    assert df.schema.simpleString() == "struct<id:bigint,name:string,score:double>"
    assert_exactly_once(sink_rows(spark, out), ids)


def test_a_continuous_json_source_on_s3_reads_files_arriving_while_it_runs(
        spark, tmp_path, s3) -> None:
    s3.create_bucket("continuous")
    ids = put_files(s3, "continuous/events", "json", files=2, rows=300)
    out = str(tmp_path / "out")
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = (FileStream(job).format("json").schema(SCHEMA).storage_options(**s3.storage_options)
          .option("discoveryInterval", "200ms").load("s3://continuous/events"))
    handle = job.start(df.writeStream.format("parquet").option("path", out)
                       .trigger(processingTime="0 seconds"), timeout_s=240)
    try:
        for wave in range(1, 4):
            before = len(sink_rows(spark, out))
            ids += put_files(s3, "continuous/events", "json", files=2, rows=100,
                             first_id=10_000 * wave)
            for _ in range(600):
                if len(sink_rows(spark, out)) >= before + 200:
                    break
                assert not handle.await_termination(0.2)
        status = handle.request("files", "status")
    finally:
        handle.stop()
    assert_exactly_once(sink_rows(spark, out), ids)
    assert status["handed_out"] == status["finished"] == 8
