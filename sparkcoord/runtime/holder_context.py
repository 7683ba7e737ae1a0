"""What a coordinator instance holds of the runtime: its context, its timers, its subtask gateways.

One :class:`Context` per generation of a coordinator (holder rule 3: a reset or failover
creates a fresh instance with a fresh context), handed to the user's coordinator by its
holder (holder.py); its gateways (:class:`Gateway`) are how the instance sends to its
subtasks, its timers (:class:`Periodic`) and ``call_async`` handlers run on its mailbox. A
rule number alone is this module's; the holder's are cited as "holder rule N".

Rules:
  1. A send made on the mailbox thread takes effect at once (the event joins the valve);
     from another thread it is enqueued at the instant it happens (holder rule 2: the mailbox
     order of the sends and of the checkpoint completion defines the boundary).
  2. A context and its gateways belong to one generation: once it is fenced (a reset, a
     failure, ``close``: holder rules 3 and 5) or the job failed globally, its gateways' sends
     fail with :class:`CoordinatorFenced`, its timers stop, its actions and ``call_async``
     handlers are dropped unrun, ``request_batch`` and ``fail_job`` go quiet.
  3. ``fail_job``, an exception of an action, and an exception of a ``call_async`` work that
     has no handler report a global failure through the holder, once per generation (holder
     rule 4); an action counts as a callback for the watchdog (holder rule 6).

Thread model: a context's and a gateway's methods may be called from any thread (the
coordinator's own, a timer's, a worker's); everything they do to the coordinator happens on
its mailbox. A timer fires on the clock's timer thread and only enqueues.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from sparkcoord.coordinator import (
    Cancellable,
    CoordinatorContext,
    OperatorCoordinator,
    SubtaskGateway,
)
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.errors import (
    AttemptNoLongerLive,
    EventEncodingError,
    EventTooLarge,
    SparkCoordError,
)
from sparkcoord.core.valve import OutboundValve
from sparkcoord.runtime.clock import Clock
from sparkcoord.runtime.futures import SendFuture
from sparkcoord.runtime.mailbox import Mailbox
from sparkcoord.runtime.workers import Workers

T = TypeVar("T")

#: the module that exports :class:`CoordinatorFenced` and names it: its path before this
#: module existed (docs/decisions/105-runtime-modules.md), so an error line reads as before
EXPORTED_BY = "sparkcoord.runtime.holder"


class CoordinatorFenced(SparkCoordError):
    """A send or action of a coordinator instance that was replaced by a reset or failover."""


CoordinatorFenced.__module__ = EXPORTED_BY


class HolderSide(Protocol):
    """What a context and its gateways use of their holder
    (:class:`~sparkcoord.runtime.holder.CoordinatorHolder`), for the type checker."""

    name: str
    parallelism: int
    available_now: bool
    batch_requested: bool
    generation: int
    coordinator: OperatorCoordinator | None
    mailbox: Mailbox
    clock: Clock
    codec: EventCodec
    workers: Workers
    valve: OutboundValve[Future[None]]
    _globally_failed: bool
    _busy: str | None
    _began: int

    def _run_or_submit(self, action: Callable[[], None]) -> None: ...

    def _report_failure(self, generation: int, cause: str) -> None: ...

    def _fenced_error(self) -> CoordinatorFenced: ...

    def _send_many(self, generation: int, subtask: int, attempt: int, payloads: list[bytes],
                   fut: Future[None]) -> None: ...


def name_of(action: Callable[[], Any]) -> str:
    """How a watchdog line and a failure name ``action`` (a callable of the user's). Any
    thread."""
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


class Gateway(SubtaskGateway):
    """The gateway of one generation of a coordinator to one attempt of one of its subtasks
    (rules 1 and 2)."""

    # What send_event needs is looked up once here: it is the hot path of every coordinator.
    __slots__ = ("_holder", "_generation", "subtask", "attempt", "_encode", "_max_bytes",
                 "_on_mailbox", "_event_sent")

    def __init__(self, holder: HolderSide, generation: int, subtask: int, attempt: int) -> None:
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


class Periodic(Cancellable):
    """A timer of ``call_periodically``: its action runs on the mailbox every interval until
    it is cancelled or its context is fenced (rule 2)."""

    def __init__(self, context: Context, interval_s: float, action: Callable[[], None]) -> None:
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


class Context(CoordinatorContext):
    """The context of one generation of a coordinator."""

    def __init__(self, holder: HolderSide, generation: int) -> None:
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
            holder._busy = f"an action ({name_of(action)})"
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - user code fails the job
                holder._report_failure(self.generation,
                                       f"coordinator {holder.name!r} raised in an action "
                                       f"({name_of(action)}): {exc!r}{user_traceback(exc)}")
            finally:
                holder._busy = None
        holder.mailbox.execute(run)

    def call_periodically(self, interval_s: float, action: Callable[[], None]) -> Cancellable:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        periodic = Periodic(self, interval_s, action)
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
                    self.fail_job(f"{name_of(work)} on lane {lane!r} raised: {error!r}"
                                  f"{user_traceback(error)}")
                return
            if handler is not None:
                post(lambda: handler(result, None))

        holder.workers.run(f"{holder.name}.{self.generation}", lane, run)

