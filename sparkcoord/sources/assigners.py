"""The split enumerator's hand-out order: which pending split a reader starts next.

Rules:
  1. An assigner is a deterministic function of the enumerator's state (its pending splits, the
     splits in flight) and of the logged reports the enumerator observed: a replay of a batch's
     requests against the same snapshot gets the same answers (``enumerator.py`` rules 1 and 2).
     It keeps no state of its own: what it reads lives in the enumerator's checkpointed state.
  2. :class:`InOrder` hands splits out in pending order: discovery order, or each discovery's
     newest first (``latest_first``: a discovery's splits go to the front, newest first).
  3. :class:`AlignedLanes` (watermark alignment, docs/alignment.md): among the lanes whose
     reported watermark the decision in force allows, the lane furthest behind; a lane held
     back by another has at most one split in flight; before a decision with a minimum is in
     force, the running batch's reports hold the lanes together (:meth:`AlignedLanes.held`).
     Its splits are added as :class:`InOrder`'s.

Thread model: the enumerator's mailbox only.
"""

from __future__ import annotations

import abc
from typing import Any

from sparkcoord.sources.alignment import WatermarkAlignment
from sparkcoord.sources.backlog import Backlog, Chunk
from sparkcoord.sources.splits import Split


class SplitAssigner(abc.ABC):
    """Where discovered splits go among the pending ones and which one goes out next (module
    rules). Made by :meth:`SplitEnumerator.make_assigner` at each reset, for the state in force.
    """

    @abc.abstractmethod
    def add(self, pending: Backlog, chunks: list[Chunk]) -> None:
        """Put a discovery's splits (as chunks, in discovery order) among ``pending``. Called
        by the enumerator at a checkpoint boundary (mailbox)."""

    @abc.abstractmethod
    def next_split(self, pending: Backlog) -> tuple[Any, Split] | None:
        """The handle and split of the pending split a reader starts next, or None when none
        may go out now (``pending`` is not empty). Called by the enumerator as it answers a
        reader's request (mailbox)."""


class InOrder(SplitAssigner):
    """Rule 2."""

    def __init__(self, latest_first: bool = False) -> None:
        self.latest_first = latest_first

    def add(self, pending: Backlog, chunks: list[Chunk]) -> None:
        if self.latest_first:
            pending.prepend_chunks(chunks)  # newest first (the enumerator chunked them so)
        else:
            pending.append(chunks)

    def next_split(self, pending: Backlog) -> tuple[Any, Split] | None:
        return pending.first()


class AlignedLanes(InOrder):
    """Rule 3, over ``alignment`` and ``in_flight_keys`` (split id -> lane of every split in
    flight), both the enumerator's state in force."""

    def __init__(self, alignment: WatermarkAlignment, in_flight_keys: dict[str, str],
                 latest_first: bool = False) -> None:
        super().__init__(latest_first)
        self.alignment = alignment
        self.in_flight_keys = in_flight_keys

    def next_split(self, pending: Backlog) -> tuple[Any, Split] | None:
        """Among the lanes whose reported watermark the decision in force allows (a split of a
        lane past the allowed maximum would only wait in the reader that took it, and a reader
        would take the lane's next split, and the next, each kept at once), the lane furthest
        behind: one that has not reported yet first (it may be the slowest: a backlog listed
        with an ahead lane's files first would otherwise be read unaligned until the slow lane
        started), then the lowest watermark, then the fewest splits in flight, then pending
        order within the lane. A lane held back by another one (its allowed maximum is not
        None) is skipped while it has a split in flight (``enumerator.py`` rule 4): its next
        file goes out once the reader of the last one reported it finished, with the
        watermark it reached, so the lane ends at most one record batch past its allowed
        maximum however many readers there are. A lane nothing holds back (a single lane, the
        only one not idle) has no such limit and is read by every reader at once. Before a
        decision with a minimum is in force (the first batch: no lane had reported at the
        boundary), the reports of the running batch hold the lanes instead (:meth:`held`).
        The reports this batch made count too, since the request that carries one is answered
        after it is observed (docs/decisions/043-watermark-alignment.md)."""
        decision = self.alignment.decision
        entries = self.alignment.state.splits
        in_flight: dict[str, int] = {}
        for key in self.in_flight_keys.values():
            in_flight[key] = in_flight.get(key, 0) + 1
        undecided = decision.minimum is None
        best: tuple[int, int, int, int] | None = None
        chosen: tuple[Any, Split] | None = None
        seen: set[str] = set()
        lanes = len(pending.lanes())
        for index, (handle, split) in enumerate(pending):
            key = split.alignment_key
            if key in seen:
                continue  # a lane's first pending split stands for the lane
            seen.add(key)
            entry = entries.get(key)
            watermark = entry.watermark if entry is not None else None
            if not decision.allows(watermark, key):
                continue
            if in_flight.get(key) and decision.allowed_maximum_of(key) is not None:
                continue  # one split of a held-back lane at a time (enumerator rule 4)
            if undecided and self.held(pending, key, watermark, in_flight):
                continue
            rank = (0 if watermark is None else 1, watermark or 0, in_flight.get(key, 0), index)
            if best is None or rank < best:
                best, chosen = rank, (handle, split)
                if rank[:3] == (0, 0, 0):
                    break  # a lane nobody reads and nothing reported: none comes before it
            if len(seen) == lanes:
                break  # every lane's first split was ranked
        return chosen

    def held(self, pending: Backlog, key: str, watermark: int | None,
             in_flight: dict[str, int]) -> bool:
        """Whether lane ``key`` gets no split now because no decision with a minimum is in
        force (mailbox, from :meth:`next_split`). Without one nothing pauses the readers, so
        the hand-out alone keeps the lanes together, by the reports of this batch: while more
        than one lane has work, a lane has at most one split in flight; a lane that has not
        reported may be the slowest and is read; one that has reported waits until every
        other lane with work has reported too, and then reads only if it is within
        ``maxDrift`` of the lowest. Without this, in a first batch where one lane's reader was
        slow to report (a task retried), another reader took that lane's next file too, as a
        lane not yet reported comes first: the lane went two files ahead in one batch and a
        watermark delay of ``maxDrift`` plus one file dropped rows of the slow lane as late."""
        lanes = pending.lanes()
        lanes.update(self.in_flight_keys.values())
        if len(lanes) < 2:
            return False
        if in_flight.get(key):
            return True
        if watermark is None:
            return False
        entries = self.alignment.state.splits
        others = [entries[k].watermark if k in entries else None for k in lanes if k != key]
        if any(mark is None for mark in others):
            return True
        lowest = min([watermark, *(mark for mark in others if mark is not None)])
        return watermark > lowest + self.alignment.options.max_drift_ms
