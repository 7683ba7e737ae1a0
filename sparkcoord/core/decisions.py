"""What the inbound gate decides: the values its inputs return (core/inbound.py decides them).

Rules:
  1. Every registration, event, run of events, request and finish gets a decision with a
     :class:`Verdict`: ACCEPT (it takes effect: the runtime logs the gate's ``last_entry``, puts
     it on the mailbox, then acknowledges or answers), DUPLICATE (it took effect before: the
     runtime acknowledges again or answers from the log) or REJECT (dropped, with a reason).
  2. A rejection that is divergence (a nondeterministic subtask: core/inbound.py rules 4 and
     6) says so (``diverged``): the runtime fails the job; any other rejection only refuses.
  3. A decision also carries what the runtime tells the coordinator: the subtask's execution
     attempt number, the attempt a retry replaced, whether the retry adopted the history
     (gate rule 5), and the items a finish withdrew with their logged answers (gate rule 6).
  4. A replay of a log yields :class:`ReplayedItem` values, in log order: what a coordinator
     reset or a restore hands to the coordinator again.
  5. A re-sent event or request whose bytes differ from the logged ones is the same item only
     if its value is (core/histories.py rule 1), and the gate unpickles nothing: unless the
     caller handed it the verdict of that comparison (:data:`Compared`, made outside the
     runtime's critical section), the decision is COMPARE, naming the (logged, re-sent) byte
     pairs to compare, and the input took no effect; the caller asks again with the verdicts.
     A verdict counts only for the exact pair of bytes it was made for.

Thread model: none (values).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sparkcoord.core.entries import Answer, ClientResponseEntry, ResponseEntry
from sparkcoord.core.ids import TaskAttempt


class Verdict(enum.Enum):
    ACCEPT = "accept"        # log, enqueue, then acknowledge (a request: answer when logged)
    DUPLICATE = "duplicate"  # already accepted: acknowledge again (answer from the log)
    REJECT = "reject"        # drop; tell the sender why
    COMPARE = "compare"      # nothing decided: compare the values of ``compare`` and ask again


#: rule 5: whether a (logged, re-sent) pair of byte strings encode the same value, by that
#: pair, as core/encoding.py's ``same_value`` found outside the runtime's critical section
Compared = Mapping[tuple[bytes, bytes], bool]
#: no verdict yet (a COMPARE for any re-sent item whose bytes differ from the logged ones)
NOT_COMPARED: Compared = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class InboundDecision:
    """What to do with one registration or event."""

    verdict: Verdict
    reason: str = ""
    #: for an accepted registration that replaces a live attempt (a task retry): that attempt
    replaced: TaskAttempt | None = None
    #: the subtask's execution attempt number (the coordinator's view) after this input
    execution_attempt: int = 0
    #: an accepted retry that took over the replaced attempt's history (gate rule 5): the
    #: runtime resets nothing
    adopted: bool = False
    #: a registration: the length of the history the attempt continues (gate rule 6: it says
    #: at the end if it sent fewer items); a finish: the items it withdrew, in order
    history_length: int = 0
    withdrawn: tuple[WithdrawnItem, ...] = ()
    #: a refused finish that is divergence (gate rule 6): the runtime fails the job
    diverged: bool = False


@dataclass(frozen=True, slots=True)
class RunDecision:
    """What to do with a run of consecutive events of one attempt, in order: the first
    ``duplicates`` were logged before (acknowledge them again), the next ``accepted`` take
    effect (log, enqueue, then acknowledge), the last ``rejected`` are dropped for ``reason``.
    ``diverged``: the rejection is a re-sent item that differs from the logged one (gate rule
    4), which fails the job. ``compare`` (rule 5): nothing is decided (all counts 0) until
    the values of these (logged, re-sent) pairs are compared."""

    duplicates: int
    accepted: int
    rejected: int
    reason: str = ""
    execution_attempt: int = 0
    diverged: bool = False
    compare: tuple[tuple[bytes, bytes], ...] = ()

    def of_one(self, seq: int, attempt: TaskAttempt) -> InboundDecision:
        """The decision for event ``seq`` of ``attempt`` when the run holds only that event
        (the gate's ``event_received``, in the runtime's inbound critical section)."""
        if self.compare:
            return InboundDecision(Verdict.COMPARE, f"event {seq} of {attempt}: its value is "
                                                    f"to be compared with the logged one")
        if self.accepted:
            return InboundDecision(Verdict.ACCEPT, execution_attempt=self.execution_attempt)
        if self.duplicates:
            return InboundDecision(Verdict.DUPLICATE, f"event {seq} of {attempt} already logged",
                                   execution_attempt=self.execution_attempt)
        return InboundDecision(Verdict.REJECT, self.reason)


@dataclass(frozen=True, slots=True)
class RequestDecision:
    """What to do with one request.

    ACCEPT: log it (the gate's ``last_entry``), hand it to the coordinator, answer once the
    response is logged. DUPLICATE: it was logged before (a re-send, or a retry re-asking what
    the attempt it adopted asked): answer with ``response`` if already logged, else when it is.
    REJECT: refuse for ``reason``; ``diverged`` as in :class:`RunDecision`; ``ask_again``: a
    client's request that a moment later (or the job's next run) takes (no epoch sealed yet).
    COMPARE (rule 5): nothing decided until the values of the pair ``compare`` are compared.
    """

    verdict: Verdict
    reason: str = ""
    execution_attempt: int = 0
    diverged: bool = False
    response: Answer | None = None
    ask_again: bool = False
    compare: tuple[tuple[bytes, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class WithdrawnItem:
    """Item ``seq`` of a subtask's history, withdrawn (gate rule 6): its payload, whether it is
    a request, and a request's logged answer (None: not answered when it was withdrawn)."""

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
    #: a client's request (``attempt`` is its log identity, core/entries.py's
    #: :func:`~sparkcoord.core.entries.client_identity`)
    client: bool = False
    #: a withdrawal (gate rule 6): the withdrawn items of ``attempt``'s subtask (``payload``
    #: empty)
    withdrawn: tuple[WithdrawnItem, ...] | None = None
