"""The running epoch's state as its inbound log makes it up, and what a replay of a log keeps.

Rules (docs/protocol.md [retry-resets-the-coordinator] [rerun-keeps-answered-histories]):
  1. The state of the running epoch is a function of its log: every entry the gate logs
     changes it exactly as meeting that entry in a replay does (a registration, an item, an
     answer, a finish, a client's request or answer), so a gate that re-reads a durable log
     derives what the live gate decided (core/inbound.py, "theory of operation").
  2. The in-memory log mirrors the durable one while a batch runs (a coordinator reset replays
     it). Between batches nothing replays it (a restore reads the durable log), so it keeps
     only the last entry, a client's (gate rule 7).
  3. What survives a log, in log order: the items of the histories that survive (the attempts
     registrations left live, and those they adopted: gate rule 5), each request with its
     logged answer; every client request with its remembered answer; and the withdrawals
     (gate rule 6), each with the items it took back. A reset of one subtask's operator
     replays those of its operator but the failed subtask's own.
  4. A restore to an uncommitted epoch keeps of its log what :func:`kept_at_rerun` says: the
     entries of the operators that answered a subtask's request, every client entry, and the
     finishes a later attempt of their run did not replace.

Thread model: none; the runtime calls the gate (which is a :class:`LogState`) inside its
inbound critical section, and a restore or ``sparkcoord inspect`` replays logs on their own.
"""

from __future__ import annotations

from collections.abc import Iterable

from sparkcoord.core.clients import ClientMemory
from sparkcoord.core.decisions import InboundDecision, ReplayedItem, Verdict, WithdrawnItem
from sparkcoord.core.entries import (
    ClientRequestEntry,
    ClientResponseEntry,
    EventEntry,
    FinishedEntry,
    LogEntry,
    RegistrationEntry,
    RequestEntry,
    ResponseEntry,
    events_of,
    is_client_identity,
)
from sparkcoord.core.histories import History
from sparkcoord.core.ids import NO_EPOCH, SubtaskId, TaskAttempt


class LogState:
    """The running epoch's live attempts, histories and answers, and its log (rule 1); the
    inbound gate (core/inbound.py) is one that also admits inputs."""

    def __init__(self, last_committed: int = NO_EPOCH) -> None:
        self.running_epoch: int | None = None
        self.last_committed = last_committed
        self._live: dict[SubtaskId, TaskAttempt] = {}
        self._histories: dict[SubtaskId, History] = {}
        self._responses: dict[tuple[SubtaskId, int], ResponseEntry] = {}
        # every logged answer by its request (asking attempt, seq), withdrawn ones included:
        # what a replay compares with (a withdrawn item's number may be asked again)
        self._answers: dict[tuple[TaskAttempt, int], ResponseEntry] = {}
        # the items each withdrawal in the log took back (gate rule 6), for replays
        self._withdrawals: dict[FinishedEntry, tuple[WithdrawnItem, ...]] = {}
        self._requested: set[str] = set()  # operators that accepted a request this epoch
        # subtasks whose batch an attempt of an earlier run finished without asking, in an
        # operator whose log held no request (so only the finish was kept): a request of a
        # later run's attempt is divergence (gate rule 6)
        self._finished_unasked: dict[SubtaskId, TaskAttempt] = {}
        # the newest client requests, kept across epochs; a restore seeds it from the log it
        # replays (core/clients.py)
        self._clients = ClientMemory()
        self._log: list[LogEntry] = []
        self._logged = NO_EPOCH  # the newest epoch Spark is known to have logged
        self._execution_attempts: dict[SubtaskId, int] = {}

    def execution_attempt(self, subtask: SubtaskId) -> int:
        """The coordinator-visible execution attempt number of ``subtask`` in this run (the
        runtime, in its inbound critical section, for a replay or a reset)."""
        return self._execution_attempts.get(subtask, 0)

    @property
    def client_log_epoch(self) -> int | None:
        """The epoch whose log takes client requests now: the running one, else the last
        committed one until the next epoch starts; None before anything was sealed."""
        if self.running_epoch is not None:
            # only once Spark logged the epoch: a sealed epoch it never logs is garbage, and
            # so would be a client request logged in it
            return self.running_epoch if self._logged == self.running_epoch else None
        return self.last_committed if self.last_committed != NO_EPOCH else None

    @property
    def last_entry(self) -> LogEntry:
        """The entry that the last ACCEPT added (the runtime appends it to the durable log)."""
        return self._log[-1]

    @property
    def last_entry_epoch(self) -> int:
        """The epoch whose durable log takes :attr:`last_entry`: a task's entry goes to its
        attempt's epoch (the running one), a client's to the current one (gate rule 7)."""
        entry = self._log[-1]
        if is_client_identity(entry.attempt):
            epoch = self.client_log_epoch
            assert epoch is not None  # a client's entry is only made while there is one
            return epoch
        return entry.attempt.epoch

    # ----------------------------------------------------------------------- transitions
    def _register(self, attempt: TaskAttempt) -> InboundDecision:
        # ``attempt`` becomes the live attempt of its subtask: a live registration the gate
        # admitted, or one a replay meets (rule 1)
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
                history = self._histories[sid] = History({attempt})
            history.attempts.add(attempt)
            # an attempt of this run that finished was retried after all: its task failed
            # later (its sink write), so no sink holds its output (gate rule 6)
            history.finishes.pop(attempt.run, None)
        else:
            if replaced is not None:
                self._execution_attempts[sid] = self.execution_attempt(sid) + 1
            self._histories[sid] = History({attempt})
        self._live[sid] = attempt
        self._log.append(RegistrationEntry(attempt))
        return InboundDecision(Verdict.ACCEPT, replaced=replaced,
                               execution_attempt=self.execution_attempt(sid), adopted=adopted,
                               history_length=history.length if adopted and history else 0)

    def _withdraw(self, entry: FinishedEntry) -> tuple[WithdrawnItem, ...]:
        # a finish cuts its subtask's history (gate rule 6): what it took back, in order
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

    def _log_client(self, entry: LogEntry) -> None:
        # rule 2: the in-memory log mirrors the durable one only while a batch runs, so a job
        # polled by a client while idle does not grow it
        if self.running_epoch is None:
            self._log[:] = [entry]
        else:
            self._log.append(entry)

    def _replay(self, entry: LogEntry) -> None:
        # meet ``entry`` of a durable log: the same transitions as when it was admitted
        # (rule 1), without the identity checks
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
            self._clients.replayed([entry])
            self._log.append(entry)
            return
        sid = entry.attempt.subtask
        history = self._histories.get(sid)
        if history is None:  # a log written without registrations (tools, old tests)
            history = self._histories[sid] = History({entry.attempt})
            self._live[sid] = entry.attempt
        history.append(entry)
        self._log.append(entry)
        if isinstance(entry, RequestEntry):
            self._requested.add(sid.operator)

    def _clear(self) -> None:
        # the epoch's batch ended (or the next one started): nothing of it stays but the
        # client memory and the execution attempt numbers (they span batches)
        self._live.clear()
        self._histories.clear()
        self._responses.clear()
        self._answers.clear()
        self._withdrawals.clear()
        self._requested.clear()
        self._finished_unasked.clear()
        self._log.clear()

    # ---------------------------------------------------------------------------- replays
    def surviving_items(self, operator: str | None = None, excluding: SubtaskId | None = None
                        ) -> list[ReplayedItem]:
        """Events and requests of the surviving histories (of ``operator``, or all), in log
        order (rule 3): what a coordinator reset (the runtime, in its inbound critical
        section) or a restore hands to the coordinator again."""
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
                                            self._clients.answer(entry.attempt, entry.seq),
                                            client=True))
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
                out.extend(ReplayedItem(e.attempt, e.seq, e.payload) for e in events_of(entry))
        return out

    def surviving_events(self, operator: str, excluding: SubtaskId | None = None
                         ) -> list[EventEntry]:
        """Accepted events of ``operator``'s surviving histories, in log order (rule 3)."""
        return [EventEntry(i.attempt, i.seq, i.payload)
                for i in self.surviving_items(operator, excluding) if not i.is_request]


def replayed(entries: Iterable[LogEntry]) -> LogState:
    """The state that a durable log makes up (rule 1)."""
    state = LogState()
    for entry in entries:
        state._replay(entry)
    return state


def surviving_items(entries: Iterable[LogEntry]) -> list[ReplayedItem]:
    """The events and requests of a durable inbound log that a restore replays, in log order,
    each request with its logged answer (rule 3; gate rule 5)."""
    return replayed(entries).surviving_items()


def surviving_events(entries: Iterable[LogEntry]) -> list[EventEntry]:
    """The events of a durable inbound log that a restore replays, in log order."""
    return [EventEntry(i.attempt, i.seq, i.payload)
            for i in surviving_items(entries) if not i.is_request]


def operators_with_requests(entries: Iterable[LogEntry]) -> set[str]:
    """The operators that accepted a subtask's request in a log (a restore keeps their
    history)."""
    return {e.attempt.subtask.operator for e in entries if isinstance(e, RequestEntry)}


def kept_at_rerun(entries: Iterable[LogEntry]) -> list[LogEntry]:
    """What a restore to an uncommitted epoch keeps of its log (rule 4; docs/protocol.md
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
