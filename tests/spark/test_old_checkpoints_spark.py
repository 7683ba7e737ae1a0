"""A pipeline stopped by a released sparkcoord goes on with the code as it is now, exactly
once (issue 44: checkpoints survive an upgrade). The checkpoints are tests/fixtures/checkpoints'
(made by ``make.py`` with the released code); the decoding of every value they hold is
tests/test_old_checkpoints.py's."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.fixtures.checkpoints import TAGS, unpacked
from tests.fixtures.checkpoints.make import FILES, NUMBERS, ROWS, write_files

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("tag", TAGS)
def test_a_file_stream_into_delta_stopped_by_a_released_version_goes_on_exactly_once(
        spark: Any, tag: str) -> None:
    from deltalake import DeltaTable

    from sparkcoord.sinks import LakeSink
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    with unpacked(tag, "files_lake") as root:
        table = os.path.join(root, "delta")
        before = DeltaTable(table)
        stopped_at = before.to_pyarrow_table().num_rows
        assert 0 < stopped_at < FILES * ROWS  # the released run stopped in the middle
        write_files(os.path.join(root, "data"), FILES, 2)  # and more files came since
        job = CoordinatedJob(spark, os.path.join(root, "ckpt"))
        df = (FileStream(job).format("json").schema("id long, name string")
              .options(maxFilesPerTrigger="1").load(os.path.join(root, "data")))
        writer = (LakeSink(job).format("delta")
                  .options(targetFileSize="64k", compaction="true", parallelism="2")
                  .writer(df, table))
        report = job.run(writer.trigger(availableNow=True), timeout_s=240)
        assert report.failures == []
        data = DeltaTable(table).to_pyarrow_table()
        assert sorted(data.column("id").to_pylist()) == list(range((FILES + 2) * ROWS))
        assert DeltaTable(table).version() > before.version()


@pytest.mark.parametrize("tag", TAGS)
def test_a_user_coordinator_stopped_by_a_released_version_goes_on_exactly_once(
        spark: Any, tag: str) -> None:
    from tests.spark.helpers import numbers_job, run_until_rows, sink_rows, values_by_subtask

    with unpacked(tag, "numbers") as root:
        out = os.path.join(root, "out")
        assert values_by_subtask(sink_rows(spark, out)) == {  # as the released run left it
            ("numbers", 0): list(range(NUMBERS)), ("numbers", 1): list(range(NUMBERS))}
        # the coordinator goes on from its restored state: the next numbers, none again
        job, df = numbers_job(spark, root, total=2 * NUMBERS)
        report = run_until_rows(spark, job, df, out, 4 * NUMBERS)
        assert report.failures == []
        assert values_by_subtask(sink_rows(spark, out)) == {
            ("numbers", 0): list(range(2 * NUMBERS)), ("numbers", 1): list(range(2 * NUMBERS))}
