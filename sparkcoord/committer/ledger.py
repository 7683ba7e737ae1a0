"""The commit ledger: what each committed batch produced, until its commit is done.

A *commit* is a side effect that must happen once per batch that committed in Spark and only
after it did: publish a manifest of the files a batch read, commit a table transaction of the
files a batch wrote (Flink's sink committer, Hudi's and Iceberg's commit on checkpoint). The
ledger decides what to commit and when; a :class:`~sparkcoord.committer.worker.CommitWorker`
runs the commits. It lives inside a coordinator and is confined to its mailbox.

Rules:
  1. What a batch produced is recorded while the batch of epoch N runs, from the coordinator's
     logged inputs only (a request, an event), so a restore that replays the batch's log
     records it again and a retry that withdraws an input takes its item out again.
  2. When the batch of N commits in Spark (``notify_checkpoint_complete``), what it produced
     becomes the pending commit of N and a command to commit it goes out. Commits go out in
     epoch order; an epoch that produced nothing has no commit. A commit notified again (a
     restore notifies its committed epoch again) is not issued twice by one ledger.
  3. A commit stays pending until the committer reported it done. Every checkpoint taken
     meanwhile holds it, so a restore issues it again: the committer may be called again for
     an epoch it already committed (a driver killed after the commit and before the report),
     and must be idempotent per epoch. Nothing is ever dropped unreported.
  4. Checkpoint ids only grow: a batch committed before the newest one already committed, or
     a snapshot for an epoch not newer than the last, is an error naming both.

Thread model: none; the owner confines a ledger to one thread (a coordinator's mailbox).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkcoord.core.encoding import encoded
from sparkcoord.core.errors import CheckpointIdRegression


@dataclass(frozen=True)
class Commit:
    """A command: run the commit of ``epoch`` with what its batch produced."""

    epoch: int
    items: tuple[Any, ...]


@encoded("committer.LedgerState")
@dataclass
class LedgerState:
    """The checkpointed part of a ledger: commits not yet reported done, by epoch."""

    pending: dict[int, tuple[Any, ...]] = field(default_factory=dict)


class CommitLedger:
    """What each batch produced and which commits are not done yet (rules 1-4)."""

    def __init__(self, state: LedgerState | None = None) -> None:
        """A ledger restored from ``state`` (``None``: a fresh one). The caller issues
        :meth:`restored` commands once its coordinator started."""
        self._pending: dict[int, tuple[Any, ...]] = dict(state.pending) if state else {}
        #: items of the batch that runs now (rule 1), in the order they were produced
        self._running: list[Any] = []
        #: the newest epoch whose batch committed (rule 2's "not twice"), and the newest
        #: snapshot epoch (rule 4)
        self._committed = max(self._pending, default=-1)
        self._snapshot = -1
        #: epochs handed out as commands and not reported done (not issued again meanwhile)
        self._issued: set[int] = set()

    # ------------------------------------------------------------------ inputs (facts)
    def item_produced(self, item: Any) -> None:
        """The running batch produced ``item`` (a logged input of the coordinator said so)."""
        self._running.append(item)

    def item_withdrawn(self, item: Any) -> None:
        """A retry withdrew the input that produced ``item`` (rule 1): it is not in the batch's
        output. Raises if the running batch did not produce it."""
        try:
            self._running.remove(item)
        except ValueError:
            raise ValueError(f"commit ledger: {item!r} was withdrawn but the running batch "
                             f"did not produce it") from None

    def checkpoint_taken(self, epoch: int) -> LedgerState:
        """Checkpoint ``epoch`` is being taken (its snapshot): the state to keep in it. The
        running batch's items are not in it: the batch of ``epoch`` produces them, after the
        snapshot, from logged inputs (rule 1)."""
        if epoch <= self._snapshot:
            raise CheckpointIdRegression("commit ledger: checkpoint taken", epoch, self._snapshot)
        self._snapshot = epoch
        return LedgerState(dict(self._pending))

    def batch_committed(self, epoch: int) -> list[Commit]:
        """The batch of ``epoch`` committed in Spark: the commits to run now (rule 2)."""
        if epoch < self._committed:
            raise CheckpointIdRegression("commit ledger: batch committed (or the one before "
                                         "it again)", epoch, self._committed - 1)
        if epoch == self._committed and epoch in self._pending:
            return self._issue()  # notified again (a restore): pending ones not yet issued
        self._committed = epoch
        if self._running:
            self._pending[epoch] = tuple(self._running)
        self._running = []
        return self._issue()

    def commit_done(self, epoch: int) -> None:
        """The committer reported the commit of ``epoch`` done (rule 3)."""
        self._pending.pop(epoch, None)
        self._issued.discard(epoch)

    def commit_failed(self, epoch: int) -> list[Commit]:
        """The committer gave up on this attempt of ``epoch``'s commit: issue it again."""
        self._issued.discard(epoch)
        return self._issue()

    def restored(self) -> list[Commit]:
        """The coordinator started from a restored state: every pending commit, in epoch
        order (rule 3)."""
        return self._issue()

    # ------------------------------------------------------------------ queries
    @property
    def pending_epochs(self) -> list[int]:
        """Epochs whose commit is not reported done, oldest first."""
        return sorted(self._pending)

    def pending_items(self) -> list[tuple[Any, ...]]:
        """What each pending commit holds, oldest epoch first."""
        return [self._pending[epoch] for epoch in sorted(self._pending)]

    @property
    def running(self) -> tuple[Any, ...]:
        """What the running batch produced so far, in order."""
        return tuple(self._running)

    def _issue(self) -> list[Commit]:
        out = [Commit(epoch, self._pending[epoch]) for epoch in sorted(self._pending)
               if epoch not in self._issued]
        self._issued.update(c.epoch for c in out)
        return out
