"""The job runner: builds coordinated sources and runs a query under a restart strategy.

Rules:
  1. A job runs one query at a time on its checkpoint directory. The handle's thread starts
     it, polls it, and after a failure restarts it from the same checkpoints (Spark's and
     sparkcoord's) as the restart strategy allows; a new query starts only after the old one
     stopped. A global failure of the coordination (``last-failure.json`` of the current run)
     stops the query at the next poll (docs/decisions/044-quiet-failover.md); when the strategy
     gives up, the job raises :class:`JobGaveUp` with every cause.
  2. ``until`` is checked on the handle's thread after batches; it raising ``RunUnavailable``
     (a request while the job fails over) means "not done yet"
     (docs/decisions/051-client-request-across-failover.md), any other error stops the query and
     is the job's failure.
  3. A client request (:meth:`CoordinatedJob.request`) goes to the run that ``channel.json``
     names, one at a time per driver program, with a number kept when it is re-sent to the
     next run: the service logs it before the coordinator sees it and answers a re-send from
     its log, so it takes effect once (docs/protocol.md [client-requests-take-effect-once]).
  4. The handle's id, progress and batch count continue across restarts
     (docs/decisions/055-job-handle.md); the batch count agrees with Spark's commit log once a
     query ended.
  5. A run's failure report is read every ``FAILURE_CHECK_S`` (50 ms) when every source's
     checkpoint directory is local (a failed ``open``), every ``poll_s`` otherwise (a store
     request); batches, ``until`` and the timeout are looked at every ``poll_s``. A
     ``fail_job`` thus stops and restarts the query within ~50 ms of its report, whatever
     ``poll_s`` (default 0.5 s) is (docs/decisions/084-failure-seen-fast.md).
  6. One driver program at a time runs a job on its checkpoint location: ``start`` takes the
     lease of every coordinated source's directory before the first query starts, and raises
     :class:`~sparkcoord.core.lease.LeaseHeld` naming the holder when another program has
     it (runtime/lease.py rule 1); the handle keeps the lease across restarts and releases
     it as the job ends. A lease found taken over, before a query starts, at a poll or after
     a failure, ends the job with :class:`~sparkcoord.core.lease.LeaseLost`, and a failure
     whose cause is a permanent sparkcoord error (``SparkCoordError.permanent``: a refusal
     that no restart changes) ends it with :class:`JobGaveUp` at once: neither is retried.

Thread model: the user's driver program thread. The coordination itself runs in Spark's source
runner process; this side only starts, watches and restarts the query.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkcoord.coordinator import CoordinatorProvider
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.encoding import loads
from sparkcoord.core.errors import SparkCoordError
from sparkcoord.core.lease import DEFAULT_TTL_S, LeaseLost
from sparkcoord.core.text import plural
from sparkcoord.operator import SubtaskOperator
from sparkcoord.runtime import layout
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.files import files_for
from sparkcoord.runtime.lease import CoordinationLease, LeaseKeeper
from sparkcoord.runtime.logs import check_level, install_log_handler
from sparkcoord.runtime.restart import FixedDelay, RestartStrategy
from sparkcoord.spark.python_start import launched_python
from sparkcoord.spark.session import resolve_location, session_setting, struct_of
from sparkcoord.spark.source import CoordinatedSource
from sparkcoord.spark.spec import FORMAT, OperatorSpec, SourceSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.listener import StreamingQueryProgress
    from pyspark.sql.streaming.readwriter import DataStreamWriter
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: rule 5: how often the job runner reads a local checkpoint directory's failure report
FAILURE_CHECK_S = 0.05

__all__ = ["CoordinatedJob", "JobGaveUp", "JobHandle", "OperatorSpec", "RunReport"]

#: the JobHandle whose ``until`` runs on this thread, and its query (for ``request``)
_until_caller = threading.local()

#: progress reports a JobHandle keeps across the job's queries (Spark keeps 100 per query:
#: ``spark.sql.streaming.numRecentProgressUpdates``)
PROGRESS_KEPT = 100


#: URL schemes Spark's own checkpoint can be written to from the pip package (Hadoop's
#: file systems without extra jars); anything else needs an explicit ``spark_checkpoint``
SPARK_WRITABLE = ("file", "hdfs")


def check_checkpoint_urls(checkpoint_dir: str, spark_checkpoint: str | None) -> None:
    """Refuse, at construction, checkpoint locations that cannot work (driver program)."""
    scheme = checkpoint_dir.split("://", 1)[0].lower() if "://" in checkpoint_dir else "file"
    if scheme == "memory":
        raise ValueError(
            f"checkpoint_dir {checkpoint_dir!r}: an in-memory file system cannot hold a job's "
            "checkpoint: each query run (and each executor) is a process of its own with its "
            "own memory, so a restart would find nothing. Use a directory or a shared store "
            "(s3://..., gs://...)")
    if spark_checkpoint is None and scheme not in SPARK_WRITABLE:
        raise ValueError(
            f"checkpoint_dir {checkpoint_dir!r}: Spark writes the query's own checkpoint "
            f"through Hadoop, which has no file system for {scheme}:// in the pip package, so "
            f"the default <checkpoint_dir>/spark cannot be used. Pass spark_checkpoint= a "
            f"location Spark can write (an s3a:// URL with hadoop-aws on the classpath, HDFS, "
            f"or a shared disk)")
    if spark_checkpoint is not None and "://" in spark_checkpoint:
        spark_scheme = spark_checkpoint.split("://", 1)[0].lower()
        if spark_scheme == "memory":
            raise ValueError(f"spark_checkpoint {spark_checkpoint!r}: Spark cannot write a "
                             f"memory:// location")


class JobGaveUp(SparkCoordError):
    """The query failed and the restart strategy allows no further restart."""


#: a Python traceback's last line naming one of sparkcoord's exceptions, as Spark's error text
#: carries it for an exception raised in a task: ``sparkcoord.<module>.<Class>: <message>``
_OUR_EXCEPTION = re.compile(r"(sparkcoord(?:\.\w+)*)\.([A-Za-z_]\w*): (.*)")
#: where Spark's (or the JVM's) text resumes after that message
_SPARK_RESUMES = ("SQLSTATE: ", "=== ", "JVM stacktrace", "Driver stacktrace", "Caused by: ")
#: the line after a traceback's exception when that exception is not the final one
_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")


def sparkcoord_error_in(spark_text: str) -> str | None:
    """sparkcoord's own exception (``Class: message``) raised in a Spark task, found in the
    text of the Spark error that reports it; None when there is none
    (docs/decisions/052-own-error-leads.md).

    Spark leads with its wrappers (``[STREAM_FAILED] ... [FOREACH_BATCH_USER_FUNCTION_ERROR]
    ... Python Proxy``, ``[PYTHON_EXCEPTION] ...``, ``Job aborted due to stage failure``);
    the task's Python traceback inside ends with the exception's qualified name and message.
    Only a :class:`SparkCoordError` counts (the module is imported to check: it is ours), and
    only the exception a traceback ends with (not one that another exception chained)."""
    found = _sparkcoord_exception_in(spark_text)
    return None if found is None else found[1]


def permanent_error_in(text: str) -> str | None:
    """The name of the permanent sparkcoord error (``SparkCoordError.permanent``: a refusal a
    restart cannot change) that ``text`` (a failure's cause, or Spark's error text) ends
    with; None if it ends with another (rule 6). Handle thread, after a query failed."""
    found = _sparkcoord_exception_in(text)
    if found is None or not getattr(found[0], "permanent", False):
        return None
    return found[0].__name__


def _sparkcoord_exception_in(spark_text: str) -> tuple[type, str] | None:
    lines = spark_text.split("\n")
    found = None
    for i, line in enumerate(lines):
        m = _OUR_EXCEPTION.fullmatch(line.rstrip("\r"))
        cls = None if m is None else _our_class(m.group(1), m.group(2))
        if m is None or cls is None:
            continue
        message = [m.group(3)]
        j = i + 1
        while (j < len(lines) and lines[j].strip() and not lines[j].startswith("\tat ")
               and not lines[j].lstrip().startswith(_SPARK_RESUMES)):
            message.append(lines[j])
            j += 1
        following = next((ln for ln in lines[j:] if ln.strip()), "")
        if following.startswith(_CHAINED):
            continue  # another exception followed from this one: that one is the error
        found = (cls, f"{m.group(2)}: " + "\n".join(message).rstrip())
    return found


def _our_class(module: str, name: str) -> type | None:
    import importlib

    try:
        cls = getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001 - a module of another version, or none: not ours to tell
        return None
    return cls if isinstance(cls, type) and issubclass(cls, SparkCoordError) else None


def failure_text(spark_text: str) -> str:
    """The cause of a query failure that the coordination service did not record: sparkcoord's
    own exception from a task first, then Spark's text; Spark's text alone if none."""
    ours = sparkcoord_error_in(spark_text)
    if ours is None:
        return spark_text
    return f"{ours}\n\n(raised in a Spark task; Spark reported:)\n{spark_text}"


class _JobFailedInRun(Exception):
    """The handle found the run's failure report and stopped the query (handle thread)."""


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


class CoordinatedJob:
    """A coordinated streaming job on one checkpoint directory.

    Layout: ``<checkpoint_dir>/coordination/<source name>`` holds sparkcoord's records, inbound
    logs and subtask state; ``checkpoint_dir`` may be any fsspec URL that every process of the
    job reaches (``storage_options`` are handed to each of them: the source runner, the
    executors' tasks, this driver program). The query's own checkpoint location is
    ``spark_checkpoint`` (default ``<checkpoint_dir>/spark``): Spark writes it through Hadoop,
    which cannot write ``s3://`` and the like from the pip package, so a remote
    ``checkpoint_dir`` needs an explicit ``spark_checkpoint`` Spark can write (an ``s3a://``
    location with hadoop-aws, HDFS, a shared disk).
    """

    def __init__(self, spark: SparkSession, checkpoint_dir: str, *, config: ServiceConfig | None = None,
                 checkpoint_interval_s: float | None = None, channel_host: str = "127.0.0.1",
                 channel_advertised_host: str | None = None, retain: int = 3,
                 fsync: bool = False, channel_fault_plan: str | None = None,
                 spark_checkpoint: str | None = None,
                 storage_options: dict[str, Any] | None = None,
                 log_level: str = "WARNING", lease_ttl_s: float = DEFAULT_TTL_S) -> None:
        if lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be > 0 seconds, got {lease_ttl_s}")
        self.spark = spark
        #: rule 6: how long another machine's driver waits for an unrenewed lease to lapse
        self.lease_ttl_s = lease_ttl_s
        self.log_level = check_level(log_level)
        self.checkpoint_dir = resolve_location(spark, checkpoint_dir, "checkpoint_dir")
        self.storage_options = dict(storage_options or {})
        check_checkpoint_urls(self.checkpoint_dir, spark_checkpoint)
        self._spark_checkpoint = (None if spark_checkpoint is None else
                                  resolve_location(spark, spark_checkpoint, "spark_checkpoint"))
        self.config = config or ServiceConfig()
        self.checkpoint_interval_s = checkpoint_interval_s
        self.channel_host = channel_host
        self.channel_advertised_host = channel_advertised_host
        self.retain = retain
        self.fsync = fsync
        self.channel_fault_plan = channel_fault_plan  # tests only (sparkcoord.channel.faults)
        self._names: set[str] = set()
        self._specs: dict[str, SourceSpec] = {}
        #: per source, the operators attach() added, in order
        self._attached: dict[str, list[OperatorSpec]] = {}
        # client requests (request()): one client per run of a source, one request at a time
        self._client_lock = threading.Lock()
        self._clients: dict[tuple[str, str], Any] = {}
        self._client_id = uuid.uuid4().hex[:12]
        self._client_seq = 0
        # the source runner and task workers start from compiled code where they can
        # (docs/decisions/082-compiled-python-start.md): a runner starts at every query start
        # and restart
        with launched_python(spark):
            spark.dataSource.register(CoordinatedSource)

    @property
    def spark_checkpoint(self) -> str:
        """The query's checkpoint location (Spark's offset and commit logs)."""
        return self._spark_checkpoint or f"{self.checkpoint_dir}/spark"

    def coordination_url(self, source: str) -> str:
        return f"{self.checkpoint_dir}/coordination/{source}"

    def source(self, operator: Callable[[], SubtaskOperator], coordinator: CoordinatorProvider,
               parallelism: int, schema: str | StructType, name: str = "coordinated") -> DataFrame:
        """A streaming DataFrame from one coordinated operator (driver program thread). The
        operator, and the source, are called ``name`` (default ``"coordinated"``): the name
        :meth:`request` takes (``job.request(name, "status")``)."""
        return self.sources([OperatorSpec(name, coordinator, operator, parallelism)], schema, name)

    def sources(self, operators: Sequence[OperatorSpec], schema: str | StructType,
                name: str = "coordinated", recipients: Sequence[OperatorSpec] = ()) -> DataFrame:
        """A streaming DataFrame whose partitions are the subtasks of several operators, each
        with its own coordinator; all checkpointed together.

        ``recipients`` are coordinated operators downstream of a shuffle whose coordinators
        this source hosts; apply each with :meth:`apply`."""
        if name in self._names:
            raise ValueError(f"this job already has a coordinated source named {name!r}")
        names = [op.name for op in list(operators) + list(recipients)]
        if not operators or len(set(names)) != len(names):
            raise ValueError(f"operators need unique names, got {names}")
        self._names.add(name)
        spec = SourceSpec(name, self.coordination_url(name), list(operators), schema, self.config,
                          self.checkpoint_interval_s, self.channel_host,
                          self.channel_advertised_host, self.retain, self.fsync,
                          list(recipients), self.spark_checkpoint, self.channel_fault_plan,
                          self.storage_options, self.log_level)
        # rule 6: another driver program running this job is refused before this one writes
        self._lease(spec.checkpoint_url).peek()
        self._specs[name] = spec
        # a fresh DataFrame hosts no attached operator yet: an earlier program's attachments
        # on this checkpoint directory do not linger (attach() writes the file again)
        files, root = files_for(spec.checkpoint_url, self.storage_options)
        files.remove(f"{root}/{layout.ATTACHED}")
        self._attached.pop(name, None)
        return self.spark.readStream.format(FORMAT).option("spec", spec.encode()).load()

    def attach(self, operator: OperatorSpec, source: str | None = None) -> str:
        """Host downstream operator ``operator``'s coordinator in coordinated source
        ``source``'s service (default: the job's only source), after the source's DataFrame
        was made; apply it with :meth:`apply`. Driver program thread, before the query
        starts. Returns the source's name.

        The source's DataFrame carries its spec already, so the attached operators go to
        ``<coordination>/attached.pkl`` (cloudpickled, private like ``channel.json``), which
        the source's runner reads when a run starts (:mod:`sparkcoord.spark.driver`). A
        sink attaches itself this way: ``FileStream(job).load(...)`` then a sink on the
        result, as in Flink, where the sink is added to the graph before it runs. What is
        attached must hold no credential: the file lives in the checkpoint directory."""
        if source is None:
            if len(self._specs) != 1:
                raise ValueError(f"this job has {len(self._specs)} coordinated sources "
                                 f"({sorted(self._specs)}): name the one to attach to")
            source = next(iter(self._specs))
        spec = self._specs.get(source)
        if spec is None:
            raise ValueError(f"no coordinated source {source!r} in this job; create it first")
        taken = {op.name for op in list(spec.operators) + list(spec.recipients)}
        if operator.name in taken:
            raise ValueError(f"source {source!r} already has an operator named "
                             f"{operator.name!r}")
        spec = dataclasses.replace(spec, recipients=[*spec.recipients, operator])
        self._specs[source] = spec
        attached = self._attached.setdefault(source, [])
        attached.append(operator)
        from pyspark import cloudpickle

        files, root = files_for(spec.checkpoint_url, self.storage_options)
        files.write_atomic(f"{root}/{layout.ATTACHED}",
                           cloudpickle.dumps(attached),  # type: ignore[no-untyped-call]
                           private=True)
        return source

    def apply(self, df: DataFrame, operator: str, schema: str, source: str = "coordinated",
              *, shuffle: bool = True) -> DataFrame:
        """Run downstream operator ``operator`` of ``source`` on ``df`` (driver program thread).

        ``df`` is repartitioned into the operator's parallelism (subtask = partition id) and
        mapped with ``mapInArrow``; the result has ``schema``. ``shuffle=False`` coalesces
        instead (no shuffle: each task maps the partitions it is given where they are, and a
        subtask may get none in a batch), for an operator that does not care which rows it
        gets and whose coordinator copes with an event that is never handled: one sealed for a
        subtask that gets no task in a batch completes at the batch's commit unseen (the lake
        sink's compaction plans such a bin again). See :mod:`sparkcoord.spark.recipient` for
        how batches map to epochs.
        """
        from pyspark.sql.pandas.types import to_arrow_schema

        from sparkcoord.spark.recipient import RecipientFunction

        spec = self._specs.get(source)
        if spec is None:
            raise ValueError(f"no coordinated source {source!r} in this job; create it first")
        op = spec.operator(operator)
        if op not in spec.recipients:
            raise ValueError(f"{operator!r} is not a downstream operator of source {source!r}")
        struct = struct_of(self.spark, schema)
        fn = RecipientFunction(spec, operator, to_arrow_schema(struct))
        spread = df.repartition(op.parallelism) if shuffle else df.coalesce(op.parallelism)
        # PySpark wraps the function here (docs/decisions/082-compiled-python-start.md)
        with launched_python(self.spark):
            return spread.mapInArrow(fn, struct)

    def _lease(self, url: str) -> CoordinationLease:
        return CoordinationLease(url, self.storage_options, ttl_s=self.lease_ttl_s)

    def check_cluster_settings(self) -> None:
        """Refuse settings that break the guarantee (speculative execution: two live attempts).
        Driver program thread; reads ``spark.conf`` only, so a Spark Connect session works."""
        if session_setting(self.spark, "spark.speculation", "false").strip().lower() == "true":
            raise SparkCoordError("spark.speculation=true runs two live attempts of a subtask, "
                                  "which breaks exactly-once coordination: disable it")

    def start(self, writer: DataStreamWriter, *, restart: RestartStrategy | None = None,
              until: Callable[[], bool] | None = None, poll_s: float = 0.5,
              timeout_s: float | None = None,
              on_failure: Callable[[str], None] | None = None) -> JobHandle:
        """Start ``writer`` on the job's checkpoint location and keep it running in the
        background; returns a :class:`JobHandle` at once (the query is starting).

        The job ends when the query terminates by itself (e.g. ``availableNow``), when
        ``until()`` becomes true or :meth:`JobHandle.stop` is called (the query is then
        stopped), after ``timeout_s`` (``TimeoutError``), or when the restart strategy gives up
        (:class:`JobGaveUp`). A failed query is restarted on the same checkpoint location after
        the delay the strategy gives. ``until`` and ``on_failure`` are called on the handle's
        thread. ``until`` may ask the job's coordinators (:meth:`request`): a request that no
        run can take while a restart is due or the query is starting means "not done yet"
        (docs/decisions/051-client-request-across-failover.md). Called from the user's driver
        program thread.

        Raises :class:`~sparkcoord.core.lease.LeaseHeld`, naming the holder, when another
        driver program runs this job on the same checkpoint location (rule 6).
        """
        self.check_cluster_settings()
        install_log_handler(self.log_level)  # unless this program configured logging
        lease = LeaseKeeper([self._lease(self._specs[name].checkpoint_url)
                             for name in sorted(self._specs)]).acquire()
        try:
            handle = JobHandle(self, writer, restart or FixedDelay(attempts=3, delay_s=1.0),
                               until, poll_s, timeout_s, on_failure, lease)
            handle._thread.start()
        except BaseException:
            lease.stop()
            raise
        return handle

    def run(self, writer: DataStreamWriter, *, restart: RestartStrategy | None = None,
            until: Callable[[], bool] | None = None, poll_s: float = 0.5,
            timeout_s: float | None = None,
            on_failure: Callable[[str], None] | None = None) -> RunReport:
        """:meth:`start`, then wait until the job ends; its report, or its error raised here.

        Driver program thread; blocks (Ctrl-C stops the query and re-raises)."""
        handle = self.start(writer, restart=restart, until=until, poll_s=poll_s,
                            timeout_s=timeout_s, on_failure=on_failure)
        try:
            handle.await_termination()
        except KeyboardInterrupt:
            handle.stop()
            raise
        return handle.report

    def request(self, operator: str, request: Any, *, timeout_s: float = 30.0) -> Any:
        """Ask coordinator ``operator`` of the running job (its ``handle_client_request``) and
        return the answer: a status, a pause, work to add. Any thread of the driver program,
        while the job runs (e.g. from ``until``, or while a :class:`JobHandle` runs it).

        The request is logged in the runner before the coordinator sees it (docs/protocol.md
        [client-requests-logged-in-current-epoch]), so what it changes survives a task retry, a
        restart and a killed driver; a request re-sent after a lost connection takes effect
        once. While no run can take it (the
        query is starting, restarting after a failure, or failing over: the failed run
        refuses it), the request waits for the next run, up to ``timeout_s``, and is then
        sent to it (the same request: it takes effect once). Called from ``until`` on the
        job's own thread while a restart is due, it does not wait (that thread restarts the
        query) and raises :class:`~sparkcoord.core.errors.RunUnavailable`, which the job
        runner takes as "not done yet" (docs/decisions/051-client-request-across-failover.md): so
        ``until=lambda: job.request("queue", "status")["done"]`` survives a ``fail_job`` and
        a killed driver program. Raises
        :class:`~sparkcoord.core.errors.RequestRefused` when the coordinator refused,
        :class:`~sparkcoord.core.errors.RunUnavailable` (a ``RequestFailed``) when no run
        took the request within ``timeout_s``, and
        :class:`~sparkcoord.core.errors.RequestFailed` when a run took it but no answer came.
        """

        from sparkcoord.channel.client import ChannelUnavailable, JobClient
        from sparkcoord.channel.frames import ResponseStatus
        from sparkcoord.core.errors import RequestFailed, RequestRefused, RunUnavailable
        from sparkcoord.runtime.files import files_for

        spec = next((sp for sp in self._specs.values()
                     if operator in {op.name for op in list(sp.operators) + list(sp.recipients)}),
                    None)
        if spec is None:
            known = sorted(op.name for sp in self._specs.values()
                           for op in list(sp.operators) + list(sp.recipients))
            raise ValueError(f"no coordinated operator {operator!r} in this job (operators: "
                             f"{known})")
        payload = EventCodec(self.config.max_event_bytes).encode(request)
        deadline = time.monotonic() + timeout_s
        last = "the query has not started its coordinated source yet"
        # set when a JobHandle calls its until() on its own thread: the thread that restarts
        # the query must not wait for that restart
        handle: JobHandle | None = getattr(_until_caller, "handle", None)
        query = getattr(_until_caller, "query", None)

        def failing_over(why: str) -> None:
            if handle is not None and handle._restart_due(query):
                raise RunUnavailable(f"request {request!r} to coordinator {operator!r}: the "
                                     f"job is failing over; ask again after its restart "
                                     f"({why})")

        def wait_for_run(why: str, pause_s: float) -> None:
            # no run can take the request now: wait for the next one (re-read channel.json)
            nonlocal last
            last = why
            failing_over(why)
            time.sleep(min(pause_s, max(0.0, deadline - time.monotonic())))

        # one request at a time (one connection per run); the handle's thread stops waiting
        # for the lock when a restart is due (another thread may hold it, waiting for the run
        # that this thread is to start)
        while not self._client_lock.acquire(timeout=0.1):
            failing_over("another request of this driver program is waiting for the job")
            if time.monotonic() > deadline:
                raise RunUnavailable(f"request {request!r} to coordinator {operator!r}: no "
                                     f"answer within {timeout_s} s (another request of this "
                                     f"driver program held the channel)")
        try:
            # one number per call, kept when the call is re-sent to the next run after a
            # restart: the service answers a request it logged once (docs/protocol.md
            # [client-requests-take-effect-once])
            seq = self._client_seq
            self._client_seq += 1
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RunUnavailable(f"request {request!r} to coordinator {operator!r}: "
                                         f"no answer within {timeout_s} s ({last})")
                try:
                    files, root = files_for(spec.checkpoint_url, spec.storage_options)
                    info = json.loads(files.read(f"{root}/{layout.CHANNEL_INFO}"))
                except (OSError, ValueError) as exc:
                    wait_for_run(f"no channel.json yet: {exc!r}", 0.2)
                    continue
                key = (spec.name, info["run"])
                client = self._clients.get(key)
                if client is None:
                    for old in self._clients.values():
                        old.close()
                    self._clients = {key: (client := JobClient(
                        (info["host"], int(info["port"])), bytes.fromhex(info["secret"]),
                        self._client_id, max_retries=2))}
                try:
                    response = client.request(operator, payload, remaining, seq)
                except ChannelUnavailable as exc:  # the run ended; a restart writes a new file
                    self._clients.pop(key, None)
                    wait_for_run(str(exc), 0.2)
                    continue
                reason = response.payload.decode(errors="replace")
                if response.status is ResponseStatus.ANSWER:
                    return loads(response.payload)
                if response.status is ResponseStatus.REFUSED:
                    raise RequestRefused(f"coordinator {operator!r} refused request "
                                         f"{request!r}: {reason}")
                if response.status is ResponseStatus.UNAVAILABLE:
                    # starting or ending a run, or a failed one: the next run takes it (the
                    # server says so by status; docs/protocol.md
                    # [client-requests-take-effect-once])
                    self._clients.pop(key, None)
                    wait_for_run(reason, 0.1)
                    continue
                raise RequestFailed(f"request {request!r} to coordinator {operator!r} got no "
                                    f"answer: {reason}")
        finally:
            self._client_lock.release()

    def _release_clients(self) -> None:
        """Close the connection :meth:`request` keeps to the job's current run (handle thread,
        when the job ended: the run is over, and the driver program may live on for long). A
        request still running on another thread keeps it; it ends with the run."""
        if not self._client_lock.acquire(timeout=1.0):
            return
        try:
            for client in self._clients.values():
                client.close()
            self._clients = {}
        finally:
            self._client_lock.release()

    def failure_cause(self) -> str | None:
        """The cause of the global failure of the latest run of this job's coordinated
        sources, as the coordination service recorded it (with the user's traceback), or None
        if that run did not fail in sparkcoord (e.g. a task kept failing). Driver program
        thread (the handle's), after the query failed and before it is restarted, and at every
        poll while it runs (a job failure stops the query at once:
        docs/decisions/044-quiet-failover.md)."""
        from sparkcoord.runtime.files import files_for

        for spec in self._specs.values():
            try:
                files, root = files_for(spec.checkpoint_url, spec.storage_options)
                # the failure report first: usually there is none, one read (polled)
                failure = json.loads(files.read(f"{root}/{layout.FAILURE_REPORT}"))
                run = json.loads(files.read(f"{root}/{layout.CHANNEL_INFO}"))["run"]
            except Exception:  # noqa: BLE001 - no report (or an unreadable one): Spark's text
                continue
            if isinstance(failure, dict) and failure.get("run") == run:
                return str(failure.get("cause"))
        return None

    def _forget_failures(self) -> None:
        # A failure recorded by an earlier run must not be taken for the next run's cause (that
        # run may fail before it writes its own channel.json). Driver program thread.
        from sparkcoord.runtime.files import files_for

        for spec in self._specs.values():
            try:
                files, root = files_for(spec.checkpoint_url, spec.storage_options)
                files.remove(f"{root}/{layout.FAILURE_REPORT}")
            except Exception:  # noqa: BLE001 - best effort: the run ids still guard the report
                log.debug("cannot remove the failure report of %s", spec.name, exc_info=True)


class JobHandle:
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

    def __init__(self, job: CoordinatedJob, writer: DataStreamWriter, strategy: RestartStrategy,
                 until: Callable[[], bool] | None, poll_s: float, timeout_s: float | None,
                 on_failure: Callable[[str], None] | None,
                 lease: LeaseKeeper | None = None) -> None:
        self.job = job
        #: the job's leases (rule 6), released as the handle's thread ends
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
                # rule 6: nothing written, no query started, on a lease another run took over
                self._lease.check()
            job._forget_failures()
            self._last_counted = -1
            self._counted_before = report.batches
            self._committed_before = self._newest_commit()
            query = self._writer.option("checkpointLocation", job.spark_checkpoint).start()
            self._query_started(query)
            log.info("query %s started on %s%s", query.id, job.spark_checkpoint,
                     f" (restart {report.restarts})" if report.restarts else "")
            # rule 5: the failure report is read every wait; the rest every poll_s
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
                        log.error("%s", self._lease.lost)  # rule 6: another run has the job
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
        """Rule 6, after a query failed (handle thread): a lease another run took over raises
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
        and how many such waits make one ``poll_s`` (rule 5): a local checkpoint directory's
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
        _until_caller.handle, _until_caller.query = self, query
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
            _until_caller.handle = _until_caller.query = None

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
