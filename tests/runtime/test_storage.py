import os
import pathlib

import pytest

from sparkcoord.core.entries import EventEntry, RegistrationEntry
from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.records import CheckpointRecord, encode_log_entry
from sparkcoord.runtime.storage import CheckpointStorage, RecordNotFound

SID = SubtaskId("op", 0)


def record(epoch: int, *events: bytes) -> CheckpointRecord:
    return CheckpointRecord(epoch, {"op": b"snap%d" % epoch}, {SID: list(events)})


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> CheckpointStorage:
    if request.param == "local":
        return CheckpointStorage(str(tmp_path / "ckpt"))
    return CheckpointStorage(f"memory://storage-test/{tmp_path.name}")


def test_a_record_is_written_and_read_back(storage: CheckpointStorage) -> None:
    storage.write_record(record(3, b"a", b"b"))
    assert storage.read_record(3).events_for(SID) == [b"a", b"b"]


def test_a_garbage_record_of_an_unlogged_epoch_is_overwritten(storage: CheckpointStorage) -> None:
    storage.write_record(record(4, b"garbage"))
    storage.write_record(record(4, b"fresh"))
    assert storage.read_record(4).events_for(SID) == [b"fresh"]


def test_a_missing_record_is_reported_with_its_path(storage: CheckpointStorage) -> None:
    with pytest.raises(RecordNotFound, match="epoch 9 not found"):
        storage.read_record(9)


def test_no_temporary_files_are_left_behind(tmp_path: pathlib.Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "c"))
    for i in range(3):
        storage.write_record(record(i))
    assert sorted(os.listdir(tmp_path / "c" / "records")) == ["0.ckpt", "1.ckpt", "2.ckpt"]


def test_a_corrupted_record_file_raises_naming_it(tmp_path: pathlib.Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "c"))
    storage.write_record(record(1, b"x"))
    path = tmp_path / "c" / "records" / "1.ckpt"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x55
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecord, match="1.ckpt: checksum mismatch"):
        storage.read_record(1)


def test_the_inbound_log_appends_reads_and_truncates(storage: CheckpointStorage) -> None:
    a = TaskAttempt("r", SID, 2, 0)
    entries = [RegistrationEntry(a), EventEntry(a, 0, b"e0"), EventEntry(a, 1, b"e1")]
    storage.start_inbound_log(2)
    for e in entries:
        storage.append_inbound(2, encode_log_entry(e))
    assert storage.read_inbound_log(2) == entries
    storage.truncate_inbound_log(2)
    with pytest.raises(RecordNotFound, match="inbound log of epoch 2 is missing"):
        storage.read_inbound_log(2)


def test_starting_a_log_discards_a_garbage_log_of_the_same_epoch(storage: CheckpointStorage) -> None:
    a = TaskAttempt("old", SID, 5, 0)
    storage.start_inbound_log(5)
    storage.append_inbound(5, encode_log_entry(RegistrationEntry(a)))
    storage.start_inbound_log(5)
    assert storage.read_inbound_log(5) == []


def test_a_torn_tail_in_the_log_of_a_committed_batch_is_an_error_naming_the_file(
        tmp_path: pathlib.Path) -> None:
    # the restore reads only logs of committed batches, whose frames were all acknowledged
    storage = CheckpointStorage(str(tmp_path / "c"))
    a = TaskAttempt("r", SID, 1, 0)
    storage.start_inbound_log(1)
    storage.append_inbound(1, encode_log_entry(RegistrationEntry(a)))
    storage.append_inbound(1, encode_log_entry(EventEntry(a, 0, b"payload"))[:-3])  # torn
    with pytest.raises(CorruptRecord, match=r"inbound/1.log: the frame at byte \d+ is cut short"):
        storage.read_inbound_log(1)


def test_pruning_at_completion_keeps_the_last_k_records_and_never_the_completed_one(
        storage: CheckpointStorage) -> None:
    storage.retain = 2
    for epoch in range(6):
        storage.write_record(record(epoch))
        storage.start_inbound_log(epoch)
        storage.append_inbound(epoch, encode_log_entry(RegistrationEntry(TaskAttempt("r", SID, epoch, 0))))
    storage.prune(4)
    assert [e for e in range(6) if storage.fs.exists(storage.record_path(e))] == [3, 4, 5]
    assert [e for e in range(6) if log_exists(storage, e)] == [4, 5]
    storage.prune(5)
    assert [e for e in range(6) if storage.fs.exists(storage.record_path(e))] == [4, 5]


def log_exists(storage: CheckpointStorage, epoch: int) -> bool:
    try:
        storage.read_inbound_log(epoch)
    except RecordNotFound:
        return False
    return True


def test_subtask_state_files_stay_bounded_by_retention_whatever_the_number_of_epochs(
        tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path), retain=2)
    for epoch in range(50):
        storage.read_subtask_state(SID, epoch)
        storage.write_subtask_state(SID, epoch, f"s{epoch}".encode())
    names = sorted(p.name for p in (tmp_path / "state" / SID.operator / str(SID.index)).iterdir())
    assert names == ["47.state", "48.state", "49.state", "lineage"]
    # a rerun of the newest batch (restore or task retry) still finds the state before it
    assert storage.read_subtask_state(SID, 49) == (48, b"s48")
    fresh = CheckpointStorage(str(tmp_path), retain=2)  # another task: no cached listing
    fresh.write_subtask_state(SID, 50, b"s50")
    assert fresh.read_subtask_state(SID, 50) == (49, b"s49")
    assert len(list((tmp_path / "state" / SID.operator / str(SID.index)).iterdir())) == 4


def test_subtask_state_is_read_from_the_newest_earlier_epoch(storage: CheckpointStorage) -> None:
    assert storage.read_subtask_state(SID, 3) is None
    storage.write_subtask_state(SID, 0, b"s0")
    storage.write_subtask_state(SID, 2, b"s2")
    storage.write_subtask_state(SID, 3, b"s3")
    assert storage.read_subtask_state(SID, 3) == (2, b"s2")
    assert storage.read_subtask_state(SID, 1) == (0, b"s0")
    storage.write_subtask_state(SID, 2, b"retry overwrites")
    assert storage.read_subtask_state(SID, 3) == (2, b"retry overwrites")


def test_a_tool_reading_the_running_log_does_not_change_the_seal_of_its_batch(
        storage: CheckpointStorage) -> None:
    a = TaskAttempt("r", SID, 3, 0)
    storage.start_inbound_log(3)
    storage.append_inbound(3, encode_log_entry(RegistrationEntry(a)))
    assert storage.read_inbound_log(3) == [RegistrationEntry(a)]  # a tool, mid-batch
    storage.append_inbound(3, encode_log_entry(EventEntry(a, 0, b"e0")))
    storage.seal_inbound_log(3)
    assert storage.read_inbound_log(3) == [RegistrationEntry(a), EventEntry(a, 0, b"e0")]
