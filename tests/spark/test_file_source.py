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


def run_until_rows(spark: Any, job: CoordinatedJob, df: Any, out: str, expected: int,
                   **options: Any) -> Any:
    writer = (df.writeStream.format("parquet").option("path", out)
              .trigger(processingTime="0 seconds"))
    return job.run(writer, until=lambda: len(sink_rows(spark, out)) >= expected, poll_s=0.3,
                   timeout_s=240, **options)


def test_a_continuous_source_reads_files_that_arrive_while_it_runs_and_keeps_its_state_small(
        spark, tmp_path) -> None:
    data, out = str(tmp_path / "data"), str(tmp_path / "out")
    ids = write_files(data, "json", files=3, rows=200)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = file_stream(job, "json", discoveryInterval="200ms", parallelism=2).load(data)
    handle = job.start(df.writeStream.format("parquet").option("path", out)
                       .trigger(processingTime="0 seconds"), timeout_s=240)
    try:
        wave = 0
        while len(ids) < 3 * 200 + 4 * 3 * 100:
            wave += 1
            before = len(sink_rows(spark, out))
            ids += write_files(data, "json", files=3, rows=100, first_id=10_000 * wave)
            assert handle.await_termination(0) is False
            waited = 0
            while len(sink_rows(spark, out)) < before + 300 and waited < 600:
                handle.await_termination(0.2)
                waited += 1
        status = handle.request("files", "status")
    finally:
        handle.stop()
    assert_exactly_once(sink_rows(spark, out), ids)
    assert status["pending"] == 0 and status["in_flight"] == 0
    assert status["handed_out"] == status["finished"] == 15
    # the marker plus the files since the last backfill, not one entry per file ever seen
    assert status["discovery_state_entries"] <= 1 + 15


def test_max_files_per_trigger_spreads_the_files_over_batches(spark, tmp_path) -> None:
    data, out = str(tmp_path / "data"), str(tmp_path / "out")
    ids = write_files(data, "parquet", files=6, rows=90)  # 3 row groups per file
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = file_stream(job, "parquet", bounded="true", maxFilesPerTrigger="2").load(data)
    handle = job.start(df.writeStream.format("parquet").option("path", out)
                       .trigger(availableNow=True), timeout_s=180)
    assert handle.await_termination(200)
    assert_exactly_once(sink_rows(spark, out), ids)
    sizes = [p.numInputRows for p in handle.query.recentProgress if p.numInputRows]
    assert sum(sizes) == len(ids)
    assert max(sizes) <= 2 * 90 and len(sizes) >= 3, sizes  # at most 2 files per batch


def failing_reader(options: Any, schema_json: str, marker_dir: str) -> Any:
    """A FileReader whose task raises once, after the first record batch of a file's second
    row group (a task retry in the middle of a split)."""
    from sparkcoord.examples.numbers import _once
    from sparkcoord.sources.files.reading import FileReader

    class Reader(FileReader):
        def read_split(self, split: Any, position: Any) -> Any:
            for n, item in enumerate(super().read_split(split, position)):
                yield item
                if (n == 0 and split.split_id.endswith("#rg1")
                        and _once(marker_dir, "fail_task")):
                    raise RuntimeError(f"injected task failure in the middle of {split.split_id}")

    return Reader(options, schema_json)


def failing_enumerator(context: Any, marker_dir: str, after: int, **kwargs: Any) -> Any:
    from sparkcoord.examples.numbers import _once
    from sparkcoord.sources.enumerator import SplitEnumerator

    class Enumerator(SplitEnumerator):
        def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
            if self.state.handed_out == after and _once(marker_dir, "fail_job"):
                self.context.fail_job("injected failure while handing out splits")
            return super().handle_request(subtask, attempt, request)

    return Enumerator(context, **kwargs)


@pytest.mark.parametrize("failure", ["task retry mid-split", "fail_job"])
def test_a_failure_while_reading_loses_and_repeats_no_row(spark, tmp_path, failure) -> None:
    import dataclasses
    import functools

    data, out, markers = (str(tmp_path / "data"), str(tmp_path / "out"),
                          str(tmp_path / "markers"))
    ids = write_files(data, "parquet", files=6, rows=300)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    spec, struct = file_stream(job, "parquet", batchRows="40").operator_spec(data)
    if failure == "fail_job":
        enumerator = functools.partial(failing_enumerator, marker_dir=markers, after=7,
                                       **spec.coordinator.keywords)
        spec = dataclasses.replace(spec, coordinator=enumerator)
    else:
        reader = functools.partial(failing_reader, *spec.operator.args, marker_dir=markers)
        spec = dataclasses.replace(spec, operator=reader)
    df = job.sources([spec], struct, name="files")
    report = run_until_rows(spark, job, df, out, len(ids))
    assert os.listdir(markers), "no failure was injected"
    assert report.restarts == (1 if failure == "fail_job" else 0)
    assert_exactly_once(sink_rows(spark, out), ids)


def test_the_tail_command_reads_a_directory_into_a_parquet_sink_and_reports_its_rows(
        spark, tmp_path) -> None:
    import io

    from rich.console import Console

    from sparkcoord.sources.files.tail import run_tail

    data, out = str(tmp_path / "data"), str(tmp_path / "out")
    ids = write_files(data, "csv", files=4, rows=250)
    screen = io.StringIO()
    result = run_tail(data, "csv", out, str(tmp_path / "ckpt"), schema=SCHEMA,
                      options={"header": "true"}, bounded=True, spark=spark,
                      console=Console(file=screen, width=200))
    assert result["rows"] == len(ids) and result["restarts"] == 0
    assert "1,000 rows" in screen.getvalue()
    assert_exactly_once(sink_rows(spark, out), ids)


def test_the_own_source_example_of_the_docs_runs_as_written(spark, tmp_path) -> None:
    import inspect

    import sparkcoord.examples.ranges as ranges
    from tests.test_docs_examples import python_blocks

    # blocks 2 and 3 of sources.md (tests/test_docs_examples.py's EXECUTED): the module, the job
    module_block, block = python_blocks("sources.md")[2:4]
    source = inspect.getsource(ranges)
    assert module_block == source[source.index("from __future__"):]  # the module, as shown
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    namespace: dict[str, Any] = {"job": job}
    exec(compile(block, "docs/sources.md", "exec"), namespace)  # noqa: S102
    out = str(tmp_path / "out")
    report = job.run(namespace["df"].writeStream.format("parquet").option("path", out)
                     .trigger(availableNow=True), timeout_s=180)
    assert report.failures == []
    assert sorted(r.id for r in sink_rows(spark, out)) == list(range(4000))


#: files of the availableNow backlog test: twice the default maxFilesPerDiscovery (10,000) in
#: the default suite (about 25 s); the issue's 100,000 (about 2 minutes on 2 cores: a Python
#: source asks the driver once per file, ~1,100 files/s) with SPARKCOORD_BACKLOG_FILES=100000
BACKLOG_FILES = int(os.environ.get("SPARKCOORD_BACKLOG_FILES", "20000"))


def test_an_available_now_run_over_a_backlog_past_the_listing_cap_reads_every_file(
        spark, tmp_path) -> None:
    # issue 24 item 2a: a bounded source listed once with maxFilesPerDiscovery (10,000) as
    # its cap and ended the availableNow run after 10,000 of 100,000 files, no error. A
    # bounded source's one listing now takes every file.
    data, out = tmp_path / "data", str(tmp_path / "out")
    data.mkdir()
    files = BACKLOG_FILES
    assert files > 10_000  # past the default cap, or the test shows nothing
    for i in range(files):
        (data / f"f{i:06d}.json").write_text(f'{{"id":{i}}}\n')
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = FileStream(job).format("json").schema("id long").option("bounded", "true").load(
        str(data))
    report = job.run(df.writeStream.format("parquet").option("path", out)
                     .trigger(availableNow=True), timeout_s=900)
    assert report.failures == []
    from pyspark.sql import functions as F

    got = spark.read.parquet(out).agg(F.count("*").alias("rows"),
                                      F.countDistinct("id").alias("ids"),
                                      F.min("id").alias("low"), F.max("id").alias("high"))
    assert got.first().asDict() == {"rows": files, "ids": files, "low": 0, "high": files - 1}


def test_an_available_now_run_of_a_continuous_source_reads_past_the_per_cycle_cap(
        spark, tmp_path) -> None:
    # a continuous source (no ``bounded``) takes maxFilesPerDiscovery files per listing
    # cycle; in an availableNow run it lists, as the run starts, until a cycle finds nothing,
    # and reads all of it before the run ends (decision 53). Before: 300 of 1,000 files
    data, out = tmp_path / "data", str(tmp_path / "out")
    data.mkdir()
    files = 1_000
    for i in range(files):
        (data / f"f{i:06d}.json").write_text(f'{{"id":{i}}}\n')
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = (FileStream(job).format("json").schema("id long")
          .option("maxFilesPerDiscovery", "300")
          .option("discoveryInterval", "10 minutes")  # no periodic cycle during the run
          .load(str(data)))
    report = job.run(df.writeStream.format("parquet").option("path", out)
                     .trigger(availableNow=True), timeout_s=300)
    assert report.failures == []
    ids = sorted(r.id for r in sink_rows(spark, out))
    assert ids == list(range(files)), (len(ids), len(set(ids)))


def packed_failing_reader(options: Any, schema_json: str, marker_dir: str) -> Any:
    """A FileReader that stops a batch after 150 rows (so packed splits are kept and resumed
    from a (member, rows) position in the next batch) and whose task raises once, after the
    second record batch of a resumed packed split (a task retry in the middle of it)."""
    from sparkcoord.examples.numbers import _once
    from sparkcoord.sources.files.reading import FileReader

    class Reader(FileReader):
        max_rows_per_batch = 150

        def read_split(self, split: Any, position: Any) -> Any:
            for n, item in enumerate(super().read_split(split, position)):
                yield item
                if (split.files and position is not None and n == 1
                        and _once(marker_dir, "fail_task")):
                    raise RuntimeError(f"injected task failure in the middle of packed split "
                                       f"{split.split_id} (from {position})")

    return Reader(options, schema_json)


def test_tiny_files_packed_into_few_splits_are_read_exactly_once_across_a_task_retry(
        spark, tmp_path) -> None:
    # issue 25 item 4 (sources/files rule 8): 2,000 one-line files in splits of 32 files; a reader
    # stops mid-split, resumes it from its (member, rows) position in the next batch, and
    # its task fails there once: Spark retries it, no row is lost or repeated, and every
    # row's _metadata names its own file
    import dataclasses
    import functools

    data, out, markers = tmp_path / "data", str(tmp_path / "out"), str(tmp_path / "markers")
    data.mkdir()
    files = 2_000
    for i in range(files):
        (data / f"t-{i:06d}.json").write_text(json.dumps(
            {"id": i, "name": f"n{i}", "score": i * 0.5}) + "\n")
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    spec, struct = file_stream(job, "json", bounded="true", batchRows="5",
                               includeMetadata="true").operator_spec(str(data))
    reader = functools.partial(packed_failing_reader, *spec.operator.args, marker_dir=markers)
    df = job.sources([dataclasses.replace(spec, operator=reader)], struct, name="files")
    report = job.run(df.writeStream.format("parquet").option("path", out)
                     .trigger(availableNow=True), timeout_s=300)
    assert report.failures == [] and report.restarts == 0
    assert os.listdir(markers), "no failure was injected"
    rows = sink_rows(spark, out)
    assert_exactly_once(rows, list(range(files)))
    assert all(r._metadata.file_name == f"t-{r.id:06d}.json" for r in rows)


@pytest.mark.parametrize("ddl", [SCHEMA, "id long", "`a b` int NOT NULL, m map<string, array<int>>",
                                 "s struct<x: int, y: string>, d decimal(10, 2)", "int",
                                 "c char(5), v varchar(10)", "m map<string, array<char(2)>>",
                                 "a: int, b: string",
                                 "x int COMMENT 'the x', s string COLLATE UTF8_LCASE"])
def test_a_schema_string_gives_the_struct_or_the_error_create_data_frame_gives(
        spark, ddl) -> None:
    from sparkcoord.spark.session import struct_of

    def outcome(make: Any) -> Any:
        try:
            return make()
        except Exception as exc:  # noqa: BLE001 - the outcome compared is the error's kind
            return type(exc).__name__

    expected = outcome(lambda: spark.createDataFrame([], ddl).schema)
    assert outcome(lambda: struct_of(spark, ddl)) == expected
    if "char(" in ddl:
        assert isinstance(expected, str)  # refused there, so refused here
