"""The inbound log's vocabulary: what an entry of an epoch's inbound log says.

Rules:
  1. An epoch's inbound log holds, in the one total order of the runtime's inbound critical
     section, every input a coordinator took in that epoch: task registrations, events,
     requests and their answers, finishes (withdrawals), and the requests of clients of the job
     with their answers. core/inbound.py decides what is logged; core/records.py gives each
     entry its byte format; inspection reads them back.
  2. Every entry names who it came from as a :class:`~sparkcoord.core.ids.TaskAttempt`. A task's
     entries carry the task attempt that sent them. A client of the job (the user's driver
     program, :class:`DriverClient`) has no attempt: its entries carry its *log identity*,
     :func:`client_identity`, whose run is the client's id and whose subtask index is
     :data:`CLIENT_INDEX` (no subtask has it), in the epoch whose log took the request.
  3. Entries are immutable values; equal entries are the same input (a re-send is recognised
     by its bytes, core/histories.py rule 1).

Thread model: none (values).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkcoord.core.ids import SubtaskId, TaskAttempt


@dataclass(frozen=True, slots=True)
class DriverClient:
    """A client of the job asking a coordinator: the user's driver program, through
    ``CoordinatedJob.request``, as ``client`` (its id, unique per job handle) asking the
    coordinator of ``operator``. The other kind of asker is a task (its
    :class:`~sparkcoord.core.ids.TaskAttempt`)."""

    operator: str
    client: str

    def __str__(self) -> str:
        return f"client {self.client} of {self.operator!r}"


#: Who asks a request: a task attempt or a client of the job.
Asker = TaskAttempt | DriverClient


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


@dataclass(frozen=True, slots=True)
class RequestEntry:
    """Log entry: item ``seq`` of ``attempt`` is a request, accepted and handed to the
    coordinator (requests and events of an attempt share one sequence)."""

    attempt: TaskAttempt
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class ResponseEntry:
    """Log entry: the coordinator's answer to request ``seq`` that ``attempt`` asked.

    ``failed``: the coordinator refused the request (its future failed); ``payload`` is then
    the reason as UTF-8 text. A task sees a response only after this entry is logged.
    """

    attempt: TaskAttempt
    seq: int
    payload: bytes
    failed: bool = False


#: The subtask index of a client request's log identity (no subtask has it).
CLIENT_INDEX = 0xFFFFFFFF


def client_identity(operator: str, client: str, epoch: int) -> TaskAttempt:
    """The log identity of client ``client``'s requests to ``operator`` in ``epoch``'s log."""
    return TaskAttempt(client, SubtaskId(operator, CLIENT_INDEX), epoch, 0)


def client_of(identity: TaskAttempt) -> DriverClient:
    """The client whose log identity (in any epoch's log) ``identity`` is: the inverse of
    :func:`client_identity` but for the epoch."""
    return DriverClient(identity.subtask.operator, identity.run)


@dataclass(frozen=True, slots=True)
class ClientRequestEntry:
    """Log entry: request ``seq`` of a client of the job (the user's driver program) to the
    coordinator ``attempt.subtask.operator``; ``attempt`` is :func:`client_identity` (its run is
    the client's id). Client requests are in no subtask's history: they always survive."""

    attempt: TaskAttempt
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class ClientResponseEntry:
    """Log entry: the coordinator's answer to client request ``seq`` (as :class:`ResponseEntry`)."""

    attempt: TaskAttempt
    seq: int
    payload: bytes
    failed: bool = False


@dataclass(frozen=True, slots=True)
class FinishedEntry:
    """Log entry: ``attempt``, the live attempt of its subtask, finished the batch having
    sent items 0 .. ``seq`` - 1; any items of its history from ``seq`` on are withdrawn
    (rule 6)."""

    attempt: TaskAttempt
    seq: int


LogEntry = (RegistrationEntry | EventEntry | EventRunEntry | RequestEntry | ResponseEntry
            | ClientRequestEntry | ClientResponseEntry | FinishedEntry)
#: The entries that are items of a subtask's history (numbered by sequence).
ItemEntry = EventEntry | EventRunEntry | RequestEntry

#: The logged answer to a request, a task's or a client's.
Answer = ResponseEntry | ClientResponseEntry


def events_of(entry: LogEntry) -> list[EventEntry]:
    """The events ``entry`` holds, one entry each (none: it is not an event or a run of them)."""
    if isinstance(entry, EventRunEntry):
        return entry.each()
    if isinstance(entry, EventEntry):
        return [entry]
    return []


def is_client_identity(identity: TaskAttempt) -> bool:
    """Whether ``identity`` (an entry's attempt) is a client's log identity (rule 2)."""
    return identity.subtask.index == CLIENT_INDEX


def answer_key(asker: Asker, seq: int) -> tuple[SubtaskId, str, int]:
    """Which request an answer belongs to, whoever asked it (``asker``: a task attempt, a
    client, or a client's log identity): a task's request by its subtask and sequence (a retry
    that adopted the history waits for the same answer), a client's by its operator, id and
    sequence (the epoch of its log identity may change before the answer comes)."""
    if isinstance(asker, DriverClient):
        return SubtaskId(asker.operator, CLIENT_INDEX), asker.client, seq
    if is_client_identity(asker):
        return asker.subtask, asker.run, seq
    return asker.subtask, "", seq
