"""Mode merge on Iceberg by copy-on-write (sparkcoord/sinks/formats/iceberg/rewrite.py, issue
43 finding 4): only the files whose key bounds may hold a changed key are read, one snapshot
per epoch, small files folded in with their rows kept exactly, old snapshots expired without
costing the fence or a live snapshot's files."""

from __future__ import annotations

import os
from typing import Any

import pytest

from sparkcoord.sinks import icebergmerge, mergefold
from sparkcoord.sinks.changes import reduce_changes
from sparkcoord.sinks.fencing import ALREADY_COMMITTED, COMMIT, CheckpointBehindTable
from tests.sinks.test_changes import Target, changes


def epoch_of(*rows: tuple[Any, ...]) -> Any:
    staged = changes(*rows)
    return lambda: reduce_changes(staged, "public.t")


def puts(keys: range, name: str, lsn: int = 0) -> Any:
    return epoch_of(*(("c", lsn + i, 0, k, name) for i, k in enumerate(keys)))


def data_files(target: Target) -> set[str]:
    table = target.catalog.load_table("lake.t")
    return {str(t.file.file_path) for t in table.scan().plan_files()}


def current_files(target: Target) -> set[str]:
    if target.kind == "delta":
        from deltalake import DeltaTable

        return set(DeltaTable(str(target.root / "table")).file_uris())
    return data_files(target)


def test_an_iceberg_merge_reads_only_the_files_whose_key_bounds_may_hold_a_changed_key(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    target = Target("iceberg", tmp_path)
    c = target.committer("run")
    for epoch in range(3):  # three files: keys 0-9, 100-109, 200-209
        assert c.merge(epoch, puts(range(epoch * 100, epoch * 100 + 10), f"e{epoch}"),
                       ["id"]) == COMMIT
    before = data_files(target)
    read: list[str] = []
    real = icebergmerge.read_file
    monkeypatch.setattr(icebergmerge, "read_file", lambda table, f, schema: (
        read.append(str(f.file_path)), real(table, f, schema))[1])
    assert c.merge(3, epoch_of(("u", 50, 0, 105, "changed"), ("d", 51, 0, 203, None)),
                   ["id"]) == COMMIT
    after = data_files(target)
    assert len(read) == 2  # the files of keys 100-109 and 200-209, not 0-9
    assert len(before & after) == 1 and len(before - after) == 2
    rows = dict(target.rows())
    assert rows[105] == "changed" and 203 not in rows and rows[3] == "e0"
    assert len(rows) == 29
    table = target.catalog.load_table("lake.t")
    assert [s.summary["sparkcoord.epoch"] for s in table.snapshots()] == ["0", "1", "2", "3"]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_small_merge_files_are_folded_into_a_later_epoch_keeping_every_row_exactly(
        tmp_path: Any, kind: str) -> None:
    target = Target(kind, tmp_path)
    c = target.committer("run")
    expected: dict[int, str] = {}
    counts = []
    for epoch in range(12):  # each epoch writes a small file of new keys, far apart
        keys = range(epoch * 1000, epoch * 1000 + 5)
        assert c.merge(epoch, puts(keys, f"e{epoch}", lsn=epoch * 100), ["id"]) == COMMIT
        expected.update({k: f"e{epoch}" for k in keys})
        counts.append(len(current_files(target)))
    assert max(counts) <= mergefold.FOLD_AT + 1 and counts[-1] < 12
    assert dict(target.rows()) == expected
    assert len(target.rows()) == len(expected)  # no row twice


def test_snapshot_expiry_keeps_the_fence_and_only_deletes_files_no_live_snapshot_holds(
        tmp_path: Any) -> None:
    target = Target("iceberg", tmp_path)
    c = target.committer("run")
    last = icebergmerge.KEEP_SNAPSHOTS + 10
    for epoch in range(last + 1):  # every epoch rewrites the one file of keys 0-9
        assert c.merge(epoch, puts(range(10), f"e{epoch}", lsn=epoch * 100), ["id"]) == COMMIT
        if epoch == 0:  # another writer's snapshot: not the sink's to expire
            import pyarrow as pa

            target.catalog.load_table("lake.t").append(pa.table(
                {"id": pa.array([500], pa.int64()), "name": ["outside"]}))
            outside = target.catalog.load_table("lake.t").current_snapshot().snapshot_id
    table = target.catalog.load_table("lake.t")
    assert len(table.snapshots()) == icebergmerge.KEEP_SNAPSHOTS + 1
    assert table.snapshot_by_id(outside) is not None
    assert dict(target.rows()) == {**{k: f"e{last}" for k in range(10)}, 500: "outside"}
    # the files of expired snapshots are gone; every file a live snapshot holds is there
    data = f"{table.location().removeprefix('file://')}/data"
    on_disk = {f"file://{data}/{n}" for n in os.listdir(data)}
    referenced = set(table.inspect.all_data_files().column("file_path").to_pylist())
    assert on_disk == referenced
    # a restore: the epoch pending in the checkpoint is found in the table (the earliest
    # epochs' snapshots are gone, the property says which epoch the table holds)
    again = target.committer("restored", last_committed=last - 1, pending=(last,))
    assert again.merge(last, puts(range(10), "never"), ["id"]) == ALREADY_COMMITTED
    assert again.merge(last + 1, puts(range(10), "next"), ["id"]) == COMMIT
    # a checkpoint behind the table is still refused, by the property expiry leaves
    with pytest.raises(CheckpointBehindTable, match=f"holds epoch {last + 1} "):
        target.committer("old", last_committed=5)


def test_expiry_keeps_the_newest_snapshots_and_honours_the_tables_own_properties() -> None:
    snapshots = [(i, 1000 * i) for i in range(30)]
    kept = icebergmerge.KEEP_SNAPSHOTS
    assert icebergmerge.snapshots_to_expire(snapshots, set(), {}, 10**9) == list(
        range(30 - kept))
    assert 3 not in icebergmerge.snapshots_to_expire(snapshots, {3}, {}, 10**9)
    # a table that keeps a minute of history for time travel: nothing younger goes
    props = {icebergmerge.MAX_AGE_PROPERTY: "60000"}
    assert icebergmerge.snapshots_to_expire(snapshots, set(), props, 59_000) == []
    assert icebergmerge.snapshots_to_expire(snapshots, set(), props, 5_000 + 60_000) == [
        0, 1, 2, 3, 4]


def test_key_bounds_are_trusted_only_where_iceberg_keeps_them_exact() -> None:
    from pyiceberg.conversions import to_bytes
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    def bounds(field: Any, lo: Any, hi: Any) -> Any:
        return icebergmerge.trusted_range(
            [field], {field.field_id: to_bytes(field.field_type, lo)},
            {field.field_id: to_bytes(field.field_type, hi)})

    long_key = NestedField(1, "id", LongType(), required=False)
    text_key = NestedField(2, "code", StringType(), required=False)
    assert bounds(long_key, 3, 9) == ((3,), (9,))
    assert bounds(text_key, "a", "b" * 15) == (("a",), ("b" * 15,))
    # 16 characters may be a truncated prefix (Iceberg's default truncate(16)): read the file
    assert bounds(text_key, "a", "b" * 16) == (None, None)
    assert bounds(NestedField(3, "x", DoubleType(), required=False), 1.0, 2.0) == (None, None)
    assert icebergmerge.trusted_range([long_key], {}, {}) == (None, None)
