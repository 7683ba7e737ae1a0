"""A coordinated operator downstream of a shuffle: a ``mapInArrow`` function whose subtask is
the Spark partition id.

Rules (docs/protocol.md [epochs-are-not-batch-ids] [spark-batches-that-leave-a-source-out]
[spark-offset-log-format] [spark-retried-task-keeps-its-batch-id]):
  1. Spark runs batches that leave the coordinated source out (no-data batches of stateful
     queries, another source's data). So the task maps its ``streaming.sql.batchId`` to an
     epoch by reading Spark's offset log: ``offsets/<batch>`` holds our source's offset line;
     the batch carries a new epoch iff that epoch differs from the one in ``offsets/<batch-1>``.
  2. In a batch that carries new epoch E, the subtask fetches its epoch-E events from the
     coordination service (which is running: the source's ``partitions`` of this very batch
     started it), registers its attempt, and hands the operator the events before any input
     row. In a batch that carries no new epoch it gets no events and cannot send any.
  3. Its state is keyed by Spark batch id (not epoch: several batches may share an epoch) and
     restored from the newest earlier batch, so a retried or replayed batch starts from the
     same state.
"""

from __future__ import annotations

import json
import pickle
import posixpath
from collections.abc import Iterable, Iterator
from typing import Any

from sparkcoord.channel.client import ChannelClient
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.encoding import loads
from sparkcoord.core.errors import SparkCoordError
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.operator import RecipientOperator, SubtaskContext, SubtaskOperator
from sparkcoord.runtime.files import files_for
from sparkcoord.runtime.kills import kill_point
from sparkcoord.spark.offsets import offset_values, source_epoch
from sparkcoord.spark.spec import SourceSpec
from sparkcoord.spark.subtask import request_function, state_store, task_boundary, user_code

__all__ = ["NoEpochInThisBatch", "RecipientFunction", "RecipientOperator", "epoch_of_batch"]


class NoEpochInThisBatch(SparkCoordError):
    """A downstream subtask tried to send in a batch that carries no new epoch."""


def epoch_of_batch(spark_checkpoint: str, source: str, batch: int) -> tuple[int, bool]:
    """(epoch of ``batch``, whether it is new in that batch), from Spark's offset log."""
    files, root = files_for(spark_checkpoint)

    def read(b: int) -> int:
        path = posixpath.join(root, "offsets", str(b))
        try:
            data = files.read(path)
        except FileNotFoundError:
            raise SparkCoordError(f"Spark's offset log has no batch {b} at {path}") from None
        epoch = source_epoch(offset_values(data, path), source)
        if epoch is None:
            raise SparkCoordError(f"{path}: no offset of coordinated source {source!r}; a "
                                  "downstream operator needs its source in the same query")
        return epoch

    epoch = read(batch)
    previous = read(batch - 1) if batch > 0 else -1
    return epoch, epoch != previous and epoch != -1


class RecipientFunction:
    """The picklable ``mapInArrow`` function of one downstream operator."""

    def __init__(self, spec: SourceSpec, operator: str, arrow_schema: Any) -> None:
        if spec.spark_checkpoint is None:
            raise ValueError("a downstream operator needs the query's checkpoint location")
        self.spec = spec
        self.operator = operator
        self.arrow_schema = arrow_schema

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The operator's Arrow batches for this partition of a Spark batch (task thread,
        called by ``mapInArrow``)."""
        with task_boundary():
            yield from self._batches(batches)

    def _batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        task = TaskContext.get()
        if task is None:
            raise SparkCoordError("a downstream operator runs only inside a Spark task")
        batch = int(str(task.getLocalProperty("streaming.sql.batchId")))
        index, number = task.partitionId(), task.attemptNumber()
        op = self.spec.operator(self.operator)
        if index >= op.parallelism:
            raise SparkCoordError(f"downstream operator {op.name!r} has parallelism "
                                  f"{op.parallelism} but runs in partition {index}")
        assert self.spec.spark_checkpoint is not None
        epoch, fresh = epoch_of_batch(self.spec.spark_checkpoint, self.spec.name, batch)
        sid = SubtaskId(op.name, index)
        store = state_store(self.spec)
        client: ChannelClient | None = None
        events: tuple[bytes, ...] = ()
        execution_attempt = 0
        if fresh:
            info = json.loads(store.files.read(f"{store.root}/channel.json"))
            address = (info["host"], int(info["port"]))
            secret = bytes.fromhex(info["secret"])
            client = ChannelClient(address, secret, TaskAttempt(info["run"], sid, epoch, number))
            delivery = client.fetch(op.name, index, epoch)
            client.attempt = TaskAttempt(delivery.run, sid, epoch, number)
            execution_attempt = client.register()
            events = delivery.events
        codec = EventCodec(self.spec.config.max_event_bytes)

        def send(event: Any) -> None:
            if client is None:
                raise NoEpochInThisBatch(
                    f"{sid} in Spark batch {batch}: this batch carries no new epoch (epoch "
                    f"{epoch} was delivered earlier), so it cannot send events to the coordinator")
            client.send(codec.encode(event))

        # No previous-batch gap check here (only the lineage one): Spark may run a batch
        # without this operator's tasks (an empty relation optimized away), so batch - 1 need
        # not have left a state.
        restored = store.read_before(sid, batch)
        state = loads(restored[1]) if restored is not None else None
        ask = request_function(client, codec, sid, epoch) if client is not None else None

        def request(value: Any, timeout_s: float) -> Any:
            if ask is None:
                raise NoEpochInThisBatch(
                    f"{sid} in Spark batch {batch}: this batch carries no new epoch (epoch "
                    f"{epoch} was delivered earlier), so it cannot ask the coordinator")
            return ask(value, timeout_s)

        context = SubtaskContext(op.name, index, op.parallelism, epoch, execution_attempt,
                                 number, send, request)
        with user_code(sid, epoch, "constructor"):
            operator: SubtaskOperator = op.operator()
        names = self.arrow_schema.names
        try:
            with user_code(sid, epoch, "open()"):
                operator.open(context, state)
            for payload in events:
                event = loads(payload)
                with user_code(sid, epoch, "handle_operator_event()"):
                    rows = operator.handle_operator_event(event)
                with user_code(sid, epoch, "handle_operator_event()"):
                    yield from self._to_arrow(rows, names)
            for record_batch in batches:
                if isinstance(operator, RecipientOperator):
                    with user_code(sid, epoch, "process_arrow()"):
                        rows = operator.process_arrow(record_batch)
                    with user_code(sid, epoch, "process_arrow()"):
                        yield from self._to_arrow(rows, names)
            with user_code(sid, epoch, "process()"):
                rows = operator.process()
            with user_code(sid, epoch, "process()"):
                yield from self._to_arrow(rows, names)
            if client is not None:
                kill_point("mid-batch", epoch)  # tests only: events sent, batch not finished
                client.finish()  # acknowledged; a retry's unsent history withdrawn (dec. 47)
            with user_code(sid, epoch, "snapshot_state()"):
                snapshot = operator.snapshot_state()
            store.write(sid, batch, pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL))
        finally:
            try:
                with user_code(sid, epoch, "close()"):
                    operator.close()
            finally:
                if client is not None:
                    client.close()

    def _to_arrow(self, rows: Iterable[tuple[Any, ...]] | None, names: list[str]) -> Iterator[Any]:
        import pyarrow as pa

        if rows is None:
            return
        rows = list(rows)
        if rows:
            yield pa.RecordBatch.from_pylist([dict(zip(names, r, strict=True)) for r in rows],
                                             schema=self.arrow_schema)
