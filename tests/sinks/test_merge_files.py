"""The data files a ``merge`` commit writes carry the sink's job id and epoch
(sparkcoord/sinks/mergefiles.py), so a commit killed before its transaction landed leaves files
the sweep at the next start deletes: never one the table references, never another writer's."""

from __future__ import annotations

import posixpath
import threading
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkcoord.sinks.changes import ChangeStreamError, reduce_changes
from sparkcoord.sinks.cleanup import delete_files, files_to_delete, list_data_files
from sparkcoord.sinks.fencing import COMMIT
from sparkcoord.sinks.mergefiles import (
    KeyRange,
    files_to_rewrite,
    merge_file_name,
    parse_merge_name,
)
from sparkcoord.sinks.target import SinkTarget
from tests.sinks.test_changes import ROW, Target, changes
from tests.sinks.test_changes import SCHEMA as CHANGES
from tests.sinks.test_sink_coordinator import (
    checkpoint,
    fresh,
    paths,
    report,
    restored,
    settle,
    wait_until,
)


def first_epoch() -> Any:
    return reduce_changes(changes(*(("r", 10, None, i, f"n{i}") for i in range(1, 7))),
                          "public.t")


def second_epoch() -> Any:
    return reduce_changes(changes(("u", 20, 0, 2, "two"), ("d", 20, 1, 5, None),
                                  ("c", 21, 0, 9, "nine")), "public.t")


def location(target: Target, committer: Any) -> str:
    return committer.table_uri if target.kind == "delta" else committer.table_location


def merged_once(kind: str, tmp_path: Any) -> tuple[Target, Any, str]:
    """A table of ``kind`` holding epoch 0's merge, its committer (run ``run-a``) and where
    its files are."""
    target = Target(kind, tmp_path)
    c = target.committer("run-a")
    assert c.merge(0, first_epoch, ["id"]) == COMMIT
    return target, c, location(target, c)


def die_in_the_commit(kind: str, monkeypatch: Any) -> threading.Event:
    """The next table commit raises SystemExit after the merge's files were written: a driver
    killed between writing them and the transaction that references them. The event is set
    when it died."""
    died = threading.Event()

    def killed(*args: Any, **kwargs: Any) -> None:
        died.set()
        raise SystemExit("killed in the commit")

    monkeypatch.setattr(*table_commit(kind), killed)
    return died


def table_commit(kind: str) -> tuple[Any, str]:
    """The class and method name of a table format's commit (what a test patches)."""
    if kind == "delta":
        from deltalake import DeltaTable

        return DeltaTable, "create_write_transaction"
    from pyiceberg.table import Transaction

    return Transaction, "commit_transaction"


def foreign_files(where: str) -> list[str]:
    """Files of other writers in the table's data directory: never ours to delete."""
    data = pa.table({"id": [1], "name": ["x"]})
    names = ["part-00000-0f1e2d3c-foreign-c000.snappy.parquet",
             merge_file_name("otherjob", 1, "0123456789ab", 0)]
    for name in names:
        pq.write_table(data, f"{where}/data/{name}")
    return [f"data/{n}" for n in names]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_merge_killed_before_its_commit_leaves_only_files_the_next_sweep_deletes(
        tmp_path: Any, kind: str, monkeypatch: Any) -> None:
    target, c, where = merged_once(kind, tmp_path)
    before = set(list_data_files(where))
    with monkeypatch.context() as patch:
        die_in_the_commit(kind, patch)
        with pytest.raises(SystemExit):
            c.merge(1, second_epoch, ["id"])
    strays = set(list_data_files(where)) - before
    assert strays, "the merge wrote no file before its commit"
    # named the sink's way, with the job and the epoch whose commit wrote them
    assert {parse_merge_name(posixpath.basename(p)) for p in strays} == {
        parse_merge_name(merge_file_name("job", 1, "0" * 12, 0))}
    others = foreign_files(where)
    # the restart: a new committer, the sweep at start (the coordinator's, cleanup.py rule 4)
    again = target.committer("run-b", last_committed=0, pending=(1,))
    referenced = again.referenced_paths()
    doomed = files_to_delete("job", list_data_files(where), final_through=1, held=referenced)
    assert set(doomed) == strays
    delete_files(where, doomed)
    left = set(list_data_files(where))
    assert referenced <= left and set(others) <= left and not strays & left
    # the epoch is committed again from scratch, and its own files are then held
    assert again.merge(1, second_epoch, ["id"]) == COMMIT
    assert target.rows() == [(1, "n1"), (2, "two"), (3, "n3"), (4, "n4"), (6, "n6"),
                             (9, "nine")]
    referenced = again.referenced_paths()
    assert files_to_delete("job", list_data_files(where), final_through=1,
                           held=referenced) == []
    assert referenced <= set(list_data_files(where))


def test_a_delta_merge_rewrites_only_the_files_holding_changed_keys_under_merge_names(
        tmp_path: Any) -> None:
    from deltalake import DeltaTable

    target = Target("delta", tmp_path)
    c = target.committer("run")
    for epoch, ids in enumerate(([1, 2, 3], [10, 11, 12], [20, 21])):
        batch = reduce_changes(changes(*(("r", 10 + epoch, None, i, f"n{i}") for i in ids)),
                               "public.t")
        assert c.merge(epoch, lambda b=batch: b, ["id"]) == COMMIT
    uri = str(tmp_path / "table")
    before = set(DeltaTable(uri).file_uris())
    update = reduce_changes(changes(("u", 20, 0, 11, "eleven"), ("d", 20, 1, 12, None)),
                            "public.t")
    assert c.merge(3, lambda: update, ["id"]) == COMMIT
    after = set(DeltaTable(uri).file_uris())
    assert len(before - after) == 1  # the file of 10-12 only: the others' bounds exclude them
    assert all(parse_merge_name(posixpath.basename(u)) for u in after)
    assert target.rows() == [(1, "n1"), (2, "n2"), (3, "n3"), (10, "n10"), (11, "eleven"),
                             (20, "n20"), (21, "n21")]
    assert DeltaTable(uri).transaction_version("job") == 3


def test_a_delta_table_with_deletion_vectors_is_refused_by_a_merge_naming_it(
        tmp_path: Any) -> None:
    from deltalake import write_deltalake

    uri = str(tmp_path / "table")
    write_deltalake(uri, pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}),
                    configuration={"delta.enableDeletionVectors": "true"})
    from sparkcoord.sinks.delta import DeltaCommitter

    c = DeltaCommitter(uri, "job", pa.schema(list(ROW)), run_id="run")
    c.open()
    with pytest.raises(ChangeStreamError, match="deletion vectors"):
        c.merge(0, first_epoch, ["id"])
    assert c.table_epoch() == -1


def test_a_partitioned_delta_table_is_refused_at_open_naming_it_and_its_partition_columns(
        tmp_path: Any) -> None:
    # both modes: the sink's add actions carry no partition values (delta-rs takes them, and
    # the partition column reads back null), and a merge's rewrite does not split by partition
    from deltalake import DeltaTable, write_deltalake

    from sparkcoord.sinks.delta import DeltaCommitter
    from sparkcoord.sinks.target import TableShapeError

    uri = str(tmp_path / "table")
    write_deltalake(uri, pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}),
                    partition_by=["name"])
    c = DeltaCommitter(uri, "job", pa.schema(list(ROW)), run_id="run")
    with pytest.raises(TableShapeError, match=f"{uri} is partitioned by name"):
        c.open()
    assert DeltaTable(uri).to_pyarrow_table().to_pylist() == [{"id": 1, "name": "a"}]


def test_a_column_mapped_delta_table_is_refused_at_open_and_at_a_commit_naming_its_mode(
        tmp_path: Any) -> None:
    # its readers look columns up by physical names the sink's files do not use: every value
    # would read back null (decision 80's list, closed in session 14)
    from deltalake import DeltaTable, write_deltalake

    from sparkcoord.sinks.delta import DeltaCommitter
    from sparkcoord.sinks.target import TableShapeError

    mapped = {"delta.columnMapping.mode": "name", "delta.minReaderVersion": "2",
              "delta.minWriterVersion": "5"}
    uri = str(tmp_path / "mapped")
    write_deltalake(uri, pa.table({"id": pa.array([], pa.int64()), "name": pa.array([], pa.string())}),
                    configuration=mapped)
    c = DeltaCommitter(uri, "job", pa.schema(list(ROW)), run_id="run")
    with pytest.raises(TableShapeError, match=f"{uri} uses column mapping.*'name'"):
        c.open()
    # mapped after the sink opened it: the next commit refuses it, and nothing is committed
    uri = str(tmp_path / "later")
    c = DeltaCommitter(uri, "job", pa.schema(list(ROW)), run_id="run")
    c.open()
    write_deltalake(uri, pa.table({"id": pa.array([], pa.int64()), "name": pa.array([], pa.string())}),
                    configuration=mapped)
    with pytest.raises(TableShapeError, match="uses column mapping"):
        c.merge(0, first_epoch, ["id"])
    with pytest.raises(TableShapeError, match="uses column mapping"):
        c.commit(0, [])
    assert DeltaTable(uri).version() == 0 and c.table_epoch() == -1


def test_a_merge_that_creates_the_table_meets_the_fence_of_an_instance_that_committed_meanwhile(
        tmp_path: Any, monkeypatch: Any) -> None:
    # review finding: the table was missing when the merge decided, another instance of the
    # job created it and committed the epoch, and the merge committed it a second time; now
    # the fence decides again on the table created and fails loudly (a second writer)
    from deltalake import DeltaTable

    from sparkcoord.sinks.delta import DeltaCommitter
    from sparkcoord.sinks.fencing import SecondWriter

    uri = str(tmp_path / "table")
    ours = DeltaCommitter(uri, "job", pa.schema(list(ROW)), run_id="run")
    ours.open()
    other = DeltaCommitter(uri, "job", pa.schema(list(ROW)), run_id="other")
    other.open()
    create = DeltaCommitter._create

    def racing_create(self: Any, actions: Any, properties: Any) -> None:
        if self is ours:  # the other instance creates the table and commits epoch 0 first
            assert other.merge(0, first_epoch, ["id"]) == COMMIT
        create(self, actions, properties)

    monkeypatch.setattr(DeltaCommitter, "_create", racing_create)
    loaded: list[int] = []
    with pytest.raises(SecondWriter, match="epoch 0 of job 'job' is in the table"):
        ours.merge(0, lambda: loaded.append(0) or first_epoch(), ["id"])
    assert loaded == []  # nothing read, nothing written
    assert sorted(DeltaTable(uri).to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3, 4, 5, 6]


def test_only_files_whose_key_bounds_may_hold_a_changed_key_are_rewritten() -> None:
    files = [KeyRange("a", 1, (1,), (5,)), KeyRange("b", 1, (10,), (20,)),
             KeyRange("c", 1, None, None), KeyRange("d", 1, (30,), (40,))]
    assert [f.path for f in files_to_rewrite(files, [(12,), (50,)])] == ["b", "c"]
    assert [f.path for f in files_to_rewrite(files, [])] == []
    assert [f.path for f in files_to_rewrite(files, [], truncated=True)] == ["a", "b", "c", "d"]
    pairs = [KeyRange("p", 1, ("eu", 1), ("eu", 9)), KeyRange("q", 1, ("us", 1), ("us", 3))]
    assert [f.path for f in files_to_rewrite(pairs, [("us", 2)])] == ["q"]
    assert [f.path for f in files_to_rewrite(pairs, [("us", 7)])] == []


def test_merge_file_names_parse_back_and_never_as_a_tasks_file_name() -> None:
    from sparkcoord.sinks.cleanup import epoch_prefix
    from sparkcoord.sinks.files import parse_file_name

    name = merge_file_name("job", 7, "00ff00ff00ff", 3)
    parsed = parse_merge_name(name)
    assert parsed is not None and (parsed.job_id, parsed.epoch) == ("job", 7)
    # the cleanup after a commit lists the tasks' prefix and deletes a merge's staged files:
    # a merge file must never be among them
    assert parse_file_name(name) is None and not name.startswith(epoch_prefix("job", 7))
    assert parse_merge_name("00000-0-3f2a.parquet") is None


def test_a_coordinator_killed_in_a_merge_commit_sweeps_its_files_at_the_restart(
        tmp_path: Any, monkeypatch: Any) -> None:
    # the merge soak (Iceberg, a kill in the commit) left the library's files forever
    from tests.sinks.test_sink_coordinator import stage_changes

    uri = f"{tmp_path}/merged"
    target = SinkTarget("delta", uri, "job", pa.schema(list(ROW)), uri, mode="merge",
                        input_schema=CHANGES, keys=("id",))
    first, context = fresh(target)
    checkpoint(first, 0)
    staged = stage_changes(uri)
    report(first, staged)
    with monkeypatch.context() as patch:
        # SystemExit ends the commit worker's thread in the commit, as a kill ends the driver
        died = die_in_the_commit("delta", patch)
        first.notify_checkpoint_complete(0)
        state = checkpoint(first, 1)
        wait_until(died.is_set)
    first.close()
    assert any(parse_merge_name(posixpath.basename(p)) for p in list_data_files(uri))
    assert list(state.ledger.pending) == [0]
    # epoch 0 pending, at or below the sweep's bound
    second, second_context = restored(target, 1, state)
    checkpoint(second, 2)
    settle(second, second_context)
    second.close()
    assert second_context.failures == []
    from deltalake import DeltaTable

    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2]
    listed = set(list_data_files(uri))
    assert listed == target.committer().referenced_paths()  # no stray merge file, no staged file, nothing missing
    assert not paths(staged) & listed



def test_key_bounds_are_trusted_as_far_as_their_writer_keeps_them_exact() -> None:
    # another writer may cut a string bound to 32 characters, cut a timestamp's to the
    # millisecond, or clamp a decimal's: a file whose bound cannot be trusted stays a candidate
    import datetime

    from sparkcoord.sinks.formats.delta.merge import _trusted_bounds

    other, ours = "part-00000-1.parquet", "data/" + merge_file_name("job", 1, "00ff00ff00ff", 0)
    text = [pa.string()]
    assert _trusted_bounds(other, text, ("a",), ("k" * 31,)) == (("a",), ("k" * 31,))
    assert _trusted_bounds(other, text, ("a",), ("k" * 32,)) is None
    # Spark's writer counts UTF-16 code units: 16 characters outside the BMP are 32 of them,
    # so such a bound may be a cut prefix although Python counts 16 characters
    assert _trusted_bounds(other, text, ("a",), ("\U0001F600" * 16,)) is None
    assert _trusted_bounds(other, text, ("a",), ("\U0001F600" * 15 + "k",)) == (
        ("a",), ("\U0001F600" * 15 + "k",))
    assert _trusted_bounds(ours, text, ("a",), ("k" * 36,)) == (("a",), ("k" * 36,))  # a uuid
    assert _trusted_bounds(ours, text, ("a",), ("k" * 64,)) is None
    at = datetime.datetime(2026, 1, 1, 0, 0, 0, 1000)
    stamp = [pa.timestamp("us")]
    assert _trusted_bounds(other, stamp, (at,), (at,)) == (
        (at,), (at + datetime.timedelta(milliseconds=1),))
    assert _trusted_bounds(ours, stamp, (at,), (at,)) == ((at,), (at,))
    aware = at.replace(tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    assert _trusted_bounds(ours, [pa.timestamp("us", "UTC")], (aware,), (aware,)) == (
        (at - datetime.timedelta(hours=2),), (at - datetime.timedelta(hours=2),))
    assert _trusted_bounds(other, [pa.decimal128(38, 0)], (1,), (2,)) is None
    assert _trusted_bounds(other, [pa.float64()], (1.0,), (2.0,)) is None
    assert _trusted_bounds(other, [pa.int64(), pa.date32()], (1, at.date()), (5, at.date())) == (
        (1, at.date()), (5, at.date()))
    assert _trusted_bounds(other, [pa.int64()], (None,), (5,)) is None


@pytest.mark.parametrize("kind", ["timestamp", "decimal"])
def test_a_merge_finds_a_changed_key_in_another_writers_file_whose_statistics_round_it_away(
        tmp_path: Any, kind: str) -> None:
    # found by the session-13 review: delta-rs cuts a timestamp's max to the millisecond and
    # clamps a decimal(38, 0)'s to 64 bits; the file was pruned and the key's old row stayed
    import datetime
    import decimal

    from deltalake import DeltaTable, write_deltalake

    from sparkcoord.sinks.changes import OP_COLUMN, Reduced
    from sparkcoord.sinks.delta import DeltaCommitter

    key_type, key = ((pa.timestamp("us"), datetime.datetime(2026, 1, 1, 0, 0, 0, 1500))
                     if kind == "timestamp" else
                     (pa.decimal128(38, 0), decimal.Decimal("12345678901234567891")))
    schema = pa.schema([pa.field("id", key_type), pa.field("name", pa.string())])
    uri = str(tmp_path / "table")
    write_deltalake(uri, pa.table({"id": pa.array([key], key_type), "name": ["old"]}))
    rows = pa.table({"id": pa.array([key], key_type), "name": ["new"], OP_COLUMN: ["u"]})
    c = DeltaCommitter(uri, "job", schema, run_id="run")
    c.open()
    assert c.merge(0, lambda: Reduced(rows, False), ["id"]) == COMMIT
    assert DeltaTable(uri).to_pyarrow_table().to_pylist() == [{"id": key, "name": "new"}]


def race_the_commit(kind: str, target: Target, where: str, patch: Any) -> list[set[str]]:
    """Another writer appends a row (id 100) between the next merge's writes and its commit,
    once. Returns a list that then holds the data files the merge had written by then."""
    before = set(list_data_files(where))
    written: list[set[str]] = []

    def other_writer() -> None:
        written.append(set(list_data_files(where)) - before)
        row = {"id": pa.array([100], pa.int64()), "name": ["x"]}
        if kind == "delta":
            from deltalake import write_deltalake

            write_deltalake(where, pa.table(row), mode="append")
        else:
            other = target.catalog.load_table("lake.t")
            other.append(pa.table(row, schema=other.schema().as_arrow()))

    if kind == "delta":
        from sparkcoord.sinks.delta import DeltaCommitter

        build = DeltaCommitter._merge_actions

        def built_then_raced(self: Any, *args: Any) -> list[Any]:
            actions = build(self, *args)
            other_writer()
            return actions

        patch.setattr(DeltaCommitter, "_merge_actions", built_then_raced)
    else:
        from pyiceberg.table import Transaction

        commit = Transaction.commit_transaction

        def raced_then_committed(self: Any) -> Any:
            if not written:  # the other writer's own commit comes through here too
                other_writer()
            return commit(self)

        patch.setattr(Transaction, "commit_transaction", raced_then_committed)
    return written


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_merge_that_loses_to_another_writer_deletes_its_files_and_the_retry_commits(
        tmp_path: Any, kind: str, monkeypatch: Any) -> None:
    if kind == "delta":
        from deltalake.exceptions import CommitFailedError as Lost
    else:
        from pyiceberg.exceptions import CommitFailedException as Lost

    target, c, where = merged_once(kind, tmp_path)
    # another instance of the job writing the same epoch's merge, not committed yet
    racing = f"data/{merge_file_name('job', 1, 'a1b2c3d4e5f6', 0)}"
    pq.write_table(pa.table({"id": [7], "name": ["seven"]}), f"{where}/{racing}")
    with monkeypatch.context() as patch:
        written = race_the_commit(kind, target, where, patch)
        with pytest.raises(Lost):
            c.merge(1, second_epoch, ["id"])
    assert written[0] - {racing}, "the merge wrote no file before its commit"
    left = set(list_data_files(where))
    assert not (written[0] - {racing}) & left  # deleted, not left for the sweep
    assert racing in left  # another instance's files of the epoch are not this attempt's

    def held_in_data() -> set[str]:  # (delta-rs writes the other writer's file at the root)
        return {p for p in c.referenced_paths() if p.startswith("data/")}

    assert held_in_data() <= set(list_data_files(where))  # nothing the table holds
    # the commit worker's retry reads the table again and commits the epoch once
    assert c.merge(1, second_epoch, ["id"]) == COMMIT
    assert target.rows() == [(1, "n1"), (2, "two"), (3, "n3"), (4, "n4"), (6, "n6"),
                             (9, "nine"), (100, "x")]
    assert held_in_data() <= set(list_data_files(where))


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_failed_merge_commit_that_landed_after_all_keeps_its_files(
        tmp_path: Any, kind: str, monkeypatch: Any) -> None:
    # a store or catalog error after the commit was written fails it too: the one version or
    # snapshot it could have made is its own, so nothing of it is deleted
    target, c, where = merged_once(kind, tmp_path)
    before = set(list_data_files(where))
    if kind == "delta":
        from deltalake.exceptions import CommitFailedError as Lost
    else:
        from pyiceberg.exceptions import CommitFailedException as Lost
    owner, name = table_commit(kind)
    commit = getattr(owner, name)

    def landed_then_failed(self: Any, *args: Any, **kwargs: Any) -> Any:
        commit(self, *args, **kwargs)
        raise Lost("the answer was lost")

    with monkeypatch.context() as patch:
        patch.setattr(owner, name, landed_then_failed)
        with pytest.raises(Lost):
            c.merge(1, second_epoch, ["id"])
    assert set(list_data_files(where)) - before, "the merge wrote no file"
    assert target.rows() == [(1, "n1"), (2, "two"), (3, "n3"), (4, "n4"), (6, "n6"),
                             (9, "nine")]
