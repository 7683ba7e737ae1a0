"""The split enumerator: a coordinator that discovers splits and hands them to readers on demand.

Rules:
  1. Splits go out one at a time, as answers to a reader's request: sources/handout.py rule 1.
  2. The enumerator's state changes only in answer to a logged input (requests, client
     requests) or at a checkpoint boundary (inside ``checkpoint_coordinator``, so the snapshot
     holds the change). Discovery therefore runs off the mailbox and its results wait until the
     next boundary: a restore replays a batch's requests against the snapshot they were
     answered from and gets the same answers (docs/protocol.md
     [state-changes-only-through-logged-inputs]).
  3. What a reader has not finished stays in its state; a withdrawal is taken back:
     sources/handout.py rule 3.
  4. With watermark alignment (``alignment`` options; docs/alignment.md,
     docs/decisions/043-watermark-alignment.md) the readers' watermark reports are logged inputs
     (a ``NextSplit`` field, or an event at the end of a reader's batch) and change only the
     alignment state; the decision is made in ``checkpoint_coordinator``, before the snapshot,
     and sent to every reader there, so it is sealed into the epoch it was made for and reaches
     that batch's readers before any data. A lane held back by another lane (its allowed maximum
     is not None) has at most one split in flight (handed out and not yet reported finished): P
     readers taking P files of a lane before any of them reported would put the lane P files
     past the allowed maximum. Which split goes out next is the assigner's
     (``assigners.py``: in pending order, or by lanes with alignment; ``make_assigner``).
  5. A bounded source ends an ``availableNow`` run only when everything was read: while a
     split is pending or a reader keeps one (paused, stopped), each reader's last request of
     a batch (the one answered :class:`NoSplitNow`) asks for another batch, since the run
     ends at the first trigger that seals nothing (docs/protocol.md
     [bounded-run-reads-everything]). A continuous source in an ``availableNow`` run
     (``CoordinatorContext.available_now``) is bounded for that run, as Spark's file source is:
     it lists once as the run starts, reads what that listing found and what its state holds,
     and ends; files that come later wait for the next run (docs/protocol.md
     [bounded-run-reads-everything]).
  6. With a ``committer`` (docs/sources.md, "Once per committed batch"), the splits a batch's
     readers reported finished are what that batch produced: once it commits in Spark, the
     committer is called with the epoch and those splits, off the mailbox, retried until it
     returns, and again after a restore until it was seen done (it must be idempotent per
     epoch; :mod:`sparkcoord.committer.ledger`). ``close`` waits up to ``commit_drain_s``
     for the commits handed over (an ``availableNow`` run ends right after its last batch
     committed, and a run that reports done must hold that batch's commit). A split is
     reported finished in the batch that read its last rows or a later one, so a commit
     never names a split whose rows are not committed yet.
  7. A finished report's report goes to ``split_finished``, and back through
     ``finished_report_withdrawn``: sources/handout.py rule 7.
  8. Discovery on demand (``discover_ahead=N``; Flink CDC's snapshot split assigner plans
     chunks the same way): no timer and no listing in ``start``; a cycle runs off the
     mailbox whenever fewer than ``N`` splits are pending or waiting to join (checked at
     ``start`` and after each boundary; after a hand-out, below ``N // 2``), asks the
     discovery for the ones missing (``SplitDiscovery.discover_some``; sources/discovering.py
     rule 3), and joins at the next boundary as any cycle does (rule 2), until the discovery
     says it is exhausted (``SplitDiscovery.exhausted``). So a source of any size keeps a
     bounded number of splits pending and its discovery follows the readers. The first
     boundary waits for the first cycle while it runs, for up to ``first_boundary_wait_s``,
     so the run's first batch has splits (docs/decisions/077-cdc-fewer-batches.md); it
     completes from the mailbox when the cycle's result or the timer comes, and a slower
     cycle joins at the next boundary. An ``availableNow`` run (rule 5) discovers on until
     exhausted.

Theory of operation: a fresh source discovers once in ``start`` (so its first batch has
splits); after that (and after a restore) discovery runs off the mailbox (``call_async``, lane
``discovery``; sources/discovering.py: :class:`DiscoveryCycles`): never again for a bounded
source, every ``discovery_interval_s`` for a continuous one. Its result comes back to the
mailbox and is applied at the next ``checkpoint_coordinator``, which also asks for a batch so
the readers of that batch can take the new splits. Each batch may take new work up to its
:class:`ReadLimit`; when the limit stops it while splits are pending, another batch is asked
for.

Where the parts are: the request path (hand-out, finished reports, withdrawals: rules 1, 3, 7)
in sources/handout.py, the base class of :class:`SplitEnumerator`; the discovery cycles and
:class:`SplitDiscovery` in sources/discovering.py; the alignment wiring (rule 4) in
sources/aligning.py; :class:`EnumeratorState` in sources/state.py. The names stay importable
from here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ClassVar

from sparkcoord.committer import CommitFunction, CommitLedger, CommitWorker
from sparkcoord.coordinator import Cancellable, CoordinatorContext
from sparkcoord.sources.aligning import AlignmentWiring
from sparkcoord.sources.alignment import AlignmentOptions, WatermarkAlignment
from sparkcoord.sources.assigners import AlignedLanes, InOrder, SplitAssigner
from sparkcoord.sources.backlog import Backlog, Chunk, chunked
from sparkcoord.sources.discovering import DiscoveryCycles, SplitDiscovery
from sparkcoord.sources.handout import SplitHandOut
from sparkcoord.sources.splits import BatchBudget, ReadLimit, Split
from sparkcoord.sources.state import EnumeratorState

__all__ = ["EnumeratorState", "SplitDiscovery", "SplitEnumerator"]

log = logging.getLogger("sparkcoord.sources")


class SplitEnumerator(SplitHandOut):
    """A coordinator that hands splits from a :class:`SplitDiscovery` to readers on demand.

    Thread model: every callback runs on the mailbox; discovery runs off it, on the context's
    lane ``discovery`` (``call_async``), and its result comes back to the mailbox.

    Client requests: ``"status"`` (a dict: pending, in_flight, handed_out, finished,
    discovery_state_entries, done, and with alignment ``alignment``: minimum, allowed maximum,
    paused, idle, spread) and ``"discover"`` (run a discovery cycle now).

    ``alignment``: watermark alignment options (``None``: off, and nothing of rule 4 happens);
    ``clock``: wall time in seconds, read only at a checkpoint boundary (the decision's
    ``now``) and by the timer that asks for a batch while a split waits;
    ``discover_ahead`` and ``first_boundary_wait_s``: discovery on demand (rule 8).
    """

    #: keep every split in flight in the state, for the hooks of rule 7
    keeps_splits_in_flight: ClassVar[bool] = False
    #: keep each cycle's splits until the boundary, for :meth:`discovery_applied`
    keeps_discovered_splits: ClassVar[bool] = False
    #: the ``call_async`` lane discovery runs on, and what a failure there is called
    discovery_lane: ClassVar[str] = "discovery"
    discovery_name: ClassVar[str] = "discovery"

    def __init__(self, context: CoordinatorContext, discovery: SplitDiscovery, *,
                 bounded: bool = False, discovery_interval_s: float = 1.0,
                 limit: ReadLimit | None = None, latest_first: bool = False,
                 alignment: AlignmentOptions | None = None,
                 clock: Callable[[], float] = time.time,
                 committer: CommitFunction | None = None,
                 commit_drain_s: float = 60.0, discover_ahead: int | None = None,
                 first_boundary_wait_s: float = 0.0) -> None:
        super().__init__(context)
        if discovery_interval_s <= 0:
            raise ValueError(f"discovery_interval_s must be > 0, got {discovery_interval_s}")
        if discover_ahead is not None and (discover_ahead < 1 or bounded):
            raise ValueError(f"discover_ahead must be >= 1 and the source not bounded (it "
                             f"discovers until exhausted), got {discover_ahead}")
        #: rule 8: discovery on demand, keeping this many splits pending (None: off)
        self.discover_ahead = discover_ahead
        self.first_boundary_wait_s = first_boundary_wait_s
        self.discovery = discovery
        self.bounded = bounded
        self.discovery_interval_s = discovery_interval_s
        self.limit = limit or ReadLimit()
        self.latest_first = latest_first
        self.alignment_options = alignment
        #: the alignment of the state in force (None: alignment off) and its wiring (rule 4;
        #: sources/aligning.py)
        self.alignment: WatermarkAlignment | None = None
        self._aligning = (AlignmentWiring(context, alignment, clock)
                          if alignment is not None else None)
        self.state = EnumeratorState()
        self._pending = Backlog(lanes=alignment is not None)
        self._assigner: SplitAssigner = InOrder(latest_first)
        self._budget = BatchBudget(self.limit)
        #: the cycles, one at a time off the mailbox, and what they found until the boundary
        #: applies it (rule 2; sources/discovering.py)
        self._cycles = DiscoveryCycles(
            context, discovery, lane=self.discovery_lane, latest_first=latest_first,
            keeps_found=self.keeps_discovered_splits, ahead=discover_ahead,
            arrived=self._discovered, failed=self._discovery_failed)
        #: splits reported finished in the running batch, for a withdrawal (rules 3 and 7)
        self._finished_now: dict[str, Split] = {}
        #: rule 8: the first boundary, waiting for the first cycle: id, future, timer
        self._deferred: tuple[int, Future[Any], Cancellable] | None = None
        self._closed = False
        self._fresh = True
        self._timer: Cancellable | None = None
        #: the newest checkpoint whose batch committed, the last sealed one, and the one whose
        #: batch finished the last split in flight (a bounded source is done once it commits)
        self._committed = -1
        self._epoch = -1
        self._drained = -1
        #: this run lists once and ends (a bounded source, or any source in an availableNow
        #: run: rule 5), and whether that listing joined the state (for a bounded source, in
        #: this run or an earlier one; otherwise in this run)
        self._lists_once = bounded or context.available_now
        self._run_listed = False
        #: rule 6: the user's commit, the ledger of the state in force and the worker
        self.committer = committer
        self.commit_drain_s = commit_drain_s
        self._ledger: CommitLedger | None = None
        self._commits: CommitWorker | None = None

    # ---------------------------------------------------------------- lifecycle (mailbox)
    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self._fresh = state is None
        if state is None:
            state = self.fresh_state()
        if not isinstance(state, EnumeratorState):
            raise TypeError(f"enumerator {self.context.operator_id!r}: checkpointed state is a "
                            f"{type(state).__name__}, not an EnumeratorState")
        self.state = state
        if self._aligning is not None:
            self.alignment = self._aligning.restored(state)
        if self.committer is not None or self.keeps_splits_in_flight:
            if getattr(state, "in_flight_splits", None) is None:
                state.in_flight_splits = {}  # checkpointed before the committer was given
        if self.committer is not None:
            self._ledger = CommitLedger(getattr(state, "commits", None))
        self._pending = Backlog.restored(state.pending, lanes=self.alignment_options is not None)
        self._assigner = self.make_assigner()
        self._budget = BatchBudget(self.limit)
        # conservative: a restore point may be a batch that has not committed (a re-run)
        self._committed = checkpoint_id - 1
        self._epoch = self._drained = checkpoint_id
        self._finished_now = {}

    def fresh_state(self) -> EnumeratorState:
        """The state of a source that has no checkpoint yet. Called by the enumerator itself
        in ``reset_to_checkpoint`` (mailbox); a source with a state of its own (a subclass of
        :class:`EnumeratorState`) overrides it."""
        return EnumeratorState(discovery=self.discovery.initial_state())

    def make_assigner(self) -> SplitAssigner:
        """The hand-out order for the state in force (``assigners.py``): in pending order, or
        with alignment by lanes. Called by the enumerator itself at each reset (mailbox); a
        source with an order of its own overrides it (its rules must keep assigners.py rule 1).
        """
        if self.alignment is not None:
            return AlignedLanes(self.alignment, self.state.in_flight_keys, self.latest_first)
        return InOrder(self.latest_first)

    def start(self) -> None:
        if self._ledger is not None and self.committer is not None:
            post = self.context.run_in_coordinator_thread
            ledger = self._ledger
            self._commits = CommitWorker(
                self.context.operator_id, self.committer,
                lambda epoch: post(lambda: ledger.commit_done(epoch)),
                stuck=self.context.fail_job)  # a commit failing for minutes fails the job
            self._commits.submit(ledger.restored())  # rule 6: what a restore left pending
        if self._aligning is not None:
            self._aligning.start()
        if self._pending or self.state.in_flight:
            # work left (rule 5): a split pending, or kept by a reader (paused, stopped)
            self.context.request_batch()
        if self.bounded and self.state.discovered_once:
            self._run_listed = True
            return
        if self.discover_ahead is not None:
            self._discover_now()  # rule 8: off the mailbox, also for a fresh source
            return
        if self._fresh or self._lists_once:
            # a fresh source lists here, before its first checkpoint, so that the first batch
            # already has splits (as Spark's file source lists in its first latestOffset), and
            # so does a bounded one restored before its listing was applied and any source
            # starting an availableNow run (the run must not find nothing to do and end);
            # later cycles run beside the batches. A continuous discovery may cap a cycle
            # (maxFilesPerDiscovery): a run that lists once lists on until a cycle finds
            # nothing, so it reads all that is present (a bounded discovery returns
            # everything in one call)
            self._discovered(*self._cycles.list_now(
                self.state.discovery, until_empty=self._lists_once and not self.bounded))
        else:
            self._discover_now()
        if not self._lists_once:
            self._timer = self.context.call_periodically(self.discovery_interval_s,
                                                         self._discover_now)

    def run_ending(self) -> Any:
        """An availableNow run ends once the commits handed over are done (rule 6): Spark
        stops the source only after the query ended, too late for ``close`` to hold the run."""
        return self._commits.idle() if self._commits is not None else None

    def close(self) -> None:
        self._closed = True
        if self._commits is not None:
            # the last batch's commit is handed over as an availableNow run ends: a run
            # that ends by itself makes it first (rule 6)
            self._commits.stop(drain_s=self.commit_drain_s)
        if self._timer is not None:
            self._timer.cancel()
        if self._aligning is not None:
            self._aligning.close()
        if self._deferred is not None:
            self._deferred[2].cancel()
            self._deferred = None

    # ---------------------------------------------------------------- discovery
    def _discover_now(self) -> None:
        """Start a discovery cycle unless one runs (mailbox thread)."""
        if self._cycles.running or self._closed:
            return
        since = self._cycles.since(self.state.discovery)
        want = 0
        if self.discover_ahead is not None:
            # rule 8: on demand, until exhausted (also in a run that lists once)
            want = self._cycles.wanted(since, len(self._pending))
            if not want:
                return
        elif self._lists_once and (self._run_listed or self._cycles.held):
            return
        self._cycles.run(since, want)

    def _discovered(self, found: list[Split], chunks: list[Chunk], after: Any) -> None:
        """A discovery cycle's result (mailbox thread): held until the next boundary."""
        if self._closed:
            return
        self._cycles.hold(found, chunks, after)
        if found or (self._lists_once and not self._run_listed) or self.discover_ahead:
            # on demand (rule 8) every cycle changes the state (its discovery state at least)
            log.info("enumerator %s: discovered %d split(s)", self.context.operator_id,
                     len(found))
            self.context.request_batch()
        self._complete_deferred()  # rule 8: the first boundary waited for this cycle

    def _discovery_failed(self, error: BaseException) -> None:
        # a listing that fails (a network error, a deleted directory) fails the job: the
        # restart strategy decides, and the error names the source
        self.work_failed(self.discovery_name, error)

    def work_failed(self, what: str, error: BaseException) -> None:
        """Work handed to a lane (``what``: a discovery, a read a subclass made) failed:
        the job fails with one line naming the source, the work and the error. Called on the
        mailbox, from a ``call_async`` handler; nothing once the enumerator is closed. The
        first boundary, if it waits for that work (rule 8), completes first."""
        if self._closed:
            return
        self._complete_deferred()
        self.context.fail_job(RuntimeError(
            f"{self.describe()}: {what} failed: {type(error).__name__}: {error}"))

    def describe(self) -> str:
        """How errors and logs name this source (any thread)."""
        return f"enumerator {self.context.operator_id!r}"

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        if self._deferred is not None:
            # a later checkpoint while the first boundary waits (the runtime seals one epoch
            # at a time, so not expected): the earlier one completes first, in order
            self._complete_deferred()
        if (self._deferred is None and self._cycles.running and self.first_boundary_wait_s > 0
                and self.discover_ahead is not None and not self.state.discovered_once
                and not self._cycles.held):
            # rule 8: the first cycle runs, and the first batch would find no split
            timer = self.context.call_periodically(self.first_boundary_wait_s,
                                                   self._complete_deferred)
            self._deferred = (checkpoint_id, result, timer)
            return
        self._checkpoint(checkpoint_id, result)

    def _complete_deferred(self) -> None:
        """Rule 8: the first boundary, once the first cycle arrived or the wait ran out
        (mailbox thread)."""
        deferred, self._deferred = self._deferred, None
        if deferred is None:
            return
        checkpoint_id, result, timer = deferred
        timer.cancel()
        if not self._closed and not result.done():
            self._checkpoint(checkpoint_id, result)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if self._deferred is not None and self._deferred[0] == checkpoint_id:
            self._deferred[2].cancel()
            self._deferred = None

    def _checkpoint(self, checkpoint_id: int, result: Future[Any]) -> None:
        held = self._cycles.take()
        if held is not None:
            # rule 2: discoveries join the state at the boundary, inside the snapshot
            for chunks in held.chunks:
                self._apply(chunks)
            for found, after in held.found:
                self.discovery_applied(found, after)
            self.state.discovery = held.state
            if self.bounded or self.discover_ahead is not None:
                self.state.discovered_once = True
            self._run_listed = True
        self._finished_now = {}
        self.boundary_reached(checkpoint_id)
        self.state.pending = self._pending.snapshot()
        if self._ledger is not None:
            self.state.commits = self._ledger.checkpoint_taken(checkpoint_id)
        self._budget = BatchBudget(self.limit)
        self._epoch = checkpoint_id
        if self.alignment is not None:
            assert self._aligning is not None
            busy = self._pending.lanes()
            busy.update(self.state.in_flight_keys.values())
            # rule 4: decided inside the snapshot, sent before the boundary (set_result below),
            # so the event is sealed into this epoch and its batch's readers get it before any
            # data; sent at every boundary whatever the splits (FLINK-37670)
            decision = self._aligning.decide(busy, self._lists_once and self._run_listed)
            for _, gateway in self.ready_gateways():
                gateway.send_event(decision)
        if self.discover_ahead is not None:
            self._discover_now()  # rule 8: below discover_ahead, a cycle goes to the lane
        result.set_result(self.state)

    def discovery_applied(self, found: list[Split], after: Any) -> None:
        """A discovery cycle's splits joined the pending ones at this boundary, and ``after``
        is the discovery state after them (rule 2). Called by the enumerator itself on the
        mailbox inside ``checkpoint_coordinator``, cycle by cycle in order, before
        :meth:`boundary_reached`, for an enumerator with ``keeps_discovered_splits``; a
        source that keeps per-split progress records the new splits here."""

    def boundary_reached(self, checkpoint_id: int) -> None:
        """A checkpoint boundary, after the discoveries joined and before the snapshot is
        taken (rule 2). Called by the enumerator itself on the mailbox inside
        ``checkpoint_coordinator``; a source whose state changes at boundaries (a split built
        from what its readers reported: :meth:`add_splits`) overrides it."""

    def add_splits(self, splits: list[Split]) -> None:
        """Add ``splits`` to the pending ones, as a discovery would. Called by a subclass on
        the mailbox, only at a boundary (:meth:`boundary_reached`, rule 2)."""
        self._apply(chunked(splits))

    def _apply(self, chunks: list[Chunk]) -> None:
        self._assigner.add(self._pending, chunks)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._committed = max(self._committed, checkpoint_id)
        if self._ledger is not None and self._commits is not None:
            self._commits.submit(self._ledger.batch_committed(checkpoint_id))

    # ---------------------------------------------------------------- status
    def done(self) -> bool:
        """A bounded source read everything and the batch that finished it committed."""
        return (self._all_handed_out() and not self.state.in_flight
                and self._committed >= self._drained)

    def handle_client_request(self, request: Any) -> Any:
        if request == "status":
            return {"pending": len(self._pending), "in_flight": len(self.state.in_flight),
                    "handed_out": self.state.handed_out, "finished": self.state.finished,
                    "discovery_state_entries": self.discovery.size_of(self.state.discovery),
                    "bounded": self.bounded, "done": self.done(),
                    "discovery_cycles_s": list(self._cycles.times),
                    **({"commits_pending": self._ledger.pending_epochs}
                       if self._ledger is not None else {}),
                    **({"alignment": self.alignment.status()}
                       if self.alignment is not None else {})}
        if request == "discover":
            self._discover_now()
            return True
        raise ValueError(f"enumerator {self.context.operator_id!r}: unknown client request "
                         f"{request!r} (ask 'status' or 'discover')")
