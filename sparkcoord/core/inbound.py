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
     that survive. A re-sent item (seq below the history's length) must equal the logged one:
     byte for byte, or, where the bytes differ, as the values they decode to, encoded again
     by this code (an upgrade of sparkcoord between the two runs may change an encoding, not
     a value: ``core/encoding.py`` rule 6). A duplicate event is acknowledged again, a repeated request
     is answered with the logged response; anything else is divergence (a nondeterministic
     subtask), which the runtime turns into a global failover.
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
     told so (``LOST_ANSWER``).

Theory of operation: the gate keeps only the running epoch: the live attempt and history of
each subtask, the logged responses, and every log entry in order (the in-memory mirror of the
durable log). The same gate re-reads a durable log (:meth:`InboundGate.replayed`), applying the
same rules without the identity checks, so a restore derives exactly what the live run decided.
Everything is dropped when the epoch's batch commits.

Thread model: none; the runtime calls it inside its inbound critical section.
"""

from __future__ import annotations

import bisect
import enum
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sparkcoord.core.encoding import same_value
from sparkcoord.core.entries import (
    Answer,
    Asker,
    ClientRequestEntry,
    ClientResponseEntry,
    DriverClient,
    EventEntry,
    EventRunEntry,
    FinishedEntry,
    ItemEntry,
    LogEntry,
    RegistrationEntry,
    RequestEntry,
    ResponseEntry,
    client_identity,
    is_client_identity,
)
from sparkcoord.core.errors import CheckpointIdRegression
from sparkcoord.core.ids import NO_EPOCH, SubtaskId, TaskAttempt

#: How many client requests the gate remembers for answering re-sends (rule 7).
CLIENT_MEMORY = 4096
#: What a client's re-send hears when its request took effect but its answer was lost.
LOST_ANSWER = ("the request took effect, but its answer was lost when the run that owed it "
               "ended (it was not answered before the checkpoint the job restarted from)")


def _events_of(entry: LogEntry) -> list[EventEntry]:
    if isinstance(entry, EventRunEntry):
        return entry.each()
    if isinstance(entry, EventEntry):
        return [entry]
    return []


class Verdict(enum.Enum):
    ACCEPT = "accept"        # log, enqueue, then acknowledge (a request: answer when logged)
    DUPLICATE = "duplicate"  # already accepted: acknowledge again (answer from the log)
    REJECT = "reject"        # drop; tell the sender why


@dataclass(frozen=True, slots=True)
class InboundDecision:
    """What to do with one registration or event."""

    verdict: Verdict
    reason: str = ""
    #: for an accepted registration that replaces a live attempt (a task retry): that attempt
    replaced: TaskAttempt | None = None
    #: the subtask's execution attempt number (the coordinator's view) after this input
    execution_attempt: int = 0
    #: an accepted retry that took over the replaced attempt's history (rule 5): the runtime
    #: resets nothing
    adopted: bool = False
    #: a registration: the length of the history the attempt continues (rule 6: it says at
    #: the end if it sent fewer items); a finish: the items it withdrew, in order
    history_length: int = 0
    withdrawn: tuple[WithdrawnItem, ...] = ()
    #: a refused finish that is divergence (rule 6): the runtime fails the job
    diverged: bool = False


@dataclass(frozen=True, slots=True)
class RunDecision:
    """What to do with a run of consecutive events of one attempt, in order: the first
    ``duplicates`` were logged before (acknowledge them again), the next ``accepted`` take
    effect (log, enqueue, then acknowledge), the last ``rejected`` are dropped for ``reason``.
    ``diverged``: the rejection is a re-sent item that differs from the logged one (rule 4),
    which fails the job."""

    duplicates: int
    accepted: int
    rejected: int
    reason: str = ""
    execution_attempt: int = 0
    diverged: bool = False

    def of_one(self, seq: int, attempt: TaskAttempt) -> InboundDecision:
        """The decision for event ``seq`` of ``attempt`` when the run holds only that event."""
        if self.accepted:
            return InboundDecision(Verdict.ACCEPT, execution_attempt=self.execution_attempt)
        if self.duplicates:
            return InboundDecision(Verdict.DUPLICATE, f"event {seq} of {attempt} already logged",
                                   execution_attempt=self.execution_attempt)
        return InboundDecision(Verdict.REJECT, self.reason)


@dataclass(frozen=True, slots=True)
class RequestDecision:
    """What to do with one request.

    ACCEPT: log it (``self.last_entry``), hand it to the coordinator, answer once the response
    is logged. DUPLICATE: it was logged before (a re-send, or a retry re-asking what the attempt
    it adopted asked): answer with ``response`` if already logged, else when it is. REJECT:
    refuse for ``reason``; ``diverged`` as in :class:`RunDecision`; ``ask_again``: a client's
    request that a moment later (or the job's next run) takes (no epoch sealed yet).
    """

    verdict: Verdict
    reason: str = ""
    execution_attempt: int = 0
    diverged: bool = False
    response: Answer | None = None
    ask_again: bool = False


@dataclass(frozen=True, slots=True)
class WithdrawnItem:
    """Item ``seq`` of a subtask's history, withdrawn (rule 6): its payload, whether it is a
    request, and a request's logged answer (None: not answered when it was withdrawn)."""

    seq: int
    payload: bytes
    is_request: bool
    response: ResponseEntry | None = None


@dataclass(frozen=True, slots=True)
class ReplayedItem:
    """A surviving event or request of a log, in log order, for a coordinator replay.

    ``response`` is the logged answer of a request (None for events, and for a request whose
    answer was not logged yet: the coordinator's new answer is then logged and served)."""

    attempt: TaskAttempt
    seq: int
    payload: bytes
    is_request: bool = False
    response: ResponseEntry | ClientResponseEntry | None = None
    #: a client's request (``attempt`` is its :func:`client_identity`)
    client: bool = False
    #: a withdrawal (rule 6): the withdrawn items of ``attempt``'s subtask (``payload`` empty)
    withdrawn: tuple[WithdrawnItem, ...] | None = None


@dataclass(slots=True)
class _History:
    """The items of one subtask in the running epoch, by sequence number (rule 4)."""

    attempts: set[TaskAttempt]          # the live attempt and the attempts it adopted
    length: int = 0                     # the next sequence number
    finished: TaskAttempt | None = None  # the last attempt that said it finished (rule 6)
    # by run: the newest attempt of that run that finished it (or may have: rule 6) and how
    # many items it had sent; a later run must send exactly as many
    finishes: dict[str, tuple[TaskAttempt, int]] = field(default_factory=dict)
    starts: list[int] = field(default_factory=list)       # first seq of each item entry
    items: list[ItemEntry] = field(default_factory=list)  # in sequence order

    def append(self, entry: ItemEntry, count: int) -> None:
        self.starts.append(self.length)
        self.items.append(entry)
        self.length += count

    def truncate(self, length: int) -> None:
        """Forget the items from ``length`` on (rule 6); a run entry that straddles the cut
        stays, covering only its items below it."""
        cut = bisect.bisect_left(self.starts, length)
        del self.starts[cut:], self.items[cut:]
        self.length = length

    def item(self, seq: int) -> tuple[bytes, bool, TaskAttempt]:
        """(payload, is a request, the attempt that logged it) of item ``seq`` < length."""
        entry = self.items[bisect.bisect_right(self.starts, seq) - 1]
        if isinstance(entry, EventRunEntry):
            return entry.payloads[seq - entry.first_seq], False, entry.attempt
        return entry.payload, isinstance(entry, RequestEntry), entry.attempt


class InboundGate:
    """Admission of registrations, events and requests for the running epoch."""

    def __init__(self, run: str, parallelism: Mapping[str, int],
                 last_committed: int = NO_EPOCH) -> None:
        self.run = run
        self.parallelism = dict(parallelism)
        self.running_epoch: int | None = None
        self.last_committed = last_committed
        self._live: dict[SubtaskId, TaskAttempt] = {}
        self._histories: dict[SubtaskId, _History] = {}
        self._responses: dict[tuple[SubtaskId, int], ResponseEntry] = {}
        # every logged answer by its request (asking attempt, seq), withdrawn ones included:
        # what a replay compares with (a withdrawn item's number may be asked again)
        self._answers: dict[tuple[TaskAttempt, int], ResponseEntry] = {}
        # the items each withdrawal in the log took back (rule 6), for replays
        self._withdrawals: dict[FinishedEntry, tuple[WithdrawnItem, ...]] = {}
        self._requested: set[str] = set()  # operators that accepted a request this epoch
        # subtasks whose batch an attempt of an earlier run finished without asking, in an
        # operator whose log held no request (so only the finish was kept): a request of a
        # later run's attempt is divergence (rule 6)
        self._finished_unasked: dict[SubtaskId, TaskAttempt] = {}
        # the newest client requests, (operator, client, seq) -> answer (None: not yet), kept
        # across epochs (a client re-sends a request it got no answer to, also to the next
        # run after a restart) and bounded; a restore seeds it from the log it replays
        self._client: OrderedDict[tuple[str, str, int], ClientResponseEntry | None] = OrderedDict()
        self._log: list[LogEntry] = []
        self._logged = NO_EPOCH  # the newest epoch Spark is known to have logged
        self._execution_attempts: dict[SubtaskId, int] = {}

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

    def execution_attempt(self, subtask: SubtaskId) -> int:
        """The coordinator-visible execution attempt number of ``subtask`` in this run."""
        return self._execution_attempts.get(subtask, 0)

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

    def _register(self, attempt: TaskAttempt) -> InboundDecision:
        sid = attempt.subtask
        replaced = self._live.get(sid)
        if replaced is None and attempt.number > 0:
            # Spark numbers a task's attempts 0, 1, ...: an earlier attempt of this task ran
            # in this epoch and failed before it registered (first attempts register lazily,
            # with their first item). It is a retry all the same.
            replaced = TaskAttempt(attempt.run, sid, attempt.epoch, attempt.number - 1)
        history = self._histories.get(sid)
        adopted = replaced is not None and sid.operator in self._requested
        if adopted:
            if history is None:
                history = self._histories[sid] = _History({attempt})
            history.attempts.add(attempt)
            # an attempt of this run that finished was retried after all: its task failed
            # later (its sink write), so no sink holds its output (rule 6)
            history.finishes.pop(attempt.run, None)
        else:
            if replaced is not None:
                self._execution_attempts[sid] = self.execution_attempt(sid) + 1
            self._histories[sid] = _History({attempt})
        self._live[sid] = attempt
        self._log.append(RegistrationEntry(attempt))
        return InboundDecision(Verdict.ACCEPT, replaced=replaced,
                               execution_attempt=self.execution_attempt(sid), adopted=adopted,
                               history_length=history.length if adopted and history else 0)

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
        earlier = self._earlier_finish(history, attempt)
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

    def _withdraw(self, entry: FinishedEntry) -> tuple[WithdrawnItem, ...]:
        sid = entry.attempt.subtask
        history = self._histories[sid]
        items = []
        for seq in range(entry.seq, history.length):
            payload, is_request, _ = history.item(seq)
            items.append(WithdrawnItem(seq, payload, is_request,
                                       self._responses.pop((sid, seq), None)))
        history.truncate(entry.seq)
        history.finished = entry.attempt
        history.finishes[entry.attempt.run] = (entry.attempt, entry.seq)
        withdrawn = self._withdrawals[entry] = tuple(items)
        self._log.append(entry)
        return withdrawn

    def event_received(self, attempt: TaskAttempt, seq: int, payload: bytes) -> InboundDecision:
        """Event ``seq`` of ``attempt`` arrived. On ACCEPT the caller logs ``self.last_entry``."""
        return self.event_run_received(attempt, seq, (payload,)).of_one(seq, attempt)

    def event_run_received(self, attempt: TaskAttempt, first_seq: int,
                           payloads: tuple[bytes, ...]) -> RunDecision:
        """Events ``first_seq``, ``first_seq + 1``, ... of ``attempt`` arrived together, in order.

        The same rules as :meth:`event_received` for each, decided once for the run: those below
        the history's length are duplicates (each checked against the logged item), the rest
        are accepted, unless the run starts past the expected number (a gap) or the attempt is
        not live (all rejected). If any is accepted, the caller logs ``self.last_entry`` (one
        entry for the accepted ones).
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
        for i in range(duplicates):
            problem = self._differs(history, attempt, first_seq + i, payloads[i], False)
            if problem:
                return RunDecision(i, 0, n - i, problem, execution_attempt, diverged=True)
        accepted = n - duplicates
        if accepted and self._earlier_finish(history, attempt) is not None:
            return RunDecision(duplicates, 0, accepted, self._beyond(history, attempt),
                               execution_attempt, diverged=True)
        if accepted:
            entry: ItemEntry = (EventEntry(attempt, expected, payloads[duplicates]) if accepted == 1
                                else EventRunEntry(attempt, expected, payloads[duplicates:]))
            history.append(entry, accepted)
            self._log.append(entry)
        return RunDecision(duplicates, accepted, 0, "", execution_attempt)

    def request_received(self, asker: Asker, seq: int, payload: bytes) -> RequestDecision:
        """Request ``seq`` of ``asker`` (a task attempt, or a client: rule 7) arrived. On
        ACCEPT the caller logs ``self.last_entry`` in the log of :attr:`last_entry_epoch`,
        hands the request to the coordinator, and answers once :meth:`response_recorded` took
        the answer. DUPLICATE: a re-send (or a retry re-asking what the attempt it adopted
        asked), answered from the log."""
        if isinstance(asker, DriverClient):
            return self._client_request(asker.operator, asker.client, seq, payload)
        return self._task_request(asker, seq, payload)

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

    def _task_request(self, attempt: TaskAttempt, seq: int, payload: bytes) -> RequestDecision:
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
            problem = self._differs(history, attempt, seq, payload, True)
            if problem:
                return RequestDecision(Verdict.REJECT, problem, execution_attempt, diverged=True)
            return RequestDecision(Verdict.DUPLICATE, execution_attempt=execution_attempt,
                                   response=self._responses.get((sid, seq)))
        if self._earlier_finish(history, attempt) is not None:
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
        history.append(entry, 1)
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

    @property
    def client_log_epoch(self) -> int | None:
        """The epoch whose log takes client requests now: the running one, else the last
        committed one until the next epoch starts; None before anything was sealed."""
        if self.running_epoch is not None:
            # only once Spark logged the epoch: a sealed epoch it never logs is garbage, and
            # so would be a client request logged in it
            return self.running_epoch if self._logged == self.running_epoch else None
        return self.last_committed if self.last_committed != NO_EPOCH else None

    def epoch_logged(self, epoch: int) -> None:
        """Spark logged ``epoch`` (it planned the epoch's batch). Runtime, critical section."""
        self._logged = max(self._logged, epoch)

    def _client_request(self, operator: str, client: str, seq: int, payload: bytes
                        ) -> RequestDecision:
        # rule 7: logged in the log of ``client_log_epoch``
        if operator not in self.parallelism:
            return RequestDecision(Verdict.REJECT, f"unknown operator {operator!r}")
        epoch = self.client_log_epoch
        if epoch is None:
            return RequestDecision(Verdict.REJECT, "no epoch was sealed yet (the query is "
                                                   "starting); ask again", ask_again=True)
        key = (operator, client, seq)
        if key in self._client:
            return RequestDecision(Verdict.DUPLICATE, response=self._client[key])
        entry = ClientRequestEntry(client_identity(operator, client, epoch), seq, payload)
        self._remember_client(key, None)
        self._log_client(entry)
        return RequestDecision(Verdict.ACCEPT)

    def _log_client(self, entry: LogEntry) -> None:
        # While a batch runs, the in-memory log mirrors the durable one (a reset replays it).
        # Between batches nothing replays it (a restore reads the durable log), so it keeps
        # only the last entry: a job polled by a client while idle does not grow it.
        if self.running_epoch is None:
            self._log[:] = [entry]
        else:
            self._log.append(entry)

    def client_memory(self) -> list[tuple[str, str, int, bytes | None, bool]]:
        """The remembered client requests as ``(operator, client, seq, answer, failed)``
        (answer None: not answered yet), oldest first: stored with each checkpoint record, so
        that a restore to that record still answers a client's re-send once
        (docs/protocol.md [client-requests-take-effect-once])."""
        return [(op, client, seq, None if a is None else a.payload, False if a is None else a.failed)
                for (op, client, seq), a in self._client.items()]

    def client_memory_restored(self, memory: Iterable[tuple[str, str, int, bytes | None, bool]],
                               epoch: int) -> None:
        """A restore to the record of ``epoch`` brings back its client memory. A request that
        had no answer yet took effect (it is in the snapshots) but its answer is gone with the
        run that owed it: a re-send is told so instead of being applied again."""
        for op, client, seq, payload, failed in memory:
            identity = client_identity(op, client, epoch)
            if payload is None:
                answer = ClientResponseEntry(identity, seq, LOST_ANSWER.encode(), True)
            else:
                answer = ClientResponseEntry(identity, seq, payload, failed)
            self._remember_client((op, client, seq), answer)

    def clients_replayed(self, entries: Iterable[LogEntry]) -> None:
        """A restore replays ``entries`` (a committed batch's log): remember their client
        requests, so that a client re-sending one to this run is answered, not applied again."""
        for entry in entries:
            if isinstance(entry, (ClientRequestEntry, ClientResponseEntry)):
                key = (entry.attempt.subtask.operator, entry.attempt.run, entry.seq)
                if isinstance(entry, ClientResponseEntry):
                    self._remember_client(key, entry)
                elif key not in self._client:
                    self._remember_client(key, None)

    def _remember_client(self, key: tuple[str, str, int],
                         answer: ClientResponseEntry | None) -> None:
        self._client[key] = answer
        self._client.move_to_end(key)
        while len(self._client) > CLIENT_MEMORY:
            self._client.popitem(last=False)

    def _client_answer(self, asked_by: TaskAttempt, seq: int, payload: bytes,
                       failed: bool) -> ClientResponseEntry | None:
        # rule 7: logged in the log of ``client_log_epoch`` (maybe a later epoch's than the
        # request's); None when it was answered already or is forgotten
        key = (asked_by.subtask.operator, asked_by.run, seq)
        if key not in self._client or self._client[key] is not None \
                or self.client_log_epoch is None:
            return None
        entry = ClientResponseEntry(asked_by, seq, payload, failed)
        self._remember_client(key, entry)
        self._log_client(entry)
        return entry

    @property
    def last_entry(self) -> LogEntry:
        """The entry that the last ACCEPT added (the runtime appends it to the durable log)."""
        return self._log[-1]

    @property
    def last_entry_epoch(self) -> int:
        """The epoch whose durable log takes :attr:`last_entry`: a task's entry goes to its
        attempt's epoch (the running one), a client's to the current one (rule 7)."""
        entry = self._log[-1]
        if is_client_identity(entry.attempt):
            epoch = self.client_log_epoch
            assert epoch is not None  # a client's entry is only made while there is one
            return epoch
        return entry.attempt.epoch

    # ---------------------------------------------------------------------------- replays
    def surviving_items(self, operator: str | None = None, excluding: SubtaskId | None = None
                        ) -> list[ReplayedItem]:
        """Events and requests of the surviving histories (of ``operator``, or all), in log
        order: what a coordinator reset or a restore hands to the coordinator again."""
        histories = self._histories
        out: list[ReplayedItem] = []
        for entry in self._log:
            if isinstance(entry, (RegistrationEntry, ResponseEntry, ClientResponseEntry)):
                continue
            sid = entry.attempt.subtask
            if isinstance(entry, FinishedEntry):
                if self._withdrawals.get(entry) and sid != excluding and (
                        operator is None or sid.operator == operator):
                    out.append(ReplayedItem(entry.attempt, entry.seq, b"",
                                            withdrawn=self._withdrawals[entry]))
                continue
            if isinstance(entry, ClientRequestEntry):
                if operator is None or sid.operator == operator:
                    out.append(ReplayedItem(entry.attempt, entry.seq, entry.payload, True,
                                            self._client.get((sid.operator, entry.attempt.run,
                                                              entry.seq)), client=True))
                continue
            if sid == excluding or (operator is not None and sid.operator != operator):
                continue
            history = histories.get(sid)
            if history is None or entry.attempt not in history.attempts:
                continue
            if isinstance(entry, RequestEntry):
                out.append(ReplayedItem(entry.attempt, entry.seq, entry.payload, True,
                                        self._answers.get((entry.attempt, entry.seq))))
            else:
                out.extend(ReplayedItem(e.attempt, e.seq, e.payload) for e in _events_of(entry))
        return out

    def surviving_events(self, operator: str, excluding: SubtaskId | None = None
                         ) -> list[EventEntry]:
        """Accepted events of ``operator``'s surviving histories, in log order."""
        return [EventEntry(i.attempt, i.seq, i.payload)
                for i in self.surviving_items(operator, excluding) if not i.is_request]

    @classmethod
    def replayed(cls, entries: Iterable[LogEntry]) -> InboundGate:
        """A gate that re-read a durable log: the same rules, without identity checks (the
        entries were admitted by a live gate when they were logged)."""
        gate = cls("", {})
        for entry in entries:
            gate._replay(entry)
        return gate

    def _replay(self, entry: LogEntry) -> None:
        if isinstance(entry, RegistrationEntry):
            if self._live.get(entry.attempt.subtask) != entry.attempt:
                self._register(entry.attempt)
            else:
                self._log.append(entry)
            return
        if isinstance(entry, ResponseEntry):
            sid = entry.attempt.subtask
            self._responses.setdefault((sid, entry.seq), entry)
            self._answers.setdefault((entry.attempt, entry.seq), entry)
            self._log.append(entry)
            return
        if isinstance(entry, FinishedEntry):
            sid = entry.attempt.subtask
            if sid in self._histories:
                self._withdraw(entry)
            else:
                # a finish kept without its history (kept_at_rerun: its operator answered
                # no request): that attempt asked nothing, and a sink may hold its output
                self._finished_unasked.setdefault(sid, entry.attempt)
                self._log.append(entry)
            return
        if isinstance(entry, (ClientRequestEntry, ClientResponseEntry)):
            self.clients_replayed([entry])
            self._log.append(entry)
            return
        sid = entry.attempt.subtask
        history = self._histories.get(sid)
        if history is None:  # a log written without registrations (tools, old tests)
            history = self._histories[sid] = _History({entry.attempt})
            self._live[sid] = entry.attempt
        count = len(entry.payloads) if isinstance(entry, EventRunEntry) else 1
        history.append(entry, count)
        self._log.append(entry)
        if isinstance(entry, RequestEntry):
            self._requested.add(sid.operator)

    # ---------------------------------------------------------------------------- helpers
    def _differs(self, history: _History, attempt: TaskAttempt, seq: int, payload: bytes,
                 is_request: bool) -> str:
        logged, logged_is_request, logged_by = history.item(seq)
        if logged_is_request == is_request and (logged == payload
                                                 or same_value(logged, payload)):
            return ""
        what = "request" if is_request else "event"
        was = "a request" if logged_is_request else "an event"
        how = "different bytes" if logged_is_request == is_request else f"it was {was}"
        return (f"nondeterministic subtask: {attempt.subtask} re-sent item {seq} of epoch "
                f"{attempt.epoch} as {what} with {how} than logged from {logged_by} "
                f"({len(payload)} vs {len(logged)} bytes); a retried or replayed task must send "
                f"the same events and requests in the same order")

    @staticmethod
    def _earlier_finish(history: _History, attempt: TaskAttempt) -> tuple[TaskAttempt, int] | None:
        """A finish of ``history`` by an attempt of another (earlier) run than ``attempt``'s,
        with its length: the bound a batch that runs again must keep (rule 6)."""
        for run, finish in history.finishes.items():
            if run != attempt.run:
                return finish
        return None

    def _beyond(self, history: _History, attempt: TaskAttempt) -> str:
        earlier = self._earlier_finish(history, attempt)
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

    def _clear(self) -> None:
        self._live.clear()
        self._histories.clear()
        self._responses.clear()
        self._answers.clear()
        self._withdrawals.clear()
        self._requested.clear()
        self._finished_unasked.clear()
        self._log.clear()


def surviving_items(entries: Iterable[LogEntry]) -> list[ReplayedItem]:
    """The events and requests of a durable inbound log that a restore replays, in log order,
    each request with its logged answer (the same rules as the live gate: rule 5)."""
    return InboundGate.replayed(entries).surviving_items()


def surviving_events(entries: Iterable[LogEntry]) -> list[EventEntry]:
    """The events of a durable inbound log that a restore replays, in log order."""
    return [EventEntry(i.attempt, i.seq, i.payload)
            for i in surviving_items(entries) if not i.is_request]


def operators_with_requests(entries: Iterable[LogEntry]) -> set[str]:
    """The operators that accepted a subtask's request in a log (a restore keeps their
    history)."""
    return {e.attempt.subtask.operator for e in entries if isinstance(e, RequestEntry)}


def kept_at_rerun(entries: Iterable[LogEntry]) -> list[LogEntry]:
    """What a restore to an uncommitted epoch keeps of its log (docs/protocol.md
    [rerun-keeps-answered-histories]):
    every entry of the operators that answered a subtask's request, every client request and
    answer (a client was answered: the effect must survive), and every other operator's
    finishes (a sink may hold a finished attempt's output: its subtask may not ask in the
    rerun, gate rule 6); the rest is truncated."""
    entries = list(entries)
    keep = operators_with_requests(entries)
    # a finish that a later attempt of the same run replaced (its task failed after all, so
    # no sink holds its output) binds nothing; the kept log would lose that registration
    replaced: set[int] = set()
    latest: dict[tuple[SubtaskId, str], int] = {}
    for i in range(len(entries) - 1, -1, -1):
        e = entries[i]
        key = (e.attempt.subtask, e.attempt.run)
        if isinstance(e, RegistrationEntry):
            latest[key] = max(latest.get(key, -1), e.attempt.number)
        elif isinstance(e, FinishedEntry) and latest.get(key, -1) > e.attempt.number:
            replaced.add(i)
    return [e for i, e in enumerate(entries) if e.attempt.subtask.operator in keep
            or isinstance(e, (ClientRequestEntry, ClientResponseEntry))
            or (isinstance(e, FinishedEntry) and i not in replaced)]
