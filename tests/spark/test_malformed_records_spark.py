"""Malformed records on real Spark (issue 25 item 1): a bounded availableNow run over JSON-lines
files, one of which has one bad line, in each of Spark's reader modes: PERMISSIVE (the default)
reads it as a row with its text in ``_corrupt_record``, DROPMALFORMED drops it, FAILFAST ends
the job with sparkcoord's error naming the file and the line first."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from sparkcoord.runtime.restart import NoRestart
from sparkcoord.sources import FileStream
from sparkcoord.spark import CoordinatedJob, JobGaveUp
from tests.spark.helpers import sink_rows

pytestmark = pytest.mark.spark
SCHEMA = "id long, name string, _corrupt_record string"
FILES, ROWS, BAD_FILE, BAD_LINE = 4, 30, 2, 20
#: a line cut short, as a writer that died mid-line leaves it
BAD = '{"id": 66, "name": "n6'


def write_files(directory: str) -> tuple[list[int], str, int]:
    """FILES files of ROWS lines; line BAD_LINE (1-based) of file BAD_FILE is BAD. Returns the
    good ids, the bad file's path and the byte offset of its bad line."""
    os.makedirs(directory, exist_ok=True)
    ids: list[int] = []
    bad_path, bad_offset = "", 0
    for f in range(FILES):
        lines = [json.dumps({"id": f * ROWS + i, "name": f"n{f * ROWS + i}"})
                 for i in range(ROWS)]
        if f == BAD_FILE:
            lines[BAD_LINE - 1] = BAD
            bad_offset = sum(len(line) + 1 for line in lines[:BAD_LINE - 1])
        path = os.path.join(directory, f"part-{f:03d}.json")
        with open(path, "w") as out:
            out.writelines(line + "\n" for line in lines)
        ids.extend(f * ROWS + i for i in range(ROWS)
                   if not (f == BAD_FILE and i == BAD_LINE - 1))
        if f == BAD_FILE:
            bad_path = path
    return ids, bad_path, bad_offset


def job_and_writer(spark, tmp_path, **options: str):
    data, out = str(tmp_path / "data"), str(tmp_path / "out")
    ids, bad_path, bad_offset = write_files(data)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    df = (FileStream(job).format("json").schema(SCHEMA)
          .options(bounded="true", maxSplitBytes="256", parallelism="2", **options).load(data))
    writer = df.writeStream.format("parquet").option("path", out).trigger(availableNow=True)
    return job, writer, out, ids, bad_path, bad_offset


@pytest.mark.parametrize("mode", [None, "dropmalformed"], ids=["default-permissive",
                                                               "dropmalformed"])
def test_a_bounded_run_reads_every_good_row_once_and_the_bad_line_as_its_mode_says(
        spark, tmp_path, mode) -> None:
    options = {} if mode is None else {"mode": mode}
    job, writer, out, ids, _, _ = job_and_writer(spark, tmp_path, **options)
    report = job.run(writer, timeout_s=180)
    assert report.failures == []
    rows = sink_rows(spark, out)
    good = [r for r in rows if r.id is not None]
    assert Counter(r.id for r in good) == Counter(ids)  # every good row, exactly once
    assert all(r.name == f"n{r.id}" and r._corrupt_record is None for r in good)
    bad = [r.asDict() for r in rows if r.id is None]
    if mode is None:  # PERMISSIVE, Spark's default: a row of nulls holding the raw line
        assert bad == [{"id": None, "name": None, "_corrupt_record": BAD}]
    else:
        assert bad == []


def test_failfast_ends_the_job_with_an_error_that_leads_with_the_file_and_the_line(
        spark, tmp_path) -> None:
    job, writer, out, _, bad_path, bad_offset = job_and_writer(spark, tmp_path, mode="FAILFAST")
    with pytest.raises(JobGaveUp) as caught:
        job.run(writer, restart=NoRestart(), timeout_s=180)
    first = str(caught.value).splitlines()[0]
    assert first.startswith(f"MalformedRecord: malformed record in {bad_path} line {BAD_LINE} "
                            f"(byte offset {bad_offset}): JSON parse error: "), first
    assert repr(BAD) in first and "mode FAILFAST" in first
