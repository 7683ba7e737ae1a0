"""Settings of the coordination service (see docs/configuration.md).

A module of its own because the settings travel inside every coordinated source's spec to
Spark's Python workers, which must not import the service (threads, storage) to read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkcoord.core.codec import DEFAULT_MAX_EVENT_BYTES


@dataclass(frozen=True)
class ServiceConfig:
    """Settings of the coordination service (see docs/configuration.md)."""

    checkpoint_timeout_s: float = 60.0
    tolerable_checkpoint_failures: int = 0
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    #: A coordinator callback running, or a checkpoint waiting, longer than this is logged as
    #: a warning, again every interval while it lasts (0 turns the warnings off).
    stall_warning_s: float = 10.0
    #: Connections the channel server serves at once; more are refused. None: automatic,
    #: max(64, 4 x the total parallelism of the source's operators and recipients).
    max_channel_connections: int | None = None
    #: A channel connection must send its first authenticated frame within this time.
    channel_first_frame_timeout_s: float = 10.0
    #: A task the service refuses because the job failed waits up to this long (measured
    #: from the failure) for the job runner to cancel it: ``CoordinatedJob.run``/``start``
    #: stops the query when the job fails, and Spark logs a cancelled task in one line and
    #: does not retry it. Past it (a query run otherwise) the task fails by itself. 0: at once.
    cancel_wait_s: float = 10.0
    #: An ``availableNow`` run ends only once every coordinator's side effects of the
    #: committed batches are done (``OperatorCoordinator.run_ending``); one not done within
    #: this time fails the run, naming the coordinator (docs/protocol.md
    #: [run-ends-after-side-effects]).
    run_end_wait_s: float = 300.0
