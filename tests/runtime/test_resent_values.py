"""A re-sent item whose bytes differ from the logged ones is compared by value outside the
inbox's lock (runtime/inbox.py rule 6, docs/decisions/106-inbox-modules-and-value-compare.md).

Deterministic: the coordinator harness on manual mailboxes, and one thread of the test's that
re-sends an item whose unpickling blocks until the test lets it go on. Each time it blocks,
another input must still be admitted: if any unpickling of the comparison ran under the lock,
that input would wait for the lock, and the test fails (after a timeout that only a broken
inbox ever reaches).
"""

from __future__ import annotations

import pickle
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from sparkcoord import OperatorCoordinator
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.inbound import Verdict
from sparkcoord.testing import CoordinatorHarness

#: while set, every unpickling of a :class:`Slow` value blocks until the test lets it go on
ARMED = threading.Event()
ENTERED: queue.Queue[None] = queue.Queue()
PROCEED: queue.Queue[None] = queue.Queue()
ADMISSION_S = 10.0  # far more than an uncontended lock takes; reached only under the lock


def _slow(value: int) -> Slow:
    if ARMED.is_set():
        ENTERED.put(None)
        PROCEED.get(timeout=60)
    return Slow(value)


class Slow:
    """A value whose unpickling (the comparison's, and the one before the lock) blocks."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Callable[[int], Slow], tuple[int]]:
        return _slow, (self.value,)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Slow) and other.value == self.value

    def __hash__(self) -> int:
        return self.value


class Answering(OperatorCoordinator):
    """Takes events and answers every request with the number of requests before it."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.events: list[tuple[int, Any]] = []
        self.asked = 0

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.events.append((subtask, event))

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        self.asked += 1
        return self.asked - 1

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result(None)


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    yield
    ARMED.clear()
    for _ in range(100):  # whatever still blocks goes on (a failed test's threads end)
        PROCEED.put(None)
    while not ENTERED.empty():
        ENTERED.get()
    while not PROCEED.empty():
        PROCEED.get()


def attempt(h: CoordinatorHarness, subtask: int, number: int = 0) -> TaskAttempt:
    return TaskAttempt(h.service.run_id, SubtaskId(h.name, subtask), h.epoch, number)


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


def resend_while_others_are_admitted(h: CoordinatorHarness, resend: Callable[[], Any]) -> Any:
    """Run ``resend`` on a thread with unpickling armed; each time it blocks, subtask 1 sends
    its next event, which must be admitted while it blocks. Returns what ``resend`` returned."""
    other = attempt(h, 1)
    seq = h.service.inbox.history_length(other.subtask)
    ARMED.set()
    thread, out = in_thread(resend)
    blocked = 0
    while thread.is_alive() or not ENTERED.empty():
        try:
            ENTERED.get(timeout=0.05)
        except queue.Empty:
            continue
        blocked += 1
        sender, decision = in_thread(lambda s=seq: h.service.inbox.event_received(
            other, s, h.service.codec.encode(("meanwhile", s))))
        sender.join(ADMISSION_S)
        assert not sender.is_alive(), (
            f"an input waited for the inbox's lock while a re-sent item was being unpickled "
            f"(block {blocked}): the comparison by value ran under the lock")
        assert decision[0].verdict is Verdict.ACCEPT, decision
        seq += 1
        PROCEED.put(None)
    thread.join(ADMISSION_S)
    ARMED.clear()
    # the re-sent payload before the lock (rule 3), then the logged and the re-sent one
    assert blocked >= 3, blocked
    h.run()
    return out[0]


def harness() -> CoordinatorHarness:
    h = CoordinatorHarness(Answering, parallelism=2)
    h.start()
    h.checkpoint()  # epoch 0 sealed: its batch runs
    h.send_from_subtask(1, "first")  # registers subtask 1's attempt
    return h


def test_a_resent_event_of_other_bytes_is_compared_outside_the_lock_and_is_a_duplicate() -> None:
    h = harness()
    h.send_from_subtask(0, Slow(7))  # logged in this encoding (protocol 5)
    again = pickle.dumps(Slow(7), protocol=4)  # the same value, as other bytes
    assert again != h.service.codec.encode(Slow(7))
    decision = resend_while_others_are_admitted(
        h, lambda: h.service.inbox.event_received(attempt(h, 0), 0, again))
    assert decision.verdict is Verdict.DUPLICATE
    assert h.service.failure is None
    coordinator = h.coordinator
    assert isinstance(coordinator, Answering)
    assert coordinator.events[:2] == [(1, "first"), (0, Slow(7))]  # not applied twice
    assert [e for s, e in coordinator.events if s == 0] == [Slow(7)]
    assert sum(1 for s, _ in coordinator.events if s == 1) >= 4  # admitted meanwhile


def test_a_resent_request_of_other_bytes_is_compared_outside_the_lock_and_answered_from_the_log(
        ) -> None:
    h = harness()
    assert h.request_from_subtask(0, Slow(3)) == 0
    again = pickle.dumps(Slow(3), protocol=4)
    answer = resend_while_others_are_admitted(
        h, lambda: h.service.inbox.request_received(attempt(h, 0), 0, again))
    assert answer.done() and pickle.loads(answer.result().payload) == 0  # the logged answer
    coordinator = h.coordinator
    assert isinstance(coordinator, Answering) and coordinator.asked == 1  # asked once
    assert h.service.failure is None


def test_a_resent_item_of_another_value_still_fails_the_job_after_the_comparison() -> None:
    h = harness()
    h.send_from_subtask(0, Slow(7))
    other = pickle.dumps(Slow(8), protocol=4)
    decision = resend_while_others_are_admitted(
        h, lambda: h.service.inbox.event_runs_received([(attempt(h, 0), 0, (other,))])[0])
    assert decision.diverged and decision.duplicates == 0 and decision.rejected == 1
    assert "nondeterministic subtask" in (h.service.failure or "")
    assert "different bytes" in (h.service.failure or "")


def test_the_gate_decides_again_against_the_log_as_it_is_after_the_comparison() -> None:
    # While the re-sent event is compared, subtask 0's task is retried (an operator that
    # answered no request resets): the verdict is for bytes the history no longer holds, and
    # the re-send, decided against the log as it is then, comes from a dead attempt
    h = harness()
    h.send_from_subtask(0, Slow(7))
    first = attempt(h, 0)
    again = pickle.dumps(Slow(7), protocol=4)
    ARMED.set()
    thread, out = in_thread(lambda: h.service.inbox.event_received(first, 0, again))
    for _ in range(2):  # its unpickling before the lock, then the logged item's, compared
        ENTERED.get(timeout=ADMISSION_S)
        PROCEED.put(None)
    ENTERED.get(timeout=ADMISSION_S)  # the re-sent one, compared: blocked outside the lock
    retry, registered = in_thread(lambda: h.service.inbox.attempt_registered(attempt(h, 0, 1)))
    retry.join(ADMISSION_S)
    assert not retry.is_alive() and registered[0].verdict is Verdict.ACCEPT
    PROCEED.put(None)
    thread.join(ADMISSION_S)
    ARMED.clear()
    assert out[0].verdict is Verdict.REJECT and "not the live attempt" in out[0].reason
    h.run()
    assert h.service.failure is None
