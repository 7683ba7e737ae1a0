"""The enumerator's backlog held as chunks written once (sources/backlog.py) and the files
discovery has seen (sources/files/seen.py): the same hand-out order as a plain list, across
snapshots, and a snapshot that stays small however big the backlog is."""

from __future__ import annotations

import functools
import os
import pickle
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkcoord.core.restore import RestorePoint
from sparkcoord.core.stored import dump_snapshot, load_snapshot
from sparkcoord.sources import NextSplit, NoSplitNow, SplitDiscovery, SplitEnumerator
from sparkcoord.sources.backlog import CHUNK_SPLITS, Backlog, chunked
from sparkcoord.sources.files.seen import CHUNK_FILES, MERGED_CHUNKS, TAIL_FILES, SeenFiles
from sparkcoord.sources.splits import Split
from sparkcoord.testing import CoordinatorHarness, ManualWorkers


def splits(prefix: str, n: int, lanes: int = 1) -> list[Split]:
    return [Split(f"{prefix}{i}", 10, ) if lanes == 1 else _Laned(f"{prefix}{i}", 10, f"l{i % lanes}")
            for i in range(n)]


class _Laned(Split):
    def __init__(self, split_id: str, weight: int, lane: str) -> None:
        super().__init__(split_id, weight)
        object.__setattr__(self, "lane", lane)

    @property
    def alignment_key(self) -> str:
        return self.lane  # type: ignore[attr-defined, no-any-return]


def roundtrip(backlog: Backlog) -> Backlog:
    snapshot, parts = dump_snapshot(backlog.snapshot())
    state = load_snapshot(snapshot, lambda name: parts[name])
    return Backlog.restored(state, lanes=True)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_backlog_hands_out_as_a_plain_list_would_across_snapshots(seed: int) -> None:
    # a model test: random appends (big and small), prepends, takes from anywhere (alignment
    # takes out of order) and snapshots restored; the order must equal a list's
    print(f"seed {seed}")
    rng = random.Random(seed)
    backlog, model = Backlog(lanes=True), []
    made = 0
    for _ in range(60):
        op = rng.random()
        if op < 0.25:
            n = rng.choice([1, 5, 7, 30, 70])
            new = splits(f"s{made}-", n, lanes=3)
            made += 1
            backlog.append(chunked(new, size=16, stored_from=4))  # small: many chunks
            model.extend(new)
        elif op < 0.35:
            new = splits(f"b{made}-", rng.choice([1, 3, 20]), lanes=3)
            made += 1
            backlog.prepend(new)
            model[:0] = new
        elif op < 0.85 and model:
            items = list(backlog)
            index = rng.randrange(len(items)) if rng.random() < 0.3 else 0
            handle, split = items[index]
            assert split.split_id == model[index].split_id
            assert backlog.take(handle) is split
            del model[index]
        else:
            backlog = roundtrip(backlog)
        assert [s.split_id for _, s in backlog] == [s.split_id for s in model]
        assert len(backlog) == len(model)
        assert backlog.lanes() == {s.alignment_key for s in model}


def test_a_snapshot_of_a_hundred_thousand_pending_splits_names_chunks_and_stays_small() -> None:
    backlog = Backlog()
    backlog.append(chunked(splits("f", 100_000)))
    first, parts = dump_snapshot(backlog.snapshot())
    assert len(parts) == 100_000 // CHUNK_SPLITS + 1
    for _ in range(10_000):  # a trigger's worth taken from the front
        backlog.take(backlog.first()[0])
    rng = random.Random(5)
    for _ in range(300):  # and out of order, as alignment takes lanes
        items = list(zip(range(3_000), backlog, strict=False))
        backlog.take(items[rng.randrange(len(items))][1][0])
    snapshot, later = dump_snapshot(backlog.snapshot())
    assert set(later) <= set(parts)  # nothing new to write
    assert len(first) < 5_000 and len(snapshot) < 20_000, (len(first), len(snapshot))
    assert len(pickle.dumps([s for _, s in backlog])) > 50 * len(snapshot)


def test_a_list_of_splits_from_an_older_snapshot_is_restored_in_order() -> None:
    old = splits("o", 10)
    assert [s.split_id for _, s in Backlog.restored(old)] == [s.split_id for s in old]


def test_seen_files_remember_and_forget_as_a_dict_and_pickle_as_chunks() -> None:
    seen, model = SeenFiles(), {}
    for i in range(3 * CHUNK_FILES + 10):
        seen[f"f{i}"] = model[f"f{i}"] = (i, float(i))
    assert 2 <= seen.chunk_count < 3 + MERGED_CHUNKS and len(seen) == len(model)
    assert len(seen.__getstate__()["tail"]) < TAIL_FILES  # the rest is in chunks, by name
    copy = pickle.loads(pickle.dumps(seen))
    assert {p: copy.get(p) for p in copy} == model
    first = seen._chunks[0].value  # the oldest chunk: dropped once all of it is older
    floor = max(m for _, m in first.values()) + 1
    seen.forget_older(floor)
    assert not any(p in seen for p in first)
    assert all(p in seen for p, (_, m) in model.items() if m >= floor)  # never before the floor
    second = seen._chunks[0].value  # more than half of it older: rewritten without them
    ordered = sorted(m for _, m in second.values())
    floor = ordered[len(ordered) * 3 // 4]
    seen.forget_older(floor)
    assert all((p in seen) == (m >= floor) for p, (_, m) in second.items())
    assert all(p in seen for p, (_, m) in model.items() if m >= floor)


def test_many_small_discoveries_leave_a_small_snapshot() -> None:
    # rule 5 of backlog.py and rule 1 of seen.py: a continuous source that finds a few files
    # per cycle while its readers are behind must not write them all with every trigger
    backlog, seen = Backlog(), SeenFiles()
    for cycle in range(2_000):
        found = splits(f"c{cycle}-", 10)
        backlog.append(chunked(found))
        for s in found:
            seen[s.split_id] = (10, float(cycle))
    assert len(backlog) == 20_000 and len(seen) == 20_000
    snapshot, _ = dump_snapshot((backlog.snapshot(), seen))
    assert len(snapshot) < 10_000, len(snapshot)  # as lists: about 1.5 MB
    assert [s.split_id for _, s in backlog][:3] == ["c0-0", "c0-1", "c0-2"]


class Listing(SplitDiscovery):
    def __init__(self, files: list[Split]) -> None:
        self.files = files

    def initial_state(self) -> int:
        return 0

    def discover(self, state: Any) -> tuple[list[Split], Any]:
        return list(self.files[state:]), len(self.files)


def test_a_source_with_a_big_backlog_writes_small_records_and_restores_it_exactly(
        tmp_path: Any) -> None:
    # issue 25 item 3: with a backlog of 30,000 splits a trigger writes what changed only, and
    # a restore from any record hands out exactly what was not handed out before
    root = str(tmp_path)
    listing = Listing(splits("f", 30_000))
    enumerator = functools.partial(SplitEnumerator, discovery=listing,
                                   bounded=True)
    h = CoordinatorHarness(enumerator, 2, name="files", storage_url=root,
                           workers=ManualWorkers(inline=True))
    h.start()
    h.checkpoint()
    got: list[str] = []
    sizes = []
    reading: dict[int, tuple[str, ...]] = {0: (), 1: ()}  # each reader reports what it read
    for _ in range(4):
        for _ in range(500):
            subtask = len(got) % 2
            answer = h.request_from_subtask(subtask, NextSplit(reading[subtask]))
            got.append(answer.split_id)
            reading[subtask] = (answer.split_id,)
        h.commit()
        h.checkpoint()
        sizes.append(os.path.getsize(h.storage.record_path(h.epoch)))
    parts = os.listdir(os.path.join(root, "parts"))
    assert max(sizes) < 20_000, sizes  # a list of 28,000 splits would be about 1.5 MB
    assert len(parts) == 30_000 // CHUNK_SPLITS + 1
    epoch = h.epoch
    h.service.close()
    again = CoordinatorHarness(enumerator, 2, name="files", storage_url=root,
                               workers=ManualWorkers(inline=True))
    again.service.restore(RestorePoint(epoch, committed=True))
    again.run()
    assert again.service.failure is None
    again.checkpoint()
    answer = again.request_from_subtask(0, NextSplit())
    while not isinstance(answer, NoSplitNow):
        got.append(answer.split_id)
        answer = again.request_from_subtask(0, NextSplit((answer.split_id,)))
    assert got == [f"f{i}" for i in range(30_000)]  # each once, in order
