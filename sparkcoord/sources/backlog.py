"""The split enumerator's backlog: splits discovered and not yet handed out, in hand-out order.

A backlog of 100,000 files is 100,000 splits; checkpointed as a list, every trigger would pickle
and write all of them (about 150 bytes each) while the backlog drains. Here it is held as
immutable *chunks* of at most ``CHUNK_SPLITS`` splits, each a stored-once part of the
enumerator's state (core/stored.py: written once, then named by every record that holds it),
and what was taken from a chunk is a position: the count taken from its front, and a bit set
of positions taken out of order (watermark alignment reads lanes out of listing order).

Rules:
  1. A chunk never changes. What a trigger writes is per chunk a name, a count and a bit set
     of at most ``CHUNK_SPLITS`` bits, whatever the backlog holds; new chunks are written once,
     by the trigger after the discovery that found them.
  2. Hand-out order is the order of the chunks, then the order within a chunk, skipping what
     was taken: splits appended go after every split present, splits prepended before them, in
     the order given.
  3. A chunk of fewer than ``STORED_SPLITS`` splits (a few splits given back by a task retry,
     a small discovery) is kept inline in the snapshot: a part of its own would cost a file.
  4. A chunk whose splits were all taken is dropped.
  5. Small chunks do not pile up at the end (a continuous source discovering a few files per
     cycle while the readers are behind): appended splits join an inline chunk at the end,
     and ``MERGED_CHUNKS`` small stored chunks at the end that nothing was taken from are
     merged into one. So a snapshot holds at most one inline chunk at the end and fewer than
     ``MERGED_CHUNKS`` small ones, and a split is rewritten a few times at most.

Thread model: a backlog belongs to the enumerator's mailbox thread. :func:`chunked` is a pure
function that may run on the discovery thread (it pickles and hashes the new chunks there, so
that the checkpoint boundary does not).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sparkcoord.core.encoding import encoded
from sparkcoord.core.stored import StoredOnce
from sparkcoord.sources.splits import Split

#: the most splits one chunk holds (rule 1): a chunk's bit set is at most 512 bytes
CHUNK_SPLITS = 4096
#: chunks of fewer splits are kept inline in the snapshot (rule 3)
STORED_SPLITS = 64
#: this many small chunks at the end are merged into one (rule 5)
MERGED_CHUNKS = 8

Chunk = StoredOnce[tuple[Split, ...]] | tuple[Split, ...]


def chunked(splits: Sequence[Split], *, size: int = CHUNK_SPLITS,
            stored_from: int = STORED_SPLITS) -> list[Chunk]:
    """``splits`` as chunks of at most ``size`` (rules 1 and 3), in order. Called by the
    enumerator on its discovery thread (or the mailbox for a few splits given back); the stored
    chunks' bytes and names are computed here."""
    out: list[Chunk] = []
    for start in range(0, len(splits), size):
        piece = tuple(splits[start:start + size])
        if len(piece) < stored_from:
            out.append(piece)
        else:
            part = StoredOnce(piece)
            part.digest  # noqa: B018 - pickled and hashed now, on this thread
            out.append(part)
    return out


def _splits_of(chunk: Chunk) -> tuple[Split, ...]:
    return chunk.value if isinstance(chunk, StoredOnce) else chunk


@encoded("sources.BacklogState")
@dataclass(frozen=True)
class BacklogState:
    """A backlog as the enumerator's snapshot holds it: per chunk, the chunk (a part's name
    when stored), how many were taken from its front, and a bit set of the later positions
    taken (bit ``i``: position ``skip + 1 + i``)."""

    segments: tuple[tuple[Chunk, int, int], ...] = ()


class _Segment:
    __slots__ = ("chunk", "splits", "skip", "taken", "left")

    def __init__(self, chunk: Chunk, skip: int = 0, taken: Iterable[int] = ()) -> None:
        self.chunk = chunk
        self.splits = _splits_of(chunk)
        self.skip = skip  # every position before it is taken
        self.taken = set(taken)  # positions after ``skip`` taken out of order
        self.left = len(self.splits) - skip - len(self.taken)


class Backlog:
    """The pending splits of a :class:`~sparkcoord.sources.enumerator.SplitEnumerator`.

    Thread model: the enumerator's mailbox thread only (module docstring)."""

    def __init__(self, *, lanes: bool = False) -> None:
        self._segments: list[_Segment] = []
        self._count = 0
        #: with ``lanes`` (watermark alignment): how many splits of each alignment key
        self._lanes: Counter[str] | None = Counter() if lanes else None

    @classmethod
    def restored(cls, state: BacklogState | Sequence[Split] | None, *,
                 lanes: bool = False) -> Backlog:
        """The backlog a snapshot holds (``reset_to_checkpoint``, mailbox thread); a list of
        splits is what snapshots held before backlogs had chunks."""
        backlog = cls(lanes=lanes)
        if state is None:
            return backlog
        if not isinstance(state, BacklogState):
            backlog.append(chunked(list(state)))
            return backlog
        for chunk, skip, bits in state.segments:
            taken = [skip + 1 + i for i in range(bits.bit_length()) if bits >> i & 1]
            backlog._add(_Segment(chunk, skip, taken), front=False)
        return backlog

    def snapshot(self) -> BacklogState:
        """What the enumerator's snapshot holds (``checkpoint_coordinator``, mailbox thread):
        per chunk a reference, a count and a bit set (rule 1)."""
        out = []
        for seg in self._segments:
            bits = 0
            for position in seg.taken:
                bits |= 1 << (position - seg.skip - 1)
            out.append((seg.chunk, seg.skip, bits))
        return BacklogState(tuple(out))

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def lanes(self) -> set[str]:
        """The alignment keys of the splits present (mailbox thread; a backlog made with
        ``lanes``)."""
        if self._lanes is None:
            raise ValueError("this backlog does not count its lanes (made without lanes=True)")
        return set(self._lanes)

    def append(self, chunks: Iterable[Chunk]) -> None:
        """Add ``chunks`` after every split present (rule 2; mailbox thread)."""
        for chunk in chunks:
            self._add(_Segment(chunk), front=False)
            self._merge_end()

    def _merge_end(self) -> None:
        # rule 5, on the small chunks at the end that nothing was taken from: an inline one
        # is merged with the one before it, and MERGED_CHUNKS stored ones into one
        while True:
            end = 0
            for seg in reversed(self._segments):
                if seg.skip or seg.taken or len(seg.splits) >= CHUNK_SPLITS:
                    break
                end += 1
            if end < 2:
                return
            tail = self._segments[-end:]
            if not (isinstance(tail[-1].chunk, StoredOnce)
                    and isinstance(tail[-2].chunk, StoredOnce)):
                merge = tail[-2:]
            elif end >= MERGED_CHUNKS:
                merge = tail
            else:
                return
            del self._segments[-len(merge):]
            for chunk in chunked([split for seg in merge for split in seg.splits]):
                self._segments.append(_Segment(chunk))  # the same splits: the counts stay

    def prepend(self, splits: Sequence[Split]) -> None:
        """Add ``splits`` before every split present, in the order given (rule 2; mailbox
        thread: a task retry gives splits back)."""
        self.prepend_chunks(chunked(splits))

    def prepend_chunks(self, chunks: Sequence[Chunk]) -> None:
        """Add ``chunks`` before every split present, in the order given (rule 2; mailbox
        thread: newest first)."""
        for chunk in reversed(chunks):
            self._add(_Segment(chunk), front=True)

    def _add(self, seg: _Segment, *, front: bool) -> None:
        if seg.left == 0:
            return
        if front:
            self._segments.insert(0, seg)
        else:
            self._segments.append(seg)
        self._count += seg.left
        if self._lanes is not None:
            for position in self._positions(seg):
                self._lanes[seg.splits[position].alignment_key] += 1

    @staticmethod
    def _positions(seg: _Segment) -> Iterator[int]:
        taken = seg.taken
        for position in range(seg.skip, len(seg.splits)):
            if position not in taken:
                yield position

    def __iter__(self) -> Iterator[tuple[tuple[_Segment, int], Split]]:
        """Every split present in hand-out order, with the handle :meth:`take` takes it by
        (mailbox thread; do not change the backlog while iterating)."""
        for seg in self._segments:
            for position in self._positions(seg):
                yield (seg, position), seg.splits[position]

    def first(self) -> tuple[tuple[_Segment, int], Split]:
        """The first split in hand-out order, with its handle (mailbox thread; not empty)."""
        seg = self._segments[0]
        return (seg, seg.skip), seg.splits[seg.skip]

    def take(self, handle: tuple[Any, int]) -> Split:
        """Remove the split of ``handle`` (from :meth:`first` or iteration) and return it
        (mailbox thread)."""
        seg, position = handle
        split: Split = seg.splits[position]
        if position == seg.skip:
            seg.skip += 1
            while seg.skip in seg.taken:  # positions taken out of order join the front run
                seg.taken.discard(seg.skip)
                seg.skip += 1
        else:
            seg.taken.add(position)
        seg.left -= 1
        self._count -= 1
        if self._lanes is not None:
            key = split.alignment_key
            self._lanes[key] -= 1
            if not self._lanes[key]:
                del self._lanes[key]
        if seg.left == 0:
            self._segments.remove(seg)  # rule 4
        return split
