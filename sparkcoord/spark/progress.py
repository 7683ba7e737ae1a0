"""A job's progress across its queries: the report the job runner keeps, and the merge of the
progress reports of its queries.

Rules:
  1. The report's id, progress and batch count continue across restarts (job.py rule 4;
     docs/decisions/055-job-handle.md).
  2. Progress reports are kept one per (runId, batchId), the newest of each, at most
     :data:`PROGRESS_KEPT`, oldest first.

Thread model: the job handle's thread (sparkcoord-job) writes a :class:`RunReport` at each
poll; any thread reads it. :func:`merge_progress` is a pure function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.streaming.listener import StreamingQueryProgress

#: progress reports a JobHandle keeps across the job's queries (Spark keeps 100 per query:
#: ``spark.sql.streaming.numRecentProgressUpdates``)
PROGRESS_KEPT = 100


@dataclass
class RunReport:
    """What happened in :meth:`CoordinatedJob.run` (or so far, on a :class:`JobHandle`).

    Written by the handle's thread at each poll; read from any thread. ``id``, ``runIds`` and
    ``recentProgress`` carry Spark's names (``StreamingQuery``'s) across the job's queries."""

    #: query restarts after failures
    restarts: int = 0
    #: the cause of each failure, sparkcoord's own where known, else Spark's error text
    failures: list[str] = field(default_factory=list)
    #: micro-batches the queries ran (from their progress reports; not capped at Spark's 100)
    batches: int = 0
    #: Spark's id of the job's query: the same for every restart from the job's checkpoint
    #: (None until the first query started)
    id: str | None = None
    #: Spark's ``runId`` of each query the job started, in order (a restart adds one)
    runIds: list[str] = field(default_factory=list)
    #: the newest progress reports (at most 100) of all the job's queries, oldest first, one
    #: per (runId, batchId); as of the handle's last poll (left out of the repr: long)
    recentProgress: list[StreamingQueryProgress] = field(default_factory=list, repr=False)

    @property
    def lastProgress(self) -> StreamingQueryProgress | None:
        """The newest of :attr:`recentProgress`, None if no query reported progress yet."""
        return self.recentProgress[-1] if self.recentProgress else None


def merge_progress(reports: Sequence[StreamingQueryProgress]) -> list[StreamingQueryProgress]:
    """``reports`` (oldest first) with one report per (runId, batchId), the newest of each
    (an idle trigger reports the next batch id again, until that batch runs), at most the
    newest :data:`PROGRESS_KEPT`. Any thread (a pure function)."""
    seen: set[tuple[Any, int]] = set()  # (a UUID, a batch id)
    out: list[StreamingQueryProgress] = []
    for p in reversed(reports):
        key = (p.runId, p.batchId)
        if key in seen:
            continue
        seen.add(key)
        out.append(p)
        if len(out) == PROGRESS_KEPT:
            break
    out.reverse()
    return out
