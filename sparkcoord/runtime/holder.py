"""The coordinator holder: one coordinator instance, its mailbox, its valve and its futures.

Here: the instance's lifecycle (created, reset, fenced, closed) and every callback into it;
its part of the checkpoint round is ``holder_checkpoints.py``'s, the context and subtask
gateways it holds are ``holder_context.py``'s (docs/decisions/105-runtime-modules.md).

Rules:
  1. Every coordinator callback, every valve change and every future of this coordinator is
     touched on the mailbox thread only (its own thread, or a thread that claimed the idle
     mailbox to answer a request: mailbox rule 2). Other threads enqueue.
  2. A send or a checkpoint completion made on the mailbox thread takes effect at once; from
     another thread it is enqueued at the instant it happens. Either way the mailbox order is
     the order in which the sends and the completion happened, which defines the boundary
     (the sends: holder_context.py rule 1; the completion: holder_checkpoints.py rule 1).
  3. A reset (subtask failure in default mode) fences the current instance by bumping the
     generation: its gateways, timers and ``fail_job`` go quiet; its held events fail; a fresh
     instance is created from the provider, reset to the epoch's snapshot, started, handed its
     gateways and the surviving events of the running batch, in log order.
  4. An exception from any callback, and ``fail_job``, report a global failure to the listener,
     once per generation (the context's side: holder_context.py rule 3).
  5. A failed instance is fenced the moment it fails (rule 4) or the service reports a global
     failure from anywhere: no further callback reaches it (no replayed event, no completion
     notice, no checkpoint), its gateways and timers go quiet; only ``close()`` is still
     called, after the failing callback has returned, so that it can release resources. Its
     state matches no checkpoint, so acting on it (committing side effects in
     ``notify_checkpoint_complete``) would break the guarantee (the context and gateways:
     holder_context.py rule 2; the boundary: holder_checkpoints.py rule 2).

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
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from sparkcoord.coordinator import Cancellable, CoordinatorProvider, OperatorCoordinator
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.control import BatchRequested
from sparkcoord.core.errors import AttemptNoLongerLive, SparkCoordError, WrongThread
from sparkcoord.core.stored import StoredOnce, load_snapshot
from sparkcoord.core.valve import OutboundValve
from sparkcoord.runtime import holder_context
from sparkcoord.runtime.clock import Clock
from sparkcoord.runtime.holder_checkpoints import HolderCheckpoints
from sparkcoord.runtime.holder_checkpoints import HolderListener as HolderListener
from sparkcoord.runtime.holder_context import Context, Gateway, Periodic, name_of
from sparkcoord.runtime.holder_context import CoordinatorFenced as CoordinatorFenced
from sparkcoord.runtime.holder_context import user_traceback as user_traceback
from sparkcoord.runtime.mailbox import Mailbox
from sparkcoord.runtime.workers import ThreadWorkers, Workers

R = TypeVar("R")
P = ParamSpec("P")

log = logging.getLogger(__name__)

# what moved to holder_context.py, by its names here before (decision 105): old imports work
_Context, _Gateway, _Periodic, _name_of = Context, Gateway, Periodic, name_of
_failed, _dumps, _PROTOCOL = holder_context._failed, holder_context._dumps, holder_context._PROTOCOL


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


class CoordinatorHolder(HolderCheckpoints):
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
        self._context: Context | None = None
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
        ``answered`` once its answer exists (docs/protocol.md [requests-are-inbound-items]).

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
        """A task of ``subtask`` was retried inside the batch of ``checkpoint_id`` (docs/protocol.md
        [retry-resets-the-coordinator]).

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
                               Gateway(self, self.generation, subtask, new_attempt))
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
        self._context = Context(self, self.generation)
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
                           Gateway(self, self.generation, subtask, attempt))
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
