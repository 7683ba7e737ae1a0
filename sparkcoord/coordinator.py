"""The API a user implements: operator coordinators, their context and subtask gateways.

Vocabulary: a coordinated operator has ``parallelism`` subtasks (index 0..P-1) that run as Spark
tasks, batch after batch; its coordinator is one long-lived object on the driver. An *execution
attempt* of a subtask spans many batches and ends only when a task of that subtask fails (Spark
retries it as a new attempt). A *checkpoint* is taken per epoch; each epoch's events reach the
subtasks in the next micro-batch, before any of that batch's data.

Every callback of a coordinator runs on its own single-thread mailbox, one at a time, in order.
Callbacks must not block (I/O goes to ``CoordinatorContext.call_async``). Sends and the
completion of the checkpoint future may happen from any thread: they are ordered through the
mailbox, so "send e1, complete, send e2" keeps its order.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from sparkcoord.core.errors import GatewayNotReady, WithdrawnNotHandled

T = TypeVar("T")


class Cancellable(abc.ABC):
    """A handle on something scheduled."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop it; idempotent. Any thread."""


class SubtaskGateway(abc.ABC):
    """The way to send events to one execution attempt of one subtask.

    A gateway is bound to the attempt it was handed out for in
    :meth:`OperatorCoordinator.execution_attempt_ready`. After that attempt fails, its sends
    fail at once; a subtask that merely has no task running (between batches) accepts them.
    """

    subtask: int
    attempt: int

    @abc.abstractmethod
    def send_event(self, event: Any) -> Future[None]:
        """Send ``event`` to the subtask. Any thread; returns at once.

        The event is pickled right here: an unpicklable or oversized event raises
        :class:`~sparkcoord.core.errors.EventEncodingError` or
        :class:`~sparkcoord.core.errors.EventTooLarge` in the caller and nothing is sent.
        The returned future completes when the batch that delivered the event commits; it
        fails if the event was still held when its attempt failed or the coordinator was
        reset, and on a global failover. Events that share their fate (sent to the same subtask
        and held together) may share one future object; ``cancel()`` returns False (a sent
        event cannot be unsent).
        """

    def send_events(self, events: Iterable[Any]) -> list[Future[None]]:
        """Send several events to the subtask, in order: the same as calling
        :meth:`send_event` for each, at a fraction of the cost. Any thread; returns at once.

        Every event is pickled first: if one cannot be, the error names it and none is sent.
        Returns one future per event, in order (the same future for all: they share their fate).
        """
        return [self.send_event(e) for e in list(events)]


@dataclass(frozen=True)
class Withdrawn:
    """An item of a subtask's history in an epoch that its surviving attempt did not send
    again: a task retry (or the rerun of a batch after a restart) adopted the failed
    attempt's history, sent a shorter one, and finished (docs/protocol.md
    [every-answer-consumed-or-returned]).

    ``item`` is the event or request as the subtask sent it; ``is_request`` tells which.
    ``answered``: the request got an answer, ``answer``, which the failed attempt was handed
    and nobody will use (False for an event, for a request not answered yet and for a
    refused one; if you complete such a request's future later, that answer goes nowhere).
    """

    item: Any
    is_request: bool
    answered: bool = False
    answer: Any = None


class CoordinatorContext(abc.ABC):
    """What a coordinator may ask of the runtime. Handed to the coordinator's constructor."""

    operator_id: str
    parallelism: int
    #: True while the coordinator's ``start()`` runs (no gateway is ready then).
    starting: bool = False
    #: True when this run is Spark's ``Trigger.AvailableNow``: the run ends at the first
    #: trigger that seals nothing, so a coordinator with work left must keep asking for
    #: batches (``request_batch``) until it has handed out what was present when it started.
    available_now: bool = False
    #: True for a coordinator restored from checkpoint N whose batch had committed in Spark:
    #: the logged inputs of batch N are handed to it again after ``start``, then
    #: ``notify_checkpoint_complete(N)`` (docs/protocol.md [restore-order]
    #: [completion-is-repeatable]). False for a fresh start and for a restore whose batch N runs
    #: again. A committer uses it to tell epoch N's side effect, which its predecessor may have
    #: made, from one this run is about to produce.
    restored_committed: bool = False

    @abc.abstractmethod
    def fail_job(self, cause: BaseException | str) -> None:
        """Fail the whole query (global failover); the restart strategy restarts it.

        Any thread. Only the first call counts until the coordinator is reset.
        """

    @abc.abstractmethod
    def run_in_coordinator_thread(self, action: Callable[[], None]) -> None:
        """Run ``action`` on this coordinator's mailbox, after what is already queued.

        Any thread. An exception from ``action`` fails the job like one from a callback.
        """

    def request_batch(self) -> None:
        """Ask for another batch: work is pending (a queue is not empty, a split is not done).

        Any thread. At Spark's next ``latestOffset`` a new epoch is sealed and its batch runs
        even if no event is held for a subtask (otherwise a batch runs only when there are
        events to carry, or ``checkpoint_interval_s`` passed). One batch per call made before
        that checkpoint; call it again (e.g. from ``notify_checkpoint_complete``) for more.
        Subtasks ask the same with ``SubtaskContext.request_batch()``.
        """
        raise NotImplementedError

    @abc.abstractmethod
    def call_periodically(self, interval_s: float, action: Callable[[], None]) -> Cancellable:
        """Run ``action`` on the mailbox every ``interval_s`` seconds until cancelled or reset."""

    def call_async(self, work: Callable[[], T],
                   handler: Callable[[T | None, BaseException | None], None] | None = None, *,
                   lane: str = "io") -> None:
        """Run ``work`` off the mailbox (I/O: list a directory, ask a server), then
        ``handler(result, None)`` or ``handler(None, error)`` on the mailbox, as Flink's
        ``callAsync``. Called by the coordinator on its mailbox (or any thread).

        The works of one ``lane`` run one at a time, in order; lanes run beside each other
        (``runtime/workers.py`` rule 1): one lane per connection the coordinator keeps. A work
        handed over runs even if the coordinator is reset or closed meanwhile; its handler then
        does not (rule 2). Without a handler, the result is dropped and an error fails the job
        naming the work; an error the handler raises fails the job too. Tests drive the works
        by hand (``CoordinatorHarness.workers``)."""
        raise NotImplementedError

    @abc.abstractmethod
    def is_coordinator_thread(self) -> bool:
        """Whether the caller runs on this coordinator's mailbox thread."""


class OperatorCoordinator:
    """Base class of a coordinator. Override what you need; every method runs on the mailbox.

    The runtime creates a coordinator by calling ``YourClass(context)``; after a subtask failure
    (default mode) or a global failover it creates a fresh one and fences the old one, whose
    context goes quiet (its sends fail, its ``fail_job`` is ignored).

    Order of calls in one life: ``reset_to_checkpoint`` (restore point, or ``(-1, None)`` when
    nothing was checkpointed), ``start``, ``execution_attempt_ready`` for every subtask, then any
    of the other callbacks, and ``close`` at the end.
    """

    #: Opt in to Flink's per-subtask failure sequence (``execution_attempt_failed``,
    #: ``subtask_reset``, ``execution_attempt_ready``) instead of resetting the whole
    #: coordinator when one subtask's task fails. Only correct for coordinators that never
    #: answer an event of one subtask by sending to another (a split enumerator).
    resets_per_subtask: ClassVar[bool] = False

    def __init__(self, context: CoordinatorContext) -> None:
        self.context = context
        self._gateways: dict[int, SubtaskGateway] = {}

    def start(self) -> None:
        """Called once, after ``reset_to_checkpoint``, before any other callback."""

    def close(self) -> None:
        """Called once when the coordinator is discarded (end of run, reset, failover)."""

    def run_ending(self) -> Future[None] | None:
        """An ``availableNow`` run is about to end: the last batch committed (its
        ``notify_checkpoint_complete`` came before this call) and no coordinator asked for
        another batch. Mailbox thread. Return a future that completes once the side effects
        of the committed batches are done (a committer's queued commits), or ``None`` if
        there are none: the run reports done only after it completed, so a run that says it
        is done holds them. A future not done within the service's ``run_end_wait_s`` fails
        the run naming this coordinator (what is pending stays in the checkpoint and is done
        after the restart). Spark's source ``stop`` comes after the query ended, too late to
        hold it (docs/protocol.md [run-ends-after-side-effects])."""
        return None

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        """An event that subtask ``subtask`` (execution attempt ``attempt``) sent.

        Events of a batch are handled before the batch commits, exactly once in the state that
        survives: after a failure, the runtime hands the surviving events to a reset
        coordinator again, in their original order.
        """

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        """Answer ``request`` of subtask ``subtask`` (execution attempt ``attempt``), asked with
        ``SubtaskContext.request`` inside a running batch. Mailbox thread.

        Return the response (any picklable value), or a :class:`~concurrent.futures.Future`
        that you complete later, from any thread (a worker that waits for more work parks
        its future until some arrives). Fail that future to refuse the request: the task's
        ``request`` raises :class:`~sparkcoord.core.errors.RequestRefused` with the reason.
        An exception raised right here fails the job, as from any callback.

        The contract (docs/coordinators.md, "Requests"): every request is logged before it
        reaches you and every response before the task sees it, so a retried task or a
        replayed batch gets the logged answer again without asking you; after a restore you
        are handed the logged requests again, in log order, and must answer them the same way.
        So the answer must be a deterministic function of your checkpointed state and of the
        inputs the runtime hands you (events, requests): state that a timer or another thread
        changed since the last checkpoint is not replayed. Once a request was answered in a
        batch, a task retry no longer resets the coordinator: the retry continues the failed
        attempt's history (docs/protocol.md [retry-adopts-history-once-answered]).

        The default refuses every request.
        """
        refused: Future[Any] = Future()
        refused.set_exception(NotImplementedError(
            f"coordinator {self.context.operator_id!r} ({type(self).__qualname__}) does not "
            f"answer requests: implement handle_request(subtask, attempt, request)"))
        return refused

    def handle_client_request(self, request: Any) -> Any:
        """Answer ``request`` from a client of the job: the user's driver program, through
        ``CoordinatedJob.request`` (status, pause and resume, add work). Mailbox thread.

        Return the answer or a future, as in :meth:`handle_request`. The request is logged
        before it reaches you, so what it changes survives a task retry's reset and a restore
        (it is handed to you again, in log order); its answer is the state when it was asked
        and is not compared when replayed. The default refuses every request.
        """
        refused: Future[Any] = Future()
        refused.set_exception(NotImplementedError(
            f"coordinator {self.context.operator_id!r} ({type(self).__qualname__}) does not "
            f"answer client requests: implement handle_client_request(request)"))
        return refused

    def handle_items_withdrawn(self, subtask: int, attempt: int,
                               withdrawn: list[Withdrawn]) -> None:
        """Take back what the last items of ``subtask``'s history did: its surviving attempt
        ``attempt`` finished the batch without sending them again. Mailbox thread, in log
        order (a restore replays it at the same place).

        Happens only after a task retry that adopted a history (once the operator answered a
        request in the epoch, docs/protocol.md [retry-adopts-history-once-answered]) and sent
        fewer items than the attempt it replaced, e.g. a worker whose time budget ran out
        sooner. ``withdrawn`` lists those items in the order they were sent: for each request
        put back what its answer handed out (an item of a queue, a split: Flink's
        ``addSplitsBack``) and undo what it reported; for each event undo its effect. The
        retry's own output holds none of them.

        The default fails the job, naming the operator, the subtask and the items: without
        this method, what was handed out would be lost silently.
        """
        raise WithdrawnNotHandled(
            f"coordinator {self.context.operator_id!r} ({type(self).__qualname__}): subtask "
            f"{subtask}'s surviving attempt finished without {len(withdrawn)} item(s) its "
            f"failed attempt sent ({', '.join(_describe(w) for w in withdrawn[:5])}"
            f"{', ...' if len(withdrawn) > 5 else ''}); what their answers handed out would be "
            f"lost: implement handle_items_withdrawn(subtask, attempt, withdrawn) to take it "
            f"back (docs/coordinators.md, 'A retry that asks less')")

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        """Take checkpoint ``checkpoint_id``: complete ``result`` with your state.

        The state may be any picklable value (bytes included); it is pickled at the instant the
        future completes, and that instant is the checkpoint boundary: events sent before it
        reach the subtasks in this epoch, events sent after it in a later one. Complete it now
        or later, from any thread; fail it (``set_exception``) to decline the checkpoint.
        """
        result.set_result(None)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The batch of ``checkpoint_id`` committed in Spark: commit external side effects here.

        After a restart the same id may be notified again; make side effects idempotent per id.
        """

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was declined or timed out; held events stay queued."""

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        """Restore to the state completed for ``checkpoint_id`` (``(-1, None)``: fresh start)."""

    def subtask_reset(self, subtask: int, checkpoint_id: int) -> None:
        """Only if ``resets_per_subtask``: forget what ``subtask`` did after ``checkpoint_id``.

        Events you sent to it that had not been sealed into an epoch failed; re-offer them.
        """

    def execution_attempt_failed(self, subtask: int, attempt: int, reason: str) -> None:
        """Only if ``resets_per_subtask``: the task of ``(subtask, attempt)`` failed."""
        self._gateways.pop(subtask, None)

    def execution_attempt_ready(self, subtask: int, attempt: int, gateway: SubtaskGateway) -> None:
        """``gateway`` sends to execution attempt ``attempt`` of ``subtask`` from now on.

        The base class remembers it; :meth:`ready_gateways` lists them. Call ``super()`` if you
        override this.
        """
        self._gateways[subtask] = gateway

    def ready_gateways(self) -> list[tuple[int, SubtaskGateway]]:
        """The current gateway of every subtask, by subtask index. Mailbox thread.

        Raises :class:`~sparkcoord.core.errors.GatewayNotReady` when called from ``start()``:
        no gateway exists yet, and an empty list there would make a send silently do nothing.
        """
        if getattr(self.context, "starting", False):
            raise GatewayNotReady(
                f"coordinator {self.context.operator_id!r}: no subtask gateway is ready during "
                f"start(). Gateways arrive through execution_attempt_ready(), which runs for "
                f"every subtask right after start() returns: send from there, or from a later "
                f"callback or timer (call_periodically)")
        return sorted(self._gateways.items(), key=lambda kv: kv[0])

    def gateway(self, subtask: int) -> SubtaskGateway:
        """The current gateway of ``subtask``. Mailbox thread.

        Raises :class:`~sparkcoord.core.errors.GatewayNotReady` (a ``LookupError``) if there is
        none: during ``start()``, or after the subtask's attempt failed in per-subtask mode
        until its next attempt is ready."""
        try:
            return self._gateways[subtask]
        except KeyError:
            when = ("during start(); gateways arrive through execution_attempt_ready(), right "
                    "after start() returns" if getattr(self.context, "starting", False)
                    else "now; it arrives through execution_attempt_ready()")
            raise GatewayNotReady(
                f"coordinator {self.context.operator_id!r} has no gateway for subtask "
                f"{subtask} {when}") from None


def _describe(w: Withdrawn) -> str:
    if not w.is_request:
        return f"event {w.item!r}"
    return f"request {w.item!r} answered {w.answer!r}" if w.answered else f"request {w.item!r}"


#: What the runtime calls to create a coordinator: usually the class itself.
CoordinatorProvider = Callable[[CoordinatorContext], OperatorCoordinator]
