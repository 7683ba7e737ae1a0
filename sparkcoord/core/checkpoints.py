"""Checkpoint bookkeeping across the coordinators of one job.

Rules:
  1. Checkpoints are strictly sequential: checkpoint N+1 is triggered only after the batch of
     the last sealed epoch has committed, and ids only increase.
  2. A checkpoint is ready to seal when every coordinator has completed its future for it. A
     decline (failed future) or a timeout aborts it for every coordinator.
  3. After ``tolerable_failures`` aborted checkpoints in a row, the next abort fails the job.
     A sealed checkpoint resets that count.
  4. Completions for a checkpoint that is no longer pending are ignored (late futures).

Theory of operation: the tracker never calls anyone. Each input returns what happened as a
value (``True`` when the checkpoint is now ready, a :class:`CheckpointAbort` when it must be
aborted) and the runtime acts on it: it asks every coordinator's valve to re-hold its cut,
notifies ``notify_checkpoint_aborted`` and, if ``fail_job`` is set, fails the job.

Thread model: none; the runtime calls it under the coordination service's lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sparkcoord.core.errors import CheckpointIdRegression, IllegalTransition
from sparkcoord.core.ids import NO_EPOCH
from sparkcoord.core.text import plural


@dataclass(frozen=True, slots=True)
class CheckpointAbort:
    """Command: abort ``checkpoint_id`` everywhere; if ``fail_job`` is set, fail the job."""

    checkpoint_id: int
    reason: str
    fail_job: str | None


class CheckpointTracker:
    """Which checkpoint is in flight, who has completed it, and the decline streak."""

    def __init__(self, coordinators: Iterable[str], tolerable_failures: int = 0,
                 last_sealed: int = NO_EPOCH, last_committed: int = NO_EPOCH) -> None:
        self.coordinators = tuple(coordinators)
        if not self.coordinators:
            raise ValueError("a job needs at least one coordinator")
        if len(set(self.coordinators)) != len(self.coordinators):
            raise ValueError(f"coordinator names must be unique: {self.coordinators}")
        if tolerable_failures < 0:
            raise ValueError(f"tolerable_failures must be >= 0, got {tolerable_failures}")
        self.tolerable_failures = tolerable_failures
        self.last_triggered = last_sealed
        self.last_sealed = last_sealed
        self.last_committed = last_committed
        self.consecutive_failures = 0
        self._pending: int | None = None
        self._snapshots: dict[str, bytes | None] = {}

    @property
    def pending(self) -> int | None:
        """The id of the checkpoint in flight, if any."""
        return self._pending

    def checkpoint_triggered(self, checkpoint_id: int) -> None:
        """The service decided to take checkpoint ``checkpoint_id``."""
        if checkpoint_id <= self.last_triggered:
            raise CheckpointIdRegression("trigger", checkpoint_id, self.last_triggered)
        if self._pending is not None:
            raise IllegalTransition(
                f"checkpoint {checkpoint_id} triggered while checkpoint {self._pending} is "
                "still in flight (checkpoints are strictly sequential)")
        if self.last_sealed != self.last_committed:
            raise IllegalTransition(
                f"checkpoint {checkpoint_id} triggered before the batch of epoch "
                f"{self.last_sealed} committed (last committed: {self.last_committed})")
        self._pending = checkpoint_id
        self.last_triggered = checkpoint_id
        self._snapshots = {}

    def coordinator_completed(self, name: str, checkpoint_id: int,
                              snapshot: bytes | None) -> bool:
        """Coordinator ``name`` completed its future for ``checkpoint_id``.

        Returns True when this completion makes the checkpoint ready to seal. A completion of a
        checkpoint that is not in flight (aborted, or never triggered) returns False.
        """
        self._check_name(name)
        if checkpoint_id != self._pending:
            return False
        if name in self._snapshots:
            raise IllegalTransition(
                f"coordinator {name!r} completed checkpoint {checkpoint_id} twice")
        self._snapshots[name] = snapshot
        return len(self._snapshots) == len(self.coordinators)

    def waiting_for(self) -> list[str]:
        """The coordinators that have not completed the pending checkpoint yet."""
        if self._pending is None:
            return []
        return [name for name in self.coordinators if name not in self._snapshots]

    def snapshots(self, checkpoint_id: int) -> dict[str, bytes | None]:
        """The snapshots of a checkpoint that is ready to seal."""
        if checkpoint_id != self._pending or len(self._snapshots) != len(self.coordinators):
            raise IllegalTransition(f"checkpoint {checkpoint_id} is not ready to seal")
        return dict(self._snapshots)

    def coordinator_declined(self, name: str, checkpoint_id: int,
                             reason: str) -> CheckpointAbort | None:
        """Coordinator ``name`` failed its future for ``checkpoint_id``."""
        self._check_name(name)
        return self._abort(checkpoint_id, f"coordinator {name!r} declined checkpoint "
                                          f"{checkpoint_id}: {reason}")

    def checkpoint_timed_out(self, checkpoint_id: int, timeout_s: float) -> CheckpointAbort | None:
        """The checkpoint's timeout passed before every coordinator completed it."""
        missing = [n for n in self.coordinators if n not in self._snapshots]
        return self._abort(checkpoint_id, f"checkpoint {checkpoint_id} timed out after "
                                          f"{timeout_s}s waiting for {missing}")

    def checkpoint_sealed(self, checkpoint_id: int) -> None:
        """The record of ``checkpoint_id`` is durable."""
        self.snapshots(checkpoint_id)  # validates
        self._pending = None
        self._snapshots = {}
        self.last_sealed = checkpoint_id
        self.consecutive_failures = 0

    def batch_committed(self, epoch: int) -> bool:
        """Spark committed the batch of ``epoch``. Returns False if it was already known."""
        if epoch == self.last_committed:
            return False
        if epoch < self.last_committed:
            raise CheckpointIdRegression("commit", epoch, self.last_committed)
        if epoch != self.last_sealed:
            raise IllegalTransition(
                f"commit of epoch {epoch}, but the last sealed epoch is {self.last_sealed}")
        self.last_committed = epoch
        return True

    def _abort(self, checkpoint_id: int, reason: str) -> CheckpointAbort | None:
        if checkpoint_id != self._pending:
            return None
        if len(self._snapshots) == len(self.coordinators):
            return None  # every coordinator completed: the seal is under way, too late to abort
        self._pending = None
        self._snapshots = {}
        self.consecutive_failures += 1
        fail = None
        if self.consecutive_failures > self.tolerable_failures:
            fail = (f"{plural(self.consecutive_failures, 'checkpoint')} failed in a row, more "
                    f"than the {self.tolerable_failures} tolerated "
                    f"(ServiceConfig.tolerable_checkpoint_failures); last: {reason}")
        return CheckpointAbort(checkpoint_id, reason, fail)

    def _check_name(self, name: str) -> None:
        if name not in self.coordinators:
            raise IllegalTransition(f"unknown coordinator {name!r}; known: {self.coordinators}")
