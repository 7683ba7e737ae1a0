"""The files a file source's discovery has seen, held so that a checkpoint writes only what changed.

Discovery in mode ``listing`` remembers every file of the last ``maxFileAge`` (mode
``lexical``: those since the last backfill) by path, with its size and modification time. A
source that saw 100,000 files would write all of them with every trigger; here they are held
as immutable *chunks* of at most ``CHUNK_FILES`` entries, each a stored-once part of the
enumerator's state (core/stored.py), plus a small inline tail of the newest entries.

Rules:
  1. New entries go to the tail; a tail of ``TAIL_FILES`` entries becomes a chunk (pickled
     and hashed on the discovery thread, written once by the next trigger), and
     ``MERGED_CHUNKS`` chunks of fewer than ``CHUNK_FILES`` entries at the end are merged into
     one: a snapshot holds at most ``TAIL_FILES`` entries inline and a few small chunks, and
     an entry is rewritten a few times at most.
  2. A chunk never changes. Forgetting entries older than a floor drops a chunk whose newest
     entry is older; a chunk of which more than half is older is rewritten without them; a
     chunk with fewer older entries is kept whole, so an entry may be remembered past the
     floor, never forgotten before it (a remembered path is not read again: at most a file
     rewritten under the same name waits longer to be read as new). The tail is filtered
     exactly.
  3. What the state pickles is the chunks (by name) and the tail; the index of every path,
     and each chunk's oldest and newest modification time, are rebuilt when it is unpickled.

Thread model: a value of the discovery state: changed only by the discovery thread, on a copy
(:meth:`SeenFiles.copy`), then handed to the mailbox, which only pickles it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from sparkcoord.core.encoding import encoded
from sparkcoord.core.stored import StoredOnce

#: entries per chunk (rule 1)
CHUNK_FILES = 4096
#: entries of the inline tail (rule 1)
TAIL_FILES = 256
#: this many small chunks at the end are merged into one (rule 1)
MERGED_CHUNKS = 8

Entry = tuple[int, float]  # size, modification time


@encoded("sources.SeenFiles")
class SeenFiles:
    """Paths seen by discovery, with their size and modification time (module rules)."""

    def __init__(self, entries: Mapping[str, Entry] | None = None) -> None:
        self._chunks: list[StoredOnce[dict[str, Entry]]] = []
        self._tail: dict[str, Entry] = {}
        self._index: dict[str, Entry] = {}
        self._ages: dict[int, tuple[float, float]] = {}  # id(chunk) -> oldest, newest mtime
        for path, entry in (entries or {}).items():
            self[path] = entry

    # ------------------------------------------------------------------ pickling (rule 3)
    def __getstate__(self) -> dict[str, Any]:
        return {"chunks": self._chunks, "tail": self._tail}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._chunks = list(state["chunks"])
        self._tail = dict(state["tail"])
        self._index = {}
        self._ages = {}
        for chunk in self._chunks:
            self._index.update(chunk.value)
            self._ages[id(chunk)] = _ages_of(chunk.value)
        self._index.update(self._tail)

    def copy(self) -> SeenFiles:
        """A copy to change (discovery thread): the chunks are shared, being immutable."""
        other = SeenFiles.__new__(SeenFiles)
        other._chunks = list(self._chunks)
        other._tail = dict(self._tail)
        other._index = dict(self._index)
        other._ages = dict(self._ages)
        return other

    # ------------------------------------------------------------------ a mapping's reads
    def __contains__(self, path: object) -> bool:
        return path in self._index

    def get(self, path: str) -> Entry | None:
        return self._index.get(path)

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    @property
    def chunk_count(self) -> int:
        return len(self._chunks)

    # ------------------------------------------------------------------ changes (discovery)
    def __setitem__(self, path: str, entry: Entry) -> None:
        """Remember ``path`` (discovery thread; rule 1)."""
        self._tail[path] = entry  # over an entry of a chunk: the newer value wins
        self._index[path] = entry
        if len(self._tail) >= TAIL_FILES:
            self._freeze()

    def _freeze(self) -> None:
        self._add_chunk(self._tail)
        self._tail = {}
        small = 0
        for chunk in reversed(self._chunks):
            if len(chunk.value) >= CHUNK_FILES:
                break
            small += 1
        if small >= MERGED_CHUNKS:
            merged: dict[str, Entry] = {}
            for chunk in self._chunks[-small:]:
                self._ages.pop(id(chunk))
                merged.update(chunk.value)
            del self._chunks[-small:]
            self._add_chunk(merged)

    def _add_chunk(self, entries: dict[str, Entry]) -> None:
        chunk = StoredOnce(entries)
        chunk.digest  # noqa: B018 - pickled and hashed here, on the discovery thread
        self._chunks.append(chunk)
        self._ages[id(chunk)] = _ages_of(entries)

    def forget_older(self, floor: float) -> None:
        """Forget entries modified before ``floor`` (discovery thread; rule 2)."""
        kept: list[StoredOnce[dict[str, Entry]]] = []
        for chunk in self._chunks:
            oldest, newest = self._ages.pop(id(chunk))
            if newest < floor:
                self._drop(chunk.value)
                continue
            if oldest < floor:
                old = {p: v for p, v in chunk.value.items() if v[1] < floor}
                if 2 * len(old) > len(chunk.value):
                    self._drop(old)
                    young = {p: v for p, v in chunk.value.items() if v[1] >= floor}
                    chunk = StoredOnce(young)
                    chunk.digest  # noqa: B018 - on the discovery thread
            kept.append(chunk)
            self._ages[id(chunk)] = _ages_of(chunk.value)
        self._chunks = kept
        old_tail = {p: v for p, v in self._tail.items() if v[1] < floor}
        for path in old_tail:
            del self._tail[path]
        self._drop(old_tail)

    def _drop(self, entries: Mapping[str, Entry]) -> None:
        for path, entry in entries.items():
            if self._index.get(path) == entry:  # not remembered since with newer values
                del self._index[path]


def _ages_of(entries: Mapping[str, Entry]) -> tuple[float, float]:
    mtimes = [v[1] for v in entries.values()]
    return (min(mtimes), max(mtimes)) if mtimes else (0.0, 0.0)
