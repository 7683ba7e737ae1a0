"""The job runner's supervisor: the handle's thread that starts a job's query, watches it,
counts its batches and restarts it after a failure.

Rules (job.py's rules, as this loop keeps them):
  1. One query at a time on the job's checkpoint location: a new query starts only after
     the old one stopped; a failed query is restarted from the same checkpoints after the
     delay the restart strategy gives, and when it gives up the job raises
     :class:`~sparkcoord.spark.failures.JobGaveUp` (job.py rule 1). A global failure of the
     coordination (the current run's failure report) stops the query at the next read of the
     report (docs/decisions/044-quiet-failover.md).
  2. ``until`` is called on this thread after batches; its ``RunUnavailable`` while a restart
     is due or the query is starting means "not done yet", any other error stops the query
     and ends the job (job.py rule 2; docs/decisions/051-client-request-across-failover.md).
  3. The failure report is read every :data:`FAILURE_CHECK_S` when every source's checkpoint
     directory is local, every ``poll_s`` otherwise; batches, ``until`` and the timeout every
     ``poll_s`` (job.py rule 5; docs/decisions/084-failure-seen-fast.md).
  4. The lease is checked before each query starts, at each poll and after each failure; a
     lease taken over ends the job with ``LeaseLost``, a permanent sparkcoord error with
     ``JobGaveUp``: neither is retried (job.py rule 6).
  5. The batch count and the progress reports continue across restarts; once a query ended,
     the count agrees with Spark's commit log (job.py rule 4).

Thread model: every method here runs on the handle's thread ("sparkcoord-job"), except
``__init__`` (the driver program thread that starts the job).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from sparkcoord.core.lease import LeaseLost
from sparkcoord.core.text import plural
from sparkcoord.spark.failures import JobGaveUp, failure_text, permanent_error_in
from sparkcoord.spark.progress import RunReport, merge_progress
from sparkcoord.spark.requests import until_caller

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.listener import StreamingQueryProgress
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from sparkcoord.runtime.lease import LeaseKeeper
    from sparkcoord.runtime.restart import RestartStrategy
    from sparkcoord.spark.spec import SourceSpec

#: the job runner's logger (sparkcoord.spark.job): one name for the runner's modules
log = logging.getLogger("sparkcoord.spark.job")

#: rule 3: how often the job runner reads a local checkpoint directory's failure report
FAILURE_CHECK_S = 0.05


class _JobFailedInRun(Exception):
    """The handle found the run's failure report and stopped the query (handle thread)."""


class SupervisedJob(Protocol):
    """What the supervisor (and its handle) need of the job they run:
    :class:`~sparkcoord.spark.job.CoordinatedJob` is one. A protocol, so that neither this
    module nor handle.py imports job.py (which imports them)."""

    spark: SparkSession
    storage_options: dict[str, Any]
    _specs: dict[str, SourceSpec]

    @property
    def spark_checkpoint(self) -> str:
        """The query's checkpoint location."""
        ...

    def failure_cause(self) -> str | None:
        """The recorded cause of the current run's global failure, None if it has none."""
        ...

    def request(self, operator: str, request: Any, *, timeout_s: float = 30.0) -> Any:
        """Ask coordinator ``operator`` of the running job."""
        ...

    def _forget_failures(self) -> None: ...

    def _release_clients(self) -> None: ...


class Supervisor:
    """The loop of a job's handle (:class:`~sparkcoord.spark.handle.JobHandle` is one): its
    state, and the thread that starts, watches and restarts the job's query (rules 1-5)."""

    def __init__(self, job: SupervisedJob, writer: DataStreamWriter, strategy: RestartStrategy,
                 until: Callable[[], bool] | None, poll_s: float, timeout_s: float | None,
                 on_failure: Callable[[str], None] | None,
                 lease: LeaseKeeper | None = None) -> None:
        self.job = job
        #: the job's leases (rule 4), released as the handle's thread ends
        self._lease = lease
        self.report = RunReport()
        self.query: Any = None
        self._writer = writer
        self._strategy = strategy
        self._until = until
        self._poll_s = poll_s
        self._timeout_s = timeout_s
        self._on_failure = on_failure
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._last_counted = -1  # the highest batch id counted in the current query
        # the count and the newest commit log entry as the current query started
        self._counted_before = 0
        self._committed_before: int | None = None
        # progress across restarts (docs/decisions/055-job-handle.md). Under _progress_lock:
        # the current or last query, its (id, runId, name), the reports of the queries before it
        # (merged) and its own reports as last polled. _phase: the status message while no query
        # runs.
        self._progress_lock = threading.Lock()
        self._last_query: Any = None
        self._query_info: tuple[str | None, str | None, str | None] = (None, None, None)
        self._earlier_progress: list[StreamingQueryProgress] = []
        self._polled_progress: list[StreamingQueryProgress] = []
        self._phase = "Starting the query"
        self._thread = threading.Thread(target=self._main, name="sparkcoord-job", daemon=True)

    # ---------------------------------------------------------------- handle thread
    def _main(self) -> None:
        try:
            # Spark resolves a sink's format (a Python data source the user registered, too)
            # through the JVM thread's active session; this thread has none of its own yet
            spark: Any = self.job.spark
            jsession = getattr(spark, "_jsparkSession", None)  # classic PySpark only
            if jsession is not None:
                spark._jvm.SparkSession.setActiveSession(jsession)
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - handed to await_termination
            self._error = exc
        finally:
            self.job._release_clients()
            if self._lease is not None:
                self._lease.stop()

    def _loop(self) -> None:
        from pyspark.errors import StreamingQueryException

        job, report = self.job, self.report
        deadline = None if self._timeout_s is None else time.monotonic() + self._timeout_s
        while not self._stop.is_set():
            if self._lease is not None:
                # rule 4: nothing written, no query started, on a lease another run took over
                self._lease.check()
            job._forget_failures()
            self._last_counted = -1
            self._counted_before = report.batches
            self._committed_before = self._newest_commit()
            query = self._writer.option("checkpointLocation", job.spark_checkpoint).start()
            self._query_started(query)
            log.info("query %s started on %s%s", query.id, job.spark_checkpoint,
                     f" (restart {report.restarts})" if report.restarts else "")
            # rule 3: the failure report is read every wait; the rest every poll_s
            wait_s, waits_per_poll = self._waits()
            try:
                for waited in itertools.count(1):
                    # seconds, a float: PySpark's hint says int, its code takes any number
                    if query.awaitTermination(wait_s):  # type: ignore[arg-type]
                        self._count_batches(query)
                        log.info("query %s ended by itself after %d batches in all", query.id,
                                 report.batches)
                        return  # ended by itself (availableNow, or stopped by Spark)
                    if waited % waits_per_poll == 0:
                        self._count_batches(query)
                        try:
                            done = self._stop.is_set() or self._until_done(query)
                        except BaseException:
                            # until() ends the job with its error: the query must not run
                            # on after the job ended
                            query.stop()
                            self._count_batches(query)
                            raise
                        if done:
                            query.stop()
                            self._count_batches(query)
                            return
                        if deadline is not None and time.monotonic() > deadline:
                            query.stop()
                            self._count_batches(query)
                            raise TimeoutError(f"job not done after {self._timeout_s}s; "
                                               f"failures so far: {report.failures}")
                    if self._lease is not None and self._lease.lost is not None:
                        log.error("%s", self._lease.lost)  # rule 4: another run has the job
                        query.stop()
                        self._count_batches(query)
                        raise LeaseLost(self._lease.lost)
                    cause = job.failure_cause()
                    if cause is not None:
                        # The job failed in sparkcoord: stop the query now, as Flink cancels
                        # a failed job's tasks. Its refused tasks are waiting for this
                        # (cancel_wait_s): Spark logs each cancelled task in one line and
                        # retries none, instead of a traceback per attempt
                        # (docs/decisions/044-quiet-failover.md).
                        log.info("the job failed; stopping query %s to restart it", query.id)
                        query.stop()
                        raise _JobFailedInRun(cause)
            except (StreamingQueryException, _JobFailedInRun) as exc:
                self._count_batches(query)
                # sparkcoord's cause first: the service's record of a global failure, else
                # our exception raised in a task (Spark's text follows it), else Spark's text
                cause = job.failure_cause() or failure_text(str(exc))
                report.failures.append(cause)
                self._phase = f"Query failed: {(cause.strip().splitlines() or [''])[0]}"
                self.query = None
                if self._on_failure is not None:
                    self._on_failure(cause)
                self._give_up_if_permanent(cause, exc)
                delay = self._strategy.next_delay(time.monotonic())
                if delay is None:
                    spark_first = ([] if isinstance(exc, _JobFailedInRun)
                                   else str(exc).strip().splitlines()[:1])
                    log.error("query failed %s and the restart strategy gave up: %s",
                              plural(len(report.failures), "time"),
                              (cause.strip().splitlines() or [""])[0])
                    raise JobGaveUp(
                        f"{cause}\n\nThe query failed {plural(len(report.failures), 'time')} and "
                        f"the restart strategy gave up; the cause above is the last failure"
                        + (f". Spark reported: {spark_first[0]}" if spark_first
                           and spark_first[0] not in cause else "")) from exc
                log.warning("query failed, restarting in %.1fs: %s", delay,
                            (cause.strip().splitlines() or [""])[0])
                self._phase = (f"Restarting in {delay:.1f} s after failure "
                               f"{len(report.failures)}: "
                               f"{(cause.strip().splitlines() or [''])[0]}")
                report.restarts += 1
                if self._stop.wait(delay):
                    return
                self._phase = f"Restarting the query (restart {report.restarts})"

    def _give_up_if_permanent(self, cause: str, exc: BaseException) -> None:
        """Rule 4, after a query failed (handle thread): a lease another run took over raises
        :class:`LeaseLost` (whatever the failure looked like: the fenced run fails with the
        lease's text, or with a symptom of the two runs); a cause that is a permanent
        sparkcoord error raises :class:`JobGaveUp` without a restart."""
        first = (cause.strip().splitlines() or [""])[0]
        if self._lease is not None:
            try:
                self._lease.check()
            except LeaseLost as lost:
                log.error("%s", lost)
                raise LeaseLost(f"{lost}\n\n(the query failed with: {first})") from exc
        permanent = permanent_error_in(cause)
        if permanent is None and not isinstance(exc, _JobFailedInRun):
            permanent = permanent_error_in(str(exc))
        if permanent is not None:
            log.error("query failed with %s, which a restart cannot change: %s", permanent,
                      first)
            raise JobGaveUp(f"{cause}\n\nThe query failed with {permanent}, which a restart "
                            f"cannot change, so it was not restarted") from exc

    def _waits(self) -> tuple[float, int]:
        """How long the handle thread waits on the query between reads of the failure report,
        and how many such waits make one ``poll_s`` (rule 3): a local checkpoint directory's
        report is one failed ``open`` to read, so it is read every ``FAILURE_CHECK_S``; a
        remote one (a request to a store) every ``poll_s``."""
        from sparkcoord.runtime.files import is_local_url

        if self._poll_s <= FAILURE_CHECK_S or not all(
                is_local_url(spec.checkpoint_url) and not spec.storage_options
                for spec in self.job._specs.values()):
            return self._poll_s, 1
        waits = max(1, round(self._poll_s / FAILURE_CHECK_S))
        return self._poll_s / waits, waits

    def _until_done(self, query: Any) -> bool:
        """Whether ``until()`` says the job is done (handle thread, at each poll).

        A client request in ``until`` that no run could take (:class:`RunUnavailable`) means
        "not done yet" while a restart is due (the run failed, or the query ended) or the query
        is starting (it has run no batch yet): the loop then restarts the query, or gives up
        with the failure's own cause. Anything else ``until`` raises ends the job
        (docs/decisions/051-client-request-across-failover.md).
        """
        from sparkcoord.core.errors import RunUnavailable

        if self._until is None:
            return False
        until_caller.handle, until_caller.query = self, query
        try:
            return bool(self._until())
        except RunUnavailable as exc:
            if not (self._restart_due(query) or self._last_counted < 0):
                raise
            log.info("until(): not done yet, the job is %s: %s",
                     "starting" if self._last_counted < 0 else "failing over",
                     (str(exc).splitlines() or [""])[0])
            return False
        finally:
            until_caller.handle = until_caller.query = None

    def _restart_due(self, query: Any) -> bool:
        """Whether the current query is to be restarted (or the job stopped) rather than asked:
        its run failed in sparkcoord, or it ended (handle thread)."""
        if self._stop.is_set() or query is None:
            return True
        try:
            if not query.isActive:
                return True
        except Exception:  # noqa: BLE001 - a query that cannot say is not running
            return True
        return self.job.failure_cause() is not None

    def _query_started(self, query: Any) -> None:
        """``query`` was started, the first or a restart (handle thread): it becomes the
        current query; the reports of the one before join the earlier ones."""
        info: list[str | None] = []
        for attribute in ("id", "runId", "name"):
            try:
                value = getattr(query, attribute)
            except Exception:  # noqa: BLE001 - informational (a lost Connect channel)
                value = None
            info.append(None if value is None else str(value))
        with self._progress_lock:
            self._earlier_progress = merge_progress(self._earlier_progress
                                                    + self._polled_progress)
            self._polled_progress = []
            self._last_query = self.query = query
            self._query_info = (info[0], info[1], info[2])
        if info[0] is not None:
            self.report.id = info[0]
        if info[1] is not None:
            self.report.runIds.append(info[1])

    def _count_batches(self, query: Any) -> None:
        # Spark keeps the last 100 progress reports; polled every poll_s, none is missed. A
        # report counts if it ran a batch (an idle trigger reports the next batch id with no
        # addBatch); batch ids only grow within a query, so a high-water mark dedups.
        try:
            progress = list(query.recentProgress)
        except Exception:  # noqa: BLE001 - progress is informational
            return
        with self._progress_lock:
            if query is self._last_query:
                self._polled_progress = progress
                self.report.recentProgress = merge_progress(self._earlier_progress + progress)
        for p in progress:
            batch = p.batchId
            if batch > self._last_counted and "addBatch" in (p.durationMs or {}):
                self.report.batches += 1
                self._last_counted = batch
        try:
            ended = not query.isActive
        except Exception:  # noqa: BLE001 - a query that cannot say is not running
            ended = True
        if ended:
            # A query stopped between a batch's commit log entry and its progress report
            # never reports that batch: once it ended, its commit log has the last word
            # (every batch a query ran committed once, and a batch re-run after a failure
            # is counted by the query that committed it).
            newest = self._newest_commit()
            if newest is not None:
                ran = newest - (-1 if self._committed_before is None else self._committed_before)
                self.report.batches = max(self.report.batches, self._counted_before + ran)

    def _newest_commit(self) -> int | None:
        """The newest batch id in Spark's commit log, None if there is none or it cannot be
        listed (handle thread, as a query starts and after it ended)."""
        from sparkcoord.runtime.files import files_for

        try:
            files, root = files_for(f"{self.job.spark_checkpoint}/commits",
                                    self.job.storage_options)
            ids = [int(name) for name in files.names(root) if name.isdigit()]
        except Exception:  # noqa: BLE001 - the count is informational
            return None
        return max(ids) if ids else None
