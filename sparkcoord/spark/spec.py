"""What a coordinated source is made of, as the driver, the source runner and the tasks share it.

The specs are shipped as one option string (cloudpickled, base64); a partition is pickled to
the task that runs a subtask. Imported in every process (Spark's planning process, the source
runner, the Python workers), so it imports nothing of the service, the channel or fsspec
(docs/decisions/032-worker-imports.md).

The offsets a source gives Spark, and how its offset log is read: spark/offsets.py.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark import cloudpickle
from pyspark.sql.datasource import InputPartition

from sparkcoord.core.encoding import encoded
from sparkcoord.runtime.config import ServiceConfig

FORMAT = "sparkcoord"


@encoded("spark.OperatorSpec")
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
    #: the rows' schema: a DDL string or a ``StructType``
    schema: Any
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
    #: fsspec options for ``checkpoint_url`` (credentials, endpoint), for every process
    storage_options: dict[str, Any] = field(default_factory=dict)
    #: the level of sparkcoord's lines in the source runner (sparkcoord.runtime.logs)
    log_level: str = "WARNING"

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


class CoordinatedPartition(InputPartition):
    """The input of one subtask in one batch: its sealed events and how to reach the service."""

    def __init__(self, operator: str, index: int, epoch: int, events: Sequence[bytes],
                 address: tuple[str, int], secret: bytes, run_id: str,
                 previous_epoch: int | None = None, continues_history: bool = False) -> None:
        super().__init__(f"{operator}[{index}]@{epoch}")
        self.operator = operator
        self.index = index
        self.epoch = epoch
        #: the epoch of the batch before this one (every subtask ran it), None for the first
        self.previous_epoch = previous_epoch
        self.events = list(events)
        self.address = address
        self.secret = secret
        self.run_id = run_id
        #: the batch runs again after a restore and this subtask's logged history is kept:
        #: its task registers at once and says at its end how much of it it sent
        #: (docs/protocol.md [rerun-keeps-answered-histories] [logged-finish-binds-the-rerun])
        self.continues_history = continues_history
