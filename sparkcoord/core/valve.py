"""The outbound valve: which coordinator events belong to which epoch.

Rules:
  1. The boundary of checkpoint N for a coordinator is the instant its checkpoint future
     completes. Events sent before it are cut into epoch N; events after it are held for a
     later epoch. Order per subtask is send order, always.
  2. If checkpoint N is aborted, its cut goes back in front of the held events, order kept.
     A future of an aborted checkpoint that completes late closes no boundary.
  3. Sealed events are bound to their epoch: they complete when the batch that delivered them
     commits and fail only on a global reset. An execution attempt failure fails only the
     events still held (not sealed) for that subtask.
  4. Sends through the gateway of a failed execution attempt are refused; sends to a subtask
     with no task running are accepted and held.

Theory of operation: the events held for one subtask share their fate: they are cut, aborted,
sealed, committed or failed together, as one list. So the runtime need not track events one
by one: it attaches an opaque *ticket* (a future) to a run of events, and every held event of a
subtask belongs to the newest ticket held for it. Per subtask the valve keeps the held payloads
and the tickets of the runs they came in; a send is one append (plus one when a run starts), a
boundary a swap of lists. At most one cut (the pending checkpoint's) waits to be sealed, and
for every sealed but uncommitted epoch the valve keeps the tickets that complete at its commit.
The payload lists of a cut are handed out as they are and never changed afterwards.

Thread model: none. The runtime confines each valve to its coordinator's mailbox thread.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from typing import Generic, TypeVar

from sparkcoord.core.errors import (
    AttemptNoLongerLive,
    CheckpointIdRegression,
    IllegalTransition,
    UnknownSubtask,
)
from sparkcoord.core.ids import NO_EPOCH

#: What the runtime attaches to each event to learn its fate (its future).
Ticket = TypeVar("Ticket")


class OutboundValve(Generic[Ticket]):
    """Epoch bookkeeping of the events one coordinator sends to its ``parallelism`` subtasks."""

    __slots__ = ("operator", "parallelism", "_payloads", "_tickets", "_cut_payloads",
                 "_cut_tickets", "_cut_id", "_pending", "_last_checkpoint", "_sealed", "_attempts")

    def __init__(self, operator: str, parallelism: int, last_checkpoint: int = NO_EPOCH) -> None:
        if parallelism <= 0:
            raise ValueError(f"parallelism of {operator!r} must be positive, got {parallelism}")
        self.operator = operator
        self.parallelism = parallelism
        self._payloads: list[list[bytes]] = [[] for _ in range(parallelism)]
        self._tickets: list[list[Ticket]] = [[] for _ in range(parallelism)]
        self._cut_payloads: list[list[bytes]] | None = None
        self._cut_tickets: list[list[Ticket]] = []
        self._cut_id = NO_EPOCH
        self._pending: int | None = None
        self._last_checkpoint = last_checkpoint
        self._sealed: dict[int, list[list[Ticket]]] = {}
        self._attempts = [0] * parallelism

    # ----------------------------------------------------------------------------- queries
    def live_attempt(self, subtask: int) -> int:
        """The execution attempt number that gateways of ``subtask`` must carry to send."""
        self._check_subtask(subtask)
        return self._attempts[subtask]

    def held_count(self) -> int:
        """How many events wait for a future epoch (held plus cut, all subtasks)."""
        n = sum(len(q) for q in self._payloads)
        if self._cut_payloads is not None:
            n += sum(len(q) for q in self._cut_payloads)
        return n

    def held_for(self, subtask: int) -> list[bytes]:
        """Payloads held for ``subtask`` in send order (for tests and diagnostics)."""
        self._check_subtask(subtask)
        cut = self._cut_payloads[subtask] if self._cut_payloads is not None else []
        return cut + self._payloads[subtask]

    @property
    def pending_checkpoint(self) -> int | None:
        return self._pending

    # ------------------------------------------------------------------------------ inputs
    def event_sent(self, subtask: int, attempt: int, payload: bytes,
                   new_ticket: Callable[[], Ticket]) -> Ticket:
        """A gateway of ``(subtask, attempt)`` sent ``payload``. Returns its ticket: the newest
        ticket held for that subtask, or, when nothing is held, a new one from ``new_ticket``.

        Raises :class:`AttemptNoLongerLive` if that attempt has failed (nothing is held).
        """
        # inlined checks: this is the hot path
        if subtask < 0 or subtask >= self.parallelism or attempt != self._attempts[subtask]:
            self._refuse(subtask, attempt, "the event was")
        self._payloads[subtask].append(payload)
        tickets = self._tickets[subtask]
        if tickets:
            return tickets[-1]
        ticket = new_ticket()
        tickets.append(ticket)
        return ticket

    def events_sent(self, subtask: int, attempt: int, payloads: list[bytes], ticket: Ticket) -> None:
        """Like :meth:`event_sent` for several events in order, under a ticket of their own
        (``ticket`` starts a new run even if events are held). All or nothing."""
        if subtask < 0 or subtask >= self.parallelism or attempt != self._attempts[subtask]:
            self._refuse(subtask, attempt, f"the {len(payloads)} events were")
        if payloads:
            self._payloads[subtask].extend(payloads)
            self._tickets[subtask].append(ticket)

    def _refuse(self, subtask: int, attempt: int, what: str) -> None:
        self._check_subtask(subtask)
        raise AttemptNoLongerLive(
            f"{self.operator}[{subtask}]: execution attempt {attempt} has failed "
            f"(live attempt is {self._attempts[subtask]}); {what} not sent")

    def checkpoint_triggered(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was triggered on this coordinator."""
        if checkpoint_id <= self._last_checkpoint:
            raise CheckpointIdRegression(f"trigger on {self.operator!r}", checkpoint_id,
                                         self._last_checkpoint)
        if self._pending is not None or self._cut_payloads is not None:
            raise IllegalTransition(
                f"{self.operator!r}: checkpoint {checkpoint_id} triggered while checkpoint "
                f"{self._pending if self._pending is not None else self._cut_id} is unfinished")
        self._pending = checkpoint_id
        self._last_checkpoint = checkpoint_id

    def boundary_reached(self, checkpoint_id: int) -> bool:
        """The coordinator completed its future for ``checkpoint_id``.

        Returns False (and changes nothing) when that checkpoint is not the pending one, e.g. a
        late completion of an aborted checkpoint: such a future closes no boundary.
        """
        if self._pending != checkpoint_id:
            return False
        self._cut_payloads, self._cut_tickets = self._payloads, self._tickets
        self._cut_id = checkpoint_id
        self._payloads = [[] for _ in range(self.parallelism)]
        self._tickets = [[] for _ in range(self.parallelism)]
        self._pending = None
        return True

    def cut(self, checkpoint_id: int) -> list[list[bytes]]:
        """The payloads cut at the boundary of ``checkpoint_id``, per subtask (read only)."""
        if self._cut_payloads is None or self._cut_id != checkpoint_id:
            raise IllegalTransition(
                f"{self.operator!r}: no boundary was reached for checkpoint {checkpoint_id}")
        return self._cut_payloads

    def checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was declined or timed out: its cut is held again."""
        if self._cut_payloads is not None and self._cut_id == checkpoint_id:
            self._payloads = [c + h for c, h in zip(self._cut_payloads, self._payloads, strict=True)]
            self._tickets = [c + h for c, h in zip(self._cut_tickets, self._tickets, strict=True)]
            self._drop_cut()
        elif self._pending == checkpoint_id:
            self._pending = None
        elif checkpoint_id > self._last_checkpoint:
            raise IllegalTransition(
                f"{self.operator!r}: abort of checkpoint {checkpoint_id}, which was never "
                f"triggered (last triggered: {self._last_checkpoint})")
        # else: an abort of an older, already finished checkpoint changes nothing.

    def checkpoint_sealed(self, checkpoint_id: int) -> list[list[bytes]]:
        """Checkpoint ``checkpoint_id`` was written durably: its cut becomes epoch N's events.

        Returns the sealed payloads per subtask."""
        cut = self.cut(checkpoint_id)
        tickets = [t for t in self._cut_tickets if t]
        self._drop_cut()
        if tickets:
            self._sealed[checkpoint_id] = tickets
        return cut

    def batch_committed(self, epoch: int) -> list[Ticket]:
        """Spark committed the batch of ``epoch``: the tickets of the events that complete."""
        done: list[list[Ticket]] = []
        for sealed_epoch in [e for e in self._sealed if e <= epoch]:
            done.extend(self._sealed.pop(sealed_epoch))
        return list(chain.from_iterable(done))

    def attempt_failed(self, subtask: int) -> tuple[int, list[Ticket]]:
        """The live execution attempt of ``subtask`` failed.

        Returns the new attempt number and the tickets of the events that fail: those held (not
        sealed) for that subtask. Sealed events stay: the retry gets them again.
        """
        self._check_subtask(subtask)
        failed = self._tickets[subtask]
        self._payloads[subtask] = []
        self._tickets[subtask] = []
        if self._cut_payloads is not None:
            failed = self._cut_tickets[subtask] + failed
            # replace, never mutate: the cut's lists may already be in a prepared checkpoint
            self._cut_payloads = list(self._cut_payloads)
            self._cut_payloads[subtask] = []
            self._cut_tickets[subtask] = []
        self._attempts[subtask] += 1
        return self._attempts[subtask], failed

    def held_events_dropped(self) -> list[Ticket]:
        """The coordinator is being reset to its last snapshot: every held event fails.

        Sealed events stay bound to their epoch. Returns the failed tickets.
        """
        failed = list(chain.from_iterable(self._tickets))
        if self._cut_payloads is not None:
            failed = list(chain.from_iterable(self._cut_tickets)) + failed
            self._drop_cut()
        self._payloads = [[] for _ in range(self.parallelism)]
        self._tickets = [[] for _ in range(self.parallelism)]
        self._pending = None
        return failed

    def globally_reset(self) -> list[Ticket]:
        """A global failover: every held, cut and sealed event fails. Returns their tickets."""
        failed = self.held_events_dropped()
        for lists in self._sealed.values():
            failed.extend(chain.from_iterable(lists))
        self._sealed.clear()
        return failed

    def _drop_cut(self) -> None:
        self._cut_payloads = None
        self._cut_tickets = []

    def _check_subtask(self, subtask: int) -> None:
        if not 0 <= subtask < self.parallelism:
            raise UnknownSubtask(
                f"{self.operator!r} has subtasks 0..{self.parallelism - 1}, got {subtask}")
