"""A subtask's history in the running epoch: its items by sequence number, and when a re-sent
item is the one logged.

Rules (docs/protocol.md [resent-item-equals-logged]):
  1. Each subtask has one *history* per epoch: the items, numbered by sequence, of the attempts
     that survive. A re-sent item (seq below the history's length) must equal the logged one:
     byte for byte, or, where the bytes differ, as the values they decode to, encoded again
     by this code (an upgrade of sparkcoord between the two runs may change an encoding, not
     a value: ``core/encoding.py`` rule 6). A duplicate event is acknowledged again, a
     repeated request is answered with the logged response; anything else is divergence (a
     nondeterministic subtask), which the runtime turns into a global failover. The history
     unpickles nothing: the comparison of values is its caller's, made outside the runtime's
     critical section and handed in as a verdict for the pair of bytes (core/decisions.py
     rule 5, runtime/inbox.py rule 6).
  2. The attempts a history belongs to are the live attempt of its subtask and the attempts
     whose history it adopted (core/inbound.py rule 5); its items are the log's item entries
     in sequence order, an entry of a run of events covering as many numbers as it has events.
  3. A finish cuts the history at the number of items its attempt sent (core/inbound.py rule
     6); a run of events that straddles the cut stays, covering only its items below it. The
     finishes of each run stay with the history: a rerun after a restart must send as many
     items as an earlier run's finished attempt did.

Thread model: none; the inbound gate (core/inbound.py) keeps one per subtask of the running
epoch, inside the runtime's inbound critical section.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from sparkcoord.core.decisions import Compared
from sparkcoord.core.entries import EventRunEntry, ItemEntry, RequestEntry
from sparkcoord.core.ids import TaskAttempt


@dataclass(slots=True)
class History:
    """The items of one subtask in the running epoch, by sequence number (rule 1)."""

    attempts: set[TaskAttempt]          # the live attempt and the attempts it adopted (rule 2)
    length: int = 0                     # the next sequence number
    finished: TaskAttempt | None = None  # the last attempt that said it finished (rule 3)
    # by run: the newest attempt of that run that finished it (or may have: rule 3) and how
    # many items it had sent; a later run must send exactly as many
    finishes: dict[str, tuple[TaskAttempt, int]] = field(default_factory=dict)
    starts: list[int] = field(default_factory=list)       # first seq of each item entry
    items: list[ItemEntry] = field(default_factory=list)  # in sequence order

    def append(self, entry: ItemEntry) -> None:
        """The gate accepted (or a replay met) ``entry``: the next item, or as many as a run of
        events holds (rule 2)."""
        self.starts.append(self.length)
        self.items.append(entry)
        self.length += len(entry.payloads) if isinstance(entry, EventRunEntry) else 1

    def truncate(self, length: int) -> None:
        """Forget the items from ``length`` on (rule 3); a run entry that straddles the cut
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

    def resent(self, seq: int, payload: bytes, is_request: bool, compared: Compared
               ) -> bool | None:
        """Whether item ``seq`` (< length), re-sent as ``payload``, is the logged one (rule 1):
        True when the bytes are equal or ``compared`` says the values are, False when the kind
        differs or ``compared`` says the values do, None when the bytes differ and ``compared``
        holds no verdict for the pair (:meth:`logged` and ``payload``). The gate asks for each
        re-sent event and request, in the runtime's critical section."""
        logged, logged_is_request, _ = self.item(seq)
        if logged_is_request != is_request:
            return False
        if logged == payload:
            return True
        return compared.get((logged, payload))

    def logged(self, seq: int) -> bytes:
        """The logged bytes of item ``seq`` (< length)."""
        return self.item(seq)[0]

    def difference(self, attempt: TaskAttempt, seq: int, payload: bytes, is_request: bool) -> str:
        """Why item ``seq`` that ``attempt`` re-sent as ``payload`` is not the logged one, when
        :meth:`resent` said it is not: the reason the job fails with."""
        logged, logged_is_request, logged_by = self.item(seq)
        what = "request" if is_request else "event"
        was = "a request" if logged_is_request else "an event"
        how = "different bytes" if logged_is_request == is_request else f"it was {was}"
        return (f"nondeterministic subtask: {attempt.subtask} re-sent item {seq} of epoch "
                f"{attempt.epoch} as {what} with {how} than logged from {logged_by} "
                f"({len(payload)} vs {len(logged)} bytes); a retried or replayed task must send "
                f"the same events and requests in the same order")

    def earlier_finish(self, attempt: TaskAttempt) -> tuple[TaskAttempt, int] | None:
        """A finish of this history by an attempt of another (earlier) run than ``attempt``'s,
        with its length: the bound a batch that runs again must keep (rule 3)."""
        for run, finish in self.finishes.items():
            if run != attempt.run:
                return finish
        return None
