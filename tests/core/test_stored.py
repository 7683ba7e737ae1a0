"""Stored-once parts of a coordinator's state and the snapshot format that names them
(core/stored.py)."""

from __future__ import annotations

import pickle

import pytest

from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.stored import (
    PARTS_MAGIC,
    StoredOnce,
    dump_snapshot,
    load_snapshot,
    snapshot_parts,
)


def test_a_state_without_parts_is_snapshotted_as_the_plain_pickle_older_records_hold() -> None:
    state = {"pending": [1, 2, 3]}
    snapshot, parts = dump_snapshot(state)
    assert parts == {} and snapshot == pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    assert snapshot_parts(snapshot) == [] and load_snapshot(snapshot, None) == state


def test_a_part_is_named_by_the_snapshot_and_not_copied_into_it() -> None:
    big = StoredOnce(tuple(range(100_000)))
    snapshot, parts = dump_snapshot({"backlog": big, "cursor": 7})
    assert snapshot.startswith(PARTS_MAGIC)
    assert list(parts) == [big.digest] == snapshot_parts(snapshot)
    assert len(snapshot) < 200 < len(big.data)  # the name, not the 100,000 values
    loaded = load_snapshot(snapshot, lambda name: StoredOnce.read_back(name, parts[name].data))
    assert loaded["cursor"] == 7 and loaded["backlog"].value == tuple(range(100_000))
    assert loaded["backlog"].digest == big.digest


def test_a_part_held_twice_is_named_once_and_loaded_as_one_object() -> None:
    part = StoredOnce(["a", "b"])
    snapshot, parts = dump_snapshot([part, part, StoredOnce(["a", "b"])])
    assert len(parts) == 1 and snapshot_parts(snapshot) == [part.digest]
    reads: list[str] = []

    def read(name: str) -> StoredOnce[list[str]]:
        reads.append(name)
        return StoredOnce.read_back(name, parts[name].data)

    first, second, third = load_snapshot(snapshot, read)
    assert first is second and first.value == third.value == ["a", "b"]
    assert reads == [part.digest]  # read once however often the state names it


def test_a_part_whose_bytes_changed_is_refused_with_its_name() -> None:
    part = StoredOnce({"x": 1})
    snapshot, parts = dump_snapshot(part)
    damaged = parts[part.digest].data.replace(b"x", b"y")
    with pytest.raises(CorruptRecord, match=part.digest):
        load_snapshot(snapshot, lambda name: StoredOnce.read_back(name, damaged))


def test_a_snapshot_with_parts_read_without_a_part_reader_is_a_clear_error() -> None:
    snapshot, _ = dump_snapshot(StoredOnce([1]))
    with pytest.raises(CorruptRecord, match="refers to 1 state part"):
        load_snapshot(snapshot, None)
    with pytest.raises(CorruptRecord, match="cut short"):
        snapshot_parts(snapshot[:10])


def test_a_part_sent_outside_a_snapshot_carries_its_value() -> None:
    # an event or an answer holding a part: pickled as any object, its value inside
    part = StoredOnce(("s1", "s2"))
    copy = pickle.loads(pickle.dumps(part))
    assert isinstance(copy, StoredOnce) and copy.value == ("s1", "s2")
    assert copy.digest == part.digest
