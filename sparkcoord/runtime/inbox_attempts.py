"""The inbox's inputs of a task attempt's life, and what a coordinator is handed again.

:class:`InboxAttempts` holds the methods of :class:`~sparkcoord.runtime.inbox.Inbox` for a
task's registration (a retry resets its coordinator, or adopts the history) and its finish (what
it did not send again of its history is withdrawn), and for what a coordinator gets again at a
reset or a restore: the replayed items, the withdrawn ones, the answers to replayed requests,
checked against the logged ones. The inbox (``runtime/inbox.py``) is made of it and of the
events, requests and answers, so a task's lifecycle reads apart from the items it sends (no
import circle: this module imports nothing of the inbox). Its rules are the inbox's, numbered
there; a number alone is the inbox's. The one whose code is here is stated here in full:

  4. A task retry resets the subtask's coordinator (its holder) before the new attempt is
     acknowledged (docs/protocol.md [retry-resets-the-coordinator]), replaying the other
     subtasks' and the clients' items of the running epoch in log order.

Thread model: as the inbox's: any thread (channel threads, the coordinators' mailbox threads
answering, the driver thread at a restore); the state is guarded by the service's lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from sparkcoord.coordinator import Withdrawn
from sparkcoord.core.codec import EventCodec
from sparkcoord.core.entries import Answer, answer_key
from sparkcoord.core.errors import IllegalTransition, RequestFailed
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.inbound import (
    InboundDecision,
    InboundGate,
    ReplayedItem,
    Verdict,
    WithdrawnItem,
)
from sparkcoord.core.records import CheckpointRecord
from sparkcoord.runtime.futures import SendFuture
from sparkcoord.runtime.holder import Answered, CoordinatorHolder, ReplayedEvent

log = logging.getLogger("sparkcoord.runtime.inbox")  # the inbox's logger: one for its inputs


class InboxAttempts:
    """The task attempts' inputs and the replays of :class:`~sparkcoord.runtime.inbox.Inbox`;
    not used alone."""

    # what these methods use of the inbox (``inbox.py``), for the type checker
    _lock: threading.RLock
    _codec: EventCodec
    _holders: Mapping[str, CoordinatorHolder]
    _fail: Callable[[str], None]
    gate: InboundGate | None
    _record: CheckpointRecord | None
    _refusal: str
    _waiters: dict[tuple[SubtaskId, str, int], Future[Answer]]
    _finishing: dict[TaskAttempt, Future[InboundDecision]]

    if TYPE_CHECKING:
        def _admitting(self, client: bool = False) -> InboundGate | None: ...
        def _append(self) -> None: ...
        def _answered(self, asked_by: TaskAttempt, seq: int, payload: bytes,
                      failed: bool) -> None: ...

    def attempt_registered(self, attempt: TaskAttempt) -> InboundDecision:
        """A task announced its attempt (channel thread). Answer the task with the verdict."""
        with self._lock:
            gate = self._admitting()
            if gate is None:
                return InboundDecision(Verdict.REJECT, self._refusal)
            decision = gate.attempt_registered(attempt)
            if decision.verdict is Verdict.ACCEPT:
                if decision.replaced is not None and not decision.adopted:
                    self._subtask_failed(attempt, decision)
                elif (decision.replaced is not None and decision.replaced.run != attempt.run
                      and attempt.number == 0):
                    # not a retry: the batch of a restored, uncommitted epoch runs again, and
                    # its first task takes over what the earlier run's task sent (gate rule 5)
                    log.info("epoch %d runs again after a restart: task of %s (Spark attempt "
                             "%d) continues the %d items its task of the earlier run sent, "
                             "answered from the log", attempt.epoch, attempt.subtask,
                             attempt.number, decision.history_length)
                elif decision.replaced is not None:
                    log.info("task of %s in epoch %d was retried (Spark attempt %d): it continues "
                             "the failed attempt's history (its requests were answered)",
                             attempt.subtask, attempt.epoch, attempt.number)
                self._append()
            return decision

    def attempt_finished(self, attempt: TaskAttempt, sent: int) -> Future[InboundDecision]:
        """``attempt`` (which asked a request or continues an adopted history) finished its
        batch having sent ``sent`` items (channel thread). Returns the future of the
        decision; the task waits for it before it ends.

        The finish is logged (gate rule 6). If the attempt sent fewer items than its history
        holds, the rest is withdrawn: in the same inbound critical section it is put on the
        coordinator's mailbox (``handle_items_withdrawn``), like an event, and the decision
        comes once the coordinator took the items back, so a coordinator that raises there
        fails the job before the batch can commit (docs/protocol.md
        [every-answer-consumed-or-returned]); a task still waiting for an answer to a withdrawn
        request hears that none will come. A shorter history than an earlier run's finished
        attempt sent fails the job (divergence)."""
        done: Future[InboundDecision] = SendFuture()
        sid = attempt.subtask
        with self._lock:
            gate = self._admitting()
            if gate is None:
                done.set_result(InboundDecision(Verdict.REJECT, self._refusal))
                return done
            pending = self._finishing.get(attempt)
            if pending is not None:
                return pending  # a re-sent finish: the decision comes when the first one's does
            decision = gate.attempt_finished(attempt, sent)
            if decision.verdict is Verdict.ACCEPT:
                self._append()
            if decision.verdict is not Verdict.ACCEPT or not decision.withdrawn:
                done.set_result(decision)
            else:
                self._finishing[attempt] = done
                for item in decision.withdrawn:
                    waiter = self._waiters.pop(answer_key(attempt, item.seq), None)
                    if waiter is not None and not waiter.done():
                        waiter.set_exception(RequestFailed(
                            f"request {item.seq} of {sid} was withdrawn: {attempt} finished "
                            f"without it"))

                def taken(ok: bool) -> None:  # the coordinator's thread, after its callback
                    with self._lock:
                        self._finishing.pop(attempt, None)
                        refusal = self._refusal
                    if not done.done():
                        done.set_result(decision if ok else InboundDecision(
                            Verdict.REJECT, refusal
                            or f"coordinator {sid.operator!r} is not running"))
                self._holders[sid.operator].deliver_withdrawn(
                    sid.index, decision.execution_attempt, self._withdrawn(decision.withdrawn),
                    taken)
        if decision.diverged:
            self._fail(decision.reason)  # outside the lock, like every failure (inbox rule 5)
        elif decision.withdrawn:
            log.info("task of %s in epoch %d (Spark attempt %d) finished after %d items of its "
                     "history of %d: %d withdrawn and handed back to coordinator %r", sid,
                     attempt.epoch, attempt.number, sent, sent + len(decision.withdrawn),
                     len(decision.withdrawn), sid.operator)
        return done

    # ------------------------------------------------ what a coordinator is handed again
    def replayed(self, item: ReplayedItem, execution_attempt: int) -> ReplayedEvent:
        """A logged item as its holder hands it to the coordinator again, at a reset or a
        restore (under the lock)."""
        index = item.attempt.subtask.index
        if item.withdrawn is not None:
            return ReplayedEvent(index, execution_attempt, self._withdrawn(item.withdrawn),
                                 withdrawn=True)
        return ReplayedEvent(index, execution_attempt, self._codec.decode(item.payload),
                             self._replay_answer(item) if item.is_request else None, item.client)

    def _replay_answer(self, item: ReplayedItem) -> Answered:
        """Where the answer to a replayed request goes: compared with the logged answer (a
        different one means the coordinator is not deterministic, and fails the job), or, if
        none was logged (the batch runs again), logged and served like a live answer."""
        attempt, seq, logged = item.attempt, item.seq, item.response

        def answered(payload: bytes, failed: bool) -> None:
            if logged is None:
                self._answered(attempt, seq, payload, failed)
                return
            if item.client:
                # a client's answer reflects the state when it was asked; only its effect
                # must survive (docs/protocol.md [answers-never-change]): not compared
                return
            if (logged.payload, logged.failed) == (payload, failed) or (
                    not failed and not logged.failed and self._same_value(logged.payload, payload)):
                return
            self._fail(f"nondeterministic coordinator {attempt.subtask.operator!r}: replaying "
                       f"request {seq} of {attempt.subtask} in epoch {attempt.epoch} gave a "
                       f"different answer than the logged one, which the task already used; "
                       f"handle_request must answer from the checkpointed state and the "
                       f"replayed inputs only (docs/coordinators.md, Requests)")
        return answered

    def _same_value(self, a: bytes, b: bytes) -> bool:
        try:
            return bool(self._codec.decode(a) == self._codec.decode(b))
        except Exception:  # noqa: BLE001 - a response that does not unpickle is not equal
            return False

    def _withdrawn(self, items: Sequence[WithdrawnItem]) -> list[Withdrawn]:
        # What ``handle_items_withdrawn`` is handed: the items and their answers, unpickled
        # (each was unpickled once before it was logged; a refused answer hands out nothing)
        decode = self._codec.decode
        out = []
        for item in items:
            response = item.response
            answered = response is not None and not response.failed
            out.append(Withdrawn(decode(item.payload), item.is_request, answered,
                                 decode(response.payload) if answered and response else None))
        return out

    def _subtask_failed(self, attempt: TaskAttempt, decision: InboundDecision) -> None:
        # Under the lock, before the new attempt's registration is acknowledged (rule 4).
        assert self.gate is not None and decision.replaced is not None
        sid = attempt.subtask
        record = self._record
        if record is None or record.epoch != attempt.epoch:
            raise IllegalTransition(f"task retry {attempt} without the record of its epoch")
        # the other subtasks' events and the clients' requests, in log order (a reset comes
        # before any subtask request of the epoch: rule 5 of the gate)
        replay = [self.replayed(i, 0 if i.client
                                else self.gate.execution_attempt(i.attempt.subtask))
                  for i in self.gate.surviving_items(sid.operator, excluding=sid)]
        reason = (f"task of {sid} in epoch {attempt.epoch} was retried: Spark attempt "
                  f"{decision.replaced.number} replaced by attempt {attempt.number}")
        log.info("%s; coordinator %r reset to the snapshot of epoch %d, %d entries of the "
                 "other subtasks and clients replayed", reason, sid.operator, attempt.epoch,
                 len(replay))
        self._holders[sid.operator].subtask_failed(
            sid.index, decision.execution_attempt - 1, reason, attempt.epoch,
            record.snapshots.get(sid.operator), replay)
