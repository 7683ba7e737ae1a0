"""The split enumerator's watermark alignment wiring (sources/enumerator.py rule 4): the
:class:`~sparkcoord.sources.alignment.WatermarkAlignment` of the state in force, the timer that
asks for a batch while a split waits, and the decision at each boundary, made after the quiet
lanes are settled. The rule stays the enumerator's; this is the code that keeps it.

Thread model: every method on the coordinator's mailbox; the clock is read only at a boundary
(the decision's ``now``) and by the timer.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkcoord.coordinator import Cancellable, CoordinatorContext
from sparkcoord.sources.alignment import (
    AlignmentDecision,
    AlignmentOptions,
    WatermarkAlignment,
    WatermarkReport,
)
from sparkcoord.sources.state import EnumeratorState


class AlignmentWiring:
    """Watermark alignment for one enumerator made with ``alignment`` options. Made by the
    enumerator in its constructor; every method is called by it on the mailbox."""

    def __init__(self, context: CoordinatorContext, options: AlignmentOptions,
                 clock: Callable[[], float]) -> None:
        self.context, self.options, self._clock = context, options, clock
        #: the alignment of the state in force (None until the first reset)
        self.alignment: WatermarkAlignment | None = None
        #: the timer of :meth:`_check` (from ``start``), and whether the enumerator closed
        self._timer: Cancellable | None = None
        self._closed = False

    def restored(self, state: EnumeratorState) -> WatermarkAlignment:
        """The alignment of ``state``, the state in force after a reset (into which it keeps
        what it is told)."""
        # a state checkpointed before alignment was turned on has none: start afresh
        self.alignment = WatermarkAlignment(self.options, getattr(state, "alignment", None))
        state.alignment = self.alignment.state
        if getattr(state, "in_flight_keys", None) is None:
            state.in_flight_keys = {}
        return self.alignment

    def start(self) -> None:
        """The enumerator starts: the timer of :meth:`_check` runs every update interval."""
        self._timer = self.context.call_periodically(self.options.update_interval_ms / 1000,
                                                     self._check)

    def close(self) -> None:
        """The enumerator closes: the timer stops."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()

    def decide(self, busy: set[str], listed: bool) -> AlignmentDecision:
        """The decision of a boundary (rule 4), with ``busy`` the lanes that have a split
        pending or in flight and ``listed`` whether a source that lists once (rule 5) applied
        its listing. A lane not busy is read up to now. No reader tries it, so the enumerator
        says so itself: it is empty (a live directory waiting for files; it goes idle after
        the idle timeout), or, once ``listed`` (no file will come in this run), finished and
        forgotten. A split-keyed entry is never here: it is forgotten when its reader
        finishes it."""
        assert self.alignment is not None
        quiet = tuple(sorted(key for key in self.alignment.state.splits if key not in busy))
        if quiet and listed:
            self.alignment.forget(quiet)
        elif quiet:
            self.alignment.observe(WatermarkReport(empty=quiet))
        return self.alignment.decide(self._now_ms())

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _check(self) -> None:
        """The alignment timer (mailbox thread, every update interval): while a split waits
        for the others, ask for a batch once an update interval has passed since the last
        decision, so the group is decided again even when no data flows (and an empty split
        holding the minimum can go idle)."""
        if self.alignment is None or self._closed:
            return
        due = self.alignment.next_check_ms()
        if due is not None and self._now_ms() >= due:
            self.context.request_batch()
