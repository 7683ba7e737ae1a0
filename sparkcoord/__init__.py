"""sparkcoord: Flink-style operator coordinators for PySpark Structured Streaming.

The user-facing API:

* :class:`OperatorCoordinator`, :class:`CoordinatorContext`, :class:`SubtaskGateway`: the
  driver-side coordinator you implement and what it is handed.
* :class:`EventCodec`: how events are encoded (pickle, with a size limit).
* Restart strategies: :class:`FixedDelay`, :class:`ExponentialBackoff`, :class:`FailureRate`.
* :mod:`sparkcoord.testing`: fakes and a harness to unit-test your coordinators.
"""

from sparkcoord.coordinator import (
    Cancellable,
    CoordinatorContext,
    CoordinatorProvider,
    OperatorCoordinator,
    SubtaskGateway,
    Withdrawn,
)
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.errors import (
    AttemptNoLongerLive,
    CheckpointIdRegression,
    CorruptRecord,
    EventEncodingError,
    EventTooLarge,
    GatewayNotReady,
    IllegalTransition,
    MalformedRecord,
    RequestFailed,
    RequestRefused,
    SparkCoordError,
    UnknownRecordVersion,
    UnknownSubtask,
    WithdrawnNotHandled,
    WrongThread,
)
from sparkcoord.core.stored import StoredOnce
from sparkcoord.runtime.restart import (
    ExponentialBackoff,
    FailureRate,
    FixedDelay,
    NoRestart,
    RestartStrategy,
)

__version__ = "0.1.0"

__all__ = [
    "AttemptNoLongerLive", "Cancellable", "CheckpointIdRegression", "CoordinatorContext",
    "CoordinatorProvider", "CorruptRecord", "EventCodec", "EventEncodingError", "EventTooLarge",
    "ExponentialBackoff", "FailureRate", "FixedDelay", "GatewayNotReady", "IllegalTransition",
    "MalformedRecord", "NoRestart", "OperatorCoordinator", "RequestFailed", "RequestRefused",
    "RestartStrategy", "SparkCoordError", "StoredOnce", "SubtaskGateway",
    "UnknownRecordVersion", "UnknownSubtask", "Withdrawn", "WithdrawnNotHandled", "WrongThread",
    "__version__",
]
