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
cleanup on the commit worker's thread (``sparkcoord-commit-<operator>``), in
:mod:`sparkcoord.sinks.committing` (the coordinator's base :class:`EpochCommits`, and the
errors :class:`FilesMissing` and :class:`ValueOutOfRange`, importable from here as before).
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.committer import CommitLedger, CommitWorker, LedgerState
from sparkcoord.coordinator import CoordinatorContext, OperatorCoordinator, Withdrawn
from sparkcoord.core.encoding import encoded
from sparkcoord.sinks.committing import EpochCommits, epoch_of, written_paths
from sparkcoord.sinks.committing import FilesMissing as FilesMissing
from sparkcoord.sinks.committing import ValueOutOfRange as ValueOutOfRange
from sparkcoord.sinks.compaction import (
    CompactionAssigned,
    CompactionPlanner,
    CompactionState,
    FilesCompacted,
    bin_paths,
)
from sparkcoord.sinks.fencing import NO_EPOCH
from sparkcoord.sinks.files import DataFile
from sparkcoord.sinks.tables import TableCommitter
from sparkcoord.sinks.target import SinkTarget

log = logging.getLogger("sparkcoord.sinks")

#: the names these had here before they moved to :mod:`.committing` (the same objects)
_written_paths, _epoch_of = written_paths, epoch_of


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


class SinkCoordinator(EpochCommits, OperatorCoordinator):
    """Commits a lake sink's epochs (rules 1-6). Created by the runtime from
    :func:`sink_coordinator`'s provider, on the source runner's driver side. The methods
    here run on the mailbox; those of the commit worker's thread are its base
    :class:`~sparkcoord.sinks.committing.EpochCommits`'."""

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
                    for path in written_paths(item)}
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


def _item(report: Any) -> DataFile | FilesCompacted | None:
    """The ledger item of a task's report (rule 1, rule 8), ``None`` if it is none."""
    if isinstance(report, FileWritten):
        return report.file
    return report if isinstance(report, FilesCompacted) else None


def sink_coordinator(target: SinkTarget) -> Any:
    """The coordinator provider of a sink writing ``target`` (picklable: a partial)."""
    return functools.partial(SinkCoordinator, target=target)
