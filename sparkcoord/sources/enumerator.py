"""The split enumerator: a coordinator that discovers splits and hands them to readers on demand.

Rules:
  1. Splits go out one at a time, as answers to a reader's :class:`NextSplit` request inside
     the running batch (the request path: logged before the enumerator sees it, the answer
     logged before the reader does). A split is handed out once; a retried task or a re-run
     batch gets the same answers from the log, so an assignment is never lost or repeated.
  2. The enumerator's state changes only in answer to a logged input (requests, client
     requests) or at a checkpoint boundary (inside ``checkpoint_coordinator``, so the snapshot
     holds the change). Discovery therefore runs off the mailbox and its results wait until the
     next boundary: a restore replays a batch's requests against the snapshot they were
     answered from and gets the same answers (docs/protocol.md
     [state-changes-only-through-logged-inputs]).
  3. What a reader has not finished is in the reader's state (with its position), not taken
     back by the enumerator: the subtask state is restored with the epoch, so a failure neither
     loses nor repeats it. The enumerator only counts splits in flight (handed out, not yet
     reported finished) to know when a bounded source is done. The one exception is a task
     retry that adopted its failed attempt's history and finished without re-sending its
     tail (``handle_items_withdrawn``): what the tail's answers handed out goes back to the
     front of the pending splits, as Flink's ``addSplitsBack``, and what it reported is undone.
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
     reported finished in the batch
     that read its last rows or a later one, so a commit never names a split whose rows are
     not committed yet.
  7. A finished report may come with what the reader said about the split (``NextSplit.
     reports``, reader.py rule 6): each names one of the request's finished splits (anything
     else fails the request, naming the split). The enumerator hands it to
     :meth:`SplitEnumerator.split_finished` after its own bookkeeping of the split, in log
     order, and to :meth:`SplitEnumerator.finished_report_withdrawn` when a task retry
     withdraws the request that carried it (rule 3), so a subclass that keeps per-split
     progress in its state (a chunk's high watermark, the offset a split ended at) changes
     it only through logged inputs (rule 2), as Flink CDC's enumerator learns a snapshot
     split's high watermark from its reader's finished report. The hooks get the split
     itself: an enumerator that has them (``keeps_splits_in_flight``) or a committer keeps
     every split in flight in its state (``in_flight_splits``).
  8. Discovery on demand (``discover_ahead=N``; Flink CDC's snapshot split assigner plans
     chunks the same way): no timer and no listing in ``start``; a cycle runs off the
     mailbox whenever fewer than ``N`` splits are pending or waiting to join (checked at
     ``start`` and after each boundary; after a hand-out, below ``N // 2``), asks the
     discovery for the ones missing (``SplitDiscovery.discover_some``), and joins at the
     next boundary as any cycle does (rule 2), until the discovery says it is exhausted
     (``SplitDiscovery.exhausted``). So a source of any size keeps a bounded number of
     splits pending and its discovery follows the readers. The first boundary waits for the
     first cycle while it runs, for up to ``first_boundary_wait_s``, so the run's first
     batch has splits (docs/decisions/077-cdc-fewer-batches.md); it completes from the
     mailbox when the cycle's result or the timer comes, and a slower cycle joins at the
     next boundary. An ``availableNow`` run (rule 5) discovers on until exhausted.

Theory of operation: a fresh source discovers once in ``start`` (so its first batch has
splits); after that (and after a restore) discovery runs off the mailbox (``call_async``, lane
``discovery``): never again for a bounded source, every ``discovery_interval_s`` for a
continuous one. Its result comes back to the mailbox and is applied at the next
``checkpoint_coordinator``, which also asks for a batch so the readers of that batch can take
the new splits. Each batch may take new work up to its :class:`ReadLimit`; when the limit
stops it while splits are pending, another batch is asked for.
"""

from __future__ import annotations

import abc
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sparkcoord.committer import CommitFunction, CommitLedger, CommitWorker, LedgerState
from sparkcoord.coordinator import Cancellable, CoordinatorContext, OperatorCoordinator, Withdrawn
from sparkcoord.core.encoding import encoded
from sparkcoord.sources.alignment import (
    AlignmentOptions,
    AlignmentState,
    WatermarkAlignment,
    WatermarkReport,
)
from sparkcoord.sources.assigners import AlignedLanes, InOrder, SplitAssigner
from sparkcoord.sources.backlog import Backlog, BacklogState, Chunk, chunked
from sparkcoord.sources.splits import BatchBudget, NextSplit, NoSplitNow, ReadLimit, Split

log = logging.getLogger("sparkcoord.sources")


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


@encoded("sources.EnumeratorState")
@dataclass
class EnumeratorState:
    """The enumerator's checkpointed state."""

    #: splits discovered and not yet handed out, in hand-out order, as chunks written once
    #: (sources/backlog.py; a list of splits in snapshots taken before backlogs had chunks)
    pending: BacklogState | list[Split] = field(default_factory=BacklogState)
    #: split id -> subtask that got it, until that reader reports it finished
    in_flight: dict[str, int] = field(default_factory=dict)
    discovery: Any = None
    #: a bounded source's one discovery has been applied
    discovered_once: bool = False
    handed_out: int = 0
    finished: int = 0
    #: with alignment: the reported watermarks, idleness and the decision in force
    alignment: AlignmentState | None = None
    #: with alignment: split id -> alignment key (its lane) of every split in flight
    in_flight_keys: dict[str, str] = field(default_factory=dict)
    #: with a committer or ``keeps_splits_in_flight``: every split in flight (rules 6, 7),
    #: and with a committer the commits not reported done (rule 6)
    in_flight_splits: dict[str, Split] | None = None
    commits: LedgerState | None = None


class SplitEnumerator(OperatorCoordinator):
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
        self._clock = clock
        #: the alignment of the state in force (None: alignment off)
        self.alignment: WatermarkAlignment | None = None
        self._alignment_timer: Cancellable | None = None
        self.state = EnumeratorState()
        self._pending = Backlog(lanes=alignment is not None)
        self._assigner: SplitAssigner = InOrder(latest_first)
        self._budget = BatchBudget(self.limit)
        # discovery results not yet applied (rule 2; chunked on the discovery thread), and the
        # state to discover from next
        self._ready: list[list[Chunk]] = []
        self._ready_state: Any = None
        self._ready_count = 0
        #: how many splits wait in ``_ready``, and (``keeps_discovered_splits``) the splits of
        #: each cycle with the state after it
        self._ready_splits = 0
        self._ready_found: list[tuple[list[Split], Any]] = []
        #: splits reported finished in the running batch, for a withdrawal (rules 3 and 7)
        self._finished_now: dict[str, Split] = {}
        #: rule 8: the first boundary, waiting for the first cycle: id, future, timer
        self._deferred: tuple[int, Future[Any], Cancellable] | None = None
        self._discovering = False
        #: how long recent discovery cycles took (seconds; reported by "status")
        self._discovery_times: deque[float] = deque(maxlen=64)
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
        if self.alignment_options is not None:
            # a state checkpointed before alignment was turned on has none: start afresh
            self.alignment = WatermarkAlignment(self.alignment_options,
                                                getattr(state, "alignment", None))
            state.alignment = self.alignment.state
            if getattr(state, "in_flight_keys", None) is None:
                state.in_flight_keys = {}
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
        if self.alignment_options is not None:
            self._alignment_timer = self.context.call_periodically(
                self.alignment_options.update_interval_ms / 1000, self._check_alignment)
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
            # later cycles run beside the batches
            started = time.perf_counter()
            try:
                found, after = self.discovery.discover(self.state.discovery)
                if self._lists_once and not self.bounded:
                    # a continuous discovery may cap a cycle (maxFilesPerDiscovery): the run
                    # lists on until a cycle finds nothing, so it reads all that is present
                    # (a bounded discovery returns everything in one call)
                    more = found
                    while more:
                        more, after = self.discovery.discover(after)
                        found = found + more
            except Exception as exc:
                raise RuntimeError(f"enumerator {self.context.operator_id!r}: discovery failed: "
                                   f"{type(exc).__name__}: {exc}") from exc
            self._discovered(found, self._chunked(found), after, time.perf_counter() - started)
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
        for timer in (self._timer, self._alignment_timer):
            if timer is not None:
                timer.cancel()
        if self._deferred is not None:
            self._deferred[2].cancel()
            self._deferred = None

    # ---------------------------------------------------------------- discovery
    def _discover_now(self) -> None:
        """Start a discovery cycle unless one runs (mailbox thread)."""
        if self._discovering or self._closed:
            return
        since = self._ready_state if self._ready_count else self.state.discovery
        want = 0
        if self.discover_ahead is not None:
            # rule 8: on demand, until exhausted (also in a run that lists once)
            waiting = len(self._pending) + self._ready_splits
            if self.discovery.exhausted(since) or waiting >= self.discover_ahead:
                return
            want = self.discover_ahead - waiting
        elif self._lists_once and (self._run_listed or self._ready_count):
            return
        self._discovering = True

        def work() -> tuple[list[Split], list[Chunk], Any, float]:
            started = time.perf_counter()
            if self.discover_ahead is not None:
                found, after = self.discovery.discover_some(since, want)
            else:
                found, after = self.discovery.discover(since)
            chunks = self._chunked(found)  # pickled and hashed here, off the mailbox
            return found, chunks, after, time.perf_counter() - started

        def done(result: tuple[list[Split], list[Chunk], Any, float] | None,
                 error: BaseException | None) -> None:
            if result is None:
                assert error is not None
                self._discovery_failed(error)
            else:
                self._discovered(*result)

        self.context.call_async(work, done, lane=self.discovery_lane)

    def _chunked(self, found: list[Split]) -> list[Chunk]:
        # a discovery lists new splits oldest first; newest first, they go to the front
        return chunked(found[::-1] if self.latest_first else found)

    def _discovered(self, found: list[Split], chunks: list[Chunk], after: Any,
                    took_s: float = 0.0) -> None:
        """A discovery cycle's result (mailbox thread): held until the next boundary."""
        self._discovering = False
        self._discovery_times.append(took_s)
        if self._closed:
            return
        self._ready.append(chunks)
        self._ready_state = after
        self._ready_count += 1
        self._ready_splits += len(found)
        if self.keeps_discovered_splits:
            self._ready_found.append((found, after))
        if found or (self._lists_once and not self._run_listed) or self.discover_ahead:
            # on demand (rule 8) every cycle changes the state (its discovery state at least)
            log.info("enumerator %s: discovered %d split(s)", self.context.operator_id,
                     len(found))
            self.context.request_batch()
        self._complete_deferred()  # rule 8: the first boundary waited for this cycle

    def _discovery_failed(self, error: BaseException) -> None:
        self._discovering = False
        if self._closed:
            return
        self._complete_deferred()
        # a listing that fails (a network error, a deleted directory) fails the job: the
        # restart strategy decides, and the error names the source
        self.context.fail_job(RuntimeError(
            f"{self.describe()}: {self.discovery_name} failed: "
            f"{type(error).__name__}: {error}"))

    def describe(self) -> str:
        """How errors and logs name this source (any thread)."""
        return f"enumerator {self.context.operator_id!r}"

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        if self._deferred is not None:
            # a later checkpoint while the first boundary waits (the runtime seals one epoch
            # at a time, so not expected): the earlier one completes first, in order
            self._complete_deferred()
        if (self._deferred is None and self._discovering and self.first_boundary_wait_s > 0
                and self.discover_ahead is not None and not self.state.discovered_once
                and not self._ready_count):
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
        if self._ready_count:
            # rule 2: discoveries join the state at the boundary, inside the snapshot
            for chunks in self._ready:
                self._apply(chunks)
            for found, after in self._ready_found:
                self.discovery_applied(found, after)
            self.state.discovery = self._ready_state
            if self.bounded or self.discover_ahead is not None:
                self.state.discovered_once = True
            self._run_listed = True
            self._ready, self._ready_state, self._ready_count = [], None, 0
            self._ready_splits, self._ready_found = 0, []
        self._finished_now = {}
        self.boundary_reached(checkpoint_id)
        self.state.pending = self._pending.snapshot()
        if self._ledger is not None:
            self.state.commits = self._ledger.checkpoint_taken(checkpoint_id)
        self._budget = BatchBudget(self.limit)
        self._epoch = checkpoint_id
        if self.alignment is not None:
            self._settle_quiet_lanes()
            # rule 4: decided inside the snapshot, sent before the boundary (set_result below),
            # so the event is sealed into this epoch and its batch's readers get it before any
            # data; sent at every boundary whatever the splits (FLINK-37670)
            decision = self.alignment.decide(self._now_ms())
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

    def _settle_quiet_lanes(self) -> None:
        """Before a decision (mailbox thread, at the boundary): a lane with no split pending
        and none in flight is read up to now. No reader tries it, so the enumerator says so
        itself: it is empty (a live directory waiting for files; it goes idle after the idle
        timeout), or, once a source that lists once (rule 5) applied its listing (no file
        will come in this run), finished and forgotten.
        A split-keyed entry is never here: it is forgotten when its reader finishes it."""
        assert self.alignment is not None
        busy = self._pending.lanes()
        busy.update(self.state.in_flight_keys.values())
        quiet = tuple(sorted(key for key in self.alignment.state.splits if key not in busy))
        if not quiet:
            return
        if self._lists_once and self._run_listed:
            self.alignment.forget(quiet)
        else:
            self.alignment.observe(WatermarkReport(empty=quiet))

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _check_alignment(self) -> None:
        """The alignment timer (mailbox thread, every update interval): while a split waits
        for the others, ask for a batch once an update interval has passed since the last
        decision, so the group is decided again even when no data flows (and an empty split
        holding the minimum can go idle)."""
        if self.alignment is None or self._closed:
            return
        due = self.alignment.next_check_ms()
        if due is not None and self._now_ms() >= due:
            self.context.request_batch()

    def _apply(self, chunks: list[Chunk]) -> None:
        self._assigner.add(self._pending, chunks)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._committed = max(self._committed, checkpoint_id)
        if self._ledger is not None and self._commits is not None:
            self._commits.submit(self._ledger.batch_committed(checkpoint_id))

    # ---------------------------------------------------------------- requests
    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
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
                    raise KeyError(split_id)  # rule 6 keeps every split in flight
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
            # every pending split's lane is paused, or has its one split in flight (rule 4).
            # A bounded source asks for the next batch at once (rule 5): the lane holding the
            # minimum is then read, or done (and forgotten at the boundary), so the next
            # decision moves on. A continuous source's timer asks again every update interval
            # (a slow live directory may have nothing yet).
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
                and len(self._pending) + self._ready_splits < self.discover_ahead // 2):
            self._discover_now()  # rule 8: only starts a cycle; it joins at a boundary
        return split

    def split_handed_out(self, subtask: int, split: Split) -> None:
        """``split`` is the answer to ``subtask``'s request (rule 1). Called by the
        enumerator itself on the mailbox, in log order (a restore replays it at the same
        place); the default does nothing."""

    def _no_split(self, subtask: int, done: bool = False) -> NoSplitNow:
        """The answer that ends a reader's batch (mailbox thread). Rule 5: the reader asks
        nothing more in this batch, so what it keeps now (splits in flight to it: paused, or
        a live split with nothing now) and what is pending wait for the next batch, which a
        bounded source asks for here. Its other readers do the same with their last request,
        so the last one of the batch decides; a deterministic function of the state."""
        if self.another_batch_wanted(subtask):
            self.context.request_batch()
        return NoSplitNow(done=done)

    def another_batch_wanted(self, subtask: int) -> bool:
        """Whether ``subtask``'s reader, told there is nothing more in this batch, leaves
        work that needs another batch (rule 5): in a run that lists once, a split pending or
        one kept by that reader. Called by the enumerator itself on the mailbox; a source
        that knows better when a run is done overrides it."""
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
        # the split the running batch produced under ``split_id`` (rule 6; mailbox thread)
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
                    "discovery_cycles_s": list(self._discovery_times),
                    **({"commits_pending": self._ledger.pending_epochs}
                       if self._ledger is not None else {}),
                    **({"alignment": self.alignment.status()}
                       if self.alignment is not None else {})}
        if request == "discover":
            self._discover_now()
            return True
        raise ValueError(f"enumerator {self.context.operator_id!r}: unknown client request "
                         f"{request!r} (ask 'status' or 'discover')")
