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

Theory of operation: every event gets a per-coordinator id at send time. The valve keeps, per
subtask, the list of held ``(id, payload)`` pairs, at most one cut (the pending checkpoint's),
and for every sealed but uncommitted epoch the ids whose futures complete at its commit. The
runtime owns the futures and maps the ids this class returns to them.

Thread model: none. The runtime confines each valve to its coordinator's mailbox thread.
"""

from __future__ import annotations

from sparkcoord.core.errors import (
    AttemptNoLongerLive,
    CheckpointIdRegression,
    IllegalTransition,
    UnknownSubtask,
)
from sparkcoord.core.ids import NO_EPOCH

#: An event on its way to a subtask: (event id, encoded payload).
OutboundEvent = tuple[int, bytes]


class OutboundValve:
    """Epoch bookkeeping of the events one coordinator sends to its ``parallelism`` subtasks."""

    __slots__ = ("operator", "parallelism", "_held", "_cut", "_cut_id", "_pending",
                 "_last_checkpoint", "_sealed", "_attempts", "_next_id")

    def __init__(self, operator: str, parallelism: int, last_checkpoint: int = NO_EPOCH) -> None:
        if parallelism <= 0:
            raise ValueError(f"parallelism of {operator!r} must be positive, got {parallelism}")
        self.operator = operator
        self.parallelism = parallelism
        self._held: list[list[OutboundEvent]] = [[] for _ in range(parallelism)]
        self._cut: list[list[OutboundEvent]] | None = None
        self._cut_id = NO_EPOCH
        self._pending: int | None = None
        self._last_checkpoint = last_checkpoint
        self._sealed: dict[int, list[int]] = {}
        self._attempts = [0] * parallelism
        self._next_id = 0

    # ----------------------------------------------------------------------------- queries
    def live_attempt(self, subtask: int) -> int:
        """The execution attempt number that gateways of ``subtask`` must carry to send."""
        self._check_subtask(subtask)
        return self._attempts[subtask]

    def held_count(self) -> int:
        """How many events wait for a future epoch (held plus cut, all subtasks)."""
        n = sum(len(q) for q in self._held)
        if self._cut is not None:
            n += sum(len(q) for q in self._cut)
        return n

    def held_for(self, subtask: int) -> list[bytes]:
        """Payloads held for ``subtask`` in send order (for tests and diagnostics)."""
        self._check_subtask(subtask)
        cut = self._cut[subtask] if self._cut is not None else []
        return [p for _, p in cut + self._held[subtask]]

    @property
    def pending_checkpoint(self) -> int | None:
        return self._pending

    # ------------------------------------------------------------------------------ inputs
    def event_sent(self, subtask: int, attempt: int, payload: bytes) -> int:
        """A gateway of ``(subtask, attempt)`` sent ``payload``. Returns the event's id.

        Raises :class:`AttemptNoLongerLive` if that attempt has failed (nothing is held).
        """
        # inlined checks: this is the hot path
        if subtask < 0 or subtask >= self.parallelism or attempt != self._attempts[subtask]:
            self._refuse(subtask, attempt, "the event was")
        event_id = self._next_id
        self._next_id = event_id + 1
        self._held[subtask].append((event_id, payload))
        return event_id

    def events_sent(self, subtask: int, attempt: int, payloads: list[bytes]) -> int:
        """Like :meth:`event_sent` for several events in order; returns the first one's id
        (the others follow consecutively). All or nothing."""
        if subtask < 0 or subtask >= self.parallelism or attempt != self._attempts[subtask]:
            self._refuse(subtask, attempt, f"the {len(payloads)} events were")
        first = self._next_id
        self._next_id = first + len(payloads)
        self._held[subtask].extend(zip(range(first, self._next_id), payloads, strict=True))
        return first

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
        if self._pending is not None or self._cut is not None:
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
        self._cut = self._held
        self._cut_id = checkpoint_id
        self._held = [[] for _ in range(self.parallelism)]
        self._pending = None
        return True

    def cut(self, checkpoint_id: int) -> list[list[OutboundEvent]]:
        """The events cut at the boundary of ``checkpoint_id``, per subtask (read only)."""
        if self._cut is None or self._cut_id != checkpoint_id:
            raise IllegalTransition(
                f"{self.operator!r}: no boundary was reached for checkpoint {checkpoint_id}")
        return self._cut

    def checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was declined or timed out: its cut is held again."""
        if self._cut is not None and self._cut_id == checkpoint_id:
            self._held = [c + h for c, h in zip(self._cut, self._held, strict=True)]
            self._cut = None
        elif self._pending == checkpoint_id:
            self._pending = None
        elif checkpoint_id > self._last_checkpoint:
            raise IllegalTransition(
                f"{self.operator!r}: abort of checkpoint {checkpoint_id}, which was never "
                f"triggered (last triggered: {self._last_checkpoint})")
        # else: an abort of an older, already finished checkpoint changes nothing.

    def checkpoint_sealed(self, checkpoint_id: int) -> list[list[OutboundEvent]]:
        """Checkpoint ``checkpoint_id`` was written durably: its cut becomes epoch N's events."""
        cut = self.cut(checkpoint_id)
        self._cut = None
        ids = [event_id for queue in cut for event_id, _ in queue]
        if ids:
            self._sealed[checkpoint_id] = ids
        return cut

    def batch_committed(self, epoch: int) -> list[int]:
        """Spark committed the batch of ``epoch``: ids of the events whose futures complete."""
        done: list[int] = []
        for sealed_epoch in [e for e in self._sealed if e <= epoch]:
            done.extend(self._sealed.pop(sealed_epoch))
        return done

    def attempt_failed(self, subtask: int) -> tuple[int, list[int]]:
        """The live execution attempt of ``subtask`` failed.

        Returns the new attempt number and the ids of the events that fail: those held (not
        sealed) for that subtask. Sealed events stay: the retry gets them again.
        """
        self._check_subtask(subtask)
        failed = [event_id for event_id, _ in self._held[subtask]]
        self._held[subtask] = []
        if self._cut is not None:
            failed = [event_id for event_id, _ in self._cut[subtask]] + failed
            self._cut[subtask] = []
        self._attempts[subtask] += 1
        return self._attempts[subtask], failed

    def held_events_dropped(self) -> list[int]:
        """The coordinator is being reset to its last snapshot: every held event fails.

        Sealed events stay bound to their epoch. Returns the failed ids.
        """
        failed = [event_id for queue in self._held for event_id, _ in queue]
        if self._cut is not None:
            failed = [event_id for queue in self._cut for event_id, _ in queue] + failed
            self._cut = None
        self._held = [[] for _ in range(self.parallelism)]
        self._pending = None
        return failed

    def globally_reset(self) -> list[int]:
        """A global failover: every held, cut and sealed event fails. Returns their ids."""
        failed = self.held_events_dropped()
        for ids in self._sealed.values():
            failed.extend(ids)
        self._sealed.clear()
        return failed

    def _check_subtask(self, subtask: int) -> None:
        if not 0 <= subtask < self.parallelism:
            raise UnknownSubtask(
                f"{self.operator!r} has subtasks 0..{self.parallelism - 1}, got {subtask}")
