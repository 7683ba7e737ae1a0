"""The inbound gate: which subtask-to-coordinator events and requests take effect.

Rules (docs/protocol.md [inbound-critical-section] [inbound-admission]
[resent-item-equals-logged] [retry-resets-the-coordinator] [retry-adopts-history-once-answered]):
  1. Each event or request carries (run, subtask, epoch, Spark attempt number, sequence). It is
     dropped if its task attempt is not the live attempt of its subtask, or if its epoch is not
     the running (sealed, uncommitted) one. Events and requests of an attempt share one
     sequence, numbered 0, 1, ... without gaps.
  2. An accepted item is appended to the epoch's durable inbound log, then put on the
     coordinator's mailbox, then acknowledged (an event) or answered (a request, once its
     response is logged too), all in one critical section of the runtime, so that log order is
     mailbox order across all connections.
  3. A task registers its attempt before sending; registrations are logged too, so that a
     replay knows which attempts of each subtask survived. A registration with a higher Spark
     attempt number than the live one (or any attempt of a later run, after a restart) is a
     task retry: the subtask's attempt failed.
  4. Each subtask has one *history* per epoch: the items, numbered by sequence, of the attempts
     that survive (core/histories.py). A re-sent item (seq below the history's length) must
     equal the logged one, byte for byte or as a value (core/histories.py rule 1). A duplicate
     event is acknowledged again, a repeated request is answered with the logged response;
     anything else is divergence (a nondeterministic subtask), which the runtime turns into a
     global failover. The gate compares no values itself: where the bytes differ and the
     caller handed no verdict for them, the decision is COMPARE, with no effect, and the
     runtime compares the values outside its critical section and asks again with the
     verdicts (core/decisions.py rule 5, runtime/inbox.py rule 6). A verdict is a function of
     the two byte strings alone and counts only for them, so every decision stays a function
     of the log and the input: the one a comparison inside the critical section would make.
  5. A task retry in an epoch whose log holds no request of the operator *resets*: the failed
     attempt's history is dropped (the runtime resets the coordinator and replays the other
     subtasks' events, rule 7). Once the operator has answered a request in the epoch, a retry
     *adopts* the history instead: another subtask may already have acted on an answer computed
     from it, so it must stay true; the retry re-sends it (checked, not applied again) and
     continues it. Nothing is reset, and the coordinator is not told.
  6. Every attempt says when it finished the batch and how many items it sent, also one that
     sent nothing (it then registers with its finish); it is logged. Registration tells an
     attempt the length of the history it continues. If it sent fewer than its history holds,
     the items from that number on are *withdrawn*: cut from the history (a later retry that
     sends them again asks anew) and handed to the coordinator's ``handle_items_withdrawn``
     with their logged answers, in log order, so what those answers handed out goes back
     instead of vanishing (docs/protocol.md [every-answer-consumed-or-returned]). A replay
     meets the entry at the same place and withdraws the same. Only within a run: a failed
     attempt's output never reaches the sink, but when the batch runs again after a restart and
     an attempt of an earlier run had finished, a sink may hold that attempt's output (Spark's
     file sink keeps a batch it committed when only the commit log was lost), so only a *logged*
     finish binds the rerun (a task finishes before its rows can reach a sink, so an attempt
     whose finish is not logged left nothing there; docs/protocol.md
     [logged-finish-binds-the-rerun]): where the operator's log is kept (rule 5: it answered a
     request), a shorter history than the finish is divergence (rule 4), not a withdrawal, and
     so is an item beyond it; where it is not kept (no request), the finishes alone are kept,
     and a request of that subtask in the rerun is divergence (the finished attempt asked none,
     and its output holds no answer).
  7. A client of the job (the user's driver program: core/entries.py's ``DriverClient``) asks
     requests too, with its own sequence per (operator, client). A client's request is in no
     subtask's history: it always survives, a task retry replays it to the reset coordinator
     with the other subtasks' items, and it makes no retry adopt (rule 5). It is logged, under
     the client's log identity (entries rule 2), in the current epoch's log: the running one
     once Spark logged it, else the last committed one until the next epoch starts (between
     batches only its last entry is kept in memory: nothing replays it before a restore reads
     the durable log). Its answer goes to the log current when it comes. The newest
     ``CLIENT_MEMORY`` client requests are remembered across epochs and restores (with each
     record, docs/protocol.md [client-requests-take-effect-once]), so a client's re-send is
     answered from the log and never applied twice; one whose answer died with an earlier run is
     told so (``LOST_ANSWER``): core/clients.py.

Theory of operation: the gate keeps only the running epoch: the live attempt and history of
each subtask, the logged responses, and every log entry in order (the in-memory mirror of the
durable log): core/replay.py's :class:`~sparkcoord.core.replay.LogState`, which the gate extends
with admission (the identity checks and rules 1 to 7). The transitions a logged entry makes are
the state's own, so re-reading a durable log (:meth:`InboundGate.replayed`) makes the same ones
without the identity checks, and a restore derives exactly what the live run decided.
Everything but the client memory (core/clients.py) is dropped when the epoch's batch commits;
the values the gate returns are in core/decisions.py.

Thread model: none; the runtime calls it inside its inbound critical section.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# the names that moved out stay importable from here (``X as X``: a re-export), as the
# runtime, the channel and the tests import them (docs/decisions/098-inbound-split.md)
from sparkcoord.core.clients import CLIENT_MEMORY as CLIENT_MEMORY
from sparkcoord.core.clients import LOST_ANSWER as LOST_ANSWER
from sparkcoord.core.decisions import NOT_COMPARED, Compared
from sparkcoord.core.decisions import InboundDecision as InboundDecision
from sparkcoord.core.decisions import ReplayedItem as ReplayedItem
from sparkcoord.core.decisions import RequestDecision as RequestDecision
from sparkcoord.core.decisions import RunDecision as RunDecision
from sparkcoord.core.decisions import Verdict as Verdict
from sparkcoord.core.decisions import WithdrawnItem as WithdrawnItem
from sparkcoord.core.entries import (
    Answer,
    Asker,
    DriverClient,
    EventEntry,
    EventRunEntry,
    FinishedEntry,
    ItemEntry,
    LogEntry,
    RequestEntry,
    ResponseEntry,
    is_client_identity,
)
from sparkcoord.core.errors import CheckpointIdRegression
from sparkcoord.core.histories import History
from sparkcoord.core.ids import NO_EPOCH, SubtaskId, TaskAttempt
from sparkcoord.core.replay import LogState
from sparkcoord.core.replay import kept_at_rerun as kept_at_rerun
from sparkcoord.core.replay import operators_with_requests as operators_with_requests
from sparkcoord.core.replay import surviving_events as surviving_events
from sparkcoord.core.replay import surviving_items as surviving_items


class InboundGate(LogState):
    """Admission of registrations, events and requests for the running epoch."""

    def __init__(self, run: str, parallelism: Mapping[str, int],
                 last_committed: int = NO_EPOCH) -> None:
        super().__init__(last_committed)
        self.run = run
        self.parallelism = dict(parallelism)

    @classmethod
    def replayed(cls, entries: Iterable[LogEntry]) -> InboundGate:
        """A gate that re-read a durable log: the same rules, without identity checks (the
        entries were admitted by a live gate when they were logged). A restore calls it, on
        the driver, before the run admits anything."""
        gate = cls("", {})
        for entry in entries:
            gate._replay(entry)
        return gate

    # ----------------------------------------------------------------------------- epochs
    def epoch_started(self, epoch: int) -> None:
        """The record of ``epoch`` is durable: its batch may now run."""
        floor = max(self.last_committed,
                    self.running_epoch if self.running_epoch is not None else NO_EPOCH)
        if epoch <= floor:
            raise CheckpointIdRegression("epoch start", epoch, floor)
        self.running_epoch = epoch
        self._clear()

    def epoch_resumed(self, epoch: int, entries: Iterable[LogEntry]) -> None:
        """The batch of ``epoch`` runs again in this run, continuing the kept log ``entries``
        of an earlier run (:func:`kept_at_rerun`): the histories they make up are adopted by
        this run's attempts (rule 5), and the finishes they hold bind them (rule 6)."""
        self.epoch_started(epoch)
        self._logged = epoch
        for entry in entries:
            self._replay(entry)

    def batch_committed(self, epoch: int) -> None:
        """Spark committed the batch of ``epoch``: its events are final, later ones dropped."""
        if epoch < self.last_committed:
            raise CheckpointIdRegression("commit", epoch, self.last_committed)
        self.last_committed = epoch
        if self.running_epoch is not None and self.running_epoch <= epoch:
            self.running_epoch = None
            self._clear()

    def epoch_logged(self, epoch: int) -> None:
        """Spark logged ``epoch`` (it planned the epoch's batch). Runtime, critical section."""
        self._logged = max(self._logged, epoch)

    def live_attempt(self, subtask: SubtaskId) -> TaskAttempt | None:
        return self._live.get(subtask)

    def history_length(self, subtask: SubtaskId) -> int:
        """How many items ``subtask``'s history holds in the running epoch: more than 0 when
        the batch runs again after a restore and its tasks adopt a kept history (they then
        register eagerly, to say at the end whether they sent fewer: rule 6)."""
        history = self._histories.get(subtask)
        return 0 if history is None else history.length

    def answers_requests(self, operator: str) -> bool:
        """Whether ``operator`` accepted a request in the running epoch (retries adopt)."""
        return operator in self._requested

    # ----------------------------------------------------------------------------- inputs
    def attempt_registered(self, attempt: TaskAttempt) -> InboundDecision:
        """A task announced ``attempt`` before sending its first item."""
        sid = attempt.subtask
        problem = self._check_identity(attempt)
        if problem:
            return InboundDecision(Verdict.REJECT, problem)
        live = self._live.get(sid)
        if live == attempt:
            # a re-sent registration (its reply was lost): tell the history's length again
            history = self._histories.get(sid)
            return InboundDecision(Verdict.DUPLICATE, "already registered",
                                   execution_attempt=self.execution_attempt(sid),
                                   history_length=history.length if history else 0)
        if live is not None and live.run == attempt.run and attempt.number < live.number:
            return InboundDecision(
                Verdict.REJECT, f"{attempt} is older than the live attempt {live.number}")
        return self._register(attempt)

    def attempt_finished(self, attempt: TaskAttempt, sent: int) -> InboundDecision:
        """``attempt`` finished its batch having sent ``sent`` items (rule 6). ACCEPT: the
        caller logs ``self.last_entry`` and hands ``decision.withdrawn`` (if any: it sent fewer
        than its history holds) to the coordinator. DUPLICATE: a re-send of a finish already
        taken. REJECT with ``diverged``: a shorter history than an earlier run's finished
        attempt sent, which fails the job."""
        sid = attempt.subtask
        live = self._live.get(sid)
        if live != attempt:
            problem = self._check_identity(attempt) or (
                f"{attempt} is not the live attempt of {sid} (live: {live})")
            return InboundDecision(Verdict.REJECT, problem)
        history = self._histories[sid]
        execution_attempt = self.execution_attempt(sid)
        if sent > history.length:
            return InboundDecision(Verdict.REJECT, f"{attempt} says it sent {sent} items, but "
                                                   f"its history holds {history.length}",
                                   execution_attempt=execution_attempt)
        if sent == history.length and history.finished == attempt:
            return InboundDecision(Verdict.DUPLICATE, execution_attempt=execution_attempt)
        earlier = history.earlier_finish(attempt)
        if earlier is not None and sent != earlier[1]:
            return InboundDecision(
                Verdict.REJECT,
                f"nondeterministic subtask: {sid} finished epoch {attempt.epoch} after {sent} "
                f"items, but the batch runs again after a restart and {earlier[0]} had "
                f"finished it after {earlier[1]}: a sink may hold that attempt's output, so "
                f"the rest cannot be withdrawn; a task that runs a batch again must send the "
                f"same items", execution_attempt=execution_attempt, diverged=True)
        entry = FinishedEntry(attempt, sent)
        withdrawn = self._withdraw(entry)
        return InboundDecision(Verdict.ACCEPT, execution_attempt=execution_attempt,
                               withdrawn=withdrawn)

    def event_received(self, attempt: TaskAttempt, seq: int, payload: bytes,
                       compared: Compared = NOT_COMPARED) -> InboundDecision:
        """Event ``seq`` of ``attempt`` arrived. On ACCEPT the caller logs ``self.last_entry``;
        on COMPARE it compares the values and asks again (rule 4)."""
        return self.event_run_received(attempt, seq, (payload,), compared).of_one(seq, attempt)

    def event_run_received(self, attempt: TaskAttempt, first_seq: int,
                           payloads: tuple[bytes, ...],
                           compared: Compared = NOT_COMPARED) -> RunDecision:
        """Events ``first_seq``, ``first_seq + 1``, ... of ``attempt`` arrived together, in order.

        The same rules as :meth:`event_received` for each, decided once for the run: those below
        the history's length are duplicates (each checked against the logged item), the rest
        are accepted, unless the run starts past the expected number (a gap) or the attempt is
        not live (all rejected). If any is accepted, the caller logs ``self.last_entry`` (one
        entry for the accepted ones). A duplicate whose bytes differ from the logged ones and
        that ``compared`` holds no verdict for makes the decision ``compare`` (rule 4): the
        pairs before the first certain difference, nothing decided.
        """
        sid = attempt.subtask
        live = self._live.get(sid)
        n = len(payloads)
        if live is not attempt and live != attempt:  # identity first: the channel interns attempts
            problem = self._check_identity(attempt) or (
                f"{attempt} is not the live attempt of {sid} (live: {self._live.get(sid)})")
            return RunDecision(0, 0, n, problem)
        history = self._histories[sid]
        expected = history.length
        execution_attempt = self._execution_attempts.get(sid, 0)
        if first_seq > expected:
            return RunDecision(0, 0, n, f"event {first_seq} of {attempt} arrived before event "
                                        f"{expected}", execution_attempt)
        duplicates = min(n, expected - first_seq)
        unsettled: list[tuple[bytes, bytes]] = []
        for i in range(duplicates):
            same = history.resent(first_seq + i, payloads[i], False, compared)
            if same is None:  # the values decide (rule 4)
                unsettled.append((history.logged(first_seq + i), payloads[i]))
            elif not same and unsettled:
                break  # it diverges here or at an item before: the comparisons say where
            elif not same:
                return RunDecision(i, 0, n - i,
                                   history.difference(attempt, first_seq + i, payloads[i], False),
                                   execution_attempt, diverged=True)
        if unsettled:
            return RunDecision(0, 0, 0, "", execution_attempt, compare=tuple(unsettled))
        accepted = n - duplicates
        if accepted and history.earlier_finish(attempt) is not None:
            return RunDecision(duplicates, 0, accepted, self._beyond(history, attempt),
                               execution_attempt, diverged=True)
        if accepted:
            entry: ItemEntry = (EventEntry(attempt, expected, payloads[duplicates]) if accepted == 1
                                else EventRunEntry(attempt, expected, payloads[duplicates:]))
            history.append(entry)
            self._log.append(entry)
        return RunDecision(duplicates, accepted, 0, "", execution_attempt)

    def request_received(self, asker: Asker, seq: int, payload: bytes,
                         compared: Compared = NOT_COMPARED) -> RequestDecision:
        """Request ``seq`` of ``asker`` (a task attempt, or a client: rule 7) arrived. On
        ACCEPT the caller logs ``self.last_entry`` in the log of :attr:`last_entry_epoch`,
        hands the request to the coordinator, and answers once :meth:`response_recorded` took
        the answer. DUPLICATE: a re-send (or a retry re-asking what the attempt it adopted
        asked), answered from the log. COMPARE: a task's re-send whose bytes differ from the
        logged ones and that ``compared`` holds no verdict for (rule 4)."""
        if isinstance(asker, DriverClient):
            return self._client_request(asker, seq, payload)
        return self._task_request(asker, seq, payload, compared)

    def response_recorded(self, asked_by: TaskAttempt, seq: int, payload: bytes,
                          failed: bool = False) -> Answer | None:
        """The coordinator answered request ``seq`` that ``asked_by`` asked (a task attempt,
        or a client's log identity). Returns the entry to log in the log of
        :attr:`last_entry_epoch` (the caller logs it, then answers whoever waits), or None
        when the request is no longer part of the running epoch (its batch ended, or it was
        answered already) or a client's request is forgotten."""
        if is_client_identity(asked_by):
            return self._client_answer(asked_by, seq, payload, failed)
        return self._task_answer(asked_by, seq, payload, failed)

    def _task_request(self, attempt: TaskAttempt, seq: int, payload: bytes,
                      compared: Compared) -> RequestDecision:
        sid = attempt.subtask
        live = self._live.get(sid)
        if live is not attempt and live != attempt:
            problem = self._check_identity(attempt) or (
                f"{attempt} is not the live attempt of {sid} (live: {live})")
            return RequestDecision(Verdict.REJECT, problem)
        history = self._histories[sid]
        execution_attempt = self._execution_attempts.get(sid, 0)
        if seq > history.length:
            return RequestDecision(Verdict.REJECT, f"request {seq} of {attempt} arrived before "
                                                   f"item {history.length}", execution_attempt)
        if seq < history.length:
            same = history.resent(seq, payload, True, compared)
            if same is None:  # the values decide (rule 4)
                return RequestDecision(Verdict.COMPARE, execution_attempt=execution_attempt,
                                       compare=((history.logged(seq), payload),))
            if not same:
                return RequestDecision(Verdict.REJECT,
                                       history.difference(attempt, seq, payload, True),
                                       execution_attempt, diverged=True)
            return RequestDecision(Verdict.DUPLICATE, execution_attempt=execution_attempt,
                                   response=self._responses.get((sid, seq)))
        if history.earlier_finish(attempt) is not None:
            return RequestDecision(Verdict.REJECT, self._beyond(history, attempt),
                                   execution_attempt, diverged=True)
        unasked = self._finished_unasked.get(sid)
        if unasked is not None and unasked.run != attempt.run:
            return RequestDecision(
                Verdict.REJECT,
                f"nondeterministic subtask: {sid} asked request {seq} of epoch {attempt.epoch}, "
                f"but the batch runs again after a restart and {unasked} had finished it "
                f"without asking any: a sink may hold that attempt's output, so a task that "
                f"runs a batch again must send the same items (rule 6)",
                execution_attempt, diverged=True)
        entry = RequestEntry(attempt, seq, payload)
        history.append(entry)
        self._log.append(entry)
        self._requested.add(sid.operator)
        return RequestDecision(Verdict.ACCEPT, execution_attempt=execution_attempt)

    def _task_answer(self, asked_by: TaskAttempt, seq: int, payload: bytes,
                     failed: bool) -> ResponseEntry | None:
        sid = asked_by.subtask
        history = self._histories.get(sid)
        if (asked_by.epoch != self.running_epoch or history is None
                or asked_by not in history.attempts or (sid, seq) in self._responses
                or seq >= history.length or history.item(seq)[2] != asked_by):
            return None  # (the last: a withdrawn request whose number was asked anew)
        entry = ResponseEntry(asked_by, seq, payload, failed)
        self._responses[(sid, seq)] = entry
        self._answers[(asked_by, seq)] = entry
        self._log.append(entry)
        return entry

    # ---------------------------------------------------------------------------- clients
    def _client_request(self, client: DriverClient, seq: int, payload: bytes
                        ) -> RequestDecision:
        # rule 7: logged in the log of ``client_log_epoch``; the memory decides the rest
        if client.operator not in self.parallelism:
            return RequestDecision(Verdict.REJECT, f"unknown operator {client.operator!r}")
        decision, entry = self._clients.request_received(client, seq, payload,
                                                         self.client_log_epoch)
        if entry is not None:
            self._log_client(entry)
        return decision

    def _client_answer(self, asked_by: TaskAttempt, seq: int, payload: bytes,
                       failed: bool) -> Answer | None:
        # rule 7: logged in the log of ``client_log_epoch`` (maybe a later epoch's than the
        # request's); None when it was answered already or is forgotten
        entry = self._clients.response_recorded(asked_by, seq, payload, failed,
                                                self.client_log_epoch)
        if entry is not None:
            self._log_client(entry)
        return entry

    def client_memory(self) -> list[tuple[str, str, int, bytes | None, bool]]:
        """The remembered client requests as ``(operator, client, seq, answer, failed)``
        (answer None: not answered yet), oldest first: stored with each checkpoint record, so
        that a restore to that record still answers a client's re-send once
        (docs/protocol.md [client-requests-take-effect-once])."""
        return self._clients.remembered()

    def client_memory_restored(self, memory: Iterable[tuple[str, str, int, bytes | None, bool]],
                               epoch: int) -> None:
        """A restore to the record of ``epoch`` brings back its client memory. A request that
        had no answer yet took effect (it is in the snapshots) but its answer is gone with the
        run that owed it: a re-send is told so instead of being applied again."""
        self._clients.restored(memory, epoch)

    def clients_replayed(self, entries: Iterable[LogEntry]) -> None:
        """A restore replays ``entries`` (a committed batch's log): remember their client
        requests, so that a client re-sending one to this run is answered, not applied again."""
        self._clients.replayed(entries)

    # ---------------------------------------------------------------------------- helpers
    def _beyond(self, history: History, attempt: TaskAttempt) -> str:
        earlier = history.earlier_finish(attempt)
        assert earlier is not None
        return (f"nondeterministic subtask: {attempt.subtask} sent item {history.length} of "
                f"epoch {attempt.epoch}, but the batch runs again after a restart and "
                f"{earlier[0]} had finished it after {earlier[1]} items: a sink may hold that "
                f"attempt's output, so a task that runs a batch again must send the same items "
                f"(rule 6)")

    def _check_identity(self, attempt: TaskAttempt) -> str:
        sid = attempt.subtask
        p = self.parallelism.get(sid.operator)
        if p is None:
            return f"unknown operator {sid.operator!r}"
        if not 0 <= sid.index < p:
            return f"{sid.operator!r} has subtasks 0..{p - 1}, got {sid.index}"
        if attempt.run != self.run:
            return f"{attempt} belongs to run {attempt.run}, not the current run {self.run}"
        if attempt.epoch <= self.last_committed:
            return f"the batch of epoch {attempt.epoch} is already committed"
        if attempt.epoch != self.running_epoch:
            return f"epoch {attempt.epoch} is not running (running: {self.running_epoch})"
        return ""
