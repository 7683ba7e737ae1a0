"""Checkpoints written by released versions of sparkcoord (tests/fixtures/checkpoints) read
with the code as it is now: every record, part, log item, subtask state and spec decodes to the
library's classes, and what the code writes now names no class by its module path
(core/encoding.py rules 1 and 4). The runs that continue them on Spark are in
tests/spark/test_old_checkpoints_spark.py."""

from __future__ import annotations

import functools
import glob
import os
from typing import Any

import pytest

from sparkcoord.core.encoding import loads, named_globals
from sparkcoord.core.records import decode_checkpoint, decode_log, decode_subtask_state
from sparkcoord.core.stored import StoredOnce, load_snapshot
from sparkcoord.inspection import inspect_checkpoint
from tests.fixtures.checkpoints import TAGS, unpacked

#: library paths a pickle may still name: the encoded constructor, and the stored-once parts
#: (core/stored.py: their pickle is a reference, not a value)
STABLE = {"sparkcoord.core.encoding:_decoded", "sparkcoord.core.stored:_stored_part",
          "sparkcoord.core.stored:StoredOnce"}


def library_globals(data: bytes) -> set[str]:
    return {g for g in named_globals(data) if g.startswith("sparkcoord.")}


def decoded_values(root: str) -> dict[str, list[Any]]:
    """Every pickle of a job's checkpoint directory, decoded: kind -> values."""
    out: dict[str, list[Any]] = {"snapshot": [], "event": [], "log": [], "state": [],
                                 "attached": []}
    for source in glob.glob(os.path.join(root, "ckpt", "coordination", "*")):
        parts = os.path.join(source, "parts")

        def read_part(digest: str, parts: str = parts) -> StoredOnce[Any]:
            with open(os.path.join(parts, digest), "rb") as f:
                return StoredOnce.read_back(digest, f.read())
        for path in sorted(glob.glob(os.path.join(source, "records", "*.ckpt"))):
            record = decode_checkpoint(open(path, "rb").read(), path)
            for name, snapshot in record.snapshots.items():
                if not name.startswith("\x00"):
                    out["snapshot"].append(load_snapshot(bytes(snapshot), read_part, path))
            for events in record.events.values():
                out["event"] += [loads(e) for e in events]
        for path in sorted(glob.glob(os.path.join(source, "inbound", "*.log"))):
            entries = decode_log(open(path, "rb").read(), path, allow_torn_tail=True)[0]
            for entry in entries:
                for payload in ([entry.payload] if hasattr(entry, "payload")
                                else list(getattr(entry, "payloads", ()))):
                    out["log"].append(loads(payload))
        for path in sorted(glob.glob(os.path.join(source, "state", "**", "*.state"),
                                     recursive=True)):
            out["state"].append(loads(decode_subtask_state(open(path, "rb").read(), path)[1]))
        attached = os.path.join(source, "attached.pkl")
        if os.path.exists(attached):
            out["attached"].append(loads(open(attached, "rb").read()))
    return out


def classes_in(value: Any, seen: set[int] | None = None) -> set[str]:
    """The qualified names of the sparkcoord classes ``value`` holds, at any depth."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return set()
    seen.add(id(value))
    names = set()
    kind = type(value)
    if kind.__module__.startswith("sparkcoord."):
        names.add(kind.__name__)
    if isinstance(value, dict):
        children = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        children = list(value)
    elif isinstance(value, StoredOnce):
        children = [value.value]
    elif isinstance(value, functools.partial):
        children = [value.func, *value.args, *value.keywords.values()]
    elif hasattr(value, "__dataclass_fields__"):
        children = [getattr(value, f) for f in value.__dataclass_fields__]
    elif hasattr(value, "__getstate__") and kind.__module__.startswith("sparkcoord."):
        state = value.__getstate__()
        children = [state] if state is not None else []
    else:
        children = []
    for child in children:
        names |= classes_in(child, seen)
    return names


EXPECTED = {
    "files_lake": {"EnumeratorState", "BacklogState", "SeenFiles", "FileDiscoveryState",
                   "FileSplit", "SinkState", "LedgerState", "CompactionState", "DataFile",
                   "ColumnStats", "NextSplit", "NoSplitNow", "FileWritten", "OperatorSpec",
                   "SinkTarget"},
    "numbers": {"Number"},
    "postgres_merge": {"CdcEnumeratorState", "TableName", "NextChunk", "NextStreamRead",
                       "StreamBound", "NoSplitNow", "PostgresReaderState", "ChunkMap",
                       "StreamFilter", "StreamPosition", "SinkState", "LedgerState",
                       "DataFile", "OperatorSpec", "SinkTarget"},
}


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_released_checkpoint_decodes_to_the_librarys_classes_and_reencodes_by_name(
        tag: str, case: str) -> None:
    import pickle

    with unpacked(tag, case) as root:
        values = decoded_values(root)
        found = set().union(*(classes_in(v) for kind in values.values() for v in kind))
        assert EXPECTED[case] <= found, f"{case}: not found {EXPECTED[case] - found}"
        # what the code writes of those values now names no library class by path
        for kind, items in values.items():
            for value in items:
                named = library_globals(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
                loose = {g for g in named if g not in STABLE
                         # classes (not values) a spec refers to: a provider, an operator
                         and not g.endswith(("Coordinator", "Subtask"))
                         # the examples are the user's code a user copies: by path, as theirs
                         and not g.startswith("sparkcoord.examples.")}
                assert not loose, f"{case} {kind}: {type(value).__name__} pickles {loose}"
        report = inspect_checkpoint(os.path.join(root, "ckpt"), decode=True)
        assert report["problems"] == []


@pytest.mark.parametrize("tag", TAGS)
def test_a_released_postgres_checkpoint_s_states_go_on_in_the_split_framework(tag: str) -> None:
    """Decision 103: 0.1.0's enumerator state (an enumerator of its own) restores into the
    split enumerator's fields, and its reader states into the split reader's."""
    from sparkcoord.sources.enumerator import EnumeratorState
    from sparkcoord.sources.postgres.core.splits import STREAM_SPLIT_ID, StreamSplit
    from sparkcoord.sources.postgres.enumerator import CdcEnumeratorState, PlanningState
    from sparkcoord.sources.postgres.reader import PostgresReaderState, _upgraded

    with unpacked(tag, "postgres_merge") as root:
        values = decoded_values(root)
    states = [v for v in values["snapshot"] if isinstance(v, CdcEnumeratorState)]
    assert states, "the fixture holds the PostgreSQL enumerator's snapshots"
    for state in states:
        assert isinstance(state, EnumeratorState) and isinstance(state.discovery, PlanningState)
        assert state.discovered_once == state.discovery.set_up
        assert set(state.in_flight) == set(state.in_flight_splits or {})
        assert state.finished <= state.chunks_planned
        if state.snapshot_done_at is not None:
            assert state.progress == {} or state.finished == state.chunks_planned
    streaming = [s for s in states if STREAM_SPLIT_ID in s.in_flight]
    assert streaming, "the fixture reached the stream"
    assert all(isinstance((s.in_flight_splits or {})[STREAM_SPLIT_ID], StreamSplit)
               for s in streaming)
    readers = [v for v in values["state"] if isinstance(v, PostgresReaderState)]
    assert readers
    for old in readers:
        new, staged = _upgraded(old)
        if old.position is not None:
            assert new.unfinished == [(StreamSplit(), old.position)] and staged == []
        else:
            assert new.unreported == [split_id for split_id, _ in old.unreported]
            assert new.reports == dict(old.unreported) and staged == old.staged
    # and the enumerator goes on from the last of them
    import functools

    from sparkcoord.sources.postgres.enumerator import PostgresEnumerator
    from sparkcoord.testing import CoordinatorHarness, ManualWorkers
    from tests.postgres.test_cdc_enumerator import FakeIO

    last = states[-1]
    io = FakeIO({t: [] for t in last.tables}, chunk_size=10)
    h = CoordinatorHarness(functools.partial(PostgresEnumerator, io=lambda: io,
                                             tables=last.tables, startup=last.startup), 2,
                           workers=ManualWorkers())
    io.harness = h
    h.start()
    enumerator: Any = h.coordinator
    enumerator.reset_to_checkpoint(100, last)
    status = enumerator.handle_client_request("status")
    assert status["phase"] == ("stream" if STREAM_SPLIT_ID in last.in_flight else "hand-over")
    assert status["stream_owner"] == last.in_flight.get(STREAM_SPLIT_ID)
    assert status["chunks_finished"] == last.finished and status["pending"] == 0
