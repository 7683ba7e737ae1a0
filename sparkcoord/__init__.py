"""sparkcoord: Flink-style operator coordinators for PySpark Structured Streaming.

The user-facing API:

* :class:`OperatorCoordinator`, :class:`CoordinatorContext`, :class:`SubtaskGateway`: the
  driver-side coordinator you implement and what it is handed.
* :class:`EventCodec`: how events are encoded (pickle, with a size limit).
* Restart strategies: :class:`FixedDelay`, :class:`ExponentialBackoff`, :class:`FailureRate`.
* :mod:`sparkcoord.testing`: fakes and a harness to unit-test your coordinators.

The names load on first use, as :mod:`sparkcoord.spark`'s do: every process that imports a
submodule runs this file first (Spark's task workers; ``sparkcoord-python``, which starts
Spark's Python processes and then replaces itself, docs/decisions/082-compiled-python-start.md)
and needs none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkcoord.core.lazy import names_on_first_use

if TYPE_CHECKING:
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

#: name -> the module that holds it
_HOMES = {
    "Cancellable": "sparkcoord.coordinator",
    "CoordinatorContext": "sparkcoord.coordinator",
    "CoordinatorProvider": "sparkcoord.coordinator",
    "OperatorCoordinator": "sparkcoord.coordinator",
    "SubtaskGateway": "sparkcoord.coordinator",
    "Withdrawn": "sparkcoord.coordinator",
    "EventCodec": "sparkcoord.core.codec",
    "AttemptNoLongerLive": "sparkcoord.core.errors",
    "CheckpointIdRegression": "sparkcoord.core.errors",
    "CorruptRecord": "sparkcoord.core.errors",
    "EventEncodingError": "sparkcoord.core.errors",
    "EventTooLarge": "sparkcoord.core.errors",
    "GatewayNotReady": "sparkcoord.core.errors",
    "IllegalTransition": "sparkcoord.core.errors",
    "MalformedRecord": "sparkcoord.core.errors",
    "RequestFailed": "sparkcoord.core.errors",
    "RequestRefused": "sparkcoord.core.errors",
    "SparkCoordError": "sparkcoord.core.errors",
    "UnknownRecordVersion": "sparkcoord.core.errors",
    "UnknownSubtask": "sparkcoord.core.errors",
    "WithdrawnNotHandled": "sparkcoord.core.errors",
    "WrongThread": "sparkcoord.core.errors",
    "StoredOnce": "sparkcoord.core.stored",
    "ExponentialBackoff": "sparkcoord.runtime.restart",
    "FailureRate": "sparkcoord.runtime.restart",
    "FixedDelay": "sparkcoord.runtime.restart",
    "NoRestart": "sparkcoord.runtime.restart",
    "RestartStrategy": "sparkcoord.runtime.restart",
}

__all__ = [
    "AttemptNoLongerLive", "Cancellable", "CheckpointIdRegression", "CoordinatorContext",
    "CoordinatorProvider", "CorruptRecord", "EventCodec", "EventEncodingError", "EventTooLarge",
    "ExponentialBackoff", "FailureRate", "FixedDelay", "GatewayNotReady", "IllegalTransition",
    "MalformedRecord", "NoRestart", "OperatorCoordinator", "RequestFailed", "RequestRefused",
    "RestartStrategy", "SparkCoordError", "StoredOnce", "SubtaskGateway",
    "UnknownRecordVersion", "UnknownSubtask", "Withdrawn", "WithdrawnNotHandled", "WrongThread",
    "__version__",
]

__getattr__ = names_on_first_use(__name__, _HOMES)
