"""The coordinated source: a PySpark Python data source whose driver-side reader hosts the
coordination service.

Rules (DESIGN.md sections 2-3, SPARK_NOTES.md):
  1. The reader is created twice per run: in Spark's short planning process (pickled to the
     executors) and in the long-lived source runner process. It starts nothing until its
     first driver-side call; then, in the runner process only, it creates the coordination
     service and the channel server (``_DriverSide``).
  2. Offsets are ``{"sparkcoord": <source name>, "epoch": N}``; ``initialOffset`` is always
     epoch -1 and decides nothing.
  3. ``latestOffset(start)``: the run's first call restores; later ones signal that the batch
     of ``start`` committed. A new epoch is sealed only when there is something to carry (held
     events) or the checkpoint interval passed, and its record is durable before the offset
     is returned; otherwise ``start`` is returned and Spark runs no batch.
  4. ``partitions(start, end)`` is a pure function of the epoch's record: one partition per
     subtask of every operator, holding its sealed events, the channel address and secret.
  5. ``commit`` is ignored (lazy, not re-issued after failures: DESIGN rule 9).
  6. A global failure makes the next driver call raise, failing the query with the failure's
     text (which names the coordinator and the cause).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark import cloudpickle
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from sparkcoord.channel.faults import fault_plan
from sparkcoord.channel.frames import Delivery
from sparkcoord.channel.server import ChannelServer
from sparkcoord.core.ids import NO_EPOCH, SubtaskId
from sparkcoord.runtime.service import (
    CheckpointDeclined,
    CoordinationService,
    CoordinatorSpec,
    ServiceConfig,
)
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.spark.faults import kill_point

log = logging.getLogger(__name__)

FORMAT = "sparkcoord"
MARKER = "sparkcoord"


@dataclass(frozen=True)
class OperatorSpec:
    """One coordinated operator of a source: its coordinator, its subtask operator, its width."""

    name: str
    coordinator: Any      # CoordinatorProvider
    operator: Any         # zero-argument factory of a SubtaskOperator (usually the class)
    parallelism: int

    def __post_init__(self) -> None:
        if self.parallelism < 1:
            raise ValueError(f"operator {self.name!r}: parallelism must be >= 1, got {self.parallelism}")


@dataclass(frozen=True)
class SourceSpec:
    """Everything a coordinated source needs, shipped as one option string."""

    name: str
    checkpoint_url: str
    operators: Sequence[OperatorSpec]
    schema: str
    config: ServiceConfig = field(default_factory=ServiceConfig)
    checkpoint_interval_s: float | None = None
    channel_host: str = "127.0.0.1"
    channel_advertised_host: str | None = None
    retain: int = 3
    fsync: bool = False
    #: coordinated operators downstream of a shuffle, hosted by this source's service
    recipients: Sequence[OperatorSpec] = ()
    #: the query's checkpoint location (its offset log maps batch ids to epochs)
    spark_checkpoint: str | None = None
    #: tests only: a named fault plan for the channel server (sparkcoord.channel.faults)
    channel_fault_plan: str | None = None

    def operator(self, name: str) -> OperatorSpec:
        for op in list(self.operators) + list(self.recipients):
            if op.name == name:
                return op
        raise KeyError(f"source {self.name!r} has no operator {name!r}")

    def encode(self) -> str:
        return base64.b64encode(cloudpickle.dumps(self)).decode()  # type: ignore[no-untyped-call]

    @staticmethod
    def decode(text: str) -> SourceSpec:
        spec = cloudpickle.loads(base64.b64decode(text))
        if not isinstance(spec, SourceSpec):
            raise TypeError(f"option 'spec' does not hold a SourceSpec but {type(spec).__name__}")
        return spec


def offset(name: str, epoch: int) -> dict[str, Any]:
    return {MARKER: name, "epoch": epoch}


def epoch_of(name: str, value: dict[str, Any]) -> int:
    """The epoch in one of our offsets; a clear error for anything else."""
    if not isinstance(value, dict) or value.get(MARKER) != name or "epoch" not in value:
        raise ValueError(f"offset {value!r} does not belong to coordinated source {name!r} "
                         "(was the checkpoint location reused for another query?)")
    return int(value["epoch"])


class CoordinatedPartition(InputPartition):
    """The input of one subtask in one batch: its sealed events and how to reach the service."""

    def __init__(self, operator: str, index: int, epoch: int, events: Sequence[bytes],
                 address: tuple[str, int], secret: bytes, run_id: str) -> None:
        super().__init__(f"{operator}[{index}]@{epoch}")
        self.operator = operator
        self.index = index
        self.epoch = epoch
        self.events = list(events)
        self.address = address
        self.secret = secret
        self.run_id = run_id


class _DriverSide:
    """The coordination service and channel server of one run (runner process only)."""

    def __init__(self, spec: SourceSpec) -> None:
        storage = CheckpointStorage(spec.checkpoint_url, retain=spec.retain, fsync=spec.fsync)
        self.spec = spec
        self.service = CoordinationService(
            [CoordinatorSpec(op.name, op.coordinator, op.parallelism)
             for op in list(spec.operators) + list(spec.recipients)],
            storage, config=spec.config)
        self.secret = secrets.token_bytes(32)
        self.server = ChannelServer(self.service, self.secret, host=spec.channel_host,
                                    max_frame_bytes=spec.config.max_event_bytes + 4096,
                                    deliveries=self).start()
        if spec.channel_fault_plan is not None:
            self.server.fault = self._counting(fault_plan(spec.channel_fault_plan),
                                               f"{storage.root}/faults.json")
        host = spec.channel_advertised_host or self.server.address[0]
        self.address = (host, self.server.address[1])
        self.last_seal = time.monotonic()
        self.closed = False
        # Where this run listens. Downstream subtasks learn the address and the secret here
        # (they have no InputPartition of ours); the file is written before the run's first
        # batch plans, and is as private as the checkpoint directory that holds it.
        info: dict[str, Any] = {"host": self.address[0], "port": self.address[1],
                                "pid": os.getpid(), "run": self.service.run_id}
        if spec.recipients:
            info["secret"] = self.secret.hex()
        path = f"{storage.root}/channel.json"
        storage.fs.pipe_file(path, json.dumps(info).encode())
        if os.path.exists(path):  # a local file: keep the secret to its owner
            os.chmod(path, 0o600)

    def _counting(self, plan: Any, path: str) -> Any:
        # tests only: record how many faults were injected, so a test can prove they happened
        injected = {"count": 0}

        def counted(message: object) -> str | None:
            action: str | None = plan(message)
            if action:
                injected["count"] += 1
                self.service.storage.fs.pipe_file(path, json.dumps(injected).encode())
            return action

        return counted

    def fetch(self, operator: str, index: int, epoch: int) -> Delivery:
        """A downstream subtask asks for its events of ``epoch`` (channel thread)."""
        svc = self.service
        if operator not in {op.name for op in self.spec.recipients}:
            return Delivery("", epoch, (), f"{operator!r} is not a downstream operator of "
                                           f"source {self.spec.name!r}")
        if epoch != svc.last_sealed or svc.last_committed >= epoch:
            return Delivery("", epoch, (), f"epoch {epoch} is not running (last sealed "
                                           f"{svc.last_sealed}, last committed {svc.last_committed})")
        record = svc.record_for(epoch)
        events = tuple(record.events_for(SubtaskId(operator, index))) if record else ()
        return Delivery(svc.run_id, epoch, events)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.server.close()
            self.service.close()


def _install_sigterm_handler(on_term: Any) -> None:
    # The JVM stops the runner with SIGTERM (sometimes twice); ignore repeats, then exit
    # through SystemExit so that stop() and the finally blocks run.
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        on_term()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, handler)


class CoordinatedStreamReader(DataSourceStreamReader):
    """Driver side: hosts the coordination service; executor side: runs the subtasks."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self._driver: _DriverSide | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "_driver": None}

    def _driver_side(self) -> _DriverSide:
        if self._driver is None:
            self._driver = _DriverSide(self.spec)
            _install_sigterm_handler(self.stop)
        return self._driver

    # ------------------------------------------------------------- driver: runner process
    def initialOffset(self) -> dict[str, Any]:
        """Spark asks where a new query starts. Always epoch -1; it decides nothing (rule 8)."""
        return offset(self.spec.name, NO_EPOCH)

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        """Spark asks for the next batch's end: complete the previous epoch, maybe seal one."""
        d = self._driver_side()
        start_epoch = epoch_of(self.spec.name, start)
        d.service.latest_offset_called(start_epoch)
        interval = self.spec.checkpoint_interval_s
        due = interval is not None and time.monotonic() - d.last_seal >= interval
        if not (due or d.service.has_held_events()):
            return start
        future = d.service.trigger_checkpoint(d.service.next_checkpoint_id)
        try:
            prepared = future.result()
        except CheckpointDeclined as exc:
            log.warning("%s", exc)
            d.service.raise_if_failed()
            return start  # declined: held events stay queued; Spark asks again
        kill_point("sealing", prepared.checkpoint_id)
        record = d.service.seal(prepared)
        kill_point("sealed", record.epoch)
        d.last_seal = time.monotonic()
        return offset(self.spec.name, record.epoch)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The batch (start, end]: one partition per subtask, with its epoch's events."""
        d = self._driver_side()
        start_epoch, end_epoch = epoch_of(self.spec.name, start), epoch_of(self.spec.name, end)
        if start_epoch == end_epoch:
            return []
        record = d.service.partitions_called(start_epoch, end_epoch)
        parts = []
        for op in self.spec.operators:
            for index in range(op.parallelism):
                events = record.events_for(SubtaskId(op.name, index)) if record else ()
                parts.append(CoordinatedPartition(op.name, index, end_epoch, events, d.address,
                                                  d.secret, d.service.run_id))
        return parts

    def commit(self, end: dict[str, Any]) -> None:
        """Ignored: completion comes from latestOffset (DESIGN rule 9). Idempotent."""

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

    def schema(self) -> str:
        return self.spec.schema

    def streamReader(self, schema: Any) -> CoordinatedStreamReader:
        return CoordinatedStreamReader(self.spec)
