"""The coordinator holder: one coordinator instance, its mailbox, its valve and its futures.

Rules:
  1. Every coordinator callback, every valve change and every future of this coordinator is
     touched on the mailbox thread only (its own thread, or a thread that claimed the idle
     mailbox to answer a request: mailbox rule 2). Other threads enqueue.
  2. A send or a checkpoint completion made on the mailbox thread takes effect at once; from
     another thread it is enqueued at the instant it happens. Either way the mailbox order is
     the order in which the sends and the completion happened, which defines the boundary.
  3. A reset (subtask failure in default mode) fences the current instance by bumping the
     generation: its gateways, timers and ``fail_job`` go quiet; its held events fail; a fresh
     instance is created from the provider, reset to the epoch's snapshot, started, handed its
     gateways and the surviving events of the running batch, in log order.
  4. An exception from any callback, and ``fail_job``, report a global failure to the listener,
     once per generation.
  5. A failed instance is fenced the moment it fails (rule 4) or the service reports a global
     failure from anywhere: no further callback reaches it (no replayed event, no completion
     notice, no checkpoint), its gateways and timers go quiet; only ``close()`` is still
     called, after the failing callback has returned, so that it can release resources. Its
     state matches no checkpoint, so acting on it (committing side effects in
     ``notify_checkpoint_complete``) would break the guarantee.

  6. A callback or action that runs longer than ``stall_warning_s`` is reported by a
     watchdog on the clock's timer thread (first within two intervals of its start, then once
     per interval while it lasts; no clock read per callback), naming the coordinator and the
     callback: callbacks must not block, and a blocked one stalls every
     checkpoint of the job with no other sign until the checkpoint timeout.

Thread model: public methods may be called from any thread and return at once; everything they
do happens on the mailbox. The listener is called on the mailbox thread. The watchdog reads two
attributes that the mailbox thread writes (a racy read is fine for a warning).
"""

from __future__ import annotations

import logging
import pickle
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from sparkcoord.coordinator import (
    Cancellable,
    CoordinatorContext,
    CoordinatorProvider,
    OperatorCoordinator,
    SubtaskGateway,
)
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.control import BatchRequested
from sparkcoord.core.errors import (
    AttemptNoLongerLive,
    EventEncodingError,
    EventTooLarge,
    SparkCoordError,
    WrongThread,
)
from sparkcoord.core.stored import StoredOnce, dump_snapshot, load_snapshot
from sparkcoord.core.valve import OutboundValve
from sparkcoord.runtime.clock import Clock
from sparkcoord.runtime.futures import SendFuture
from sparkcoord.runtime.mailbox import Mailbox
from sparkcoord.runtime.workers import ThreadWorkers, Workers

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

log = logging.getLogger(__name__)


class CoordinatorFenced(SparkCoordError):
    """A send or action of a coordinator instance that was replaced by a reset or failover."""


class HolderListener(Protocol):
    """What a holder reports to the coordination service (on the holder's mailbox thread)."""

    def coordinator_completed(self, name: str, checkpoint_id: int, snapshot: bytes | None,
                              events: list[list[bytes]],
                              parts: dict[str, StoredOnce[Any]] | None = None) -> None: ...

    def coordinator_declined(self, name: str, checkpoint_id: int, reason: str) -> None: ...

    def coordinator_failed(self, name: str, cause: str) -> None: ...


#: Where a coordinator's answer to a request goes: ``answered(payload, failed)`` with the
#: pickled response, or (``failed``) the refusal's reason as UTF-8 text. Called on the thread
#: that produced the answer (the mailbox, or whichever thread completed the future).
Answered = Callable[[bytes, bool], None]


@dataclass(frozen=True, slots=True)
class ReplayedEvent:
    """An inbound event (or, with ``answered``, a request) handed to a coordinator again after
    a reset or at a restore."""

    subtask: int
    attempt: int
    event: Any
    answered: Answered | None = None
    #: a client's request (to ``handle_client_request``; ``subtask`` means nothing)
    client: bool = False
    #: a withdrawal: ``event`` is the list of withdrawn items (``handle_items_withdrawn``)
    withdrawn: bool = False


class CoordinatorHolder:
    """Runs one coordinator. See the module docstring for rules and thread model."""

    def __init__(self, name: str, provider: CoordinatorProvider, parallelism: int,
                 mailbox: Mailbox, clock: Clock, codec: EventCodec,
                 listener: HolderListener, last_checkpoint: int,
                 stall_warning_s: float = 10.0, available_now: bool = False,
                 read_part: Callable[[str], StoredOnce[Any]] | None = None,
                 workers: Workers | None = None) -> None:
        self.name = name
        #: where the contexts' ``call_async`` works run (runtime/workers.py)
        self.workers = workers or ThreadWorkers()
        self.available_now = available_now
        #: reads a state part its snapshots refer to (storage's ``read_part``; core/stored.py)
        self._read_part = read_part
        self.provider = provider
        self.parallelism = parallelism
        self.mailbox = mailbox
        self.clock = clock
        self.codec = codec
        self.listener = listener
        self.valve: OutboundValve[Future[None]] = OutboundValve(name, parallelism, last_checkpoint)
        self.generation = 0
        self.coordinator: OperatorCoordinator | None = None
        self._context: _Context | None = None
        self._closed = False
        # Set by the service, from any thread, at a global failure: from then on no callback
        # runs (rule 5). A plain attribute: written once, read on the mailbox thread.
        self._globally_failed = False
        # what the mailbox thread runs now (None between callbacks) and how many it began:
        # the watchdog's only inputs (rule 6)
        self._busy: str | None = None
        self._began = 0
        self.stall_warning_s = stall_warning_s
        self._watchdog: Cancellable | None = None
        # failed instances whose close() waits for the failing callback to return
        self._closing: list[OperatorCoordinator] = []
        # the coordinator or one of its subtasks asked for another batch (work pending); a
        # plain bool: set from any thread, cleared on the mailbox at the next checkpoint
        self.batch_requested = False

    # -------------------------------------------------------------------- service-facing API
    def start(self, checkpoint_id: int, snapshot: bytes | None,
              replay: Sequence[ReplayedEvent] = (), *, committed: bool = False) -> None:
        """Create the coordinator, reset it to ``checkpoint_id`` and start it; ``committed``:
        the batch of ``checkpoint_id`` committed in Spark (``replay`` is its logged inputs;
        the context's ``restored_committed``).

        Called by the service (driver thread) at the start of a run, before any checkpoint.
        """
        self._submit(lambda: self._create(checkpoint_id, snapshot, replay, committed))
        if self.stall_warning_s > 0 and self._watchdog is None:
            self._watchdog = self.clock.call_later(self.stall_warning_s,
                                                   lambda: self._watch(-1, 0.0))

    def _watch(self, began_before: int, blocked_s: float) -> None:
        # Clock's timer thread. The same callback still running as at the previous look means
        # it has run for more than the interval (rule 6).
        if self._closed:
            return
        busy, began = self._busy, self._began
        if busy is not None and began == began_before:
            blocked_s += self.stall_warning_s
            log.warning("coordinator %r has been running %s for more than %.0f s; callbacks run "
                        "on its mailbox and must not block: its events, its checkpoints and "
                        "with them the job's batches wait behind it", self.name, busy, blocked_s)
        else:
            blocked_s = 0.0
        self._watchdog = self.clock.call_later(self.stall_warning_s,
                                               lambda: self._watch(began, blocked_s))

    def trigger_checkpoint(self, checkpoint_id: int) -> None:
        """Ask the coordinator for checkpoint ``checkpoint_id``. Service, any thread."""
        self._submit(lambda: self._trigger(checkpoint_id))

    def checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: re-hold the cut, notify the coordinator."""
        def run() -> None:
            self.valve.checkpoint_aborted(checkpoint_id)
            self._callback(OperatorCoordinator.notify_checkpoint_aborted, checkpoint_id)
        self._submit(run)

    def checkpoint_sealed(self, checkpoint_id: int) -> None:
        """The record of ``checkpoint_id`` is durable: its events are now bound to the epoch."""
        def run() -> None:
            self.valve.checkpoint_sealed(checkpoint_id)
        self._submit(run)

    def batch_committed(self, epoch: int, notify: bool = True) -> None:
        """Spark committed the batch of ``epoch``: complete its futures, then notify."""
        def run() -> None:
            SendFuture.complete_all(self.valve.batch_committed(epoch))
            if notify:
                self._callback(OperatorCoordinator.notify_checkpoint_complete, epoch)
        self._submit(run)

    def deliver_many(self, runs: Sequence[tuple[int, int, list[Any]]]) -> None:
        """Accepted inbound events as runs ``(subtask, attempt, events)``, in order, as one
        mailbox action (inbound critical section; a batch read from one connection)."""
        def run() -> None:
            for subtask, attempt, events in runs:
                for event in events:
                    if type(event) is BatchRequested:  # for the runtime, not the coordinator
                        self.batch_requested = True
                        continue
                    self._callback(OperatorCoordinator.handle_event_from_operator, subtask, attempt, event)
        self._submit(run)

    def deliver_request(self, subtask: int | None, attempt: int, request: Any,
                        answered: Answered) -> bool:
        """An accepted request, as one mailbox action (the inbox, in its critical section):
        a task's (``subtask``, its execution ``attempt``) to the coordinator's
        ``handle_request``, a client's (``subtask`` None) to ``handle_client_request``; and
        ``answered`` once its answer exists (rule 7).

        True when the calling thread claimed the idle mailbox: it must then run it
        (``self.mailbox.run_claimed()``) once it left the critical section, and answers the
        request itself, without a thread handoff (mailbox rule 2)."""
        return self.mailbox.execute_claiming(lambda: self._ask(subtask, attempt, request, answered))

    def deliver_withdrawn(self, subtask: int, attempt: int, items: list[Any],
                          taken: Callable[[bool], None]) -> None:
        """Items of ``subtask``'s history that its surviving attempt finished without, as one
        mailbox action (inbound critical section): ``handle_items_withdrawn``, then
        ``taken(True)``, or ``taken(False)`` when it raised or no instance runs (the job
        failed)."""
        def run() -> None:
            result = self._callback(OperatorCoordinator.handle_items_withdrawn, subtask, attempt, items)
            taken(result is not _CALLBACK_FAILED)
        self._submit(run)

    def subtask_failed(self, subtask: int, old_attempt: int, reason: str, checkpoint_id: int,
                       snapshot: bytes | None, replay: Sequence[ReplayedEvent]) -> None:
        """A task of ``subtask`` was retried inside the batch of ``checkpoint_id`` (rule 7).

        Called inside the inbound critical section, before the new attempt's registration is
        acknowledged, so the reset comes before any of the new attempt's events on the mailbox.
        ``replay`` holds the surviving events of the other subtasks, in log order (default mode).
        """
        def run() -> None:
            if self._globally_failed:
                return  # the job is failing: no new instance, nothing more to reset
            new_attempt, failed = self.valve.attempt_failed(subtask)
            error = AttemptNoLongerLive(f"{self.name}[{subtask}] attempt {old_attempt} failed: {reason}")
            coordinator = self.coordinator
            if coordinator is not None and type(coordinator).resets_per_subtask:
                self._fail_futures(failed, error)
                self._callback(OperatorCoordinator.execution_attempt_failed, subtask, old_attempt, reason)
                self._callback(OperatorCoordinator.subtask_reset, subtask, checkpoint_id)
                self._callback(OperatorCoordinator.execution_attempt_ready, subtask, new_attempt,
                               _Gateway(self, self.generation, subtask, new_attempt))
                return
            self._fail_futures(failed + self.valve.held_events_dropped(), error)
            self._create(checkpoint_id, snapshot, replay)
        self._submit(run)

    def globally_failed(self, reason: str) -> None:
        """Global failover: fence the coordinator, fail every outstanding future, close it.

        Called by the service (any thread, under its lock) at the first global failure. No
        callback starts after this call returns (rule 5; one already running finishes); the
        rest happens on the mailbox.
        """
        self._globally_failed = True

        def run() -> None:
            self._fence()
            error = CoordinatorFenced(f"global failover of coordinator {self.name!r}: {reason}")
            self._fail_futures(self.valve.globally_reset(), error)
        self._submit(run)

    def run_ending(self) -> Future[None]:
        """An ``availableNow`` run is about to end (driver thread, after ``batch_committed``
        of its last batch): a future that completes once the coordinator's
        ``run_ending`` future did (at once when it returned none, raised, or no instance
        runs)."""
        done: Future[None] = Future()

        def run() -> None:
            result = self._callback(OperatorCoordinator.run_ending)
            if not isinstance(result, Future):
                done.set_result(None)
                return

            def finished(fut: Future[Any]) -> None:
                error = fut.exception()
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)
            result.add_done_callback(finished)
        self._submit(run)
        return done

    def close(self) -> None:
        """End of the run: close the coordinator and the mailbox. Any thread; idempotent."""
        def run() -> None:
            self._fence()
            self._closed = True
            if self._watchdog is not None:
                self._watchdog.cancel()
            while self._closing:  # a deferred close() still queued behind this action
                self._close_instance(self._closing.pop(0))
            self.mailbox.close()
        if self.mailbox.in_mailbox_thread():
            run()
        else:
            self.mailbox.execute(run)

    def held_count(self) -> int:
        """Events held for a future epoch. Any thread; a racy hint outside the mailbox."""
        return self.valve.held_count()

    # ------------------------------------------------------------------------ mailbox side
    def _submit(self, action: Callable[[], None]) -> None:
        self.mailbox.execute(action)

    def _create(self, checkpoint_id: int, snapshot: bytes | None,
                replay: Sequence[ReplayedEvent], committed: bool = False) -> None:
        if self._globally_failed:
            return
        self._fence()
        self.generation += 1
        self._context = _Context(self, self.generation)
        self._context.restored_committed = committed
        self._began += 1
        self._busy = "its constructor (and the unpickling of its snapshot)"
        try:
            self.coordinator = self.provider(self._context)
            state = (load_snapshot(snapshot, self._read_part, f"the snapshot of {self.name!r}")
                     if snapshot is not None else None)
        except Exception as exc:  # noqa: BLE001 - a user's constructor, a user's state class
            self._report_failure(self.generation, f"creating coordinator {self.name!r} (or "
                                                  f"unpickling its snapshot) raised "
                                                  f"{exc!r}{user_traceback(exc)}")
            return
        finally:
            self._busy = None
        if not (hasattr(self.coordinator, "context") and hasattr(self.coordinator, "_gateways")):
            # without OperatorCoordinator.__init__ the first callback would fail with an
            # AttributeError ('_gateways', 'context') that names nothing
            self._report_failure(self.generation, (
                f"coordinator {self.name!r} ({type(self.coordinator).__qualname__}) was "
                f"created without OperatorCoordinator.__init__: its own __init__ must call "
                f"super().__init__(context) first"))
            return
        self._callback(OperatorCoordinator.reset_to_checkpoint, checkpoint_id, state)
        self._context.starting = True
        try:
            self._callback(OperatorCoordinator.start)
        finally:
            self._context.starting = False
        for subtask in range(self.parallelism):
            attempt = self.valve.live_attempt(subtask)
            self._callback(OperatorCoordinator.execution_attempt_ready, subtask, attempt,
                           _Gateway(self, self.generation, subtask, attempt))
        for item in replay:
            if item.withdrawn:
                self._callback(OperatorCoordinator.handle_items_withdrawn, item.subtask, item.attempt, item.event)
            elif item.answered is not None:
                self._ask(None if item.client else item.subtask, item.attempt, item.event,
                          item.answered)
            elif type(item.event) is BatchRequested:
                self.batch_requested = True
            else:
                self._callback(OperatorCoordinator.handle_event_from_operator, item.subtask, item.attempt, item.event)

    def _ask(self, subtask: int | None, attempt: int, request: Any, answered: Answered) -> None:
        # Mailbox thread. The answer is pickled where it is produced (here, or in the thread
        # that completes the future), and handed on only while this instance still runs: a
        # fenced instance's answers match no surviving state (the service fails the waiters).
        generation = self.generation
        result = (self._callback(OperatorCoordinator.handle_client_request, request) if subtask is None
                  else self._callback(OperatorCoordinator.handle_request, subtask, attempt, request))
        if result is _CALLBACK_FAILED:
            return
        if isinstance(result, Future):
            result.add_done_callback(
                lambda f: self._answer(generation, subtask, request, f, answered))
        else:
            self._answer(generation, subtask, request, result, answered)

    def _answer(self, generation: int, subtask: int | None, request: Any, result: Any,
                answered: Answered) -> None:
        failed = False
        if isinstance(result, Future):
            if result.cancelled():
                payload, failed = b"the response future was cancelled", True
            elif result.exception() is not None:
                payload, failed = f"{result.exception()!r}".encode(), True
            else:
                result = result.result()
        if not failed:
            try:
                payload = self.codec.encode(result)
            except SparkCoordError as exc:
                context = self._context
                asker = "a client" if subtask is None else f"subtask {subtask}"
                cause = (f"coordinator {self.name!r} answered request {request!r} of {asker} "
                         f"with a response it cannot send: {exc}")
                self._run_or_submit(lambda: self._report_failure(
                    generation if context is None else context.generation, cause))
                return
        if generation != self.generation or self._globally_failed:
            return
        answered(payload, failed)

    def _fence(self, defer_close: bool = False) -> None:
        old, self.coordinator = self.coordinator, None
        if self._context is not None:
            self._context.fenced = True
            for timer in self._context.timers:
                timer.cancel()
        if old is not None:
            if defer_close and not self._closed:
                # the failing callback may still be on the stack: close after it returned
                # (or in close(), should the mailbox be closed before that action runs)
                self._closing.append(old)
                self.mailbox.execute(self._close_deferred)
            else:
                self._close_instance(old)

    def _close_deferred(self) -> None:
        while self._closing:
            self._close_instance(self._closing.pop(0))

    def _close_instance(self, instance: OperatorCoordinator) -> None:
        self._began += 1
        self._busy = "close()"
        try:
            instance.close()
        except Exception:  # noqa: BLE001 - closing a fenced instance must not fail anything
            log.exception("coordinator %r raised in close()", self.name)
        finally:
            self._busy = None

    def _trigger(self, checkpoint_id: int) -> None:
        self.batch_requested = False  # this checkpoint's batch is the one that was asked for
        self.valve.checkpoint_triggered(checkpoint_id)
        result: Future[Any] = Future()
        generation = self.generation
        result.add_done_callback(lambda f: self._checkpoint_future_done(generation, checkpoint_id, f))
        if self.coordinator is None:
            result.set_exception(CoordinatorFenced(f"coordinator {self.name!r} is not running"))
            return
        self._callback(OperatorCoordinator.checkpoint_coordinator, checkpoint_id, result)

    def _checkpoint_future_done(self, generation: int, checkpoint_id: int, fut: Future[Any]) -> None:
        # Runs in whichever thread completed the future: this is the boundary instant, so the
        # snapshot is pickled here and the boundary is placed in the mailbox order right now.
        snapshot: bytes | None = None
        parts: dict[str, StoredOnce[Any]] = {}
        reason = ""
        if fut.cancelled():
            reason = "the checkpoint future was cancelled"
        elif fut.exception() is not None:
            reason = f"the checkpoint future failed: {fut.exception()!r}"
        else:
            value = fut.result()
            if value is not None:
                try:
                    snapshot, parts = dump_snapshot(value)
                except Exception as exc:  # noqa: BLE001 - pickle raises many types
                    reason = f"the checkpoint state of type {type(value).__qualname__} cannot be pickled: {exc}"

        def boundary() -> None:
            if generation != self.generation or self._globally_failed:
                return
            context = self._context
            if context is not None and context.failed:
                return  # a failed instance's state is no checkpoint (rule 5)
            if reason:
                # The service aborts the checkpoint on every holder, this one included.
                self.listener.coordinator_declined(self.name, checkpoint_id, reason)
                return
            if self.valve.boundary_reached(checkpoint_id):
                cut = self.valve.cut(checkpoint_id)
                self.listener.coordinator_completed(self.name, checkpoint_id, snapshot, cut,
                                                    parts)
        self._run_or_submit(boundary)

    def _run_or_submit(self, action: Callable[[], None]) -> None:
        if self.mailbox.in_mailbox_thread():
            action()
        else:
            self.mailbox.execute(action)

    def _send_many(self, generation: int, subtask: int, attempt: int, payloads: list[bytes],
                   fut: Future[None]) -> None:
        # ``fut`` was handed out already (a batch send, or a send from another thread): it
        # starts a run of its own in the valve.
        if generation != self.generation or self.coordinator is None:
            fut.set_exception(self._fenced_error())
            return
        try:
            self.valve.events_sent(subtask, attempt, payloads, fut)
        except AttemptNoLongerLive as exc:
            fut.set_exception(exc)
            return
        if not payloads:
            fut.set_result(None)

    def _fenced_error(self) -> CoordinatorFenced:
        return CoordinatorFenced(
            f"coordinator {self.name!r} was reset or failed; this gateway belongs to an instance "
            f"that no longer runs")

    @staticmethod
    def _fail_futures(futures: list[Future[None]], error: BaseException) -> None:
        for fut in futures:
            if not fut.done():
                fut.set_exception(error)

    def _callback(self, method: Callable[Concatenate[OperatorCoordinator, P], R],
                  *args: P.args, **kwargs: P.kwargs) -> R | Any:
        """Call the running instance's override of ``method`` (a callback of
        :class:`OperatorCoordinator`, named by the base class so that its arguments are
        type-checked); its result, or ``_CALLBACK_FAILED`` when there is no running instance
        or it raised (which fails the job). Mailbox thread."""
        name = method.__name__
        coordinator = self.coordinator
        if coordinator is None or self._globally_failed:
            return _CALLBACK_FAILED
        if not self.mailbox.in_mailbox_thread():
            raise WrongThread(f"{name}() of coordinator {self.name!r} called outside its mailbox")
        generation = self.generation
        self._began += 1
        self._busy = f"{name}()"
        try:
            return getattr(coordinator, name)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any user exception fails the job
            self._report_failure(generation, f"coordinator {self.name!r} raised in {name}(): "
                                             f"{exc!r}{user_traceback(exc)}")
            return _CALLBACK_FAILED
        finally:
            self._busy = None

    def _report_failure(self, generation: int, cause: str) -> None:
        context = self._context
        if context is None or context.generation != generation or context.failed or context.fenced:
            return
        context.failed = True
        # Fenced before anything else can reach it (rule 5): the rest of a replay, a queued
        # completion notice, its timers. close() follows once the failing callback returned.
        self._fence(defer_close=True)
        self.listener.coordinator_failed(self.name, cause)


_CALLBACK_FAILED = object()  # what _callback returns when no callback ran to its end


def _name_of(action: Callable[[], Any]) -> str:
    return str(getattr(action, "__qualname__", None) or repr(action))


def user_traceback(exc: BaseException) -> str:
    """The traceback of a user's exception, from the user's own frame on (the runtime's frame
    that called the user's code is left out), as text that starts with a newline."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_next is not None:
        tb = tb.tb_next  # the runtime's frame that made the call
    text = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()
    return "\n" + text if text else ""


_dumps = pickle.dumps
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def _failed(error: BaseException) -> Future[None]:
    fut: Future[None] = SendFuture()
    fut.set_exception(error)
    return fut


class _Gateway(SubtaskGateway):
    # What send_event needs is looked up once here: it is the hot path of every coordinator.
    __slots__ = ("_holder", "_generation", "subtask", "attempt", "_encode", "_max_bytes",
                 "_on_mailbox", "_event_sent")

    def __init__(self, holder: CoordinatorHolder, generation: int, subtask: int, attempt: int) -> None:
        self._holder = holder
        self._generation = generation
        self.subtask = subtask
        self.attempt = attempt
        self._encode = holder.codec.encode
        self._max_bytes = holder.codec.max_event_bytes
        self._on_mailbox = holder.mailbox.in_mailbox_thread
        self._event_sent = holder.valve.event_sent  # the valve lives as long as its holder

    def send_event(self, event: Any) -> Future[None]:
        # the codec's encode, inlined for the common case; on any problem the codec itself
        # runs again and raises its error naming the event
        try:
            payload = _dumps(event, _PROTOCOL)
        except Exception:  # noqa: BLE001 - pickle raises many types
            payload = self._encode(event)
        if len(payload) > self._max_bytes:
            payload = self._encode(event)
        holder = self._holder
        if self._on_mailbox():
            # On the mailbox thread the send takes effect here. The event joins the future of
            # the events held for its subtask (they share their fate; see the valve), so most
            # sends allocate no future at all.
            if self._generation != holder.generation or holder.coordinator is None:
                return _failed(holder._fenced_error())
            try:
                return self._event_sent(self.subtask, self.attempt, payload, SendFuture)
            except AttemptNoLongerLive as exc:
                return _failed(exc)
        fut: Future[None] = SendFuture()
        holder.mailbox.execute(
            lambda: holder._send_many(self._generation, self.subtask, self.attempt, [payload], fut))
        return fut

    def send_events(self, events: Iterable[Any]) -> list[Future[None]]:
        holder = self._holder
        encode = holder.codec.encode
        payloads = []  # all pickled before any is sent
        for index, event in enumerate(events):
            try:
                payloads.append(encode(event))
            except EventTooLarge as exc:
                raise EventTooLarge(exc.size, exc.limit, f"event at index {index} of "
                                    f"send_events() (type {type(event).__qualname__})") from None
            except EventEncodingError as exc:
                raise EventEncodingError(f"event at index {index} of send_events(): {exc}"
                                         ) from exc.__cause__
        fut: Future[None] = SendFuture()  # the events share their fate: one future for all
        if holder.mailbox.in_mailbox_thread():
            holder._send_many(self._generation, self.subtask, self.attempt, payloads, fut)
        else:
            holder.mailbox.execute(lambda: holder._send_many(
                self._generation, self.subtask, self.attempt, payloads, fut))
        return [fut] * len(payloads)

    def __repr__(self) -> str:
        return f"SubtaskGateway({self._holder.name}[{self.subtask}], attempt {self.attempt})"


class _Periodic(Cancellable):
    def __init__(self, context: _Context, interval_s: float, action: Callable[[], None]) -> None:
        self._context = context
        self._interval = interval_s
        self._action = action
        self._cancelled = False
        self._handle = context.holder.clock.call_later(interval_s, self._fire)

    def _fire(self) -> None:
        if self._cancelled or self._context.fenced:
            return
        self._context.run_in_coordinator_thread(self._action)
        self._handle = self._context.holder.clock.call_later(self._interval, self._fire)

    def cancel(self) -> None:
        self._cancelled = True
        self._handle.cancel()


class _Context(CoordinatorContext):
    """The context of one generation of a coordinator."""

    def __init__(self, holder: CoordinatorHolder, generation: int) -> None:
        self.holder = holder
        self.generation = generation
        self.operator_id = holder.name
        self.parallelism = holder.parallelism
        self.available_now = holder.available_now
        self.fenced = False
        self.failed = False
        self.timers: list[Cancellable] = []

    def fail_job(self, cause: BaseException | str) -> None:
        text = cause if isinstance(cause, str) else repr(cause)
        if getattr(cause, "permanent", False):
            # its qualified name on a line of its own, as a traceback ends: the job runner
            # gives up at once on a permanent sparkcoord error (spark/job.py rule 6)
            kind = type(cause)
            text += f"\n{kind.__module__}.{kind.__qualname__}: {cause}"
        holder = self.holder
        holder._run_or_submit(lambda: holder._report_failure(
            self.generation, f"coordinator {holder.name!r} called fail_job: {text}"))

    def request_batch(self) -> None:
        if not self.fenced:
            self.holder.batch_requested = True

    def run_in_coordinator_thread(self, action: Callable[[], None]) -> None:
        holder = self.holder

        def run() -> None:
            if self.fenced or holder.generation != self.generation or holder._globally_failed:
                return
            holder._began += 1
            holder._busy = f"an action ({_name_of(action)})"
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - user code fails the job
                holder._report_failure(self.generation,
                                       f"coordinator {holder.name!r} raised in an action "
                                       f"({_name_of(action)}): {exc!r}{user_traceback(exc)}")
            finally:
                holder._busy = None
        holder.mailbox.execute(run)

    def call_periodically(self, interval_s: float, action: Callable[[], None]) -> Cancellable:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        periodic = _Periodic(self, interval_s, action)
        self.timers.append(periodic)
        return periodic

    def is_coordinator_thread(self) -> bool:
        return self.holder.mailbox.in_mailbox_thread()

    def call_async(self, work: Callable[[], T],
                   handler: Callable[[T | None, BaseException | None], None] | None = None, *,
                   lane: str = "io") -> None:
        # a generation's lanes are its own (workers.py rule 3); the handler is an action of
        # this generation, dropped once it is fenced (rule 2)
        post = self.run_in_coordinator_thread
        holder = self.holder

        def run() -> None:
            try:
                result = work()
            except Exception as exc:  # noqa: BLE001 - to the handler, or it fails the job
                error = exc
                if handler is not None:
                    post(lambda: handler(None, error))
                else:
                    self.fail_job(f"{_name_of(work)} on lane {lane!r} raised: {error!r}"
                                  f"{user_traceback(error)}")
                return
            if handler is not None:
                post(lambda: handler(result, None))

        holder.workers.run(f"{holder.name}.{self.generation}", lane, run)

