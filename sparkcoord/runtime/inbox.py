"""The inbox: where every input to the coordinators of a run arrives, whoever sends it.

Tasks register, send events, ask requests and say they finished; clients of the job (the
user's driver program, ``CoordinatedJob.request``) ask requests too. All of it comes here, on
the channel server's threads (or a test's), and takes one path: the inbound gate decides
(core/inbound.py), the entry is appended to the epoch's durable inbound log, the input is put
on its coordinator's mailbox, and the sender is acknowledged or, for a request, answered once
the answer is logged.

Rules:
  1. Admission, durable append, hand-off to the mailbox and the answer to the sender happen
     under the service's lock, in one total order (docs/protocol.md
     [inbound-critical-section]). The lock is the coordination service's own: the service takes
     it for restores, seals and commits, so no input slips between a checkpoint's boundary and
     its record.
  2. One waiter map for every asker: a request's future is filed under
     :func:`~sparkcoord.core.entries.answer_key` until its answer is logged. A task's key is
     its subtask and sequence (a retry that adopted the history waits for the same answer); a
     client's is its operator, id and sequence.
  3. A request is unpickled before it is logged (docs/protocol.md [unpickle-before-logging]):
     one the driver cannot unpickle is refused and never logged. A client's request is refused
     while a checkpoint is pending (it would be in neither the snapshot nor a log that a restore
     to that checkpoint replays); a task's is not (it belongs to the running epoch's log).
  4. A task retry resets the subtask's coordinator (its holder) before the new attempt is
     acknowledged (docs/protocol.md [retry-resets-the-coordinator]): stated with its code in
     ``runtime/inbox_attempts.py`` (a task's registration and finish, and what a coordinator
     is handed again), of which :class:`Inbox` is made.
  5. A failure of the inbox's own (a log append that fails, a diverging task) goes to the
     ``fail`` callback, always outside the lock; once the service fails or closes it tells
     the inbox (:meth:`Inbox.refuse`), which from then on refuses everything and fails every
     waiter with the reason.
  6. A re-sent event or request whose bytes differ from the logged ones is compared with it
     by value (core/encoding.py rule 6: both unpickled, which runs user code, and encoded
     again) outside the lock, never under it, so that an expensive unpickle delays no other
     input. The gate unpickles nothing: it decides COMPARE with the (logged, re-sent) pairs
     (core/decisions.py rule 5); the inbox leaves the lock, compares, and takes the lock again
     to ask the gate anew with the verdicts. The gate then decides from the log as it is (the
     attempt may have been replaced meanwhile, the history cut, the number logged again), and
     a verdict counts only for the two byte strings it was made for, so the outcome is the one
     a comparison under the lock would give at that moment: a function of the log and the
     input. A run of events that needs a comparison ends a critical section: the runs before
     it are logged and handed over first, as if they had come alone.

Thread model: every public method may be called from any thread (channel threads, the
coordinators' mailbox threads answering, the driver thread at a restore or seal); state is
guarded by the service's lock, handed in. Holders are called under it and only enqueue, except
that a thread which claimed an idle mailbox runs it after it left the lock (mailbox rule 2), so
the lock is never held while user code runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from sparkcoord.core.codec import EventCodec
from sparkcoord.core.encoding import same_value
from sparkcoord.core.entries import Answer, Asker, DriverClient, LogEntry, answer_key
from sparkcoord.core.errors import RequestFailed, RunUnavailable
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.inbound import (
    InboundDecision,
    InboundGate,
    ReplayedItem,
    RequestDecision,
    RunDecision,
    Verdict,
    kept_at_rerun,
)
from sparkcoord.core.records import CheckpointRecord, encode_log_entry
from sparkcoord.runtime.futures import SendFuture
from sparkcoord.runtime.holder import CoordinatorHolder
from sparkcoord.runtime.inbox_attempts import InboxAttempts
from sparkcoord.runtime.storage import CheckpointStorage

log = logging.getLogger(__name__)

NOT_RESTORED = "the service has not been restored yet"


class Inbox(InboxAttempts):
    """The one inbound path of a coordination service. See the module docstring (a task's
    registration and finish, and the replays: :class:`InboxAttempts`)."""

    def __init__(self, lock: threading.RLock, storage: CheckpointStorage, codec: EventCodec,
                 holders: Mapping[str, CoordinatorHolder], fail: Callable[[str], None],
                 checkpoint_pending: Callable[[], int | None]) -> None:
        """Created by the coordination service with its lock, its storage and codec, the
        holders it fills at its restore, its ``fail`` (the first global failure wins) and
        the id of the checkpoint being taken, if one is (rule 3)."""
        self._lock = lock
        self._storage = storage
        self._codec = codec
        self._holders = holders
        self._fail = fail
        self._checkpoint_pending = checkpoint_pending
        #: the gate of the running epoch (None until the service restored)
        self.gate: InboundGate | None = None
        #: the record of the running epoch (a task retry resets to its snapshot)
        self._record: CheckpointRecord | None = None
        self._refusal = NOT_RESTORED
        self._final = False  # the service closed: its refusal stays
        # askers waiting for answers, by answer_key (rule 2)
        self._waiters: dict[tuple[SubtaskId, str, int], Future[Answer]] = {}
        # finishes whose withdrawal the coordinator has not taken back yet (a re-sent finish
        # waits for the same decision)
        self._finishing: dict[TaskAttempt, Future[InboundDecision]] = {}

    # ------------------------------------------------------------- the service's calls
    def opened(self, gate: InboundGate, record: CheckpointRecord | None) -> None:
        """The service restored (driver thread, under the lock): inputs are admitted by
        ``gate`` from now on; ``record`` is the restored epoch's (None for a fresh start)."""
        self.gate, self._record = gate, record
        if not self._final and self._refusal == NOT_RESTORED:
            self._refusal = ""

    def epoch_started(self, record: CheckpointRecord) -> None:
        """The service sealed ``record`` (driver thread, under the lock): its batch may run."""
        assert self.gate is not None
        self.gate.epoch_started(record.epoch)
        self._record = record

    def batch_committed(self, epoch: int) -> None:
        """Spark committed the batch of ``epoch`` (driver thread, under the lock): the gate
        admits nothing more for it."""
        assert self.gate is not None
        self.gate.batch_committed(epoch)
        self._fail_waiters(f"the batch of epoch {epoch} committed")  # none expected

    def refuse(self, why: str, final: bool = False) -> None:
        """From now on refuse every input for ``why``, and fail every waiter with it (the
        service, on the thread that fails it or closes it). ``final``: the service closed;
        the reason stays whatever comes later."""
        with self._lock:
            if self._final:
                return
            self._refusal, self._final = why, final
            self._fail_waiters(why, ask_again=True)

    def epoch_resumed(self, epoch: int, logged: list[LogEntry]) -> list[ReplayedItem]:
        """At a restore to the uncommitted epoch ``epoch`` whose batch runs again (driver
        thread, under the lock): what its coordinators get again, in log order.

        Operators that answered requests in it keep their history: tasks of the previous run
        may have acted on those answers (and a sink may have kept that output), so the batch's
        new tasks adopt it. For every other operator the log is truncated. The kept entries
        replace the log durably before anything else (docs/protocol.md
        [rerun-keeps-answered-histories])."""
        assert self.gate is not None
        kept = kept_at_rerun(logged)
        self._storage.start_inbound_log(epoch, b"".join(encode_log_entry(e) for e in kept))
        self.gate.epoch_resumed(epoch, kept)
        if kept:  # the restore's INFO line counts the items these entries hold
            log.debug("epoch %d runs again: %d entries of its inbound log kept (items, "
                      "registrations, answers, finishes) of %s", epoch, len(kept),
                      ", ".join(sorted({e.attempt.subtask.operator for e in kept})))
        return self.gate.surviving_items()

    # ------------------------------------------------------------------ channel threads
    def epoch_logged(self, epoch: int) -> None:
        """Spark logged ``epoch`` (driver thread): client requests may now go to its log."""
        with self._lock:
            if self.gate is not None:
                self.gate.epoch_logged(epoch)

    def live_attempt(self, subtask: SubtaskId) -> TaskAttempt | None:
        """The live task attempt of ``subtask`` in the running batch, if any. Any thread."""
        with self._lock:
            return self.gate.live_attempt(subtask) if self.gate is not None else None

    def history_length(self, subtask: SubtaskId) -> int:
        """The length of ``subtask``'s history in the running epoch (driver thread, when
        planning a batch): above 0 when its tasks continue a kept history (gate rule 6)."""
        with self._lock:
            return self.gate.history_length(subtask) if self.gate is not None else 0

    def event_received(self, attempt: TaskAttempt, seq: int, payload: bytes) -> InboundDecision:
        """Event ``seq`` of ``attempt`` arrived (channel thread). Acknowledge only on ACCEPT or
        DUPLICATE; the event is then logged durably and on the coordinator's mailbox."""
        return self.event_runs_received([(attempt, seq, (payload,))])[0].of_one(seq, attempt)

    def event_runs_received(self, runs: Sequence[tuple[TaskAttempt, int, tuple[bytes, ...]]]
                            ) -> list[RunDecision]:
        """Runs of consecutive events ``(attempt, first_seq, payloads)`` arrived together on one
        connection (channel thread), in send order.

        The critical section of one event, once for all of them: every run is decided by the
        gate, every accepted event is appended to the inbound log with one write, then put on
        its coordinator's mailbox in order; the caller acknowledges after this returns. A run is
        cut at an event that cannot be unpickled: those before it count, it and the rest are
        rejected. Decisions come back in the same order as the runs. A run whose re-sent events
        are to be compared by value (rule 6) ends the critical section: the runs before it are
        logged and handed over, the values compared outside the lock, and the rest decided in
        the next one.
        """
        decoded, unreadable = self._decoded_runs(runs)
        decisions: list[RunDecision] = []
        compared: dict[tuple[bytes, bytes], bool] = {}
        while len(decisions) < len(runs):
            with self._lock:
                unsettled = self._decide_runs(runs, decoded, unreadable, decisions, compared)
            self._compare_values(unsettled, compared)  # rule 6: outside the lock
        diverged = next((d.reason for d in decisions if d.diverged), None)
        if diverged is not None:
            self._fail(diverged)
        return decisions

    def _decoded_runs(self, runs: Sequence[tuple[TaskAttempt, int, tuple[bytes, ...]]]
                      ) -> tuple[list[list[Any]], list[tuple[int, str] | None]]:
        # Before the lock (rule 3): each run's events unpickled, and where a run is cut (the
        # index of its first event that does not unpickle, and why), or None
        decode = self._codec.decode
        decoded: list[list[Any]] = []
        unreadable: list[tuple[int, str] | None] = []
        for attempt, first_seq, payloads in runs:
            try:
                decoded.append(list(map(decode, payloads)))
                unreadable.append(None)
            except Exception:  # noqa: BLE001 - unpickling raises anything: find the culprit
                decoded.append(good := [])
                for i, payload in enumerate(payloads):
                    try:
                        good.append(decode(payload))
                    except Exception as exc:  # noqa: BLE001
                        unreadable.append((i, f"event {first_seq + i} of {attempt} cannot be "
                                              f"unpickled on the driver: {exc!r}"))
                        break
                else:  # the second pass read them all (an unpickler that failed only once)
                    unreadable.append(None)
        return decoded, unreadable

    def _decide_runs(self, runs: Sequence[tuple[TaskAttempt, int, tuple[bytes, ...]]],
                     decoded: list[list[Any]], unreadable: list[tuple[int, str] | None],
                     decisions: list[RunDecision], compared: Mapping[tuple[bytes, bytes], bool]
                     ) -> tuple[tuple[bytes, bytes], ...]:
        # Under the lock (rule 1): the runs from len(decisions) on are decided into
        # ``decisions``, the accepted events logged with one write and put on their mailboxes,
        # up to a run the gate cannot decide before values are compared: its pairs are returned
        gate = self._admitting()
        if gate is None:
            decisions += [RunDecision(0, 0, len(p), self._refusal) for _, _, p in
                          runs[len(decisions):]]
            return ()
        unsettled: tuple[tuple[bytes, bytes], ...] = ()
        accepted: list[tuple[TaskAttempt, int, list[Any]]] = []
        entries: list[bytes] = []
        for i in range(len(decisions), len(runs)):
            (attempt, first_seq, payloads), events, bad = runs[i], decoded[i], unreadable[i]
            readable = payloads if bad is None else payloads[:bad[0]]
            decision = (gate.event_run_received(attempt, first_seq, readable, compared)
                        if readable else RunDecision(0, 0, 0))
            if decision.compare:
                unsettled = decision.compare
                break
            if bad is not None and not decision.rejected:
                decision = RunDecision(decision.duplicates, decision.accepted,
                                       len(payloads) - len(readable), bad[1],
                                       decision.execution_attempt)
            decisions.append(decision)
            if decision.accepted:
                if entries and accepted[-1][0].epoch != attempt.epoch:
                    self._append_bytes(accepted[-1][0].epoch, entries)
                    entries = []
                entries.append(encode_log_entry(gate.last_entry))
                start = decision.duplicates
                accepted.append((attempt, decision.execution_attempt,
                                 events[start:start + decision.accepted]))
        if entries:
            self._append_bytes(accepted[-1][0].epoch, entries)
        by_operator: dict[str, list[tuple[int, int, list[Any]]]] = {}
        for attempt, execution_attempt, events in accepted:  # one connection: one operator
            by_operator.setdefault(attempt.subtask.operator, []).append(
                (attempt.subtask.index, execution_attempt, events))
        for operator, items in by_operator.items():
            self._holders[operator].deliver_many(items)
        return unsettled

    def request_received(self, asker: Asker, seq: int, payload: bytes) -> Future[Answer]:
        """Request ``seq`` of ``asker`` arrived (channel thread): a task's (its attempt) or a
        client's of the job (:class:`~sparkcoord.core.entries.DriverClient`). Returns the
        future of its logged answer: the channel sends it to the asker once it resolves, or
        the future's error (:class:`~sparkcoord.core.errors.RequestFailed`) when it fails.

        The request is decided by the gate, logged, and handed to the coordinator in the
        inbound critical section (rule 1): a task's to ``handle_request`` in the running
        epoch's log, a client's to ``handle_client_request`` in the current epoch's log (the
        running batch's, or after a committed batch's entries until the next epoch starts:
        docs/protocol.md [client-requests-logged-in-current-epoch]), so that its effect
        survives a reset and a restore. A repeated request (a re-send, or a retry that adopted
        the history: docs/protocol.md [answers-never-change]) gets the logged answer
        without reaching the coordinator again; one of other bytes than the logged one is
        compared by value outside the lock first (rule 6). A task's repeated request of
        another value fails the job.
        """
        answer: Future[Answer] = SendFuture()  # no condition unless someone waits
        client = isinstance(asker, DriverClient)
        what = (f"client request {seq} to {asker.operator!r}" if isinstance(asker, DriverClient)
                else f"request {seq} of {asker}")
        request = self._decoded(payload, what, answer)
        if answer.done():
            return answer
        compared: dict[tuple[bytes, bytes], bool] = {}
        while True:
            with self._lock:
                gate = self._admitting(client)
                if gate is None:  # nothing admitted now: a client asks again (the next run)
                    answer.set_exception(RequestFailed(self._refusal) if not client
                                         else RunUnavailable(self._client_refusal()))
                    return answer
                decision = gate.request_received(asker, seq, payload, compared)
                if decision.verdict is not Verdict.COMPARE:
                    answer, claimed = self._request_decided(decision, asker, seq, request, answer)
                    break
            self._compare_values(decision.compare, compared)  # rule 6: outside the lock
        if claimed is not None:
            # this thread claimed the idle mailbox: it runs the coordinator's handler (and
            # whatever was queued behind it) now, outside the lock (no user code under it)
            claimed.mailbox.run_claimed()
        elif decision.diverged:
            self._fail(decision.reason)  # outside the lock, like every failure
        return answer

    def _request_decided(self, decision: RequestDecision, asker: Asker, seq: int, request: Any,
                         answer: Future[Answer]) -> tuple[Future[Answer], CoordinatorHolder | None]:
        # Under the lock (rule 1): what the gate decided for request ``seq`` of ``asker``
        # (unpickled: ``request``) takes effect. The future the asker gets (a duplicate's may
        # be the one an earlier send waits on), and the holder whose idle mailbox this thread
        # claimed, if it did.
        key = answer_key(asker, seq)
        if decision.verdict is Verdict.REJECT:
            answer.set_exception(RunUnavailable(decision.reason) if decision.ask_again
                                 else RequestFailed(decision.reason))
            return answer, None
        if decision.verdict is Verdict.DUPLICATE:
            if decision.response is not None:
                answer.set_result(decision.response)
                return answer, None
            return self._waiters.setdefault(key, answer), None
        assert self.gate is not None
        identity = self.gate.last_entry.attempt  # the task's attempt, or the client's
        self._append()
        self._waiters[key] = answer
        holder = self._holders[identity.subtask.operator]
        if holder.deliver_request(
                None if isinstance(asker, DriverClient) else identity.subtask.index,
                decision.execution_attempt, request,
                lambda data, failed: self._answered(identity, seq, data, failed)):
            return answer, holder
        return answer, None

    def _compare_values(self, pairs: Sequence[tuple[bytes, bytes]],
                        compared: dict[tuple[bytes, bytes], bool]) -> None:
        # Rule 6, outside the lock: whether each (logged, re-sent) pair of bytes is one value
        # (core/encoding.py rule 6: both unpickled and encoded again), for the gate's next try
        for logged, given in pairs:
            compared[(logged, given)] = same_value(logged, given)

    # ---------------------------------------------------------------------------- inside
    def _answered(self, asked_by: TaskAttempt, seq: int, payload: bytes, failed: bool) -> None:
        # The coordinator's thread that produced the answer to request ``seq`` of ``asked_by``
        # (an attempt or a client's log identity): log it, then hand it to whoever waits for
        # it (if anyone: a retry that adopts the history may ask later).
        with self._lock:
            if self._refusal or self.gate is None:
                return
            entry = self.gate.response_recorded(asked_by, seq, payload, failed)
            if entry is None:
                return
            self._append()  # a client's: the current log, maybe a later epoch's than the request's
            waiter = self._waiters.pop(answer_key(asked_by, seq), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(entry)

    def _decoded(self, payload: bytes, what: str, answer: Future[Answer]) -> Any:
        # Unpickled before it is logged (rule 3): a request the driver cannot unpickle fails
        # ``answer`` (the asker learns why) and is never logged.
        try:
            return self._codec.decode(payload)
        except Exception as exc:  # noqa: BLE001 - unpickling raises anything
            answer.set_exception(RequestFailed(f"{what} cannot be unpickled on the driver: "
                                               f"{exc!r}"))
            return None

    def _admitting(self, client: bool = False) -> InboundGate | None:
        # Under the lock: the gate, or None when nothing is admitted now (the reason is
        # ``self._refusal``, or for a client ``self._client_refusal()``).
        if self._refusal or self.gate is None:
            return None
        if client and self._checkpoint_pending() is not None:
            return None
        return self.gate

    def _client_refusal(self) -> str:
        # Under the lock (rule 3): a client request handled after a coordinator's boundary
        # would be in neither the snapshot nor a log that a restore to this checkpoint
        # replays: hold it off until the checkpoint is sealed or aborted (between batches,
        # briefly).
        return self._refusal or f"checkpoint {self._checkpoint_pending()} is being taken; ask again"

    def _append(self) -> None:
        # Under the lock: the gate's last entry, to the log of the epoch that took it.
        assert self.gate is not None
        self._append_bytes(self.gate.last_entry_epoch, [encode_log_entry(self.gate.last_entry)])

    def _append_bytes(self, epoch: int, entries: list[bytes]) -> None:
        try:
            self._storage.append_inbound(epoch, b"".join(entries))
        except Exception as exc:
            self._fail(f"cannot append to the inbound log of epoch {epoch}: {exc!r}")
            raise

    def _fail_waiters(self, why: str, ask_again: bool = False) -> None:
        # Under the lock: every asker waiting for an answer learns that none will come, and
        # every task waiting for its finish that it is refused; ``ask_again``: the job failed
        # or the run closed, and a client asks the next run (RunUnavailable)
        finishing, self._finishing = self._finishing, {}
        for done in finishing.values():
            if not done.done():
                done.set_result(InboundDecision(Verdict.REJECT, why))
        waiters, self._waiters = self._waiters, {}
        for (sid, client, seq), waiter in waiters.items():
            if not waiter.done():
                waiter.set_exception(
                    (RunUnavailable if ask_again else RequestFailed)(
                        f"request {seq} of client {client} to {sid.operator!r}: {why}")
                    if client else RequestFailed(f"request {seq} of {sid}: {why}"))
