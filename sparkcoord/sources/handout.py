"""The split enumerator's request path: hand-out, finished reports and withdrawals.

:class:`SplitHandOut` is the base of :class:`~sparkcoord.sources.enumerator.SplitEnumerator`:
it answers the readers' :class:`NextSplit` requests and takes back what a task retry withdrew,
on the state the enumerator keeps (sources/enumerator.py: the lifecycle, discovery and the
checkpoint boundary). It has no state of its own beyond the splits finished in the running
batch; the enumerator resets it at each boundary.

Rules (sources/enumerator.py cites them as its rules 1, 3 and 7, under the same numbers):
  1. Splits go out one at a time, as answers to a reader's :class:`NextSplit` request inside
     the running batch (the request path: logged before the enumerator sees it, the answer
     logged before the reader does). A split is handed out once; a retried task or a re-run
     batch gets the same answers from the log, so an assignment is never lost or repeated.
  3. What a reader has not finished is in the reader's state (with its position), not taken
     back by the enumerator: the subtask state is restored with the epoch, so a failure neither
     loses nor repeats it. The enumerator only counts splits in flight (handed out, not yet
     reported finished) to know when a bounded source is done. The one exception is a task
     retry that adopted its failed attempt's history and finished without re-sending its
     tail (``handle_items_withdrawn``): what the tail's answers handed out goes back to the
     front of the pending splits, as Flink's ``addSplitsBack``, and what it reported is undone.
  7. A finished report may come with what the reader said about the split (``NextSplit.
     reports``, reader.py rule 6): each names one of the request's finished splits (anything
     else fails the request, naming the split). The enumerator hands it to
     :meth:`SplitHandOut.split_finished` after its own bookkeeping of the split, in log
     order, and to :meth:`SplitHandOut.finished_report_withdrawn` when a task retry
     withdraws the request that carried it (rule 3), so a subclass that keeps per-split
     progress in its state (a chunk's high watermark, the offset a split ended at) changes
     it only through logged inputs (sources/enumerator.py rule 2), as Flink CDC's enumerator
     learns a snapshot split's high watermark from its reader's finished report. The hooks
     get the split itself: an enumerator that has them (``keeps_splits_in_flight``) or a
     committer keeps every split in flight in its state (``in_flight_splits``).
"""

from __future__ import annotations

import logging
from typing import Any

from sparkcoord.committer import CommitLedger
from sparkcoord.coordinator import OperatorCoordinator, Withdrawn
from sparkcoord.sources.alignment import WatermarkAlignment, WatermarkReport
from sparkcoord.sources.assigners import SplitAssigner
from sparkcoord.sources.backlog import Backlog
from sparkcoord.sources.discovering import DiscoveryCycles
from sparkcoord.sources.splits import BatchBudget, NextSplit, NoSplitNow, Split
from sparkcoord.sources.state import EnumeratorState

log = logging.getLogger("sparkcoord.sources")


class SplitHandOut(OperatorCoordinator):
    """The request path of a split enumerator (module rules). Every method runs on the
    coordinator's mailbox; :class:`~sparkcoord.sources.enumerator.SplitEnumerator` sets the
    attributes below and is the class a source uses."""

    state: EnumeratorState
    bounded: bool
    discover_ahead: int | None
    alignment: WatermarkAlignment | None
    _pending: Backlog
    _assigner: SplitAssigner
    _budget: BatchBudget
    _cycles: DiscoveryCycles
    _ledger: CommitLedger | None
    #: splits reported finished in the running batch, for a withdrawal (rules 3 and 7)
    _finished_now: dict[str, Split]
    _epoch: int
    _drained: int
    _lists_once: bool

    def _discover_now(self) -> None:
        """Start a discovery cycle unless one runs (the enumerator's; mailbox thread)."""
        raise NotImplementedError

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        """A reader's :class:`NextSplit` (mailbox thread, in log order; a restore replays it
        against the same state): its finished splits and reports are recorded (rules 3, 7),
        its watermarks observed, and it is answered with the next split or
        :class:`NoSplitNow` (rule 1)."""
        if not isinstance(request, NextSplit):
            raise TypeError(f"enumerator {self.context.operator_id!r}: subtask {subtask} sent "
                            f"{request!r}; readers ask with NextSplit")
        unfinished = {split_id for split_id, _ in request.reports} - set(request.finished)
        if unfinished:
            raise ValueError(f"enumerator {self.context.operator_id!r}: subtask {subtask} "
                             f"reports on split(s) {', '.join(sorted(map(repr, unfinished)))} "
                             f"without reporting them finished (rule 7)")
        for split_id in request.finished:
            if self.state.in_flight.pop(split_id, None) is None:
                raise ValueError(f"enumerator {self.context.operator_id!r}: subtask {subtask} "
                                 f"reports split {split_id!r} finished, which is not in flight")
            known = (self.state.in_flight_splits.pop(split_id, None)
                     if self.state.in_flight_splits is not None else None)
            if self._ledger is not None:
                if known is None:
                    raise KeyError(split_id)  # enumerator rule 6 keeps every split in flight
                self._ledger.item_produced(known)
            split = known if known is not None else Split(split_id)  # kept before rule 7
            self._finished_now[split_id] = split
            self.state.finished += 1
            if not self.state.in_flight:
                self._drained = self._epoch
            self.split_finished(subtask, split, request.report_of(split_id))  # rule 7
        if request.watermarks is not None:
            self._observe(subtask, request.watermarks)
        if self.alignment is not None:
            self.alignment.forget(request.finished)
            for split_id in request.finished:
                self.state.in_flight_keys.pop(split_id, None)
        if not self._pending:
            return self._no_split(subtask, done=self._all_handed_out())
        return self._hand_out(subtask)

    def _hand_out(self, subtask: int) -> Split | NoSplitNow:
        """The next pending split for ``subtask``'s reader, if the assigner and the batch's
        read limit let one go (mailbox thread, answering a request)."""
        handle = self._assigner.next_split(self._pending)
        if handle is None:
            # every pending split's lane is paused, or has its one split in flight
            # (sources/enumerator.py rule 4). A bounded source asks for the next batch at once
            # (sources/enumerator.py rule 5): the lane holding the minimum is then read, or
            # done (and forgotten at the boundary), so the next decision moves on. A
            # continuous source's timer asks again every update interval (a slow live
            # directory may have nothing yet).
            return self._no_split(subtask)
        split = handle[1]
        if not self._budget.admits(split):
            self.context.request_batch()  # the limit stopped this batch; the rest go next
            return NoSplitNow()
        self._pending.take(handle[0])
        self._budget.took(split)
        self.state.in_flight[split.split_id] = subtask
        if self.state.in_flight_splits is not None:
            self.state.in_flight_splits[split.split_id] = split
        if self.alignment is not None:
            self.state.in_flight_keys[split.split_id] = split.alignment_key
        self.state.handed_out += 1
        self.split_handed_out(subtask, split)
        if (self.discover_ahead is not None
                and len(self._pending) + self._cycles.held_splits < self.discover_ahead // 2):
            # sources/enumerator.py rule 8: only starts a cycle; it joins at a boundary
            self._discover_now()
        return split

    def split_handed_out(self, subtask: int, split: Split) -> None:
        """``split`` is the answer to ``subtask``'s request (rule 1). Called by the
        enumerator itself on the mailbox, in log order (a restore replays it at the same
        place); the default does nothing."""

    def _no_split(self, subtask: int, done: bool = False) -> NoSplitNow:
        """The answer that ends a reader's batch (mailbox thread). Enumerator rule 5: the
        reader asks nothing more in this batch, so what it keeps now (splits in flight to it:
        paused, or a live split with nothing now) and what is pending wait for the next batch,
        which a bounded source asks for here. Its other readers do the same with their last
        request, so the last one of the batch decides; a deterministic function of the
        state."""
        if self.another_batch_wanted(subtask):
            self.context.request_batch()
        return NoSplitNow(done=done)

    def another_batch_wanted(self, subtask: int) -> bool:
        """Whether ``subtask``'s reader, told there is nothing more in this batch, leaves
        work that needs another batch (sources/enumerator.py rule 5): in a run that lists
        once, a split pending or one kept by that reader. Called by the enumerator itself on
        the mailbox; a source that knows better when a run is done overrides it."""
        return self._lists_once and bool(self._pending
                                         or subtask in self.state.in_flight.values())

    def handle_items_withdrawn(self, subtask: int, attempt: int,
                               withdrawn: list[Withdrawn]) -> None:
        """A task retry of ``subtask`` finished without re-sending the tail of its failed
        attempt's history (mailbox thread, in log order; a restore replays it at the same
        place). Undone, last item first: a split a withdrawn ``NextSplit`` was answered with
        goes back to the front of the pending splits, in the order it went out (Flink's
        ``addSplitsBack``), and counts no more as handed out, in flight or against this
        batch's read limit; the splits it reported finished are in flight to ``subtask``
        again (the retry keeps them, finished or not, and reports them with its next
        request). Watermark reports (with a request, or as events) are kept: a watermark
        only moves forward and the enumerator keeps only the greatest, so they cannot be
        taken back exactly; one that overstates a lane makes the others wait for it a little
        longer, never for ever, and reading stays exactly-once. Other events are ignored, as
        when they arrived."""
        back: list[Split] = []
        again = 0
        for item in reversed(withdrawn):
            request = item.item
            if not item.is_request or not isinstance(request, NextSplit):
                continue
            answer = item.answer
            if item.answered and isinstance(answer, Split):
                owner = self.state.in_flight.get(answer.split_id)
                if owner != subtask:
                    raise ValueError(
                        f"enumerator {self.context.operator_id!r}: subtask {subtask}'s withdrawn "
                        f"answer {answer.split_id!r} is not in flight to it (owner {owner})")
                del self.state.in_flight[answer.split_id]
                self.state.in_flight_keys.pop(answer.split_id, None)
                if self.state.in_flight_splits is not None:
                    self.state.in_flight_splits.pop(answer.split_id, None)
                self.state.handed_out -= 1
                self._budget.gave_back(answer)
                back.append(answer)
            for split_id in request.finished:
                # the failed attempt reported it; the retry keeps it until its next request
                self.state.in_flight[split_id] = subtask
                split = self._finished_now.pop(split_id, None) or Split(split_id)
                if self._ledger is not None:
                    split = self._produced_split(split_id)
                    self._ledger.item_withdrawn(split)
                if self.state.in_flight_splits is not None:
                    self.state.in_flight_splits[split_id] = split
                self.state.finished -= 1
                again += 1
                self.finished_report_withdrawn(subtask, split, request.report_of(split_id))
        self._pending.prepend(back[::-1])  # back is last-out first: reversed, the hand-out order
        if back or again:
            log.info("enumerator %s: subtask %d's retry withdrew %d answer(s) and %d finished "
                     "report(s); the splits go out again", self.context.operator_id, subtask,
                     len(back), again)
            self.context.request_batch()

    def split_finished(self, subtask: int, split: Split, report: Any) -> None:
        """``subtask``'s reader reported ``split`` finished, with what it said about the
        split (``report``; ``None``: nothing): rule 7. Called by the enumerator itself on the
        coordinator's mailbox, in log order (a restore replays it at the same place), after
        its own bookkeeping and before the request is answered. The default does nothing; a
        source that keeps per-split progress overrides it and keeps what it learns in its
        checkpointed state."""

    def finished_report_withdrawn(self, subtask: int, split: Split, report: Any) -> None:
        """A task retry of ``subtask`` withdrew the request that reported ``split``
        finished with ``report`` (rules 3 and 7): undo what :meth:`split_finished` did with
        it; the split is in flight to ``subtask`` again, and the retry reports it again.
        Called by the enumerator itself on the coordinator's mailbox, inside
        ``handle_items_withdrawn``, last report first. The default does nothing."""

    def _produced_split(self, split_id: str) -> Split:
        # the split the running batch produced under ``split_id`` (enumerator rule 6;
        # mailbox thread)
        assert self._ledger is not None
        for split in self._ledger.running:
            if isinstance(split, Split) and split.split_id == split_id:
                return split
        raise ValueError(f"enumerator {self.context.operator_id!r}: a withdrawn report of "
                         f"split {split_id!r} finished is not in the running batch's output")

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        """A reader's watermark report sent at the end of its batch (mailbox thread, in log
        order; replayed after a restore). Other events are ignored, as before alignment."""
        if isinstance(event, WatermarkReport):
            self._observe(subtask, event)

    def _observe(self, subtask: int, report: Any) -> None:
        if self.alignment is None:
            raise ValueError(f"enumerator {self.context.operator_id!r}: subtask {subtask} "
                             f"reports watermarks, but this enumerator has no alignment "
                             f"options (give the reader and the enumerator the same ones)")
        if not isinstance(report, WatermarkReport):
            raise TypeError(f"enumerator {self.context.operator_id!r}: subtask {subtask} sent "
                            f"watermarks {report!r}; readers report a WatermarkReport")
        self.alignment.observe(report)

    def _all_handed_out(self) -> bool:
        return self.bounded and self.state.discovered_once and not self._pending

