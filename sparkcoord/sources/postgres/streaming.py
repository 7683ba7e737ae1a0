"""The stream's control in the PostgreSQL enumerator: what the stream may read (its bound), where
it stops, and what the slot may confirm. :class:`StreamControl` is composed into
:class:`~sparkcoord.sources.postgres.enumerator.PostgresEnumerator`, which calls it from its
hooks; its I/O runs on the lane ``slot`` (enumerator.py rule 1).

Rules (enumerator.py cites them as its rules 4, 5 and 7, under the same numbers):
  4. The slot is confirmed (``replication.advance``) only in ``notify_checkpoint_complete``:
     the position a :class:`NextStreamRead` reported in the batch of epoch ``e`` (where the
     reader's previous batch read to) is confirmed once a checkpoint ``>= e`` is notified
     committed, never before. The stream reader reports at every batch, also when the
     tables are idle (it then read to the bound it was given: replication.py rule 4), so a
     quiet publication holds WAL for no longer than about two batches. Nothing is confirmed during
     the snapshot: chunk reads peek the slot from the position it had when the source
     started, and the stream needs every transaction after the least high watermark. The
     batch that hands the stream out confirms its start (the least high watermark) once it
     commits: everything before it is in the snapshot, committed before that batch ran, and
     a peek reads from the confirmed position, so a stream that starts far behind would
     otherwise re-read what it skips at every batch.
  5. How far the stream reads (splits.py rule 5): every ``poll_interval_s`` once the stream
     is built, the enumerator learns the WAL insert position on the slot lane (a record
     boundary, so confirming it never skips a commit record that straddles it) and asks for
     a batch when it moved (an idle database runs no batches); the position joins the state
     at the next boundary (enumerator.py rule 2) as the stream's bound, and each
     :class:`NextStreamRead` is answered with it (a :class:`StreamBound`).
     So changes arrive within about a poll interval plus a batch, an idle publication still
     confirms the slot while anything else in the database is written (rule 4; where nothing
     is, the last batch's report waits for the next write), and a batch that runs again
     reads the same transactions.
     The stream reader asks for the next batch itself when its read stopped short of the
     bound (``max_changes_per_batch``). In an ``availableNow`` run
     (``CoordinatorContext.available_now``) there is no polling: the enumerator learns the
     insert position once, when the run starts, and that is the bound; it asks for batches
     until the stream reader reports a position at or past it (a report arrives a batch
     after its read, rule 4), so a run that ends has read every transaction committed before
     it started. The confirmation of the run's last batch then waits for the next run.
  7. The stream stops at a position ``P`` with an error: the source fails the job when the
     stream reader reports it read to ``P`` or past it. That report comes in the batch after
     the read, which Spark runs only once the read's batch committed, so every change before
     ``P`` is in the sink first; nothing is confirmed past what the sink holds, and a
     restart finds the same and stops at the same point. Two things set a stop (the
     earlier ``P`` wins):
     a captured table the publication no longer publishes (dropped, or taken out of it) is
     found by the poll, which asks for the published tables before the insert position
     ``P``: every change the table had is before ``P`` (a ``PublicationProblem`` naming the
     tables). While a stop waits every poll asks for a batch (nothing else may be written to
     move the insert position). The check starts once the stream is built: before, the
     publication may not exist yet (the set-up creates it on the other worker, at the same
     time as an ``availableNow`` run's first poll);
     a captured table that changed shape (reader.py rule 4): the reader stopped its read
     before the first change of the new shape, at ``P``, and its next batch reports ``P``
     with the reason (``NextStreamRead.stopped``), so the job fails at that report (a
     ``SchemaChanged`` naming the table, the change and the way on).

Thread model: every method on the coordinator's mailbox; ``insert_position``, ``unpublished``
and ``advance`` of the :class:`EnumeratorIO` on the lane ``slot`` (``call_async``), one call at
a time, their results posted back to the mailbox.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sparkcoord.coordinator import CoordinatorContext
from sparkcoord.sources.postgres.core.names import TableName
from sparkcoord.sources.postgres.core.splits import NextStreamRead
from sparkcoord.sources.postgres.io.enumeration import EnumeratorIO
from sparkcoord.sources.postgres.planning import CdcEnumeratorState

log = logging.getLogger("sparkcoord.sources.postgres")

#: the ``call_async`` lane of the slot's I/O (enumerator.py rule 1)
SLOT = "slot"


class StreamControl:
    """The stream's bound, its stops and the slot's confirmation (module rules), for one
    enumerator. Made by the enumerator in its constructor; every method is called by it on the
    mailbox. ``state`` gives the enumerator's state in force, ``closed`` whether it closed,
    ``owner`` the subtask the stream is in flight to, ``work_left`` whether another batch is
    needed (the enumerator's ``_work_left``), ``failed`` fails the job naming the source."""

    def __init__(self, context: CoordinatorContext, io: Callable[[], EnumeratorIO],
                 tables: Sequence[TableName], *, state: Callable[[], CdcEnumeratorState],
                 closed: Callable[[], bool], owner: Callable[[], int | None],
                 work_left: Callable[[], bool],
                 failed: Callable[[str, BaseException], None]) -> None:
        self.context = context
        self._get_io = io
        self.tables = tuple(tables)
        #: what the enumerator says (its state, whether it closed, the stream's owner, whether
        #: another batch is needed) and how it fails the job
        self._state, self._closed, self._owner = state, closed, owner
        self._work_left, self._failed = work_left, failed
        #: rule 4: an advance runs, the newest position to confirm, the slot's as confirmed
        self._advancing = False
        self._advance_target = 0
        self.confirmed = 0
        self._learning = False
        #: the newest insert position learned, joining the state at the next boundary (rule 5)
        self._learned_bound = 0
        #: an availableNow run's end: the WAL insert position when it started (rule 5)
        self._run_end: int | None = None
        #: where the stream stops, and the error the job then fails with (rule 7)
        self._stop: tuple[int, Exception] | None = None

    def restored(self) -> None:
        """The enumerator reset to a checkpoint: the slot is as that state confirmed it."""
        self.confirmed = self._state().confirmed

    # ------------------------------------------------------------------ reports (rules 4, 7)
    def reported(self, epoch: int, position: int) -> None:
        """The batch of ``epoch`` read the stream to ``position``: confirmed once a checkpoint
        ``>= epoch`` committed (rule 4)."""
        state = self._state()
        previous = state.reported.get(epoch, 0)
        state.reported[epoch] = max(previous, position)

    def stream_read(self, epoch: int, request: NextStreamRead) -> None:
        """The stream reader's request in the batch of ``epoch``: what it read to (rule 4) and
        where it stopped (rule 7); the job fails once a report reaches the stop."""
        if request.read_to is None:
            return
        self.reported(epoch, request.read_to)
        if request.stopped is not None:
            from sparkcoord.sources.postgres.errors import SchemaChanged

            self.stop_at(request.read_to, SchemaChanged(
                f"PostgreSQL source {self.context.operator_id!r}: {request.stopped}"))
        if self._stop is not None and request.read_to >= self._stop[0]:
            # rule 7: the batch that read to the stop committed
            self.context.fail_job(self._stop[1])

    def stop_at(self, position: int, error: Exception) -> None:
        """Rule 7: the stream stops at ``position`` with ``error`` (the earlier stop wins)."""
        if self._stop is None or position < self._stop[0]:
            self._stop = (position, error)

    def unpublished_error(self, gone: tuple[TableName, ...]) -> Exception:
        """Rule 7: the error of captured tables that left the publication."""
        from sparkcoord.sources.postgres.errors import PublicationProblem

        names = ", ".join(map(str, gone))
        return PublicationProblem(
            f"PostgreSQL source {self.context.operator_id!r}: captured table(s) {names} are no "
            f"longer published by the source's publication (dropped, or taken out of it); "
            "every change committed to them before that was delivered. Capture without them "
            "with a new checkpoint location, or, if a table still exists and was taken out by "
            "mistake, add it back (ALTER PUBLICATION ... ADD TABLE ...; what changed while it "
            "was out is not in the stream: capture it again with a snapshot)")

    # ------------------------------------------------------------------ the bound (rule 5)
    def polled(self) -> None:
        """A poll tick: once the stream is built, learn a new bound; a batch follows."""
        if self._state().snapshot_done_at is not None:  # the stream is built
            self.learn_bound()

    def learn_bound(self) -> None:
        """Learn the WAL insert position on the slot lane (and, rule 7, the tables that left
        the publication), unless a lookup runs or the enumerator closed."""
        if self._learning or self._closed():
            return
        self._learning = True
        # rule 7 once the stream is built: before, the publication may not exist yet (the
        # set-up creating it runs on the other worker at the same time)
        check = self._state().snapshot_done_at is not None

        def work() -> tuple[int, tuple[TableName, ...]]:
            io = self._get_io()
            # rule 7: the tables first, so that the position is after what changed them
            gone = io.unpublished(self.tables) if check else ()
            return io.insert_position(), gone

        def done(result: tuple[int, tuple[TableName, ...]] | None,
                 error: BaseException | None) -> None:
            if result is None:
                assert error is not None
                self._learning = False
                self._failed("reading the WAL insert position", error)
            else:
                self.bound_learned(*result)

        self.context.call_async(work, done, lane=SLOT)

    def bound_learned(self, position: int, gone: tuple[TableName, ...] = ()) -> None:
        """The insert position ``position`` and the captured tables no longer published."""
        self._learning = False
        if self._closed():
            return
        if gone and (self._stop is None or position < self._stop[0]):
            self.stop_at(position, self.unpublished_error(gone))
            log.warning("PostgreSQL source %s: %s no longer published; the source stops once "
                        "the stream has delivered everything before %s",
                        self.context.operator_id, ", ".join(map(str, gone)), position)
        moved = position > max(self._learned_bound, self._state().stream_bound)
        self._learned_bound = max(self._learned_bound, position)
        if self.context.available_now and self._run_end is None:
            self._run_end = position
            log.info("PostgreSQL source %s: this availableNow run reads the stream to %s",
                     self.context.operator_id, position)
        # an unmoved insert position: nothing new to read; but once tables left (rule 7), the
        # batch carrying the report past them must come even if nothing is written any more
        if self._work_left() or (self._owner() is not None
                                 and (moved or self._stop is not None)):
            self.context.request_batch()

    def behind_run_end(self) -> bool:
        """An availableNow run's stream has not yet been reported past the run's end (or the
        end is not known yet)."""
        if not self.context.available_now or self._owner() is None:
            return False
        if self._run_end is None:
            return True
        # a reported position leaves ``reported`` once its batch committed, possibly before
        # the slot worker confirmed it: the committed target counts too, else a batch or two
        # more run for nothing while the advance is on its way
        state = self._state()
        read = max([state.confirmed, self.confirmed, self._advance_target,
                    *state.reported.values()])
        return read < self._run_end

    def boundary_reached(self, committed: int) -> None:
        """A checkpoint boundary (enumerator.py rule 2), ``committed`` the newest checkpoint
        whose batch committed: the learned bound joins the state (rule 5), the reports
        confirmed leave it, and the slot's confirmed position is recorded (rule 4)."""
        state = self._state()
        state.stream_bound = max(state.stream_bound, self._learned_bound)
        state.reported = {e: p for e, p in state.reported.items() if e > committed}
        state.confirmed = self.confirmed

    # ------------------------------------------------------------------ the slot (rule 4)
    def batch_committed(self, checkpoint_id: int) -> None:
        """The batch of ``checkpoint_id`` committed: confirm what the batches up to it read."""
        done = [p for e, p in self._state().reported.items() if e <= checkpoint_id]
        if not done:
            return
        target = max(done)
        if target <= max(self.confirmed, self._advance_target):
            return
        self._advance_target = target
        self._advance()

    def _advance(self) -> None:
        if self._advancing or self._closed() or self._advance_target <= self.confirmed:
            return
        self._advancing = True
        target = self._advance_target

        def done(confirmed: int | None, error: BaseException | None) -> None:
            if confirmed is None:
                assert error is not None
                self._advance_failed(error)
            else:
                self._advanced(confirmed)

        self.context.call_async(lambda: self._get_io().advance(target), done, lane=SLOT)

    def _advanced(self, confirmed: int) -> None:
        self._advancing = False
        self.confirmed = max(self.confirmed, confirmed)
        self._advance()  # a later target arrived meanwhile

    def _advance_failed(self, error: BaseException) -> None:
        self._advancing = False
        if not self._closed():
            self.context.fail_job(RuntimeError(
                f"PostgreSQL source {self.context.operator_id!r}: confirming the replication "
                f"slot failed: {type(error).__name__}: {error}"))
