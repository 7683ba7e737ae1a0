"""The lake sink on an S3-compatible server (moto's standalone server on loopback) as on local
disk (issue 28 item 8): a coordinated file stream written into a Delta table at
``s3://bucket/...`` and into an Iceberg table whose warehouse is on S3 (pyiceberg's SQL
catalog in a local sqlite file), read back with deltalake / pyiceberg: exactly the input rows
after a sink task failed once, every data file on S3 referenced by the table, and a second
run appending.

The endpoint and the region go through ``LakeSink.storage_options`` (one name each, handed to
s3fs, delta-rs and pyiceberg's FileIO in their own names); the credentials come from the
environment of every Spark process (``spark.executorEnv``, through the session's
``environment``), never from an option: the checkpoint must not hold them, and does not."""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.s3_server import S3Server
from tests.spark.test_lake_sink import FailingSinkSubtask, source, write_files

pytestmark = pytest.mark.spark

#: moto takes any credentials; these are unique so that a leak into a file is found
SECRET = f"sc-secret-{uuid.uuid4().hex}"
ENVIRONMENT = {"AWS_ACCESS_KEY_ID": "sc-test-key-id", "AWS_SECRET_ACCESS_KEY": SECRET}
TABLE = "lake.events"


@pytest.fixture(scope="module")
def s3(spark: Any) -> Iterator[S3Server]:
    """moto's server, and the credentials in the environment of the driver program (the
    test's reads, the Iceberg table's creation) and of Spark's Python processes started from
    now on: the tasks, and the source runner hosting the sink's coordinator (a
    ``CoordinatedJob`` registers its source again, with the session's environment then)."""
    from sparkcoord.spark.source import CoordinatedSource

    server = S3Server()
    saved = {k: os.environ.get(k) for k in ENVIRONMENT}
    os.environ.update(ENVIRONMENT)
    environment = spark.sparkContext.environment
    environment.update(ENVIRONMENT)
    try:
        yield server
    finally:
        for key, value in saved.items():
            environment.pop(key, None)
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        spark.dataSource.register(CoordinatedSource)  # later jobs: without them
        server.stop()


class S3Lake:
    """A table on S3: the sink that writes it, and what is there read back."""

    def __init__(self, kind: str, s3: S3Server, root: pathlib.Path) -> None:
        self.kind, self.s3, self.root = kind, s3, root
        self.bucket = f"lake-{kind}-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(self.bucket)
        # versioned: a deleted object leaves a delete marker, so the test sees the cleanup's
        # deletes on S3 (not just that nothing is left)
        s3.filesystem().call_s3("put_bucket_versioning", Bucket=self.bucket,
                                VersioningConfiguration={"Status": "Enabled"})
        # not secret: options (the credentials are the environment's)
        self.storage = {"endpoint_url": s3.endpoint, "region": "us-east-1"}
        self.catalog = {"catalog.uri": f"sqlite:///{root}/catalog.db",
                        "catalog.warehouse": f"s3://{self.bucket}/warehouse"}
        if kind == "iceberg":
            self._catalog().create_namespace_if_not_exists("lake")
        self.table = f"s3://{self.bucket}/events" if kind == "delta" else TABLE

    def sink(self, job: Any, **options: Any) -> Any:
        from sparkcoord.sinks import LakeSink

        sink = (LakeSink(job).format(self.kind).options(targetFileSize="64k", **options)
                .storage_options(**self.storage))
        return sink.options(**self.catalog) if self.kind == "iceberg" else sink

    def _catalog(self) -> Any:
        from pyiceberg.catalog.sql import SqlCatalog

        from sparkcoord.sinks.target import storage_options_for

        return SqlCatalog("default", uri=self.catalog["catalog.uri"],
                          warehouse=self.catalog["catalog.warehouse"],
                          **storage_options_for("iceberg", self.storage))

    def _committer(self) -> Any:
        from sparkcoord.sinks.delta import DeltaCommitter
        from sparkcoord.sinks.iceberg import IcebergCommitter

        if self.kind == "delta":
            return DeltaCommitter(self.table, "check", None, storage_options=self.storage)
        return IcebergCommitter(self._catalog(), TABLE, "check", None)

    def location(self) -> str:
        if self.kind == "delta":
            return self.table
        return str(self._catalog().load_table(TABLE).location()).rstrip("/")

    def rows(self) -> list[tuple[int, str]]:
        if self.kind == "delta":
            from deltalake import DeltaTable

            from sparkcoord.sinks.target import storage_options_for

            data = DeltaTable(self.table, storage_options=storage_options_for(
                "delta", self.storage)).to_pyarrow_table()
        else:
            data = self._catalog().load_table(TABLE).scan().to_arrow()
        return sorted(zip(data.column("id").to_pylist(), data.column("name").to_pylist(),
                          strict=True))

    def data_files(self) -> set[str]:
        """The objects under the table's ``data/``, relative to the table."""
        fs = self.s3.filesystem()
        directory = f"{self.location().removeprefix('s3://')}/data"
        return {f"data/{p.rsplit('/', 1)[-1]}" for p in fs.find(directory)}

    def referenced(self) -> set[str]:
        return set(self._committer().referenced_paths())

    def deleted_files(self) -> set[str]:
        """The names of the data files deleted from the bucket."""
        listed = self.s3.filesystem().call_s3("list_object_versions", Bucket=self.bucket)
        return {m["Key"].rsplit("/", 1)[-1] for m in listed.get("DeleteMarkers", [])
                if "/data/" in m["Key"]}


def files_holding(root: pathlib.Path, needle: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_stream_lands_in_a_table_on_s3_exactly_once_despite_a_task_failure_and_a_rerun_appends(
        spark, s3, tmp_path, kind) -> None:
    from sparkcoord.spark import CoordinatedJob

    lake = S3Lake(kind, s3, tmp_path)
    data = tmp_path / "data"
    ids = write_files(data)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = source(job, data)
    spec = lake.sink(job, parallelism="2", jobId="events").operator_spec(df, lake.table)
    marker = str(tmp_path / "failed")
    spec = dataclasses.replace(spec, operator=functools.partial(
        FailingSinkSubtask, spec.operator.args[0], marker))
    writer = lake.sink(job, parallelism="2", jobId="events").writer_of(df, spec)
    report = job.run(writer.trigger(availableNow=True), timeout_s=240)
    assert report.failures == []
    assert os.path.exists(marker), "the fault was never injected"
    assert lake.location().startswith(f"s3://{lake.bucket}/")
    assert lake.rows() == [(i, f"n{i}") for i in ids]
    # the failed attempt's reported files were withdrawn and deleted from S3 by the cleanup
    assert lake.data_files() == lake.referenced()
    assert len(lake.referenced()) >= 2
    subtask, epoch, attempt = pathlib.Path(marker).read_text().split()
    failed = [n for n in lake.deleted_files() if f".e{epoch}.s{subtask}.a{attempt}." in n]
    assert failed, f"no file of the failed attempt was deleted: {lake.deleted_files()}"

    # a second run from the checkpoint: the sweep at its start lists the table's data on S3
    ids += write_files(data, first=10_000, files=2)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    writer = lake.sink(job, parallelism="2", jobId="events").writer(source(job, data),
                                                                    lake.table)
    report = job.run(writer.trigger(availableNow=True), timeout_s=240)
    assert report.failures == []
    assert lake.rows() == [(i, f"n{i}") for i in ids]
    assert lake.data_files() == lake.referenced()
    # the credentials came from the environment: nothing kept them
    assert files_holding(tmp_path / "ckpt", SECRET) == []

