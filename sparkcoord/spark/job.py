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

Where the rules live (docs/decisions/099-job-split.md): this module is the builder and the
job's public face (:class:`CoordinatedJob`); the loop that starts, watches and restarts the
query is ``supervisor.py`` (rules 1, 2, 4, 5, 6), what a caller holds while the job runs is
``handle.py`` (:class:`JobHandle`), the client side of requests is ``requests.py`` (rule 3),
a run's failure report and Spark's error text are read in ``failures.py`` (rules 1, 6), the
report and its progress are ``progress.py`` (rule 4). The names they hold are imported from
here too, as before the split.

Thread model: the user's driver program thread. The coordination itself runs in Spark's source
runner process; this side only starts, watches and restarts the query.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sparkcoord.coordinator import CoordinatorProvider
from sparkcoord.core.errors import SparkCoordError
from sparkcoord.core.lease import DEFAULT_TTL_S
from sparkcoord.operator import SubtaskOperator
from sparkcoord.runtime import layout
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.files import files_for
from sparkcoord.runtime.lease import CoordinationLease, LeaseKeeper
from sparkcoord.runtime.logs import check_level, install_log_handler
from sparkcoord.runtime.restart import FixedDelay, RestartStrategy
from sparkcoord.spark.failures import JobGaveUp as JobGaveUp
from sparkcoord.spark.failures import failure_cause_of, forget_failures
from sparkcoord.spark.failures import failure_text as failure_text
from sparkcoord.spark.failures import permanent_error_in as permanent_error_in
from sparkcoord.spark.failures import sparkcoord_error_in as sparkcoord_error_in
from sparkcoord.spark.handle import JobHandle as JobHandle
from sparkcoord.spark.progress import PROGRESS_KEPT as PROGRESS_KEPT
from sparkcoord.spark.progress import RunReport as RunReport
from sparkcoord.spark.progress import merge_progress as merge_progress
from sparkcoord.spark.python_start import launched_python
from sparkcoord.spark.requests import RequestSender
from sparkcoord.spark.session import resolve_location, session_setting, struct_of
from sparkcoord.spark.source import CoordinatedSource
from sparkcoord.spark.spec import FORMAT, OperatorSpec, SourceSpec
from sparkcoord.spark.supervisor import FAILURE_CHECK_S as FAILURE_CHECK_S

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter
    from pyspark.sql.types import StructType

__all__ = ["CoordinatedJob", "JobGaveUp", "JobHandle", "OperatorSpec", "RunReport"]


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
        # client requests (request(), requests.py): one client per run of a source, one
        # request at a time
        self._requests = RequestSender()
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
        return self._requests.request(self._specs.values(), self.config.max_event_bytes,
                                      operator, request, timeout_s)

    def _release_clients(self) -> None:
        """Close the connection :meth:`request` keeps to the job's current run (handle thread,
        when the job ended: the run is over, and the driver program may live on for long). A
        request still running on another thread keeps it; it ends with the run."""
        self._requests.release()

    def failure_cause(self) -> str | None:
        """The cause of the global failure of the latest run of this job's coordinated
        sources, as the coordination service recorded it (with the user's traceback), or None
        if that run did not fail in sparkcoord (e.g. a task kept failing). Driver program
        thread (the handle's), after the query failed and before it is restarted, and at every
        poll while it runs (a job failure stops the query at once:
        docs/decisions/044-quiet-failover.md)."""
        return failure_cause_of(self._specs.values())

    def _forget_failures(self) -> None:
        """Remove the failure reports of the runs before the next query (failures.py rule 1).
        Handle thread, before each query starts."""
        forget_failures(self._specs.values())
