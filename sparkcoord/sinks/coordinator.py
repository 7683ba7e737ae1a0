"""The lake sink's coordinator: collects the data files the tasks report and commits each
epoch's files to the table once, after the epoch's batch committed in Spark (Hudi's
StreamWriteOperatorCoordinator, Flink's committer).

Rules:
  1. A task reports each data file it wrote and closed with a :class:`FileWritten` event
     (``files.py`` rule 2). The event is logged before the coordinator sees it
     (docs/protocol.md [inbound-critical-section]), so a restore that replays the batch's log
     reports the file again; it becomes an item of the running batch in the commit ledger
     (``committer/ledger.py`` rule 1).
  2. A failed task attempt's reports are taken back: the coordinator resets per subtask
     (``subtask_reset``: the subtask's items of the running batch are withdrawn) and a
     withdrawn history (``handle_items_withdrawn``) withdraws its files. Their files are left
     to cleanup (rule 5); the retry writes files of its own under other names.
  3. ``notify_checkpoint_complete(N)``: the batch of N committed in Spark; its files become the
     pending commit of N (ledger rule 2), run by the commit worker off the mailbox: one table
     transaction per epoch, fenced by the table (``fencing.py``; ``formats/delta/``,
     ``formats/iceberg/``). An epoch without files has no commit.
  4. The checkpointed state is the ledger's pending commits and the newest epoch whose commit
     was reported done, so a restore commits what the table lacks (a commit the table already
     holds is skipped by the fence: the epoch was pending in the restored checkpoint) and the
     fence can tell a checkpoint behind the table (fencing rule 2) at start.
  5. Cleanup (``cleanup.py``) runs on the commit worker: at its start an orphan sweep of the
     table's data directory up to the newest epoch Spark committed before the restored
     checkpoint, keeping what the table references and what a pending commit holds; after
     each commit of E, the files of the epochs since the last cleaned one up to E, keeping
     E's committed files (an epoch's file set is final once its batch committed, and the
     epochs between had no files to commit).
  6. A fence error (a second writer, a checkpoint behind the table, a table behind the
     checkpoint), an existing table of other columns (``target.check_table_schema``), and in
     mode ``merge`` a change the merge refuses (``changes.py`` rule 3), and a value the
     commit cannot represent (an ``OverflowError``: a date or time past its type's range,
     :class:`ValueOutOfRange` naming the table and the epoch) fail the job with the error's
     text (``context.fail_job``) at their first occurrence: none goes away by retrying, and
     the commit stays pending in the checkpoint.
  7. Mode ``merge``: the reported files are the epoch's staged change rows; the commit reads
     them, reduces them by key (``changes.py``) and merges the result into the table in one
     transaction (``formats/delta/commit.py`` rule 4). The staged files are never in the
     table, so the cleanup after the commit deletes them.
  8. Option ``compaction`` (mode ``append``): the coordinator plans bins of small committed
     files at each checkpoint and sends each subtask its bin (:class:`CompactionAssigned`)
     before the checkpoint completes; a task's :class:`FilesCompacted` report is an item of
     the running batch like a file, and the epoch's commit swaps it in (``compaction.py``
     rules 1-6). The outputs of a swap the commit made are kept by the cleanup after it,
     like the epoch's files; those of a swap left out are deleted.
  9. A run's first checkpoint completes only once the table's fence let the run write (the
     commit worker's ``open``: the fence and the table's shape, not the orphan sweep after
     it): the batch of that epoch, the run's first, starts after it, so the tasks of a run
     the fence refuses (a second writer, a checkpoint behind its table) write nothing into
     the table's directory; the refusal fails the job (rule 6) and declines the checkpoint.
     The fence errors are permanent (``SparkCoordError.permanent``): the job runner gives up
     at once instead of restarting into the same refusal.
  10. Before an epoch's commit, the files its tasks reported are looked for (one listing of
      the epoch's prefix): a file gone (a table maintenance that deletes unreferenced files
      with a retention of seconds) would make the commit reference a missing file and the
      table unreadable, so the job fails with :class:`FilesMissing` naming them, unless the
      table holds the epoch already (a restore after the commit landed).

Thread model: every callback on the coordinator's mailbox; the committer, the sweep and the
cleanup on the commit worker's thread (``sparkcoord-commit-<operator>``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.committer import CommitLedger, CommitWorker, LedgerState
from sparkcoord.coordinator import CoordinatorContext, OperatorCoordinator, Withdrawn
from sparkcoord.core.encoding import encoded
from sparkcoord.core.errors import SparkCoordError
from sparkcoord.runtime.kills import kill_point
from sparkcoord.sinks.changes import ChangeStreamError, reduce_changes
from sparkcoord.sinks.cleanup import (
    delete_files,
    epoch_prefix,
    files_to_delete,
    list_data_files,
)
from sparkcoord.sinks.compaction import (
    CompactionAssigned,
    CompactionPlanner,
    CompactionState,
    FilesCompacted,
    bin_paths,
)
from sparkcoord.sinks.fencing import NO_EPOCH, SinkFenceError
from sparkcoord.sinks.files import DataFile, parse_file_name, read_files
from sparkcoord.sinks.tables import TableCommitter, TableShapeError
from sparkcoord.sinks.target import SinkTarget

log = logging.getLogger("sparkcoord.sinks")


class FilesMissing(SparkCoordError):
    """Data files an epoch's tasks reported are gone before its commit (rule 10); permanent:
    a restart meets the same directory."""

    permanent = True


class ValueOutOfRange(ValueError):
    """A commit that can never succeed: a value of the epoch is past its type's range
    (rule 6)."""


@encoded("sinks.FileWritten")
@dataclass(frozen=True)
class FileWritten:
    """Event, task to coordinator: this task attempt wrote and closed ``file`` (rule 1)."""

    file: DataFile


@encoded("sinks.SinkState")
@dataclass
class SinkState:
    """The coordinator's checkpointed state (rule 4)."""

    ledger: LedgerState = field(default_factory=LedgerState)
    #: the newest epoch whose commit was reported done
    committed_through: int = NO_EPOCH
    #: rule 8 (option ``compaction``): the planner's state
    compaction: CompactionState | None = None


class SinkCoordinator(OperatorCoordinator):
    """Commits a lake sink's epochs (rules 1-6). Created by the runtime from
    :func:`sink_coordinator`'s provider, on the source runner's driver side."""

    resets_per_subtask = True

    def __init__(self, context: CoordinatorContext, target: SinkTarget) -> None:
        super().__init__(context)
        self.target = target
        self._ledger = CommitLedger()
        self._committed_through = NO_EPOCH
        #: the newest epoch Spark committed before the restored checkpoint (the sweep's bound)
        self._final_at_start = NO_EPOCH
        #: the running batch's reports by subtask (rule 2): files and compactions
        self._running: dict[int, list[DataFile | FilesCompacted]] = {}
        self._planner = self._new_planner(None)
        self._worker: CommitWorker | None = None
        #: rule 9: done once the commit worker's open passed the table's fence
        self._fenced: Future[None] | None = None
        #: status (handle_client_request): commits done by this start and their durations
        self._commits_done = 0
        self._commit_seconds: deque[float] = deque(maxlen=100)
        #: worker thread only: how long the commit that ran last took, and the files it
        #: added to the table (none: the table held the epoch already; read by the report)
        self._last_commit_s = 0.0
        self._last_committed_files: tuple[DataFile, ...] = ()
        #: worker thread only: the committer of this start, and the newest cleaned epoch
        self._committer: TableCommitter | None = None
        self._cleaned_through = NO_EPOCH

    # ---------------------------------------------------------------- lifecycle (mailbox)
    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        if state is not None and not isinstance(state, SinkState):
            raise TypeError(f"sink {self.context.operator_id!r}: checkpointed state is a "
                            f"{type(state).__name__}, not a SinkState")
        state = state or SinkState()
        self._ledger = CommitLedger(state.ledger)
        self._committed_through = state.committed_through
        self._planner = self._new_planner(getattr(state, "compaction", None))
        if self._planner is not None:
            self._planner.restored(checkpoint_id)
        #: rule 4: the epochs whose commit our predecessor may have made: those pending in the
        #: checkpoint, and the restored one if its batch had committed in Spark (its logged
        #: reports are handed again); not an epoch this run produces, which another writer
        #: holding it in the table must not make ours
        self._restored_pending = set(state.ledger.pending)
        if getattr(self.context, "restored_committed", False) and checkpoint_id >= 0:
            self._restored_pending.add(checkpoint_id)
        # conservative: the restore point may be a batch that has not committed (a re-run)
        self._final_at_start = checkpoint_id - 1 if checkpoint_id >= 0 else NO_EPOCH
        self._running = {}

    def _new_planner(self, state: CompactionState | None) -> CompactionPlanner | None:
        if not self.target.compaction:
            return None
        return CompactionPlanner(self.target.target_file_bytes,
                                 self.target.compaction_max_files, state)

    def run_ending(self) -> Any:
        """An availableNow run ends once the commits handed over are done (coordinator.py)."""
        return self._worker.idle() if self._worker is not None else None

    def close(self) -> None:
        if self._worker is not None:
            # not waiting: the end of an availableNow run waited in run_ending; what is not
            # done stays pending in the checkpoint and runs after the next start
            self._worker.stop()

    # ---------------------------------------------------------------- inputs (mailbox)
    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        item = _item(event)
        if item is None:
            raise TypeError(f"sink {self.context.operator_id!r}: subtask {subtask} sent a "
                            f"{type(event).__name__}, not a FileWritten or FilesCompacted")
        self._ledger.item_produced(item)
        self._running.setdefault(subtask, []).append(item)

    def subtask_reset(self, subtask: int, checkpoint_id: int) -> None:
        for item in self._running.pop(subtask, []):
            self._ledger.item_withdrawn(item)

    def handle_items_withdrawn(self, subtask: int, attempt: int,
                               withdrawn: list[Withdrawn]) -> None:
        for w in withdrawn:
            item = _item(w.item)
            if item is not None:
                self._ledger.item_withdrawn(item)
                items = self._running.get(subtask, [])
                if item in items:
                    items.remove(item)

    def checkpoint_coordinator(self, checkpoint_id: int, result: Any) -> None:
        worker = self._started_worker()
        assert self._fenced is not None
        if not self._fenced.done():
            # rule 9: the run's first checkpoint completes once the table's fence let this
            # run write, so no task of a refused run writes a file into the table's directory
            post = self.context.run_in_coordinator_thread
            self._fenced.add_done_callback(lambda _: post(functools.partial(
                self._checkpoint_fenced, checkpoint_id, result)))
            return
        self._take_checkpoint(checkpoint_id, result, worker)

    def _checkpoint_fenced(self, checkpoint_id: int, result: Any) -> None:
        """Rule 9, on the mailbox once the fence decided: checkpoint or decline."""
        assert self._fenced is not None and self._worker is not None
        error = self._fenced.exception()
        if error is not None:
            result.set_exception(error)  # the job fails with it already (rule 6)
            return
        self._take_checkpoint(checkpoint_id, result, self._worker)

    def _take_checkpoint(self, checkpoint_id: int, result: Any, worker: CommitWorker) -> None:
        worker.submit(self._ledger.restored())  # a restore's pending commits, if not yet
        compaction = None
        if self._planner is not None:
            compaction = self._planner.checkpoint_taken(checkpoint_id, self.context.parallelism)
            gateways = dict(self.ready_gateways())
            for subtask, inputs in enumerate(compaction.plans.get(checkpoint_id, ())):
                # sent before the result: sealed into this epoch (rule 8); a subtask without
                # a gateway now (its attempt failed) gets its bin back at the batch's commit
                if subtask in gateways:
                    gateways[subtask].send_event(
                        CompactionAssigned(checkpoint_id, bin_paths(inputs)))
        result.set_result(SinkState(self._ledger.checkpoint_taken(checkpoint_id),
                                    self._committed_through, compaction))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        commits = self._ledger.batch_committed(checkpoint_id)
        self._running = {}
        if self._planner is not None:
            self._planner.batch_committed(checkpoint_id, [
                item.inputs for commit in commits if commit.epoch == checkpoint_id
                for item in commit.items if isinstance(item, FilesCompacted)])
        self._started_worker().submit(commits)

    def _started_worker(self) -> CommitWorker:
        """The commit worker, started at the first checkpoint or commit (mailbox thread): by
        then a restore's replay of its committed batch is in the ledger, so the fence knows
        every epoch this checkpoint may have committed (rule 4)."""
        if self._worker is None:
            post = self.context.run_in_coordinator_thread
            last_committed = self._committed_through
            pending = [e for e in self._ledger.pending_epochs if e in self._restored_pending]
            held = {path for items in self._ledger.pending_items() for item in items
                    for path in _written_paths(item)}
            self._fenced = Future()
            self._worker = CommitWorker(
                self.context.operator_id, self._commit,
                lambda epoch: post(functools.partial(self._commit_done, epoch,
                                                     self._last_commit_s,
                                                     self._last_committed_files)),
                prepare=lambda: self._open(last_committed, pending, held),
                stuck=self.context.fail_job)  # a commit failing for minutes fails the job
            self._worker.start()
        return self._worker

    def handle_client_request(self, request: Any) -> Any:
        """``job.request(name, "status")``: the newest epoch committed to the table, the
        epochs pending, the commits made by this start and how long each took (seconds, the
        newest 100: the table transaction and the cleanup after it)."""
        if request != "status":
            raise ValueError(f"sink {self.context.operator_id!r} answers 'status', not "
                             f"{request!r}")
        return {"table": self.target.name, "job_id": self.target.job_id,
                "committed_through": self._committed_through,
                "pending": self._ledger.pending_epochs, "commits": self._commits_done,
                "commit_s": list(self._commit_seconds),
                "small_files": None if self._planner is None else self._planner.small_files}

    def _commit_done(self, epoch: int, seconds: float,
                     committed: tuple[DataFile, ...]) -> None:
        self._ledger.commit_done(epoch)
        self._committed_through = max(self._committed_through, epoch)
        self._commits_done += 1
        self._commit_seconds.append(seconds)
        if self._planner is not None:
            self._planner.files_committed(committed)  # compaction.py rule 1

    # ---------------------------------------------------------------- commit worker thread
    def _open(self, last_committed: int, pending: list[int], held: set[str]) -> None:
        """Rule 4's fence check and rule 5's sweep (worker thread, before any commit)."""
        committer = self.target.committer()
        assert self._fenced is not None
        try:
            committer.open(last_committed, pending)
        except (SinkFenceError, TableShapeError) as e:
            self.context.fail_job(e)  # rule 6
            if not self._fenced.done():
                self._fenced.set_exception(e)  # rule 9
            raise
        if not self._fenced.done():
            self._fenced.set_result(None)  # rule 9: the sweep below need not hold it up
        self._sweep(self._final_at_start, committer.referenced_paths() | held)
        self._committer = committer
        self._cleaned_through = self._final_at_start

    def _commit(self, epoch: int, items: Sequence[Any]) -> None:
        """Rule 3's commit and rule 5's cleanup of one epoch (worker thread)."""
        started = time.perf_counter()
        kill_point("lake-committing", epoch)  # tests only
        files = [i for i in items if isinstance(i, DataFile)]
        swaps = [i for i in items if isinstance(i, FilesCompacted) and i.outputs]
        self._check_files_present(epoch, items)
        try:
            if self.target.mode == "merge":
                def load() -> Any:
                    # only for an epoch not in the table yet: once merged, the cleanup after
                    # the commit deletes the staged files, and a restore that commits the
                    # epoch again must not need them
                    staged = read_files(self.target.location, files, storage_options=dict(
                        self.target.storage_options) or None)
                    return reduce_changes(staged, self.target.table)

                decision = self._open_committer().merge(epoch, load, self.target.keys)
            else:
                decision = self._open_committer().commit(epoch, files, swaps)
        except (ChangeStreamError, SinkFenceError) as e:
            self.context.fail_job(e)  # rule 6: loud, the commit stays pending
            raise
        except OverflowError as e:  # rule 6: the same values overflow on every retry
            refused = ValueOutOfRange(
                f"sink {self.context.operator_id!r}: the commit of epoch {epoch} to table "
                f"{self.target.name} cannot succeed: a value is out of its type's range "
                f"({e}). Nothing of the epoch is in the table; the epoch stays pending. "
                f"Drop or correct the row upstream and restart from a checkpoint location "
                f"that does not hold the epoch")
            self.context.fail_job(refused)
            raise refused from e
        kill_point("lake-committed", epoch)  # tests only
        swapped = [s for s in swaps if s not in getattr(self._committer, "left_out", ())]
        log.info("sink %r: epoch %d %s to %s (%d file(s)%s)", self.context.operator_id, epoch,
                 "committed" if decision == "commit" else "was in the table already",
                 self.target.name, len(files),
                 f", {len(swapped)} compaction(s)" if swaps else "")
        added = tuple(files) + tuple(o for s in swapped for o in s.outputs)
        referenced: set[str] | None = None
        if decision != "commit":
            referenced = self._open_committer().referenced_paths()
            # compaction.py rule 1: what the table holds of this epoch's reports (a pending
            # commit restored or a replayed batch: all; a re-run batch's new files: none)
            added = tuple(f for f in added if f.path in referenced)
        self._last_committed_files = added
        if epoch > self._cleaned_through:
            # rule 7: a merge's staged files are never in the table: garbage once merged
            held = set() if self.target.mode == "merge" else {f.path for f in added}
            if referenced is not None:
                # in the table already: whatever it holds is kept, ours or not (a fence
                # that let another writer's epoch pass must still never cost its files)
                held |= referenced
            self._sweep(epoch, held, epochs=(self._cleaned_through + 1, epoch))
            self._cleaned_through = epoch
        else:
            # after a restore: an epoch pending in the restored checkpoint at or below the
            # sweep's bound (the sweep at start held what it reported, for this commit; the
            # cleanups after commits start above it): what the commit did not put in the
            # table is garbage now, a merge's staged files (rule 7) and the outputs of a
            # swap left out (rule 8)
            kept = {f.path for f in added}
            doomed = ([f.path for f in files] if self.target.mode == "merge" else
                      [o.path for s in swaps for o in s.outputs if o.path not in kept])
            if doomed:
                delete_files(self.target.location, doomed,
                             storage_options=dict(self.target.storage_options) or None)
        self._last_commit_s = time.perf_counter() - started  # read by the done report

    def _open_committer(self) -> TableCommitter:
        """The committer the worker's ``open`` made (worker thread, after it)."""
        assert self._committer is not None, "the commit worker runs commits after open"
        return self._committer

    def _check_files_present(self, epoch: int, items: Sequence[Any]) -> None:
        """Rule 10 (worker thread, before the epoch's commit): every file the epoch's tasks
        reported is still in the table's directory (one listing of the epoch's prefix), or
        the table holds the epoch already; otherwise :class:`FilesMissing` fails the job."""
        reported = {path for item in items for path in _written_paths(item)}
        if not reported:
            return
        present = set(list_data_files(self.target.location,
                                      prefix=epoch_prefix(self.target.job_id, epoch),
                                      storage_options=dict(self.target.storage_options)
                                      or None))
        missing = sorted(reported - present)
        if not missing or self._open_committer().table_epoch() >= epoch:
            return  # in the table already: its maintenance may delete what it replaced
        error = FilesMissing(
            f"sink {self.context.operator_id!r}: {len(missing)} of the {len(reported)} data "
            f"file(s) the tasks wrote for epoch {epoch} are gone from table "
            f"{self.target.name} before the epoch's commit ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}): something deleted files no commit "
            f"referenced yet (a Delta VACUUM with a retention of less than the job's commit "
            f"delay, an Iceberg orphan-file removal with a short older_than). The epoch was "
            f"not committed and stays pending: restore the files (object versioning, a "
            f"backup) and restart, or rebuild the table from its source. Keep maintenance "
            f"retentions above a few minutes while a job writes (docs/sinks.md, "
            f"'Maintenance while a job runs')")
        self.context.fail_job(error)
        raise error

    def _sweep(self, final_through: int, held: set[str],
               epochs: tuple[int, int] | None = None) -> None:
        """Delete what rule 5 says, of the whole data directory (``epochs`` None: the sweep at
        start) or of the files of epochs ``epochs[0]..epochs[1]`` (one prefix listing each,
        or one listing of the directory for a longer run of epochs without files)."""
        if final_through < 0:
            return
        options = dict(self.target.storage_options) or None
        job = self.target.job_id
        if epochs is None:
            listed = list_data_files(self.target.location, storage_options=options)
        else:
            low, high = epochs
            prefixes = ([epoch_prefix(job, e) for e in range(low, high + 1)]
                        if high - low < 8 else [f"sc-{job}.e"])
            listed = [path for prefix in prefixes
                      for path in list_data_files(self.target.location, prefix=prefix,
                                                  storage_options=options)
                      if low <= _epoch_of(path) <= high]
        doomed = files_to_delete(self.target.job_id, listed, final_through=final_through,
                                 held=held)
        if doomed:
            deleted = delete_files(self.target.location, doomed[:1], storage_options=options)
            kill_point("lake-cleaning", final_through)  # tests only: one deleted, not all
            deleted += delete_files(self.target.location, doomed[1:], storage_options=options)
            log.info("sink %r: deleted %d data file(s) no commit holds (%s)",
                     self.context.operator_id, deleted, ", ".join(doomed[:3]))


def _item(report: Any) -> DataFile | FilesCompacted | None:
    """The ledger item of a task's report (rule 1, rule 8), ``None`` if it is none."""
    if isinstance(report, FileWritten):
        return report.file
    return report if isinstance(report, FilesCompacted) else None


def _written_paths(item: DataFile | FilesCompacted) -> list[str]:
    """The paths of the files a ledger item's task wrote."""
    if isinstance(item, FilesCompacted):
        return [f.path for f in item.outputs]
    return [item.path]


def _epoch_of(path: str) -> int:
    name = parse_file_name(path.rsplit("/", 1)[-1])
    return NO_EPOCH if name is None else name.epoch


def sink_coordinator(target: SinkTarget) -> Any:
    """The coordinator provider of a sink writing ``target`` (picklable: a partial)."""
    return functools.partial(SinkCoordinator, target=target)
