"""Packing small files into one split (issue 25 item 4, sources/files rule 8): planning is a pure
function of the discovered entries and the options (byte budget, open cost, lanes, big files
split as before, ``maxFilesPerTrigger``); a packed split is read member by member with a
position (member, rows) that a resumed read continues from exactly; malformed records,
``_metadata`` and changed files name the member file; remote members are fetched ahead in
order."""

from __future__ import annotations

import json
import os
import pickle
from typing import Any

import pyarrow as pa
import pytest

from sparkcoord.core.errors import MalformedRecord
from sparkcoord.sources.files.discovery import pack_files, plan_files
from sparkcoord.sources.files.listing import FileEntry, filesystem
from sparkcoord.sources.files.metadata import METADATA_COLUMN
from sparkcoord.sources.files.options import FileSourceOptions
from sparkcoord.sources.files.reading import FileChangedError, FileReader, MemberFetcher
from sparkcoord.sources.files.split import FileSplit
from sparkcoord.sources.splits import BatchBudget, ReadLimit

KB, MB = 1 << 10, 1 << 20
SCHEMA_JSON = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "name", "type": "string", "nullable": True, "metadata": {}}]})


def options(**kw: Any) -> FileSourceOptions:
    kw.setdefault("url", "/data")
    kw.setdefault("format", "json")
    return FileSourceOptions(**kw)


def entries(sizes: list[int], directory: str = "/data") -> list[FileEntry]:
    return [FileEntry(f"{directory}/f{i:03d}.json", size, 100.0 + i)
            for i, size in enumerate(sizes)]


def shape(groups: list[list[FileEntry]]) -> list[list[str]]:
    return [[os.path.basename(e.path) for e in g if not e.path.startswith("/pad/")]
            for g in groups if not g[0].path.startswith("/pad/")]


def padded(found: list[FileEntry], files: int = 1000, size: int = 1 * KB) -> list[FileEntry]:
    """``found``, then a backlog of other files (directory /pad) after it: a cycle big enough
    that the budget is ``maxPartitionBytes`` (it shrinks for a cycle of a few files)."""
    return found + entries([size] * files, "/pad")


# ----------------------------------------------------------------------------- planning
def test_small_files_are_packed_in_discovery_order_until_the_byte_budget_is_full() -> None:
    o = options(max_partition_bytes=10 * KB, open_cost_bytes=1, parallelism=1)
    groups = pack_files(padded(entries([4 * KB, 4 * KB, 4 * KB, 1 * KB, 5 * KB, 5 * KB])), o)
    # 4+4 fits 10k, +4 does not; 4+1+5 = 10 fits; the last 5 starts a group of its own
    assert shape(groups) == [["f000.json", "f001.json"], ["f002.json", "f003.json", "f004.json"],
                             ["f005.json"]]


def test_every_file_costs_at_least_the_open_cost() -> None:
    o = options(max_partition_bytes=16 * MB, open_cost_bytes=4 * MB, parallelism=1)
    groups = pack_files(padded(entries([10] * 10)), o)
    assert [len(g) for g in shape(groups)] == [4, 4, 2]  # 16m / 4m per tiny file


def test_files_of_different_directories_are_never_packed_together() -> None:
    o = options(max_partition_bytes=1 * MB, open_cost_bytes=1, parallelism=1)
    found = (entries([10, 10], "/data/a") + entries([10], "/data/b")
             + entries([10, 10], "/data/a"))
    groups = pack_files(padded(found), o)
    assert [[e.path for e in g] for g in groups[:3]] == [
        ["/data/a/f000.json", "/data/a/f001.json"], ["/data/b/f000.json"],
        ["/data/a/f000.json", "/data/a/f001.json"]]


def test_a_file_bigger_than_max_split_bytes_is_split_as_before_and_closes_the_pack(
        tmp_path) -> None:
    o = options(url=str(tmp_path), max_partition_bytes=1 * MB, open_cost_bytes=1,
                max_split_bytes=100, parallelism=1)
    found = [FileEntry(str(tmp_path / "a.json"), 10, 1.0), FileEntry(str(tmp_path / "b.json"), 10, 1.0),
             FileEntry(str(tmp_path / "big.json"), 250, 1.0),
             FileEntry(str(tmp_path / "c.json"), 10, 1.0)]
    fs, _ = filesystem(str(tmp_path))
    splits = [s for s in plan_files(fs, padded(found), o) if not s.path.startswith("/pad/")]
    assert [s.split_id.rsplit("/", 1)[1] for s in splits] == [
        "a.json#pack", "big.json#0", "big.json#100", "big.json#200", "c.json#0"]
    packed = splits[0]
    assert packed.paths == (str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert packed.size == 20 and packed.files[1] == (str(tmp_path / "b.json"), 10, 1.0)
    assert [s.files for s in splits[1:]] == [(), (), (), ()]  # not packed: as before


def test_zero_byte_files_are_left_out_and_parquet_files_are_never_packed() -> None:
    o = options(max_partition_bytes=1 * MB, open_cost_bytes=1, parallelism=1)
    assert shape(pack_files(padded(entries([10, 0, 10])), o)) == [["f000.json", "f002.json"]]
    parquet = options(format="parquet", max_partition_bytes=1 * MB, open_cost_bytes=1)
    assert {len(g) for g in pack_files(padded(entries([10, 10, 10])), parquet)} == {1}
    aligned = options(max_partition_bytes=1 * MB, open_cost_bytes=1, packing=False)
    assert {len(g) for g in pack_files(padded(entries([10, 10, 10])), aligned)} == {1}


def test_a_few_new_files_are_not_packed_and_a_backlog_is_packed_32_tiny_files_a_split() -> None:
    o = options(parallelism=2)  # the defaults: maxPartitionBytes 128m, openCostInBytes 4m
    # 16 splits per reader while the cycle has that many files: 32 files, none packed
    assert {len(g) for g in pack_files(entries([10] * 32), o)} == {1}
    assert {len(g) for g in pack_files(entries([10] * 64), o)} == {2}
    many = pack_files(entries([10] * 2000), o)
    assert {len(g) for g in many[:-1]} == {o.max_partition_bytes // o.open_cost_bytes} == {32}
    assert sum(len(g) for g in many) == 2000


def test_max_files_per_trigger_caps_the_files_of_a_pack_and_a_batch_counts_files() -> None:
    o = options(max_partition_bytes=1 * MB, open_cost_bytes=1, parallelism=1,
                max_files_per_trigger=3)
    groups = pack_files(padded(entries([10] * 7)), o)[:3]
    assert [len(g) for g in groups] == [3, 3, 1]
    splits = [FileSplit(f"{g[0].path}#pack", 30, g[0].path,
                        files=tuple((e.path, e.size, e.mtime) for e in g)) for g in groups[:2]]
    single = FileSplit("/data/x.json#0", 10, "/data/x.json")
    budget = BatchBudget(ReadLimit(max_units=3))
    assert budget.admits(splits[0])
    budget.took(splits[0])  # three files: the batch is full
    assert not budget.admits(splits[1]) and not budget.admits(single)
    budget.gave_back(splits[0])
    assert budget.units == {} and budget.splits == 0
    budget = BatchBudget(ReadLimit(max_units=4))
    budget.took(single)
    assert budget.admits(splits[0])  # 1 + 3 files
    budget.took(splits[0])
    assert set(budget.units) == {"/data/x.json", *splits[0].paths}


def test_an_unpacked_split_pickles_as_before_and_a_packed_one_keeps_its_members() -> None:
    plain = FileSplit("/d/a.json#0", 10, "/d/a.json", 10, 1.0, end=10, lane="/d")
    assert "files" not in plain.__getstate__()
    assert plain.paths == ("/d/a.json",) and plain.units == ("/d/a.json",)
    packed = FileSplit("/d/a.json#pack", 20, "/d/a.json", 10, 1.0, lane="/d",
                       files=(("/d/a.json", 10, 1.0), ("/d/b.json", 10, 2.0)))
    again = pickle.loads(pickle.dumps(packed))
    assert again == packed and again.units == ("/d/a.json", "/d/b.json")
    assert pickle.loads(pickle.dumps(plain)).files == ()


# ----------------------------------------------------------------------------- reading
def write_members(directory: str, rows: list[int]) -> list[FileEntry]:
    """One JSON-lines file per count in ``rows``, ids consecutive over the files."""
    out, next_id = [], 0
    for f, count in enumerate(rows):
        path = os.path.join(directory, f"m{f}.json")
        with open(path, "w") as fh:
            for i in range(next_id, next_id + count):
                fh.write(json.dumps({"id": i, "name": f"n{i}"}) + "\n")
        next_id += count
        st = os.stat(path)
        out.append(FileEntry(path, st.st_size, st.st_mtime))
    return out


def packed(tmp_path, found: list[FileEntry], **kw: Any) -> tuple[FileSourceOptions, FileSplit]:
    o = options(url=str(tmp_path), max_partition_bytes=1 * MB, open_cost_bytes=1,
                parallelism=1, **kw)
    fs, _ = filesystem(str(tmp_path))
    split = plan_files(fs, padded(found), o)[0]
    assert split.paths == tuple(e.path for e in found if e.size)  # zero bytes: left out
    return o, split


def ids(batches: list[Any]) -> list[int]:
    return pa.Table.from_batches(batches).column("id").to_pylist() if batches else []


def test_a_packed_split_reads_its_members_in_order_in_batches_of_batch_rows(tmp_path) -> None:
    o, split = packed(tmp_path, write_members(str(tmp_path), [3, 4, 0, 5]), batch_rows=4)
    reader = FileReader(o, SCHEMA_JSON)
    read = list(reader.read_split(split, None))
    assert ids([b for b, _ in read]) == list(range(12))
    assert all(b.schema.equals(reader.arrow_schema) for b, _ in read)
    # positions name (member, rows of it read): m0's 3 rows + 1 of m1; m1's other 3 + 1 of
    # m3 (the empty m2 is no member); m3's last 4
    assert len(split.files) == 3
    assert [p for _, p in read] == [(1, 1), (2, 1), (2, 5)]
    assert [b.num_rows for b, _ in read] == [4, 4, 4]


def test_a_packed_split_resumed_in_the_middle_of_its_second_member_repeats_and_loses_no_row(
        tmp_path) -> None:
    o, split = packed(tmp_path, write_members(str(tmp_path), [5, 6, 4]), batch_rows=3)
    reader = FileReader(o, SCHEMA_JSON)
    read = list(reader.read_split(split, None))
    assert ids([b for b, _ in read]) == list(range(15))
    # resume after every batch: the rows before it plus the rows from it are every row once
    for n, (_, position) in enumerate(read):
        before = ids([b for b, _ in read[:n + 1]])
        after = ids([b for b, _ in FileReader(o, SCHEMA_JSON).read_split(split, position)])
        assert before + after == list(range(15)), position
    # the second member, 2 of its 6 rows read (a task retried there)
    rest = ids([b for b, _ in reader.read_split(split, (1, 2))])
    assert rest == list(range(7, 15))


def test_a_malformed_record_in_a_member_names_that_members_file_and_line(tmp_path) -> None:
    found = write_members(str(tmp_path), [2, 3, 2])
    bad = found[1].path
    with open(bad) as fh:
        lines = fh.readlines()
    lines[2] = '{"id": 4, "name": \n'  # the member's line 3
    with open(bad, "w") as fh:
        fh.writelines(lines)
    st = os.stat(bad)
    found[1] = FileEntry(bad, st.st_size, st.st_mtime)
    o, split = packed(tmp_path, found, mode="FAILFAST")
    with pytest.raises(MalformedRecord) as caught:
        list(FileReader(o, SCHEMA_JSON).read_split(split, None))
    assert caught.value.path == bad and caught.value.line == 3
    assert f"{bad} line 3" in str(caught.value)


def test_every_row_of_a_packed_split_carries_its_own_files_metadata(tmp_path) -> None:
    from pyspark.sql.types import StructType

    found = write_members(str(tmp_path), [2, 1, 3])
    o, split = packed(tmp_path, found, include_metadata=True)
    struct = StructType.fromJson(json.loads(SCHEMA_JSON))
    reader = FileReader(o, json.dumps(struct.jsonValue()))
    table = pa.Table.from_batches([b for b, _ in reader.read_split(split, None)])
    meta = table.column(METADATA_COLUMN).to_pylist()
    owner = [0, 0, 1, 2, 2, 2]
    assert [m["file_path"] for m in meta] == [f"file:{found[k].path}" for k in owner]
    assert [m["file_name"] for m in meta] == [os.path.basename(found[k].path) for k in owner]
    assert [m["file_size"] for m in meta] == [found[k].size for k in owner]
    assert [(m["file_block_start"], m["file_block_length"]) for m in meta] == [
        (0, found[k].size) for k in owner]
    assert [m["file_modification_time"].timestamp() for m in meta] == pytest.approx(
        [found[k].mtime for k in owner], abs=1e-5)


def test_a_member_that_changed_after_discovery_is_refused_naming_it(tmp_path) -> None:
    found = write_members(str(tmp_path), [2, 2])
    o, split = packed(tmp_path, found)
    with open(found[1].path, "a") as fh:
        fh.write(json.dumps({"id": 99, "name": "n99"}) + "\n")
    with pytest.raises(FileChangedError, match=rf"{found[1].path} changed .* had "
                                              rf"{found[1].size} bytes, now "):
        list(FileReader(o, SCHEMA_JSON).read_split(split, None))


def test_remote_members_are_fetched_ahead_and_handed_over_in_order() -> None:
    fs, _ = filesystem("memory://packing")
    members = []
    for i in range(9):
        path = f"/packing/m{i}.json"
        fs.pipe_file(path, f"member {i}\n".encode())
        members.append((path, len(f"member {i}\n"), 0.0))
    fetcher = MemberFetcher(fs, tuple(members), 2, ahead=3, max_bytes=1 << 20)
    try:
        assert not fetcher.local
        got = [fetcher.get(i) for i in range(2, 9)]
        assert got == [f"member {i}\n".encode() for i in range(2, 9)]
        assert len(fetcher._waiting) == 0
    finally:
        fetcher.close()
    # a byte bound smaller than two members: one member fetched ahead at a time
    fetcher = MemberFetcher(fs, tuple(members), 0, ahead=4, max_bytes=5)
    try:
        assert fetcher.get(0) == b"member 0\n" and len(fetcher._waiting) == 1
    finally:
        fetcher.close()


def test_the_packing_options_take_spark_names_and_sizes_and_have_spark_defaults() -> None:
    from sparkcoord.sources.files.options import parse_options

    default = parse_options("/data", "json", {})
    assert (default.max_partition_bytes, default.open_cost_bytes) == (128 * MB, 4 * MB)
    assert default.packing and default.prefetch_files == 8
    given = parse_options("/data", "json", {"maxPartitionBytes": "64m",
                                            "openCostInBytes": "256k", "prefetchFiles": "4"})
    assert (given.max_partition_bytes, given.open_cost_bytes, given.prefetch_files) == (
        64 * MB, 256 * KB, 4)
    with pytest.raises(ValueError, match="openCostInBytes"):
        parse_options("/data", "json", {"openCostInBytes": "a lot"})
