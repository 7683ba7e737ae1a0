"""The lake sink's subtask: writes the batch's rows into parquet files and reports each file.

Rules:
  1. The input comes as Arrow record batches (``RecipientOperator.process_arrow``): no row
     becomes a Python object. The first non-empty batch opens a
     :class:`~sparkcoord.sinks.files.TaskFileWriter` for (job, epoch, subtask, Spark attempt);
     a subtask with no rows writes no file and reports nothing.
  2. A file is reported (:class:`~sparkcoord.sinks.coordinator.FileWritten`) as soon as it is
     closed (the writer rolls at ``target_file_bytes``), the last one at the end of the input.
     The task's batch does not end before every report is acknowledged (docs/protocol.md
     [task-waits-for-its-acks]), so a batch that commits in Spark has every file of its
     surviving attempts reported.
  3. An attempt that fails deletes what it wrote, best effort (``TaskFileWriter.abort``); what
     is left is the coordinator's cleanup's (by name: ``files.py`` rule 1). Its reports are
     withdrawn by the coordinator's per-subtask reset.
  4. The subtask keeps no state between batches.
  5. A batch that carries no new epoch of the coordinated source (docs/protocol.md
     [epochs-are-not-batch-ids]: a no-data batch of a stateful query, another source's data)
     cannot report files: a subtask with rows there fails its task with an error saying so, and
     nothing is written for good.
  6. Option ``compaction``: the coordinator's :class:`CompactionAssigned` event of the epoch
     (delivered before the rows) names the subtask's bin; after its rows the subtask
     rewrites it and reports the rewrite (``compaction.py`` rule 3). A task retry gets the
     same event (it is sealed into the epoch) and writes new files.

Thread model: one subtask per Spark task, used from the task's thread only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sparkcoord.operator import RecipientOperator, SubtaskContext
from sparkcoord.runtime.kills import kill_point
from sparkcoord.sinks.compaction import CompactionAssigned, rewrite
from sparkcoord.sinks.coordinator import FileWritten
from sparkcoord.sinks.files import TaskFileWriter
from sparkcoord.sinks.target import SinkTarget


class SinkSubtask(RecipientOperator):
    """Rules 1-5, for one subtask of a sink writing ``target``."""

    def __init__(self, target: SinkTarget) -> None:
        self.target = target
        self._context: SubtaskContext | None = None
        self._writer: TaskFileWriter | None = None
        self._reported = 0
        self._done = False
        #: rule 6: the bins to rewrite after the rows (more than one after an aborted
        #: checkpoint left its bin to this epoch: compaction.py rule 2)
        self._bins: list[CompactionAssigned] = []

    def open(self, context: SubtaskContext, state: Any) -> None:
        self._context = context

    def handle_operator_event(self, event: Any) -> Iterable[tuple[Any, ...]] | None:
        if not isinstance(event, CompactionAssigned):
            raise TypeError(f"sink subtask got a {type(event).__name__}, not a "
                            f"CompactionAssigned")
        self._bins.append(event)
        return None

    def process_arrow(self, batch: Any) -> Iterable[tuple[Any, ...]] | None:
        if batch.num_rows == 0:
            return None
        if self._writer is None:
            context = self._context
            assert context is not None
            self._writer = TaskFileWriter(
                self.target.location, self.target.job_id, context.epoch, context.subtask,
                context.spark_attempt, self.target.rows_schema,
                target_file_bytes=self.target.target_file_bytes,
                storage_options=dict(self.target.storage_options) or None)
        self._writer.write(batch)
        self._report()
        return None

    def process(self) -> Iterable[tuple[Any, ...]] | None:
        if self._writer is not None:
            self._writer.close()
            self._report()
        for assigned in self._bins:
            self._compact(assigned)
        self._done = True
        return None

    def _compact(self, assigned: CompactionAssigned) -> None:
        """Rule 6."""
        context = self._context
        assert context is not None
        report = rewrite(self.target.location, self.target.job_id, context.epoch,
                         context.subtask, context.spark_attempt, self.target.rows_schema,
                         assigned.inputs, target_file_bytes=self.target.target_file_bytes,
                         storage_options=dict(self.target.storage_options) or None)
        kill_point("lake-compacted", context.epoch)  # tests only
        context.send_event(report)

    def close(self) -> None:
        if self._writer is not None and not self._done:
            try:
                self._writer.abort()  # rule 3
            except Exception:  # noqa: BLE001 - best effort: cleanup deletes the rest by name
                pass

    def _report(self) -> None:
        assert self._writer is not None and self._context is not None
        reports = self._writer.reports
        if len(reports) > self._reported:
            kill_point("lake-written", self._context.epoch)  # tests only
        for file in reports[self._reported:]:
            self._context.send_event(FileWritten(file))
        self._reported = len(reports)


def sink_subtask(target: SinkTarget) -> Any:
    """The subtask factory of a sink writing ``target`` (picklable: a partial)."""
    import functools

    return functools.partial(SinkSubtask, target)
