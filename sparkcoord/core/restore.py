"""Where a run starts from: the restore point, learned from Spark's first driver call.

Rules (docs/protocol.md [restore-point-from-first-driver-call] [restore-order]
[committed-restore-replays-the-log] [rerun-keeps-answered-histories]):
  1. The restore point is the newest epoch Spark has logged, and only Spark's first
     ``latestOffset`` or ``partitions`` call of a run tells it:
     ``latestOffset(start=end(N))`` means the batch of epoch N committed;
     ``partitions(end(N-1), end(N))`` means epoch N is logged but its batch did not commit.
  2. ``initialOffset()`` decides nothing: after a crash inside the first batch Spark calls it
     before ``partitions``.
  3. Restore: coordinators are reset to snapshot N (or to nothing when N is -1). If N
     committed, the surviving events of inbound log N are handed to them again, in log order;
     if not, inbound log N is truncated durably before anything else. Records newer than N
     are garbage that the next seal overwrites.

Thread model: none.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkcoord.core.errors import IllegalTransition
from sparkcoord.core.ids import NO_EPOCH


@dataclass(frozen=True, slots=True)
class RestorePoint:
    """The newest epoch Spark has logged, and whether its batch committed."""

    epoch: int
    committed: bool

    @property
    def replays_inbound_log(self) -> bool:
        """Whether the inbound log of ``epoch`` is replayed (else it is truncated)."""
        return self.committed and self.epoch != NO_EPOCH


FRESH = RestorePoint(NO_EPOCH, committed=True)


class RestorePointDetector:
    """Learns the restore point from the first decisive driver call of a run."""

    def __init__(self) -> None:
        self.point: RestorePoint | None = None

    def initial_offset_requested(self) -> RestorePoint | None:
        """Spark asked for the initial offset. Decides nothing; returns the known point."""
        return self.point

    def latest_offset_requested(self, start_epoch: int) -> tuple[RestorePoint, bool]:
        """Spark asked for the next offset after ``start_epoch``.

        Returns the restore point and whether this call decided it (the run's first call).
        """
        if self.point is None:
            self.point = RestorePoint(start_epoch, committed=True)
            return self.point, True
        return self.point, False

    def partitions_requested(self, start_epoch: int, end_epoch: int) -> tuple[RestorePoint, bool]:
        """Spark planned the batch (start_epoch, end_epoch]."""
        if end_epoch <= start_epoch:
            raise IllegalTransition(
                f"partitions requested for an empty range: start epoch {start_epoch}, "
                f"end epoch {end_epoch}")
        if self.point is None:
            self.point = RestorePoint(end_epoch, committed=False)
            return self.point, True
        return self.point, False
