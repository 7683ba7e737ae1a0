"""What the inbound gate remembers of its clients' requests, so each takes effect once.

Rules (docs/protocol.md [client-requests-take-effect-once]; core/inbound.py rule 7):
  1. A client's request (core/entries.py's ``DriverClient``: the user's driver program) is
     remembered by who asked it and its sequence number, with its answer once that is logged
     (none until then). A re-send of a remembered request is a DUPLICATE, answered from memory
     (or when its answer comes): it never reaches the coordinator twice.
  2. A request is accepted only while some epoch's log takes client requests (the gate's
     ``client_log_epoch``); it is logged under the client's log identity in that epoch
     (entries rule 2), its answer under the same identity in the log current when it comes.
     An answer is made once: for a remembered request that has none yet.
  3. The newest :data:`CLIENT_MEMORY` requests are remembered, across epochs and restores; the
     oldest is forgotten first. The memory is stored with each checkpoint record as plain
     ``(operator, client, seq, answer, failed)`` tuples, and a restore seeds it from the
     record and from the log it replays.
  4. A request that a restored record remembers without an answer took effect (it is in the
     snapshots) but its answer is gone with the run that owed it: a re-send is answered
     :data:`LOST_ANSWER`, as a refusal, instead of being applied again.

Thread model: none; the gate holds one, inside the runtime's inbound critical section.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from sparkcoord.core.decisions import RequestDecision, Verdict
from sparkcoord.core.entries import (
    ClientRequestEntry,
    ClientResponseEntry,
    DriverClient,
    LogEntry,
    client_identity,
    client_of,
)
from sparkcoord.core.ids import TaskAttempt

#: How many client requests the gate remembers for answering re-sends (rule 3).
CLIENT_MEMORY = 4096
#: What a client's re-send hears when its request took effect but its answer was lost (rule 4).
LOST_ANSWER = ("the request took effect, but its answer was lost when the run that owed it "
               "ended (it was not answered before the checkpoint the job restarted from)")

#: A remembered request: who asked it and its sequence number.
_Key = tuple[DriverClient, int]


class ClientMemory:
    """The newest client requests and their answers (None: not answered yet), oldest first."""

    def __init__(self) -> None:
        # kept across epochs (a client re-sends a request it got no answer to, also to the
        # next run after a restart) and bounded (rule 3)
        self._answers: OrderedDict[_Key, ClientResponseEntry | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._answers)

    def request_received(self, client: DriverClient, seq: int, payload: bytes,
                         epoch: int | None) -> tuple[RequestDecision, ClientRequestEntry | None]:
        """Request ``seq`` of ``client`` arrived while the log of ``epoch`` takes client
        requests (None: none does yet). The gate calls it, in the runtime's inbound critical
        section, once it knows the operator; it logs the entry returned (ACCEPT only)."""
        if epoch is None:
            return RequestDecision(Verdict.REJECT, "no epoch was sealed yet (the query is "
                                                   "starting); ask again", ask_again=True), None
        key = (client, seq)
        if key in self._answers:
            return RequestDecision(Verdict.DUPLICATE, response=self._answers[key]), None
        entry = ClientRequestEntry(client_identity(client.operator, client.client, epoch), seq,
                                   payload)
        self._remember(key, None)
        return RequestDecision(Verdict.ACCEPT), entry

    def response_recorded(self, identity: TaskAttempt, seq: int, payload: bytes, failed: bool,
                          epoch: int | None) -> ClientResponseEntry | None:
        """The coordinator answered request ``seq`` logged under the client's log identity
        ``identity``, while the log of ``epoch`` takes client entries (None: none does). The
        gate calls it in the runtime's inbound critical section and logs the entry returned;
        None: answered already, forgotten, or no log to take it (rule 2)."""
        key = (client_of(identity), seq)
        if key not in self._answers or self._answers[key] is not None or epoch is None:
            return None
        # the answer names the request's identity (its epoch: the log that took the request),
        # whichever log takes the answer
        entry = ClientResponseEntry(identity, seq, payload, failed)
        self._remember(key, entry)
        return entry

    def answer(self, identity: TaskAttempt, seq: int) -> ClientResponseEntry | None:
        """The remembered answer to request ``seq`` logged under ``identity``: what a replay of
        the log hands the coordinator with the request (core/replay.py)."""
        return self._answers.get((client_of(identity), seq))

    def remembered(self) -> list[tuple[str, str, int, bytes | None, bool]]:
        """The remembered requests as ``(operator, client, seq, answer, failed)`` (answer None:
        not answered yet), oldest first: the runtime stores them with each checkpoint record
        (rule 3), on the driver's checkpoint thread under the inbound lock."""
        return [(client.operator, client.client, seq,
                 None if a is None else a.payload, False if a is None else a.failed)
                for (client, seq), a in self._answers.items()]

    def restored(self, memory: Iterable[tuple[str, str, int, bytes | None, bool]],
                 epoch: int) -> None:
        """A restore to the record of ``epoch`` brings back its memory (rules 3 and 4): the
        runtime, opening a run, before any input is admitted."""
        for op, client, seq, payload, failed in memory:
            identity = client_identity(op, client, epoch)
            if payload is None:
                answer = ClientResponseEntry(identity, seq, LOST_ANSWER.encode(), True)
            else:
                answer = ClientResponseEntry(identity, seq, payload, failed)
            self._remember((DriverClient(op, client), seq), answer)

    def replayed(self, entries: Iterable[LogEntry]) -> None:
        """A restore (or a replay of a log) met ``entries``: remember their client requests
        and answers (rule 3), so that a client re-sending one is answered, not applied again."""
        for entry in entries:
            if isinstance(entry, (ClientRequestEntry, ClientResponseEntry)):
                key = (client_of(entry.attempt), entry.seq)
                if isinstance(entry, ClientResponseEntry):
                    self._remember(key, entry)
                elif key not in self._answers:
                    self._remember(key, None)

    def _remember(self, key: _Key, answer: ClientResponseEntry | None) -> None:
        self._answers[key] = answer
        self._answers.move_to_end(key)
        while len(self._answers) > CLIENT_MEMORY:
            self._answers.popitem(last=False)
