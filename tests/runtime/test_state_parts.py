"""Stored-once parts in the checkpoint directory (runtime/storage.py rule 3, core/stored.py):
written once before the first record that names them, read back checked at a restore, deleted
once no record present names them."""

from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any

import pytest

from sparkcoord.coordinator import CoordinatorContext, OperatorCoordinator
from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.restore import RestorePoint
from sparkcoord.core.stored import StoredOnce
from sparkcoord.runtime.storage import CheckpointStorage, RecordNotFound
from sparkcoord.testing import CoordinatorHarness


class Shelves(OperatorCoordinator):
    """State: a list of big shelves (each a stored-once part) and a counter. Client requests:
    ``("add", n)`` adds a shelf of n items, ``"drop"`` drops the oldest, ``"tick"`` counts."""

    def __init__(self, context: CoordinatorContext) -> None:
        super().__init__(context)
        self.shelves: list[StoredOnce[tuple[int, ...]]] = []
        self.ticks = 0

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.shelves, self.ticks = state if state is not None else ([], 0)

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result((list(self.shelves), self.ticks))

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        pass

    def handle_client_request(self, request: Any) -> Any:
        if request == "drop":
            self.shelves.pop(0)
        elif request == "tick":
            self.ticks += 1
        else:
            _, n = request
            self.shelves.append(StoredOnce(tuple(range(len(self.shelves) * 1_000_000,
                                                       len(self.shelves) * 1_000_000 + n))))
        return len(self.shelves)


def parts_in(root: str) -> set[str]:
    directory = os.path.join(root, "parts")
    return {n for n in os.listdir(directory) if not n.startswith(".")} if os.path.isdir(
        directory) else set()


def harness(root: str) -> CoordinatorHarness:
    return CoordinatorHarness(Shelves, 1, name="shelves", storage_url=root)


def run_with_a_shelf(root: str, items: int) -> int:
    """A run that checkpointed one shelf of ``items`` and stopped: the epoch to restore."""
    h = harness(root)
    h.start()
    h.checkpoint()  # client requests are answered once an epoch is sealed
    h.commit()
    h.ask_as_client(("add", items))
    h.checkpoint()
    h.commit()
    h.service.close()
    return h.epoch


def test_a_part_is_written_once_and_later_records_stay_small(tmp_path: Any) -> None:
    root = str(tmp_path)
    h = harness(root)
    h.start()
    h.checkpoint()  # client requests are answered once an epoch is sealed
    h.commit()
    h.ask_as_client(("add", 50_000))
    h.checkpoint()
    h.commit()
    first = os.path.getsize(h.storage.record_path(h.epoch))
    (part,) = parts_in(root)
    written = os.stat(os.path.join(root, "parts", part)).st_mtime_ns
    sizes = []
    for _ in range(5):
        h.ask_as_client("tick")
        h.checkpoint()
        h.commit()
        sizes.append(os.path.getsize(h.storage.record_path(h.epoch)))
    assert parts_in(root) == {part}
    assert os.stat(os.path.join(root, "parts", part)).st_mtime_ns == written  # not rewritten
    part_size = os.path.getsize(os.path.join(root, "parts", part))
    assert part_size > 100_000 and max(sizes) < 1_000 and first < 1_000, (part_size, sizes)


def test_a_part_no_record_names_is_deleted_and_one_still_named_is_kept(tmp_path: Any) -> None:
    root = str(tmp_path)
    h = harness(root)  # retain=3: the newest three records stay
    h.start()
    h.checkpoint()  # client requests are answered once an epoch is sealed
    h.commit()
    h.ask_as_client(("add", 1_000))
    h.ask_as_client(("add", 1_000))
    h.checkpoint()
    h.commit()
    both = parts_in(root)
    assert len(both) == 2
    h.ask_as_client("drop")
    h.checkpoint()
    h.commit()
    assert parts_in(root) == both  # the older records still name the dropped shelf
    for _ in range(3):
        h.ask_as_client("tick")
        h.checkpoint()
        h.commit()
    (kept,) = parts_in(root)  # no record present names the dropped shelf any more
    assert kept in both
    assert h.coordinator.shelves[0].digest == kept  # type: ignore[attr-defined]


def test_a_restore_reads_the_parts_back_and_a_later_run_sweeps_parts_of_no_record(
        tmp_path: Any) -> None:
    root = str(tmp_path)
    epoch = run_with_a_shelf(root, 20_000)
    # a run that died between writing a part and its record leaves a part no record names
    orphan = StoredOnce(("orphan",))
    CheckpointStorage(root).files.write_atomic(os.path.join(root, "parts", orphan.digest),
                                               orphan.data)
    again = harness(root)
    again.service.restore(RestorePoint(epoch, committed=True))
    again.run()
    assert again.service.failure is None
    shelves = again.coordinator.shelves  # type: ignore[attr-defined]
    assert [s.value[:2] for s in shelves] == [(0, 1)] and len(shelves[0].value) == 20_000
    again.ask_as_client("tick")
    again.checkpoint()
    again.commit()
    assert orphan.digest not in parts_in(root) and shelves[0].digest in parts_in(root)


def test_a_restore_whose_part_is_missing_or_damaged_fails_naming_the_part(tmp_path: Any) -> None:
    root = str(tmp_path)
    epoch = run_with_a_shelf(root, 5_000)
    (part,) = parts_in(root)
    path = os.path.join(root, "parts", part)
    with open(path, "r+b") as f:  # one byte of the part changed
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        f.seek(0)
        f.write(data)
    with pytest.raises(CorruptRecord, match=f"{part}.*hash"):
        harness(root).service.restore(RestorePoint(epoch, committed=True))
    os.remove(path)
    with pytest.raises(RecordNotFound, match=f"state part {part} not found"):
        harness(root).service.restore(RestorePoint(epoch, committed=True))
