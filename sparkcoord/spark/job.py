"""The job runner: builds coordinated sources and runs a query under a restart strategy.

Thread model: the user's driver program thread. The coordination itself runs in Spark's source
runner process; this side only starts, watches and restarts the query.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkcoord.coordinator import CoordinatorProvider
from sparkcoord.core.errors import SparkCoordError
from sparkcoord.core.text import plural
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.restart import FixedDelay, RestartStrategy
from sparkcoord.spark.operator import SubtaskOperator
from sparkcoord.spark.source import FORMAT, CoordinatedSource, OperatorSpec, SourceSpec

log = logging.getLogger(__name__)

__all__ = ["CoordinatedJob", "JobGaveUp", "OperatorSpec", "RunReport"]


class JobGaveUp(SparkCoordError):
    """The query failed and the restart strategy allows no further restart."""


@dataclass
class RunReport:
    """What happened in :meth:`CoordinatedJob.run`."""

    restarts: int = 0
    failures: list[str] = field(default_factory=list)
    batches: int = 0


class CoordinatedJob:
    """A coordinated streaming job on one checkpoint directory.

    Layout: ``<checkpoint_dir>/spark`` is the query's own checkpoint location;
    ``<checkpoint_dir>/coordination/<source name>`` holds sparkcoord's records, inbound logs
    and subtask state.
    """

    def __init__(self, spark: Any, checkpoint_dir: str, *, config: ServiceConfig | None = None,
                 checkpoint_interval_s: float | None = None, channel_host: str = "127.0.0.1",
                 channel_advertised_host: str | None = None, retain: int = 3,
                 fsync: bool = False, channel_fault_plan: str | None = None) -> None:
        self.spark = spark
        self.checkpoint_dir = (os.path.abspath(checkpoint_dir) if "://" not in checkpoint_dir
                               else checkpoint_dir.rstrip("/"))
        self.config = config or ServiceConfig()
        self.checkpoint_interval_s = checkpoint_interval_s
        self.channel_host = channel_host
        self.channel_advertised_host = channel_advertised_host
        self.retain = retain
        self.fsync = fsync
        self.channel_fault_plan = channel_fault_plan  # tests only (sparkcoord.channel.faults)
        self._names: set[str] = set()
        self._specs: dict[str, SourceSpec] = {}
        spark.dataSource.register(CoordinatedSource)

    @property
    def spark_checkpoint(self) -> str:
        return f"{self.checkpoint_dir}/spark"

    def coordination_url(self, source: str) -> str:
        return f"{self.checkpoint_dir}/coordination/{source}"

    def source(self, operator: Callable[[], SubtaskOperator], coordinator: CoordinatorProvider,
               parallelism: int, schema: str, name: str = "coordinated") -> Any:
        """A streaming DataFrame from one coordinated operator (driver program thread)."""
        return self.sources([OperatorSpec(name, coordinator, operator, parallelism)], schema, name)

    def sources(self, operators: Sequence[OperatorSpec], schema: str,
                name: str = "coordinated", recipients: Sequence[OperatorSpec] = ()) -> Any:
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
                          list(recipients), self.spark_checkpoint, self.channel_fault_plan)
        self._specs[name] = spec
        return self.spark.readStream.format(FORMAT).option("spec", spec.encode()).load()

    def apply(self, df: Any, operator: str, schema: str, source: str = "coordinated") -> Any:
        """Run downstream operator ``operator`` of ``source`` on ``df`` (driver program thread).

        ``df`` is repartitioned into the operator's parallelism (subtask = partition id) and
        mapped with ``mapInArrow``; the result has ``schema``. See
        :mod:`sparkcoord.spark.recipient` for how batches map to epochs.
        """
        from pyspark.sql.pandas.types import to_arrow_schema

        from sparkcoord.spark.recipient import RecipientFunction

        spec = self._specs.get(source)
        if spec is None:
            raise ValueError(f"no coordinated source {source!r} in this job; create it first")
        op = spec.operator(operator)
        if op not in spec.recipients:
            raise ValueError(f"{operator!r} is not a downstream operator of source {source!r}")
        struct = self.spark.createDataFrame([], schema).schema
        fn = RecipientFunction(spec, operator, to_arrow_schema(struct))
        return df.repartition(op.parallelism).mapInArrow(fn, struct)

    def check_cluster_settings(self) -> None:
        """Refuse settings that break the guarantee (speculative execution: two live attempts)."""
        conf = self.spark.sparkContext.getConf()
        if conf.get("spark.speculation", "false").lower() == "true":
            raise SparkCoordError("spark.speculation=true runs two live attempts of a subtask, "
                                  "which breaks exactly-once coordination: disable it")

    def run(self, writer: Any, *, restart: RestartStrategy | None = None,
            until: Callable[[], bool] | None = None, poll_s: float = 0.5,
            timeout_s: float | None = None,
            on_failure: Callable[[str], None] | None = None) -> RunReport:
        """Start ``writer`` on the job's checkpoint location and keep it running.

        Returns when the query terminates by itself (e.g. ``availableNow``) or when ``until()``
        becomes true (then the query is stopped). A failed query is restarted on the same
        checkpoint location after the delay the restart strategy gives, until it gives up
        (:class:`JobGaveUp`, naming every failure). Driver program thread; blocks.
        """
        from pyspark.errors import StreamingQueryException

        self.check_cluster_settings()
        strategy = restart or FixedDelay(attempts=3, delay_s=1.0)
        report = RunReport()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self._forget_failures()
            query = writer.option("checkpointLocation", self.spark_checkpoint).start()
            try:
                if until is None:
                    query.awaitTermination()
                    report.batches += _batches(query)
                    return report
                while not until():
                    if deadline is not None and time.monotonic() > deadline:
                        query.stop()
                        raise TimeoutError(f"job not done after {timeout_s}s; "
                                           f"failures so far: {report.failures}")
                    if query.awaitTermination(poll_s):
                        report.batches += _batches(query)
                        return report
                report.batches += _batches(query)
                query.stop()
                return report
            except StreamingQueryException as exc:
                cause = self.failure_cause() or str(exc)
                report.failures.append(cause)
                if on_failure is not None:
                    on_failure(cause)
                report.batches += _batches(query)
                delay = strategy.next_delay(time.monotonic())
                if delay is None:
                    spark_first = str(exc).strip().splitlines()[:1]
                    raise JobGaveUp(
                        f"{cause}\n\nThe query failed {plural(len(report.failures), 'time')} and "
                        f"the restart strategy gave up; the cause above is the last failure"
                        + (f". Spark reported: {spark_first[0]}" if spark_first
                           and not cause.startswith(spark_first[0]) else "")) from exc
                log.warning("query failed, restarting in %.1fs: %s", delay,
                            (cause.strip().splitlines() or [""])[0])
                report.restarts += 1
                time.sleep(delay)


    def failure_cause(self) -> str | None:
        """The cause of the global failure of the latest run of this job's coordinated
        sources, as the coordination service recorded it (with the user's traceback), or None
        if that run did not fail in sparkcoord (e.g. a task kept failing). Driver program
        thread, after the query failed and before it is restarted."""
        from sparkcoord.runtime.files import files_for

        for spec in self._specs.values():
            try:
                files, root = files_for(spec.checkpoint_url)
                run = json.loads(files.read(f"{root}/channel.json"))["run"]
                failure = json.loads(files.read(f"{root}/last-failure.json"))
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
                files, root = files_for(spec.checkpoint_url)
                files.remove(f"{root}/last-failure.json")
            except Exception:  # noqa: BLE001 - best effort: the run ids still guard the report
                log.debug("cannot remove the failure report of %s", spec.name, exc_info=True)


def _batches(query: Any) -> int:
    try:
        return len(query.recentProgress)
    except Exception:  # noqa: BLE001 - progress is informational
        return 0
