"""Which epochs a lake sink commits, skips or refuses: the fence between a job and its table.

A sink's coordinator commits each epoch's files to the table once (the commit ledger issues
the commits, ``sparkcoord.committer``); the table records, with every commit, the job id and
the epoch (Delta: an application transaction; Iceberg: snapshot summary properties) and the
*run* that made it (one run id per coordinator start). This module decides, from those facts
read back from the table, what the committer does. It never reads a table itself.

Rules:
  1. Epochs commit in order (the ledger issues them so), so the table's *newest* epoch for the
     job says which epochs it holds: every epoch up to it.
  2. At start, the newest epoch the table holds for the job must be one the restored
     checkpoint knows: its last committed epoch (reported done before the checkpoint) or one
     of its pending epochs (committed to the table, not yet reported: a driver killed between
     the table commit and the report). Newer than all of them: the checkpoint is behind the
     table (reset, or copied from an older run, or a second job ran on under the same job id)
     and is refused (:class:`CheckpointBehindTable`); starting would silently skip the commits
     of every epoch up to the table's. Older than the last committed: the table lost commits
     the checkpoint saw made (restored to an older version, or another table at that
     location) and is refused too (:class:`TableBehindCheckpoint`).
  3. A commit of an epoch the table already holds is skipped and reported as such
     (:data:`ALREADY_COMMITTED`) when our run made it (a retry after a commit that landed and
     raised) or when it was pending in the restored checkpoint (our predecessor made it, then
     died before the report). Otherwise another writer with the same job id committed it: a
     second writer, refused (:class:`SecondWriter`).
  4. The table's newest epoch must not move except by our commits: newer than every epoch we
     committed, skipped or restored as pending means another writer commits under our job id
     (:class:`SecondWriter`), whichever epoch we were about to commit.
  5. Two writers racing for the same epoch are serialized by the table (Delta's conflict check
     of a concurrent application transaction of the same app id; Iceberg's catalog commit
     that requires the branch's snapshot to be unchanged): the loser's commit fails, is
     retried by the commit worker, and meets rule 3 or 4 on its retry.

Why not a lease file: a lease needs a clock to expire it, and a restarted driver would wait for
its dead predecessor's lease; the table already serializes commits, and every commit carries
the facts this fence needs. The price: a second writer is refused at its first commit that
meets the first writer's, not at its start (unless the first writer's commits already put the
table ahead of the second's checkpoint, rule 2).

Thread model: none; one fence per sink committer, used from its commit worker's thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from sparkcoord.core.errors import SparkCoordError

#: What :meth:`EpochFence.decide` says: commit the epoch now, or it is in the table already.
Decision = Literal["commit", "already-committed"]
COMMIT: Decision = "commit"
ALREADY_COMMITTED: Decision = "already-committed"

NO_EPOCH = -1


class SinkFenceError(SparkCoordError):
    """A lake sink refused to commit: the table and this job's state do not agree. Permanent:
    a restart meets the same table and checkpoint (``coordinator.py`` rule 9)."""

    permanent = True

    def __init__(self, message: str, table: str, job_id: str, ours: int, table_epoch: int):
        super().__init__(message)
        self.table = table
        self.job_id = job_id
        self.ours = ours
        self.table_epoch = table_epoch


class CheckpointBehindTable(SinkFenceError):
    """The restored checkpoint is older than what the table holds for this job (rule 2)."""


class TableBehindCheckpoint(SinkFenceError):
    """The table lacks an epoch the restored checkpoint saw committed (rule 2)."""


class SecondWriter(SinkFenceError):
    """Another writer commits to the table under the same job id (rules 3, 4)."""


class EpochFence:
    """Rules 1-4 for one sink committer of ``job_id`` on ``table`` (named in errors)."""

    def __init__(self, table: str, job_id: str, last_committed: int = NO_EPOCH,
                 pending: Iterable[int] = ()) -> None:
        """``last_committed``: the newest epoch the restored checkpoint saw reported done;
        ``pending``: its epochs not reported done (both empty for a new job)."""
        self.table = table
        self.job_id = job_id
        self.last_committed = last_committed
        self.pending = frozenset(pending)
        #: the newest epoch we know the table holds for the job: committed or skipped by us,
        #: or found at start (rule 4)
        self._known = NO_EPOCH
        self._opened = False

    def opened(self, table_epoch: int) -> None:
        """The committer read the table's newest epoch for the job at its start (commit
        worker thread, before its first commit). Raises per rule 2."""
        newest_known = max(self.last_committed, max(self.pending, default=NO_EPOCH))
        if table_epoch > newest_known:
            raise CheckpointBehindTable(
                f"table {self.table}: it holds epoch {table_epoch} of job {self.job_id!r}, but "
                f"the checkpoint being restored knows epochs up to {newest_known} only (last "
                f"committed {self.last_committed}, pending {sorted(self.pending)}): the "
                f"checkpoint was reset or copied from an older run, or another job runs under "
                f"the same job id. Restore the newest checkpoint of this job, or start it under "
                f"a new job id", self.table, self.job_id, newest_known, table_epoch)
        if table_epoch < self.last_committed:
            raise TableBehindCheckpoint(
                f"table {self.table}: it holds epochs of job {self.job_id!r} up to "
                f"{table_epoch}, but the checkpoint being restored saw epoch "
                f"{self.last_committed} committed to it: the table was restored to an older "
                f"version, or the location holds another table", self.table, self.job_id,
                self.last_committed, table_epoch)
        self._known = table_epoch
        self._opened = True

    def decide(self, epoch: int, table_epoch: int, run_epoch: int) -> Decision:
        """Whether to commit ``epoch`` (commit worker thread, before each commit attempt),
        given the table's newest epoch for the job and the newest one our run committed, both
        read just now. Raises :class:`SecondWriter` (rules 3, 4)."""
        if not self._opened:
            raise RuntimeError("EpochFence.decide before opened()")
        ours = run_epoch >= epoch or epoch in self.pending
        if epoch <= table_epoch and not ours:
            raise SecondWriter(
                f"table {self.table}: epoch {epoch} of job {self.job_id!r} is in the table, "
                f"but neither this run nor the checkpoint it restored committed it (the table "
                f"holds up to epoch {table_epoch}): another job writes under the same job id. "
                f"Stop it, or give one of them another job id", self.table, self.job_id, epoch,
                table_epoch)
        newest_ours = max(self._known, max(self.pending, default=NO_EPOCH), run_epoch)
        if table_epoch > newest_ours:
            raise SecondWriter(
                f"table {self.table}: another writer commits under job id {self.job_id!r}: "
                f"the table holds epoch {table_epoch}, newer than any this job committed or "
                f"restored ({newest_ours}), while committing epoch {epoch}. Stop the other "
                f"job, or give one of them another job id", self.table, self.job_id, epoch,
                table_epoch)
        return ALREADY_COMMITTED if epoch <= table_epoch else COMMIT

    @property
    def known(self) -> int:
        """The newest epoch we know the table holds for the job."""
        return self._known

    def committed(self, epoch: int) -> None:
        """``epoch`` is in the table now (committed or skipped by :meth:`decide`)."""
        self._known = max(self._known, epoch)
