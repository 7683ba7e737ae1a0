"""A coordinator's part of the checkpoint round, on its holder: the trigger, the completed
checkpoint future that is its boundary, the abort, the seal, the commit, and the end of an
``availableNow`` run.

:class:`HolderCheckpoints` holds these methods of
:class:`~sparkcoord.runtime.holder.CoordinatorHolder`, which is made of it and of the
instance's lifecycle and callbacks (``holder.py``; no import circle: ``holder.py`` imports this
module, and this module of the holder's only ``holder_context.py``). A rule number alone is
this module's; the holder's are cited as "holder rule N".

Rules:
  1. The completion of a coordinator's checkpoint future is its boundary (holder rule 2):
     the snapshot is pickled on the thread that completed the future, and the boundary is
     placed in the mailbox order at that instant (at once on the mailbox thread, enqueued
     from another). A future that failed or was cancelled, or a state that cannot be
     pickled, declines the checkpoint; the service then aborts it on every holder.
  2. The boundary of an instance that was replaced (a reset ended its generation) or that
     failed is no checkpoint (holder rule 5): it is dropped, and so is every boundary once
     the job failed globally.
  3. A commit completes the futures of the epoch's sends before the coordinator is notified
     of it; an abort re-holds the cut before the coordinator is notified.

Thread model: as ``holder.py``: the service-facing methods may be called from any thread and
return at once, their work happens on the mailbox; a boundary is reached on whichever thread
completed the checkpoint future (rule 1). The listener is called on the mailbox thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from sparkcoord.coordinator import OperatorCoordinator
from sparkcoord.core.stored import StoredOnce, dump_snapshot
from sparkcoord.core.valve import OutboundValve
from sparkcoord.runtime.futures import SendFuture
from sparkcoord.runtime.holder_context import Context, CoordinatorFenced

R = TypeVar("R")
P = ParamSpec("P")


class HolderListener(Protocol):
    """What a holder reports to the coordination service (on the holder's mailbox thread)."""

    def coordinator_completed(self, name: str, checkpoint_id: int, snapshot: bytes | None,
                              events: list[list[bytes]],
                              parts: dict[str, StoredOnce[Any]] | None = None) -> None: ...

    def coordinator_declined(self, name: str, checkpoint_id: int, reason: str) -> None: ...

    def coordinator_failed(self, name: str, cause: str) -> None: ...


class HolderCheckpoints:
    """The checkpoint round's methods of :class:`~sparkcoord.runtime.holder.CoordinatorHolder`
    (module rules); not used alone."""

    # what the checkpoint round uses of the holder (``holder.py``), for the type checker
    name: str
    listener: HolderListener
    valve: OutboundValve[Future[None]]
    generation: int
    coordinator: OperatorCoordinator | None
    batch_requested: bool
    _context: Context | None
    _globally_failed: bool

    if TYPE_CHECKING:
        def _submit(self, action: Callable[[], None]) -> None: ...

        def _run_or_submit(self, action: Callable[[], None]) -> None: ...

        def _callback(self, method: Callable[Concatenate[OperatorCoordinator, P], R],
                      *args: P.args, **kwargs: P.kwargs) -> R | Any: ...

    # -------------------------------------------------------------------- service-facing API
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


    # ------------------------------------------------------------------------ mailbox side
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
                return  # a failed instance's state is no checkpoint (holder rule 5)
            if reason:
                # The service aborts the checkpoint on every holder, this one included.
                self.listener.coordinator_declined(self.name, checkpoint_id, reason)
                return
            if self.valve.boundary_reached(checkpoint_id):
                cut = self.valve.cut(checkpoint_id)
                self.listener.coordinator_completed(self.name, checkpoint_id, snapshot, cut,
                                                    parts)
        self._run_or_submit(boundary)
