"""Errors raised by the core. Each names the problem and the values involved."""

from __future__ import annotations


class SparkCoordError(Exception):
    """Base class of every error sparkcoord raises on purpose."""

    #: a failure no restart can change (a refusal): the job runner gives up at once instead
    #: of restarting the query (sparkcoord/spark/job.py rule 6)
    permanent = False


class IllegalTransition(SparkCoordError):
    """An input that the protocol does not allow in the current state.

    The state machine that raised it is unchanged.
    """


class CheckpointIdRegression(IllegalTransition):
    """A checkpoint id that does not increase."""

    def __init__(self, what: str, given: int, last: int) -> None:
        super().__init__(f"{what}: checkpoint id {given} must be greater than {last}")
        self.given = given
        self.last = last


class UnknownSubtask(IllegalTransition):
    """A subtask index outside 0..parallelism-1, or an operator that does not exist."""


class EventEncodingError(SparkCoordError):
    """An event could not be pickled at send time; nothing was sent."""


class EventTooLarge(SparkCoordError):
    """An encoded event exceeds the configured size limit; nothing was sent."""

    def __init__(self, size: int, limit: int, what: str) -> None:
        super().__init__(
            f"{what} is {size} bytes encoded, over the limit of {limit} bytes (raise "
            "max_event_bytes in the job's ServiceConfig: CoordinatedJob(spark, dir, "
            "config=ServiceConfig(max_event_bytes=...)); or send a reference to the data, "
            "e.g. a file path, instead of the data)"
        )
        self.size = size
        self.limit = limit


class CorruptRecord(SparkCoordError):
    """A checkpoint record or log that fails its checksum or cannot be parsed."""


class UnknownRecordVersion(CorruptRecord):
    """A checkpoint record written by a format version this library does not read."""


class WrongThread(SparkCoordError):
    """A coordinator-owned method was called outside the coordinator's mailbox thread."""


class GatewayNotReady(SparkCoordError, LookupError):
    """A coordinator asked for a subtask gateway that it has not been handed (yet).

    Gateways arrive through ``execution_attempt_ready``, which the runtime calls for every
    subtask right after ``start()`` returns; a send from ``start()`` has no gateway to go to.
    """


class AttemptNoLongerLive(SparkCoordError):
    """A send through the gateway of an execution attempt that has failed.

    Sends to a subtask that merely has no task running (between batches, during a restore) are
    accepted and held; only a gateway whose attempt failed refuses them.
    """


class RequestRefused(SparkCoordError):
    """The coordinator refused a request (it failed the response future); the message names
    the operator, the subtask, the request and the coordinator's reason."""


class RequestFailed(SparkCoordError):
    """A request got no answer: the job failed over, the service refused it, or it timed out.
    The message names the operator, the subtask, the request and why."""


class OperatorCodeFailed(SparkCoordError):
    """A subtask operator's own code raised, on a Python without exception notes (3.10): the
    message names the operator, subtask, epoch and callback and carries the user's traceback.
    From Python 3.11 on the user's exception itself leaves the task, with a note saying the
    same (Spark's failure text keeps a note, and may drop a cause)."""


class WithdrawnNotHandled(SparkCoordError):
    """A task retry finished without items its failed attempt sent (answers were handed out
    that no surviving task uses), and the coordinator does not implement
    ``handle_items_withdrawn`` to take them back: the job fails instead of losing them."""


class RunUnavailable(RequestFailed):
    """A client request found no run of the job to take it: the query was starting,
    restarting or failing over for the whole of the request's timeout (or, called from
    ``until`` on the job's own thread, a restart was due: that thread performs it, so the
    request does not wait for it). The job runner takes it from ``until`` as "not done yet"
    while a restart is due or the query has not run a batch yet (docs/protocol.md
    [client-requests-take-effect-once])."""


class MalformedRecord(SparkCoordError):
    """A record of a CSV or JSON-lines file that does not parse or does not fit the schema,
    raised by the file source's reader in a Spark task in mode ``FAILFAST`` (or in mode
    ``PERMISSIVE`` when a column that cannot be null would have to hold null). The message
    names the file, the line (1-based), the byte offset of the record and the parser's reason;
    ``path``, ``line`` and ``offset`` hold the same."""

    def __init__(self, message: str, *, path: str = "", line: int = 0, offset: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.offset = offset
