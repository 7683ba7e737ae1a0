"""The PostgreSQL enumerator's discovery and checkpointed state: :class:`ChunkPlanning` (planning
the snapshot's chunks, a :class:`~sparkcoord.sources.discovering.SplitDiscovery` on demand) over
its :class:`PlanningState`, and :class:`CdcEnumeratorState`, the enumerator's state with its
upgrade from sparkcoord 0.1.0 (docs/decisions/103-postgres-on-the-split-framework.md). The rules
they keep are the enumerator's (enumerator.py rules 1 to 3); both states are encoded with this
module as their home (core/encoding.py ``HOMES``) and importable from enumerator.py as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.core.encoding import encoded
from sparkcoord.sources.discovering import SplitDiscovery
from sparkcoord.sources.postgres.core.chunks import PlannerState
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.splits import STREAM_SPLIT_ID, SnapshotChunk, StreamSplit
from sparkcoord.sources.postgres.core.watermarks import ChunkProgress
from sparkcoord.sources.postgres.io.enumeration import EnumeratorIO
from sparkcoord.sources.splits import Split
from sparkcoord.sources.state import EnumeratorState

INITIAL, LATEST = "initial", "latest"
STARTUP_MODES = (INITIAL, LATEST)


@encoded("postgres.PlanningState")
@dataclass
class PlanningState:
    """Chunk planning's state (the enumerator's discovery state): whether the set-up ran, and
    each table's planner, in table order (a planner that is done stays, so the boundary that
    applies a cycle knows every table's chunk key column)."""

    set_up: bool = False
    planners: dict[TableName, PlannerState] = field(default_factory=dict)


class ChunkPlanning(SplitDiscovery):
    """Planning the snapshot's chunks as the enumerator's discovery on demand (enumerator.py
    rule 1; sources/enumerator.py rule 8). Thread model: ``discover_some`` on the planning lane, one
    cycle at a time; ``exhausted`` and ``size_of`` on the mailbox."""

    def __init__(self, io: Callable[[], EnumeratorIO], tables: Sequence[TableName],
                 snapshot: bool) -> None:
        self._io = io
        self.tables = tuple(tables)
        self.snapshot = snapshot

    def initial_state(self) -> PlanningState:
        return PlanningState()

    def discover(self, state: Any) -> tuple[list[Split], Any]:
        return self.discover_some(state, 1)

    def discover_some(self, state: Any, want: int) -> tuple[list[Split], Any]:
        io = self._io()
        planners = dict(state.planners)
        if not state.set_up:
            planners = io.set_up(self.tables, self.snapshot)
            if not self.snapshot:
                planners = {}
        chunks: list[Split] = []
        if any(not p.done for p in planners.values()):
            planned, after = io.plan({t: p for t, p in planners.items() if not p.done}, want)
            planners.update(after)
            chunks = [SnapshotChunk.of(chunk) for chunk in planned]
        return chunks, PlanningState(True, planners)

    def exhausted(self, state: Any) -> bool:
        return bool(state.set_up) and all(p.done for p in state.planners.values())

    def size_of(self, state: Any) -> int:
        return len(state.planners)


def _from_version_1(fields: dict[str, Any]) -> dict[str, Any]:
    """CdcEnumeratorState version 1 (sparkcoord 0.1.0, an enumerator of its own) -> 2 (a
    :class:`SplitEnumerator`'s state): the pending chunks, the stream built and not handed
    out, and what is in flight become the framework's pending and in-flight splits; the set-up
    and the planners the discovery state."""
    pending: list[Split] = list(fields.get("pending", []))
    chunks_pending = len(pending)
    in_flight: dict[str, int] = {}
    in_flight_splits: dict[str, Split] = {}
    for split_id, (subtask, chunk) in dict(fields.get("in_flight", {})).items():
        in_flight[split_id], in_flight_splits[split_id] = subtask, chunk
    if fields.get("stream") is not None:
        pending.append(fields["stream"])
    owner = fields.get("stream_owner")
    if owner is not None:
        in_flight[STREAM_SPLIT_ID], in_flight_splits[STREAM_SPLIT_ID] = owner, StreamSplit()
    set_up = bool(fields.get("set_up", False))
    planned = int(fields.get("chunks_planned", 0))
    return {"tables": fields["tables"], "startup": fields["startup"], "pending": pending,
            "in_flight": in_flight, "in_flight_splits": in_flight_splits,
            "discovery": PlanningState(set_up, dict(fields.get("planners", {}))),
            "discovered_once": set_up, "handed_out": planned - chunks_pending
            + (owner is not None), "finished": int(fields.get("chunks_finished", 0)),
            "progress": dict(fields.get("progress", {})), "chunks_planned": planned,
            "snapshot_done_at": fields.get("snapshot_done_at"),
            "reported": dict(fields.get("reported", {})),
            "confirmed": int(fields.get("confirmed", 0)),
            "stream_bound": int(fields.get("stream_bound", 0))}


@encoded("postgres.CdcEnumeratorState", version=2, upgrades={1: _from_version_1},
         first_fields=("tables", "startup", "set_up", "planners", "progress", "pending",
                       "in_flight", "chunks_planned", "chunks_finished", "snapshot_done_at",
                       "stream", "stream_owner", "reported", "confirmed", "stream_bound"))
@dataclass(kw_only=True)
class CdcEnumeratorState(EnumeratorState):
    """The enumerator's checkpointed state: the split framework's (pending chunks and the
    stream split before it goes out, what is in flight, the planners as the discovery state)
    and the source's own."""

    tables: tuple[TableName, ...] = ()
    startup: str = INITIAL
    #: per table while the snapshot runs: boundaries and high watermarks (enumerator.py rule 3)
    progress: dict[TableName, ChunkProgress] = field(default_factory=dict)
    chunks_planned: int = 0
    #: the checkpoint whose state first held the complete snapshot (enumerator.py rule 3)
    snapshot_done_at: int | None = None
    #: epoch -> the stream position reported in its batch, not yet confirmed (streaming.py rule 4)
    reported: dict[int, int] = field(default_factory=dict)
    #: the slot's position as last confirmed (for status; streaming.py rule 4)
    confirmed: int = 0
    #: how far the stream may read (streaming.py rule 5): a WAL insert position learned
    #: before a boundary
    stream_bound: int = 0
