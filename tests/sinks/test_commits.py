"""Committing epochs to Delta and Iceberg tables once, and refusing what would break that
(sparkcoord/sinks/formats/delta/, formats/iceberg/, fencing.py), on real tables in tmp_path."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkcoord.sinks import (
    ALREADY_COMMITTED,
    COMMIT,
    CheckpointBehindTable,
    SecondWriter,
    TableBehindCheckpoint,
)
from tests.sinks.conftest import rows
from tests.sinks.lakes import Lake

KINDS = ["delta", "iceberg"]


@pytest.fixture(params=KINDS)
def lake(request: Any, tmp_path: Any) -> Lake:
    return Lake(request.param, tmp_path)


def test_an_epoch_committed_again_after_a_driver_died_between_the_commit_and_its_report_lands_once(
        lake: Lake) -> None:
    first = lake.committer(run_id="run1")
    first.open()
    files = lake.write(first, 0, rows(0, 300), target_file_bytes=4000)
    assert first.commit(0, files) == COMMIT
    # the driver dies before the report: the restored checkpoint still holds epoch 0 pending
    second = lake.committer(run_id="run2")
    assert second.open(pending=[0]) == 0
    assert second.commit(0, files) == ALREADY_COMMITTED
    more = lake.write(second, 1, rows(1, 50))
    assert second.commit(1, more) == COMMIT
    assert second.commit(1, more) == ALREADY_COMMITTED  # a retry in the same run
    assert lake.read().equals(pa.concat_tables([rows(0, 300), rows(1, 50)]))
    assert second.table_epoch() == 1


def test_the_statistics_the_table_records_match_the_data_of_each_file(lake: Lake) -> None:
    committer = lake.committer()
    committer.open()
    reports = lake.write(committer, 4, rows(4, 2000), target_file_bytes=8000)
    assert len(reports) > 1
    committer.commit(4, reports)
    recorded = lake.file_stats()
    assert set(recorded) == {r.path for r in reports}
    for report in reports:
        data = pq.read_table(f"{lake.location(committer).removeprefix('file://')}/{report.path}")
        ids = data.column("id").to_pylist()
        assert recorded[report.path] == {"rows": data.num_rows, "min": min(ids),
                                         "max": max(ids),
                                         "nulls": data.column("name").null_count}
    assert lake.read().equals(rows(4, 2000))


def test_a_checkpoint_behind_the_table_is_refused_naming_the_table_the_job_and_both_epochs(
        lake: Lake) -> None:
    committer = lake.committer(job_id="orders")
    committer.open()
    for epoch in range(3):
        committer.commit(epoch, lake.write(committer, epoch, rows(epoch, 10)))
    stale = lake.committer(job_id="orders")
    with pytest.raises(CheckpointBehindTable) as caught:
        stale.open(last_committed=0, pending=[1])  # a checkpoint copied from an older run
    message = str(caught.value)
    assert "'orders'" in message and "epoch 2" in message and "up to 1" in message
    assert ("lake.t" if lake.kind == "iceberg" else "/table") in message
    with pytest.raises(TableBehindCheckpoint, match="saw epoch 5 committed"):
        lake.committer(job_id="orders").open(last_committed=5)
    assert lake.read().num_rows == 30  # nothing was committed by the refused ones


def test_a_second_writer_with_the_same_job_id_is_refused_at_its_first_commit_after_the_first(
        lake: Lake) -> None:
    first, second = lake.committer(run_id="a"), lake.committer(run_id="b")
    first.open()
    second.open()  # both started from the same (empty) checkpoint
    first.commit(0, lake.write(first, 0, rows(0, 10)))
    with pytest.raises(SecondWriter, match="epoch 0 of job 'job' is in the table"):
        second.commit(0, lake.write(second, 0, rows(0, 10, start=5000)))
    first.commit(1, lake.write(first, 1, rows(1, 10)))
    with pytest.raises(SecondWriter, match="holds epoch 1, newer"):
        second.commit(2, lake.write(second, 2, rows(2, 10)))
    assert lake.read().equals(pa.concat_tables([rows(0, 10), rows(1, 10)]))
    # a new job started from an empty checkpoint on a table the job already wrote to
    with pytest.raises(CheckpointBehindTable, match="holds epoch 1"):
        lake.committer(run_id="c").open()


def test_two_writers_racing_for_one_epoch_land_it_once_and_the_loser_is_refused_on_retry(
        lake: Lake) -> None:
    first, second = lake.committer(run_id="a"), lake.committer(run_id="b")
    first.open()
    first.commit(0, lake.write(first, 0, rows(0, 5)))
    second.open(last_committed=0)
    files_a, files_b = lake.write(first, 1, rows(1, 5)), lake.write(second, 1, rows(1, 5))
    barrier = threading.Barrier(2)
    outcomes: dict[str, Any] = {}

    def run(name: str, committer: Any, files: Any) -> None:
        barrier.wait()
        for _ in range(5):  # the commit worker's retries
            try:
                outcomes[name] = committer.commit(1, files)
                return
            except SecondWriter as exc:
                outcomes[name] = exc
                return
            except Exception as exc:  # noqa: BLE001 - a lost race: retried
                outcomes[name] = exc
    threads = [threading.Thread(target=run, args=("a", first, files_a)),
               threading.Thread(target=run, args=("b", second, files_b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(type(o).__name__ for o in outcomes.values()) == ["SecondWriter", "str"]
    assert lake.read().equals(pa.concat_tables([rows(0, 5), rows(1, 5)]))


@pytest.mark.parametrize("kind", KINDS)
def test_an_epoch_lands_once_on_s3_too(kind: str, s3: Any, tmp_path: Any) -> None:
    bucket = f"lake-{kind}"
    s3.create_bucket(bucket)
    if kind == "delta":
        lake = Lake(kind, f"s3://{bucket}", storage_options=s3.storage_options,
                    delta_options={"AWS_ENDPOINT_URL": s3.endpoint,
                                   "AWS_ACCESS_KEY_ID": "testing",
                                   "AWS_SECRET_ACCESS_KEY": "testing",
                                   "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                                   "AWS_S3_ALLOW_UNSAFE_RENAME": "true"})
    else:  # the catalog on local sqlite, the table's metadata and data files on S3
        lake = Lake(kind, f"s3://{bucket}", storage_options=s3.storage_options,
                    catalog_dir=tmp_path, warehouse=f"s3://{bucket}/warehouse",
                    iceberg_io={"s3.endpoint": s3.endpoint, "s3.access-key-id": "testing",
                                "s3.secret-access-key": "testing", "s3.region": "us-east-1"})
    first = lake.committer(run_id="one")
    first.open()
    files = lake.write(first, 0, rows(0, 100))
    assert first.commit(0, files) == COMMIT
    again = lake.committer(run_id="two")
    again.open(pending=[0])
    assert again.commit(0, files) == ALREADY_COMMITTED
    assert lake.read().equals(rows(0, 100))
