"""The PostgreSQL source's enumerator state once the stream has taken over a snapshot of 1,000 and
of 10,000 chunks (issue 27: <= 64 KB, the same at both sizes; Flink CDC keeps every chunk).

The real enumerator (sparkcoord/sources/postgres/enumerator.py) in this process under the
CoordinatorHarness, with the real coordination service and checkpoint storage on local disk,
and a planning I/O over a table of consecutive integer keys (no server: what is measured is the
state, which does not depend on where the boundaries came from). Two readers take chunks and
report each a batch later with a high watermark, as PostgresReader does; the stream is handed
out; the figure is the bytes of the checkpoint record written at the next trigger. The baseline,
in the same run: the state an enumerator that keeps every chunk and its high watermark until
the job ends holds (each finished chunk as its split, and its watermark), pickled.
"""

from __future__ import annotations

import functools
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from bench.common import figure


def _io_class() -> Any:
    from sparkcoord.sources.postgres.core.chunks import Chunk, ChunkPlanner, PlannerState
    from sparkcoord.sources.postgres.core.names import TableName
    from sparkcoord.sources.postgres.enumerator import EnumeratorIO

    class ConsecutiveKeys(EnumeratorIO):
        """A table whose keys are 0..rows-1: a boundary query is arithmetic."""

        def __init__(self, rows: int, chunk_size: int) -> None:
            self.rows, self.chunk_size = rows, chunk_size

        def set_up(self, tables: Sequence[TableName], snapshot: bool
                   ) -> dict[TableName, PlannerState]:
            return {t: PlannerState(t, "id", self.chunk_size) for t in tables}

        def plan(self, planners: dict[TableName, PlannerState], want: int
                 ) -> tuple[list[Chunk], dict[TableName, PlannerState]]:
            out: list[Chunk] = []
            after = dict(planners)
            for table, state in planners.items():
                planner = ChunkPlanner.restored(state)
                while len(out) < want and (query := planner.next_query()) is not None:
                    first = 0 if query.after is None else (
                        query.after if query.inclusive else query.after + 1)
                    found = first + query.offset
                    chunk = planner.boundary_found(query, found if found < self.rows else None)
                    if chunk is not None:
                        out.append(chunk)
                after[table] = planner.state
            return out, after

        def advance(self, lsn: int) -> int:
            return lsn

        def insert_position(self) -> int:
            return 1 << 40

        def unpublished(self, tables: Sequence[TableName]) -> tuple[TableName, ...]:
            return ()

    return ConsecutiveKeys


def _snapshot(chunks: int, tmp: str) -> dict[str, Any]:
    from sparkcoord.core.restore import FRESH
    from sparkcoord.sources.postgres.core.names import TableName
    from sparkcoord.sources.postgres.core.splits import NextChunk, SnapshotChunk, StreamSplit
    from sparkcoord.sources.postgres.enumerator import PostgresEnumerator
    from sparkcoord.sources.splits import NoSplitNow
    from sparkcoord.testing import CoordinatorHarness, ManualWorkers

    chunk_size = 10
    io = _io_class()(chunks * chunk_size, chunk_size)
    root = os.path.join(tmp, f"ckpt-{chunks}")
    provider = functools.partial(PostgresEnumerator, io=lambda: io,
                                 tables=(TableName("public", "orders"),), plan_ahead=256)
    h = CoordinatorHarness(provider, 2, name="postgres", storage_url=root,
                           workers=ManualWorkers(inline=True))
    h.start(FRESH)
    unreported: dict[int, list[tuple[str, int]]] = {0: [], 1: []}
    kept: list[tuple[SnapshotChunk, int]] = []  # the baseline's state: every chunk kept
    lsn, records, stream = 1000, [], None
    started = time.perf_counter()
    while stream is None:
        h.run()
        h.checkpoint()
        records.append(_newest_record_bytes(root))
        for subtask in (0, 1):
            report = tuple(unreported[subtask])
            unreported[subtask] = []
            while True:
                answer = h.request_from_subtask(subtask, NextChunk.of(report))
                report = ()
                if isinstance(answer, StreamSplit):
                    stream = answer
                    break
                if not isinstance(answer, SnapshotChunk):
                    assert isinstance(answer, NoSplitNow)
                    break
                lsn += 1
                unreported[subtask].append((answer.split_id, lsn))
                kept.append((answer, lsn))
        h.commit()
    elapsed = time.perf_counter() - started
    h.run()
    h.checkpoint()  # the first trigger after the hand-over
    after = _newest_record_bytes(root)
    state_bytes = len(pickle.dumps(h.coordinator.state,  # type: ignore[attr-defined]
                                   protocol=pickle.HIGHEST_PROTOCOL))
    h.commit()
    h.service.close()
    baseline = len(pickle.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL))
    return {"chunks": len(kept), "record_after": after, "state_after": state_bytes,
            "largest_record": max(records), "baseline": baseline, "seconds": elapsed,
            "map_bytes": len(pickle.dumps(stream.filter, protocol=pickle.HIGHEST_PROTOCOL))}


def _newest_record_bytes(root: str) -> int:
    directory = os.path.join(root, "records")
    names = [n for n in os.listdir(directory) if n.endswith(".ckpt")]
    newest = max(names, key=lambda n: int(n.split(".")[0]))
    return os.path.getsize(os.path.join(directory, newest))


def run(preset: str) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="bench-cdc-state-")
    try:
        small, large = _snapshot(1_000, tmp), _snapshot(10_000, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    figures = []
    for got in (small, large):
        kb = got["record_after"] / 1e3
        figures.append(figure(
            "cdc_state", f"enumerator's checkpoint once the stream took over a snapshot of "
            f"{got['chunks']:,} chunks", kb, "KB", got["baseline"] / 1e3, "<= 64 KB",
            got["record_after"] <= 64_000))
    figures.append(figure(
        "cdc_state", "the same at 10,000 chunks as at 1,000 (record bytes, ratio)",
        large["record_after"] / small["record_after"], "ratio", None, "<= 1.1",
        large["record_after"] <= 1.1 * small["record_after"]))
    notes = [f"- {g['chunks']:,} chunks of 10 keys, 2 readers reporting a batch later: after "
             f"the hand-over the record is {g['record_after']:,} B (the enumerator's state "
             f"pickled {g['state_after']:,} B); the largest record while the snapshot ran "
             f"{g['largest_record'] / 1e3:,.1f} KB; keeping every chunk and its watermark "
             f"{g['baseline'] / 1e3:,.1f} KB; the high-watermark map handed to the stream "
             f"reader {g['map_bytes'] / 1e3:,.1f} KB; {g['seconds']:.1f} s"
             for g in (small, large)]
    return {"figures": figures, "notes": notes, "raw": {"small": small, "large": large}}
