"""What a lake sink deletes (sparkcoord/sinks/cleanup.py): garbage of ours, never a committed
file, never another writer's."""

from __future__ import annotations

from typing import Any

import pytest

from sparkcoord.sinks.cleanup import (
    delete_files,
    epoch_prefix,
    files_to_delete,
    list_data_files,
)
from sparkcoord.sinks.files import data_file_name
from tests.sinks.conftest import rows
from tests.sinks.lakes import Lake


def name(epoch: int, job: str = "job", attempt: int = 0, token: str = "0" * 12) -> str:
    return f"data/{data_file_name(job, epoch, 0, attempt, token, 0)}"


def test_only_our_unheld_files_of_final_epochs_are_chosen() -> None:
    listed = [name(1), name(1, attempt=1), name(2), name(3), name(1, job="other"),
              "data/part-00000-foreign.parquet", "_delta_log/00000.json"]
    chosen = files_to_delete("job", listed, final_through=2, held={name(1, attempt=1), name(2)})
    assert chosen == [name(1)]  # epoch 3 is not final; others are held or not ours


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_files_of_failed_attempts_are_deleted_after_the_commit_and_committed_ones_never(
        kind: str, tmp_path: Any) -> None:
    lake = Lake(kind, tmp_path)
    committer = lake.committer()
    committer.open()
    location = lake.location(committer)
    failed = lake.write(committer, 0, rows(0, 20), attempt=0)  # never reported
    good = lake.write(committer, 0, rows(0, 20), attempt=1)
    committer.commit(0, good)
    listed = list_data_files(location, prefix=epoch_prefix("job", 0))
    doomed = files_to_delete("job", listed, final_through=0,
                             held={f.path for f in good} | committer.referenced_paths())
    assert doomed == sorted(f.path for f in failed)
    assert delete_files(location, doomed) == len(failed)
    assert delete_files(location, doomed) == 0  # a cleanup retried after a crash
    assert sorted(list_data_files(location)) == sorted(f.path for f in good)
    assert lake.read().equals(rows(0, 20))


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_the_orphan_sweep_deletes_only_our_files_no_committed_or_pending_epoch_holds(
        kind: str, tmp_path: Any) -> None:
    lake = Lake(kind, tmp_path)
    committer = lake.committer()
    committer.open()
    location = lake.location(committer)
    committed = lake.write(committer, 0, rows(0, 10))
    committer.commit(0, committed)
    orphan = lake.write(committer, 1, rows(1, 10))  # a batch whose report was lost
    pending = lake.write(committer, 2, rows(2, 10))  # reported, its commit not done
    unfinished = lake.write(committer, 3, rows(3, 10))  # a batch that may still report
    other_job = lake.committer(job_id="other")
    other_job.open()
    foreign = lake.write(other_job, 1, rows(1, 10))
    root = location.removeprefix("file://")
    (tmp_path / "stray.parquet").write_bytes(b"x")
    open(f"{root}/data/part-00000-spark.parquet", "wb").close()
    held = committer.referenced_paths() | {f.path for f in pending}
    doomed = files_to_delete("job", list_data_files(location), final_through=2, held=held)
    assert doomed == sorted(f.path for f in orphan)
    delete_files(location, doomed)
    left = set(list_data_files(location))
    for kept in (committed, pending, unfinished, foreign):
        assert {f.path for f in kept} <= left
    assert "data/part-00000-spark.parquet" in left
    assert lake.read().equals(rows(0, 10))
