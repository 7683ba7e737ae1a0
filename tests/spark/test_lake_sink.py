"""The lake sink on real Spark (issue 28): a coordinated file source written into a Delta table
and an Iceberg table (pyiceberg's SQL catalog on sqlite), read back with deltalake / pyiceberg;
a task that fails after it wrote and reported its files leaves neither a duplicate row nor an
orphan file; a second run appends; a checkpoint behind the table is refused."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from typing import Any

import pytest

from sparkcoord.sinks.task import SinkSubtask
from tests.spark import lake_kill_job

pytestmark = pytest.mark.spark

FILES, ROWS = 6, 50


def write_files(data: pathlib.Path, first: int = 0, files: int = FILES) -> list[int]:
    """``files`` JSON-lines files of ``ROWS`` rows, ids from ``first``; the ids."""
    data.mkdir(exist_ok=True)
    ids = []
    for f in range(files):
        start = first + f * ROWS
        rows = [{"id": i, "name": f"n{i}"} for i in range(start, start + ROWS)]
        (data / f"part-{start:06d}.json").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
        ids.extend(r["id"] for r in rows)
    return ids


class Lake:
    """The table a test writes (tests/spark/lake_kill_job.py's, in ``root``): its sink builder
    and its contents read back."""

    def __init__(self, kind: str, root: pathlib.Path) -> None:
        self.kind, self.root = kind, root
        self.catalog_options = lake_kill_job.catalog_options(str(root))
        if kind == "iceberg":
            lake_kill_job.iceberg_table(str(root))  # creates the namespace "lake"
        self.table = str(root / "delta") if kind == "delta" else lake_kill_job.TABLE

    def sink(self, job: Any, **options: Any) -> Any:
        from sparkcoord.sinks import LakeSink

        sink = LakeSink(job).format(self.kind).options(targetFileSize="64k", **options)
        if self.kind == "iceberg":
            sink = sink.options(**self.catalog_options)
        return sink

    def rows(self) -> list[tuple[int, str]]:
        data = lake_kill_job.table_data(str(self.root), self.kind)
        return sorted(zip(data.column("id").to_pylist(), data.column("name").to_pylist(),
                          strict=True))

    def location(self) -> pathlib.Path:
        return pathlib.Path(lake_kill_job.table_location(str(self.root), self.kind))

    def data_files(self) -> set[str]:
        """The data files in the table's data directory (relative to the table)."""
        return lake_kill_job.data_files(str(self.root), self.kind)

    def referenced(self) -> set[str]:
        """The data files the table references."""
        return lake_kill_job.referenced(str(self.root), self.kind)


class FailingSinkSubtask(SinkSubtask):
    """Fails the first attempt of the first subtask to have rows, after it wrote and reported
    its files (test only). Whichever subtask it is: the file source's readers pull their
    splits, so which of them (and so which sink subtask) gets rows in a batch is a race."""

    def __init__(self, target: Any, marker: str) -> None:
        super().__init__(target)
        self.marker = marker

    def process(self) -> Any:
        super().process()
        context = self._context
        assert context is not None
        if self._reported:
            try:  # once in all: the marker's creation is atomic, another subtask's loses
                fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                return None
            with os.fdopen(fd, "w") as f:
                f.write(f"{context.subtask} {context.epoch} {context.spark_attempt}")
            raise RuntimeError("injected: the task failed after reporting its files")
        return None


def source(job: Any, data: pathlib.Path) -> Any:
    from sparkcoord.sources import FileStream

    return (FileStream(job).format("json").schema("id long, name string")
            .options(maxFilesPerTrigger="2").load(str(data)))


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_file_stream_lands_in_the_table_exactly_once_with_no_orphan_after_a_task_failure(
        spark, tmp_path, kind) -> None:
    from sparkcoord.spark import CoordinatedJob

    lake = Lake(kind, tmp_path)
    ids = write_files(tmp_path / "data")
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = source(job, tmp_path / "data")
    spec = lake.sink(job, parallelism="2").operator_spec(df, lake.table)
    marker = str(tmp_path / "failed")
    spec = dataclasses.replace(spec, operator=functools.partial(
        FailingSinkSubtask, spec.operator.args[0], marker))
    writer = lake.sink(job, parallelism="2").writer_of(df, spec)
    report = job.run(writer.trigger(availableNow=True), timeout_s=240)
    assert report.failures == []
    assert os.path.exists(marker), "the fault was never injected"
    assert lake.rows() == [(i, f"n{i}") for i in ids]
    # the failed attempt's reported files were withdrawn and deleted by the cleanup
    assert lake.data_files() == lake.referenced()
    assert len(lake.referenced()) >= 2
    # and Spark reads the same rows from the table's current file list
    files = [str(lake.location() / p) for p in sorted(lake.referenced())]
    read = spark.read.parquet(*files).select("id", "name").collect()
    assert sorted((r.id, r.name) for r in read) == [(i, f"n{i}") for i in ids]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_second_run_appends_and_a_reset_checkpoint_is_refused(spark, tmp_path, kind) -> None:
    from sparkcoord.runtime.restart import NoRestart
    from sparkcoord.spark import CoordinatedJob, JobGaveUp

    lake = Lake(kind, tmp_path)
    data = tmp_path / "data"
    ids = write_files(data, files=2)
    for run in range(2):
        job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
        writer = lake.sink(job, jobId="events").writer(source(job, data), lake.table)
        report = job.run(writer.trigger(availableNow=True), timeout_s=240)
        assert report.failures == []
        assert lake.rows() == [(i, f"n{i}") for i in ids]
        if run == 0:
            ids += write_files(data, first=10_000, files=2)
    # the same job id from a fresh checkpoint: the table is ahead of it
    job = CoordinatedJob(spark, str(tmp_path / "ckpt-reset"))
    writer = lake.sink(job, jobId="events").writer(source(job, data), lake.table)
    with pytest.raises(JobGaveUp, match="CheckpointBehindTable|checkpoint being restored"):
        job.run(writer.trigger(availableNow=True), restart=NoRestart(), timeout_s=240)
    assert lake.rows() == [(i, f"n{i}") for i in ids]


def test_the_examples_of_docs_sinks_write_a_delta_and_an_iceberg_table_as_written(
        spark, tmp_path) -> None:
    import re

    from sparkcoord.spark import CoordinatedJob

    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "sinks.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    ids = write_files(tmp_path / "data")
    namespace: dict[str, Any] = {"spark": spark, "checkpoint": str(tmp_path / "ckpt"),
                                 "data": str(tmp_path / "data"),
                                 "table": str(tmp_path / "delta")}
    exec(compile(blocks[0], str(doc), "exec"), namespace)  # noqa: S102
    assert namespace["report"].failures == []
    assert Lake("delta", tmp_path).rows() == [(i, f"n{i}") for i in ids]
    # the Iceberg fragment, on a job and source of its own
    lake = Lake("iceberg", tmp_path)  # creates the namespace "lake", as the docs ask
    job = CoordinatedJob(spark, str(tmp_path / "ckpt-iceberg"))
    namespace.update(lake=str(tmp_path), job=job, events=source(job, tmp_path / "data"))
    exec(compile(blocks[1], str(doc), "exec"), namespace)  # noqa: S102
    report = job.run(namespace["writer"].trigger(availableNow=True), timeout_s=240)
    assert report.failures == []
    assert lake.rows() == [(i, f"n{i}") for i in ids]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_run_the_fence_refuses_writes_no_file_and_is_not_restarted(spark, tmp_path,
                                                                     kind) -> None:
    """Issue 43 finding 11: a job refused as a second writer wrote 3 files into the other
    job's table directory and restarted 3 times on a refusal no restart changes."""
    from sparkcoord.runtime.restart import FixedDelay
    from sparkcoord.spark import CoordinatedJob, JobGaveUp

    lake = Lake(kind, tmp_path)
    data = tmp_path / "data"
    ids = write_files(data, files=2)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    writer = lake.sink(job, jobId="events").writer(source(job, data), lake.table)
    assert job.run(writer.trigger(availableNow=True), timeout_s=240).failures == []
    files = lake.data_files()
    write_files(data, first=10_000, files=2)  # rows the refused run would write
    job = CoordinatedJob(spark, str(tmp_path / "ckpt-other"))
    writer = lake.sink(job, jobId="events").writer(source(job, data), lake.table)
    handle = job.start(writer.trigger(availableNow=True),
                       restart=FixedDelay(attempts=3, delay_s=0.0), timeout_s=240)
    with pytest.raises(JobGaveUp, match="CheckpointBehindTable.*which a restart cannot change"):
        handle.await_termination(240)
    assert handle.restarts == 0
    assert lake.data_files() == files  # nothing written into the table's directory
    assert lake.rows() == [(i, f"n{i}") for i in ids]
