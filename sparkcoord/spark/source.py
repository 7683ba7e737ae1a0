"""The coordinated source: a PySpark Python data source whose driver-side reader hosts the
coordination service.

Rules (docs/protocol.md [service-in-the-source-runner] [spark-reader-is-pickled-for-executors]
[restore-point-from-first-driver-call] [seal-before-offset] [completion-from-latest-offset]):
  1. The reader is created twice per run: in Spark's short planning process (pickled to the
     executors) and in the long-lived source runner process. It starts nothing until its
     first driver-side call; then, in the runner process only, it creates the coordination
     service and the channel server (:class:`sparkcoord.spark.driver.DriverSide`, imported
     only there: Spark's Python workers import this module to unpickle the reader and its
     partitions, and must not load the service, its storage and fsspec;
     docs/decisions/032-worker-imports.md).
  2. Offsets are ``{"sparkcoord": <source name>, "epoch": N}``; ``initialOffset`` is always
     epoch -1 and decides nothing.
  3. ``latestOffset(start)``: the run's first call restores; later ones signal that the batch
     of ``start`` committed. A new epoch is sealed only when there is something to carry (held
     events) or the checkpoint interval passed, and its record is durable before the offset
     is returned; otherwise ``start`` is returned and Spark runs no batch.
  4. ``partitions(start, end)`` is a pure function of the epoch's record: one partition per
     subtask of every operator, holding its sealed events, the channel address and secret.
  5. ``commit`` is ignored (lazy, not re-issued after failures: docs/protocol.md
     [spark-source-commit-is-lazy] [completion-from-latest-offset]).
  6. A global failure makes the next driver call raise, failing the query with the failure's
     text (which names the coordinator and the cause).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from sparkcoord.core.ids import NO_EPOCH, SubtaskId
from sparkcoord.spark.offsets import epoch_of, offset
from sparkcoord.spark.spec import FORMAT, CoordinatedPartition, SourceSpec

if TYPE_CHECKING:
    from sparkcoord.spark.driver import DriverSide

class CoordinatedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: hosts the coordination service; executor side: runs the subtasks.

    ``Trigger.AvailableNow``: the query runs batches while a coordinator has something to carry
    or asks for a batch (``request_batch``), and ends at the first ``latestOffset`` that seals
    nothing. A coordinator that keeps asking (a continuous file source finding new files, a
    ``checkpoint_interval_s``) keeps it running; a bounded source ends it.
    """

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self._driver: DriverSide | None = None
        self._available_now = False

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "_driver": None, "_available_now": False}

    def _driver_side(self) -> DriverSide:
        if self._driver is None:
            from sparkcoord.spark.driver import DriverSide, install_sigterm_handler

            self._driver = DriverSide(self.spec, available_now=self._available_now)
            install_sigterm_handler(self.stop)
        return self._driver

    # ------------------------------------------------------------- driver: runner process
    def initialOffset(self) -> dict[str, Any]:
        """Spark asks where a new query starts. Always epoch -1; it decides nothing (rule 8)."""
        return offset(self.spec.name, NO_EPOCH)

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        """Spark asks for the next batch's end: complete the previous epoch, maybe seal one."""
        d = self._driver_side()
        start_epoch = epoch_of(self.spec.name, start)
        end_epoch = d.latest_epoch(start_epoch, wait_for_cancel=not self._available_now)
        return start if end_epoch == start_epoch else offset(self.spec.name, end_epoch)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The batch (start, end]: one partition per subtask, with its epoch's events."""
        d = self._driver_side()
        start_epoch, end_epoch = epoch_of(self.spec.name, start), epoch_of(self.spec.name, end)
        if start_epoch == end_epoch:
            return []
        record = d.record_of_batch(start_epoch, end_epoch)
        parts = []
        for op in self.spec.operators:
            for index in range(op.parallelism):
                sid = SubtaskId(op.name, index)
                events = record.events_for(sid) if record else ()
                parts.append(CoordinatedPartition(
                    op.name, index, end_epoch, events, d.address, d.secret, d.service.run_id,
                    start_epoch if start_epoch != NO_EPOCH else None,
                    d.service.inbox.history_length(sid) > 0))
        return parts

    def prepareForTriggerAvailableNow(self) -> None:
        """Spark starts an ``availableNow`` run (runner process). The run ends when no
        coordinator wants another batch (class docstring), so a job failure must fail it at
        once rather than answer "no batch" (:meth:`DriverSide.latest_epoch`), and the
        coordinators are told (``CoordinatorContext.available_now``). Spark calls it before
        the run's first ``latestOffset``, which creates the driver side."""
        if self._driver is not None:
            raise RuntimeError("sparkcoord: Spark prepared an availableNow run after the "
                               "coordination service had started; its coordinators would "
                               "not know the run ends by itself")
        self._available_now = True

    def commit(self, end: dict[str, Any]) -> None:
        """Ignored: completion comes from latestOffset (docs/protocol.md
        [completion-from-latest-offset]). Idempotent."""

    def stop(self) -> None:
        """End of the run (best effort; Spark may also just kill the process)."""
        if self._driver is not None:
            self._driver.close()

    # ------------------------------------------------------------------ executor: tasks
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """Run one subtask for one batch (executor Python worker)."""
        assert isinstance(partition, CoordinatedPartition)
        from sparkcoord.spark.subtask import run_subtask

        return run_subtask(self.spec, partition)


class CoordinatedSource(DataSource):
    """``spark.readStream.format("sparkcoord").option("spec", SourceSpec(...).encode())``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        if "spec" not in options:
            raise ValueError("the sparkcoord source needs the option 'spec' "
                             "(use sparkcoord.spark.CoordinatedJob.source to build it)")
        self.spec = SourceSpec.decode(options["spec"])

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        return self.spec.schema

    def streamReader(self, schema: Any) -> CoordinatedStreamReader:
        return CoordinatedStreamReader(self.spec)
