"""The inbound gate: which subtask-to-coordinator events take effect.

Rules (DESIGN.md section 2, rule 6):
  1. Each event carries (run, subtask, epoch, Spark attempt number, sequence). It is dropped if
     its task attempt is not the live attempt of its subtask, if its epoch is not the running
     (sealed, uncommitted) one, or if its sequence number was already accepted (a re-send after
     a lost acknowledgement: it is acknowledged again, not applied again).
  2. An accepted event is appended to the epoch's durable inbound log, then put on the
     coordinator's mailbox, then acknowledged, all in one critical section of the runtime, so
     that log order is mailbox order across all connections.
  3. A task registers its attempt before sending; registrations are logged too, so that a
     replay knows which attempt of each subtask survived. A registration with a higher Spark
     attempt number than the live one is a task retry: the subtask's execution attempt failed,
     and the runtime handles that (rule 7) before the new attempt's events are accepted.
  4. Sequence numbers of an attempt start at 0 and have no gaps: a task re-sends every
     unacknowledged event in order.

Theory of operation: the gate keeps only the running epoch: the live attempt of each subtask,
the next expected sequence number of each live attempt, and the accepted entries in order (the
in-memory mirror of the durable log, used to replay the other subtasks' events after a task
failure). Everything is dropped when the epoch's batch commits.

Thread model: none; the runtime calls it inside its inbound critical section.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sparkcoord.core.errors import CheckpointIdRegression
from sparkcoord.core.ids import NO_EPOCH, SubtaskId, TaskAttempt


@dataclass(frozen=True, slots=True)
class RegistrationEntry:
    """Log entry: ``attempt`` registered and became the live attempt of its subtask."""

    attempt: TaskAttempt


@dataclass(frozen=True, slots=True)
class EventEntry:
    """Log entry: event number ``seq`` of ``attempt`` was accepted."""

    attempt: TaskAttempt
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class EventRunEntry:
    """Log entry: events ``first_seq``, ``first_seq + 1``, ... of ``attempt`` were accepted
    together (a client's burst; one entry instead of one per event)."""

    attempt: TaskAttempt
    first_seq: int
    payloads: tuple[bytes, ...]

    def each(self) -> list[EventEntry]:
        return [EventEntry(self.attempt, self.first_seq + i, p) for i, p in enumerate(self.payloads)]


LogEntry = RegistrationEntry | EventEntry | EventRunEntry


def _events_of(entry: LogEntry) -> list[EventEntry]:
    if isinstance(entry, EventRunEntry):
        return entry.each()
    if isinstance(entry, EventEntry):
        return [entry]
    return []


class Verdict(enum.Enum):
    ACCEPT = "accept"        # log, enqueue, then acknowledge
    DUPLICATE = "duplicate"  # already accepted: acknowledge again, change nothing
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


@dataclass(frozen=True, slots=True)
class RunDecision:
    """What to do with a run of consecutive events of one attempt, in order: the first
    ``duplicates`` were logged before (acknowledge them again), the next ``accepted`` take
    effect (log, enqueue, then acknowledge), the last ``rejected`` are dropped for ``reason``."""

    duplicates: int
    accepted: int
    rejected: int
    reason: str = ""
    execution_attempt: int = 0

    def of_one(self, seq: int, attempt: TaskAttempt) -> InboundDecision:
        """The decision for event ``seq`` of ``attempt`` when the run holds only that event."""
        if self.accepted:
            return InboundDecision(Verdict.ACCEPT, execution_attempt=self.execution_attempt)
        if self.duplicates:
            return InboundDecision(Verdict.DUPLICATE, f"event {seq} of {attempt} already logged",
                                   execution_attempt=self.execution_attempt)
        return InboundDecision(Verdict.REJECT, self.reason)


class InboundGate:
    """Admission of registrations and events for the running epoch."""

    def __init__(self, run: str, parallelism: Mapping[str, int],
                 last_committed: int = NO_EPOCH) -> None:
        self.run = run
        self.parallelism = dict(parallelism)
        self.running_epoch: int | None = None
        self.last_committed = last_committed
        self._live: dict[SubtaskId, TaskAttempt] = {}
        self._next_seq: dict[TaskAttempt, int] = {}
        self._log: list[LogEntry] = []
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

    # ----------------------------------------------------------------------------- inputs
    def attempt_registered(self, attempt: TaskAttempt) -> InboundDecision:
        """A task announced ``attempt`` before sending its first event."""
        sid = attempt.subtask
        problem = self._check_identity(attempt)
        if problem:
            return InboundDecision(Verdict.REJECT, problem)
        live = self._live.get(sid)
        if live == attempt:
            return InboundDecision(Verdict.DUPLICATE, "already registered",
                                   execution_attempt=self.execution_attempt(sid))
        if live is not None and attempt.number < live.number:
            return InboundDecision(
                Verdict.REJECT, f"{attempt} is older than the live attempt {live.number}")
        replaced = live
        if replaced is None and attempt.number > 0:
            # Spark numbers a task's attempts 0, 1, ...: an earlier attempt of this task ran
            # in this epoch and failed before it registered (first attempts register lazily,
            # with their first event). It is a retry all the same: the coordinator must hear
            # of the failure before this attempt's events.
            replaced = TaskAttempt(attempt.run, sid, attempt.epoch, attempt.number - 1)
        if replaced is not None:
            self._execution_attempts[sid] = self.execution_attempt(sid) + 1
        self._live[sid] = attempt
        self._next_seq[attempt] = 0
        self._log.append(RegistrationEntry(attempt))
        return InboundDecision(Verdict.ACCEPT, replaced=replaced,
                               execution_attempt=self.execution_attempt(sid))

    def event_received(self, attempt: TaskAttempt, seq: int, payload: bytes) -> InboundDecision:
        """Event ``seq`` of ``attempt`` arrived. On ACCEPT the caller logs ``self.last_entry``."""
        return self.event_run_received(attempt, seq, (payload,)).of_one(seq, attempt)

    def event_run_received(self, attempt: TaskAttempt, first_seq: int,
                           payloads: tuple[bytes, ...]) -> RunDecision:
        """Events ``first_seq``, ``first_seq + 1``, ... of ``attempt`` arrived together, in order.

        The same rules as :meth:`event_received` for each, decided once for the run: those below
        the next expected number are duplicates, the rest are accepted, unless the run starts
        past the expected number (a gap) or the attempt is not live (all rejected). If any is
        accepted, the caller logs ``self.last_entry`` (one entry for the accepted ones).
        """
        sid = attempt.subtask
        live = self._live.get(sid)
        n = len(payloads)
        if live is not attempt and live != attempt:  # identity first: the channel interns attempts
            problem = self._check_identity(attempt) or (
                f"{attempt} is not the live attempt of {sid} (live: {self._live.get(sid)})")
            return RunDecision(0, 0, n, problem)
        expected = self._next_seq[attempt]
        execution_attempt = self._execution_attempts.get(sid, 0)
        if first_seq > expected:
            return RunDecision(0, 0, n, f"event {first_seq} of {attempt} arrived before event "
                                        f"{expected}", execution_attempt)
        duplicates = min(n, expected - first_seq)
        accepted = n - duplicates
        if accepted:
            self._next_seq[attempt] = expected + accepted
            self._log.append(EventEntry(attempt, expected, payloads[duplicates]) if accepted == 1
                             else EventRunEntry(attempt, expected, payloads[duplicates:]))
        return RunDecision(duplicates, accepted, 0, "", execution_attempt)

    @property
    def last_entry(self) -> LogEntry:
        """The entry that the last ACCEPT added (the runtime appends it to the durable log)."""
        return self._log[-1]

    def surviving_events(self, operator: str, excluding: SubtaskId | None = None
                         ) -> list[EventEntry]:
        """Accepted events of ``operator``'s live attempts, in log order (for a replay)."""
        return [e for entry in self._log for e in _events_of(entry)
                if e.attempt.subtask.operator == operator
                and e.attempt.subtask != excluding and self._live.get(e.attempt.subtask) == e.attempt]

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
        self._next_seq.clear()
        self._log.clear()


def surviving_events(entries: Iterable[LogEntry]) -> list[EventEntry]:
    """The events of a durable inbound log that a restore replays, in log order.

    Only the last registered attempt of each subtask survived: a task retry registers after
    the attempt it replaces, and speculation (two live attempts) is refused at start.
    """
    entries = list(entries)
    survivor: dict[SubtaskId, TaskAttempt] = {}
    for entry in entries:
        if isinstance(entry, RegistrationEntry):
            survivor[entry.attempt.subtask] = entry.attempt
    return [e for entry in entries for e in _events_of(entry)
            if survivor.get(e.attempt.subtask) == e.attempt]
