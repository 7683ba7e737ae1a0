"""The subtask side a user implements: one instance per subtask per batch, in a Spark task."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sparkcoord.core.control import BatchRequested


class SubtaskContext:
    """What a subtask knows and may do. Created by the runtime for each task attempt.

    Thread model: used from the Spark task's thread only.
    """

    #: How long :meth:`request` waits for an answer by default (seconds).
    DEFAULT_REQUEST_TIMEOUT_S = 60.0

    def __init__(self, operator_id: str, subtask: int, parallelism: int, epoch: int,
                 attempt: int | Callable[[], int], spark_attempt: int,
                 send: Callable[[Any], None],
                 request: Callable[[Any, float], Any] | None = None) -> None:
        #: the coordinated operator's name
        self.operator_id = operator_id
        #: this subtask's index, 0 .. parallelism - 1
        self.subtask = subtask
        self.parallelism = parallelism
        #: the epoch whose batch this task runs (the service's checkpoint id, not Spark's
        #: batch id)
        self.epoch = epoch
        self._attempt = attempt
        #: Spark's task attempt number within this batch (0 = first try)
        self.spark_attempt = spark_attempt
        self._send = send
        self._request = request

    @property
    def attempt(self) -> int:
        """The execution attempt number the coordinator sees for this subtask. Task thread.

        A first attempt registers with the coordinator lazily; reading this registers it (one
        round trip) if it has not sent anything yet.
        """
        if callable(self._attempt):
            self._attempt = self._attempt()
        return self._attempt

    def send_event(self, event: Any) -> None:
        """Send ``event`` to the coordinator. Task thread.

        Pickled here: an unpicklable or oversized event raises at once. The task does not end
        its batch before every event it sent is acknowledged (logged durably and queued on the
        coordinator's mailbox); the coordinator handles it exactly once in the surviving state.
        """
        self._send(event)

    def request_batch(self) -> None:
        """Ask for another batch: this subtask has work pending (a split it did not finish).
        Task thread. Travels and is logged like an event (the coordinator does not see it);
        a new epoch is sealed at Spark's next ``latestOffset`` even if nothing else is to
        carry."""
        self._send(BatchRequested())

    def request(self, request: Any, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> Any:
        """Ask the coordinator and wait for its answer, inside the running batch. Task thread.

        The coordinator's ``handle_request(subtask, attempt, request)`` answers on its
        mailbox (or later, through a future). Exactly once: the request is logged before the
        coordinator sees it and the answer before this call returns it, so a retried task or a
        replayed batch that asks its k-th item again gets the logged answer, as it was logged,
        without asking the coordinator again. Requests and events of a task share one order:
        a retry must send and ask the same things in the same order (a different request
        fails the job as nondeterministic).

        Raises :class:`~sparkcoord.core.errors.RequestRefused` when the coordinator refused
        (failed its future), and :class:`~sparkcoord.core.errors.RequestFailed` when no answer
        came within ``timeout_s`` or none will (the job failed over, the run ended); both name
        the operator, the subtask, the epoch and the request.
        """
        if self._request is None:
            raise RuntimeError(f"{self.operator_id}[{self.subtask}]: this context cannot ask "
                               f"requests")
        return self._request(request, timeout_s)


class SubtaskOperator:
    """Base class of the operator a coordinated source runs in each Spark task.

    Per batch, in one Python worker of an executor: ``open`` with the state of the previous
    epoch (``None`` at first), ``handle_operator_event`` for every event the coordinator sealed
    into this epoch, in send order, before any data, then ``process``, then ``snapshot_state``
    (stored for the next batch and for retries), then ``close``. Rows are tuples matching the
    source's schema, or ``pyarrow.RecordBatch`` objects with exactly its Arrow schema (Spark
    takes those without converting rows; one kind per task, as Spark requires); yield them
    from ``handle_operator_event`` and ``process``.

    Operators must be deterministic: a retried or replayed batch gets the same state and events
    and must send the same events back.
    """

    context: SubtaskContext

    def open(self, context: SubtaskContext, state: Any) -> None:
        """Start of the batch, with the state snapshotted at the end of the previous one."""
        self.context = context

    def handle_operator_event(self, event: Any) -> Iterable[tuple[Any, ...]] | None:
        """One event from the coordinator. May yield rows."""
        return None

    def process(self) -> Iterable[tuple[Any, ...]] | None:
        """After the epoch's events: the data of the batch (e.g. read the assigned splits)."""
        return None

    def snapshot_state(self) -> Any:
        """Small picklable state for the next batch. Large keyed state belongs in Spark."""
        return None

    def close(self) -> None:
        """End of the batch (also after a failure)."""


class RecipientOperator(SubtaskOperator):
    """Base class of a downstream operator (``CoordinatedJob.apply``, run by
    ``sparkcoord.spark.recipient``): adds the input rows of the batch."""

    def process_input(self, rows: list[dict[str, Any]]) -> Iterable[tuple[Any, ...]] | None:
        """A chunk of the batch's input rows (as dicts), after the epoch's events. Task thread,
        called by :meth:`process_arrow`'s default."""
        return None

    def process_arrow(self, batch: Any) -> Iterable[tuple[Any, ...]] | None:
        """A chunk of the batch's input as a ``pyarrow.RecordBatch``, after the epoch's events
        (task thread, for each batch ``mapInArrow`` hands the operator). The default turns it
        into dicts for :meth:`process_input`; an operator that works on columns (a sink
        writing files) overrides this instead and never pays for the rows."""
        return self.process_input(batch.to_pylist())
