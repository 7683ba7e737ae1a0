"""What a caller holds while a coordinated job runs: :class:`JobHandle`, the job told in the
names of Spark's ``StreamingQuery``, for the whole job across its restarts.

Rules:
  1. The handle's id, progress and failures continue across restarts
     (job.py rule 4; docs/decisions/055-job-handle.md); ``runId``, ``name`` and ``status`` are
     the current query's, or the last one's between a failure and its restart.
  2. Every method here may be called from any thread; only the progress and status ask
     Spark, and a query that cannot answer (a stopped session, a lost Connect channel) is
     told from what the handle's thread last polled.

Thread model: any thread of the driver program; the handle's own thread
(:class:`~sparkcoord.spark.supervisor.Supervisor`) writes what is read here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkcoord.spark.progress import merge_progress
from sparkcoord.spark.supervisor import Supervisor

if TYPE_CHECKING:
    from pyspark.sql.streaming.listener import StreamingQueryProgress


class JobHandle(Supervisor):
    """A coordinated job running in the background (:meth:`CoordinatedJob.start`).

    Thread model: one daemon thread per handle ("sparkcoord-job") starts the query, watches
    it, counts its batches and restarts it; every method here may be called from any thread.
    ``query`` is the current ``StreamingQuery`` (a restart replaces it; None before the first
    start and between a failure and its restart).

    What a ``StreamingQuery`` tells, the handle tells for the whole job, under the same names:
    ``id`` (the same for every restart), ``runId`` and ``name`` (of the current or last
    query), ``recentProgress`` and ``lastProgress`` (across restarts) and ``status`` (the
    current query's, or a dict in the same shape while the job starts, restarts or after it
    ended).
    """

    # ------------------------------------------------------------------- any thread
    @property
    def restarts(self) -> int:
        """Restarts so far."""
        return self.report.restarts

    @property
    def failures(self) -> list[str]:
        """The cause of every query failure so far (sparkcoord's cause where known)."""
        return list(self.report.failures)

    @property
    def last_failure(self) -> str | None:
        return self.report.failures[-1] if self.report.failures else None

    @property
    def running(self) -> bool:
        """Whether the job is still running (or restarting)."""
        return self._thread.is_alive()

    @property
    def id(self) -> str | None:
        """Spark's id of the job's query: it persists across restarts from the job's checkpoint
        (every query the job starts has it), as ``StreamingQuery.id``. None until the first
        query started. Any thread; no call into Spark."""
        return self._query_info[0]

    @property
    def runId(self) -> str | None:
        """Spark's ``runId`` of the current query, or of the last one between a failure and
        its restart and after the job ended: each start (and restart) gets a new one
        (``report.runIds`` lists them all). None until the first query started. Any thread;
        no call into Spark."""
        return self._query_info[1]

    @property
    def name(self) -> str | None:
        """The query's name (``writeStream.queryName(...)``), None if it has none or before the
        first query started. Any thread; no call into Spark."""
        return self._query_info[2]

    @property
    def recentProgress(self) -> list[StreamingQueryProgress]:
        """The newest progress reports of the job's queries, at most 100, oldest first: those
        of the queries before a restart, then the current (or last) query's, one per
        (runId, batchId) (an idle trigger's report of the next batch id gives way to that
        batch's). The current query is asked now (``StreamingQuery.recentProgress``); if it
        cannot answer, its reports as the handle last polled them. ``report.recentProgress``
        holds the same as of the last poll. Any thread (a call into Spark)."""
        with self._progress_lock:
            query, earlier, polled = (self._last_query, self._earlier_progress,
                                      self._polled_progress)
        current = polled
        if query is not None:
            try:
                current = list(query.recentProgress)
            except Exception:  # noqa: BLE001 - a stopped session, a lost Connect channel
                current = polled
        return merge_progress(earlier + current)

    @property
    def lastProgress(self) -> StreamingQueryProgress | None:
        """The newest progress report of the job's queries (of the current query once it
        reported one, else of an earlier one), None before any; as
        ``StreamingQuery.lastProgress``. Any thread (a call into Spark)."""
        with self._progress_lock:
            query, earlier, polled = (self._last_query, self._earlier_progress,
                                      self._polled_progress)
        newest = None
        if query is not None:
            try:
                newest = query.lastProgress
            except Exception:  # noqa: BLE001 - a stopped session, a lost Connect channel
                newest = polled[-1] if polled else None
        if newest is None and earlier:
            newest = earlier[-1]
        return newest

    @property
    def status(self) -> dict[str, Any]:
        """The current query's status (``StreamingQuery.status``: ``message``,
        ``isDataAvailable``, ``isTriggerActive``) while the job runs one; otherwise a dict of
        the same keys whose ``message`` says what the job does: ``Starting the query``,
        ``Query failed: <cause's first line>``, ``Restarting in <s> s after failure <n>:
        ...``, ``Restarting the query (restart <n>)``, and once the job ended ``Stopped`` (or
        ``Stopped: <the error it ended with>``). Any thread (a call into Spark)."""
        query = self.query
        if query is not None and self._thread.is_alive():
            try:
                return dict(query.status)
            except Exception:  # noqa: BLE001 - stopped meanwhile: the job's own word below
                pass
        if self._thread.is_alive():
            message = self._phase
        elif self._error is None:
            message = "Stopped"
        else:
            first = (str(self._error).strip().splitlines() or [""])[0]
            message = f"Stopped: {type(self._error).__name__}: {first}"
        return {"message": message, "isDataAvailable": False, "isTriggerActive": False}

    def exception(self) -> BaseException | None:
        """The error the job ended with (``JobGaveUp``, ``TimeoutError``, ...), if it ended so."""
        return self._error

    def request(self, operator: str, request: Any, *, timeout_s: float = 30.0) -> Any:
        """Ask coordinator ``operator`` of this running job: :meth:`CoordinatedJob.request`.
        Any thread."""
        return self.job.request(operator, request, timeout_s=timeout_s)

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the query (and any pending restart) and wait for the job to end. Any thread."""
        self._stop.set()
        self._thread.join(timeout_s)

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait until the job ended, at most ``timeout_s``; whether it ended. Raises the error
        it ended with, like ``StreamingQuery.awaitTermination``. Any thread."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        if self._error is not None:
            raise self._error
        return True
