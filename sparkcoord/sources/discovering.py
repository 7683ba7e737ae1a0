"""Discovery for the split enumerator: the :class:`SplitDiscovery` a source implements, and the
:class:`DiscoveryCycles` that run it off the mailbox and hold what it found until a boundary.

Rules:
  1. One cycle at a time, off the mailbox: a cycle runs on the enumerator's discovery lane
     (``CoordinatorContext.call_async``), chunks what it found there (pickled and hashed off
     the mailbox: sources/backlog.py), and its result or error comes back to the mailbox.
  2. What the cycles found is held, in cycle order, until the enumerator takes it at a
     checkpoint boundary (sources/enumerator.py rule 2); the next cycle discovers from the
     state after the last held one, so cycles between two boundaries neither repeat nor lose
     a split.
  3. On demand (sources/enumerator.py rule 8) a cycle asks for the splits missing to keep
     ``discover_ahead`` pending or held, and none runs once the discovery is exhausted or
     enough are waiting. When to start a cycle is the enumerator's decision.

Thread model: every method on the coordinator's mailbox; the discovery itself on the lane.
"""

from __future__ import annotations

import abc
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.coordinator import CoordinatorContext
from sparkcoord.sources.backlog import Chunk, chunked
from sparkcoord.sources.splits import Split


class SplitDiscovery(abc.ABC):
    """Finds new splits. A pure function of its (picklable, small) state and the outside world.

    Thread model: :meth:`discover` runs on the enumerator's discovery thread, never on the
    mailbox, one call at a time; it may do I/O (list a directory, read file footers).
    """

    @abc.abstractmethod
    def initial_state(self) -> Any:
        """The discovery state of a fresh source (nothing seen yet)."""

    @abc.abstractmethod
    def discover(self, state: Any) -> tuple[list[Split], Any]:
        """Splits that appeared since ``state`` was current, and the state after them. A
        bounded source calls it once: it must then return everything there is (no cap)."""

    def size_of(self, state: Any) -> int:
        """How many entries ``state`` holds (reported by ``status``: it must stay bounded)."""
        return 0

    def discover_some(self, state: Any, want: int) -> tuple[list[Split], Any]:
        """With discovery on demand (enumerator rule 8): about ``want`` next splits from
        ``state`` (fewer when there are no more now), and the state after them. Discovery
        thread, like :meth:`discover`; the default ignores ``want``."""
        return self.discover(state)

    def exhausted(self, state: Any) -> bool:
        """With discovery on demand (enumerator rule 8): nothing is left to discover after
        ``state``, so no further cycle runs. Called by the enumerator on the mailbox; the
        default is never."""
        return False


#: a cycle's result: what it found, those splits as chunks, the state after them, seconds taken
CycleResult = tuple[list[Split], list[Chunk], Any, float]


@dataclass
class HeldCycles:
    """What the cycles found since the last boundary (rule 2), as the boundary takes it."""

    #: each cycle's splits as chunks, in cycle order
    chunks: list[list[Chunk]] = field(default_factory=list)
    #: with ``keeps_found``: each cycle's splits with the discovery state after it
    found: list[tuple[list[Split], Any]] = field(default_factory=list)
    #: the discovery state after the last cycle
    state: Any = None


class DiscoveryCycles:
    """The discovery cycles of one :class:`~sparkcoord.sources.enumerator.SplitEnumerator`
    (module rules). Made by the enumerator in its constructor; every method is called by it on
    the mailbox. ``arrived`` and ``failed`` are the enumerator's handlers of a cycle's result
    and error (mailbox thread); ``ahead`` is ``discover_ahead`` (rule 3; None: off)."""

    def __init__(self, context: CoordinatorContext, discovery: SplitDiscovery, *, lane: str,
                 latest_first: bool, keeps_found: bool, ahead: int | None,
                 arrived: Callable[[list[Split], list[Chunk], Any], None],
                 failed: Callable[[BaseException], None]) -> None:
        self.context = context
        self.discovery = discovery
        self.lane = lane
        self.latest_first = latest_first
        self.keeps_found = keeps_found
        self.ahead = ahead
        #: the enumerator's handlers of a cycle's result and of its error
        self._arrived, self._failed = arrived, failed
        #: a cycle runs on the lane
        self.running = False
        #: how many cycles' results are held (rule 2), and how many splits they found
        self.held = 0
        self.held_splits = 0
        self._held = HeldCycles()
        #: how long recent cycles took (seconds; reported by the enumerator's "status")
        self.times: deque[float] = deque(maxlen=64)

    def since(self, applied: Any) -> Any:
        """The state the next cycle discovers from: after the last held cycle, or ``applied``
        (the state in force) when none is held (rule 2)."""
        return self._held.state if self.held else applied

    def wanted(self, since: Any, pending: int) -> int:
        """Rule 3: how many splits a cycle on demand asks for, with ``pending`` splits pending
        (0: none, the discovery is exhausted or enough are waiting)."""
        assert self.ahead is not None
        waiting = pending + self.held_splits
        if self.discovery.exhausted(since) or waiting >= self.ahead:
            return 0
        return self.ahead - waiting

    def run(self, since: Any, want: int) -> None:
        """Start a cycle from ``since`` on the lane (rule 1), asking for ``want`` splits when
        on demand (rule 3). The enumerator calls it only while none runs."""
        assert not self.running
        self.running = True

        def work() -> CycleResult:
            started = time.perf_counter()
            if self.ahead is not None:
                found, after = self.discovery.discover_some(since, want)
            else:
                found, after = self.discovery.discover(since)
            chunks = self.chunked(found)  # pickled and hashed here, off the mailbox
            return found, chunks, after, time.perf_counter() - started

        def done(result: CycleResult | None, error: BaseException | None) -> None:
            self.running = False
            if result is None:
                assert error is not None
                self._failed(error)
            else:
                self.times.append(result[3])
                self._arrived(*result[:3])

        self.context.call_async(work, done, lane=self.lane)

    def list_now(self, since: Any, until_empty: bool) -> tuple[list[Split], list[Chunk], Any]:
        """A listing on the mailbox (the enumerator's ``start``: a fresh source's first one,
        or the one of a run that lists once; sources/enumerator.py rule 5). ``until_empty``:
        a discovery that caps a cycle lists on until a cycle finds nothing. A failure raises,
        naming the enumerator."""
        started = time.perf_counter()
        try:
            found, after = self.discovery.discover(since)
            if until_empty:
                more = found
                while more:
                    more, after = self.discovery.discover(after)
                    found = found + more
        except Exception as exc:
            raise RuntimeError(f"enumerator {self.context.operator_id!r}: discovery failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        chunks = self.chunked(found)
        self.times.append(time.perf_counter() - started)
        return found, chunks, after

    def chunked(self, found: list[Split]) -> list[Chunk]:
        """``found`` as the pending splits' chunks (any thread)."""
        # a discovery lists new splits oldest first; newest first, they go to the front
        return chunked(found[::-1] if self.latest_first else found)

    def hold(self, found: list[Split], chunks: list[Chunk], after: Any) -> None:
        """Keep a cycle's result until the boundary (rule 2)."""
        self._held.chunks.append(chunks)
        self._held.state = after
        self.held += 1
        self.held_splits += len(found)
        if self.keeps_found:
            self._held.found.append((found, after))

    def take(self) -> HeldCycles | None:
        """What the cycles found since the last boundary, for the boundary to apply (rule 2),
        or None when no cycle ended since."""
        if not self.held:
            return None
        held, self._held = self._held, HeldCycles()
        self.held = self.held_splits = 0
        return held
