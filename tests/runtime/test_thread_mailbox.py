"""The threaded runtime for real: mailbox threads and the blocking checkpoint path.

No sleeps to wait: the tests wait on futures and events with generous timeouts (a sleep is
only ever the coordinator's own behaviour under test: one that blocks).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sparkcoord import OperatorCoordinator
from sparkcoord.core.ids import SubtaskId
from sparkcoord.core.restore import FRESH
from sparkcoord.runtime.mailbox import ThreadMailbox
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec
from sparkcoord.runtime.storage import CheckpointStorage


def test_a_thread_mailbox_runs_actions_in_order_on_its_own_thread() -> None:
    mailbox = ThreadMailbox("t")
    seen: list[tuple[int, bool]] = []
    done = threading.Event()
    for i in range(100):
        mailbox.execute(lambda i=i: seen.append((i, mailbox.in_mailbox_thread())))
    mailbox.execute(done.set)
    assert done.wait(10)
    assert seen == [(i, True) for i in range(100)]
    assert not mailbox.in_mailbox_thread()
    mailbox.close()
    mailbox.join(10)


def test_a_raising_action_does_not_stop_the_mailbox() -> None:
    mailbox = ThreadMailbox("t")
    done = threading.Event()
    mailbox.execute(lambda: 1 / 0)
    mailbox.execute(done.set)
    assert done.wait(10)
    mailbox.close()


def test_a_claimed_run_over_its_budget_stops_claims_and_the_mailbox_thread_takes_over() -> None:
    # rule 3: the claiming thread is the channel's one I/O thread, borrowed
    ran_on: list[bool] = []
    done = threading.Event()
    generous = ThreadMailbox("fast", claim_cpu_budget_s=60.0, claim_wall_budget_s=60.0)
    assert generous.execute_claiming(lambda: ran_on.append(generous.in_mailbox_thread()))
    generous.run_claimed()
    assert generous.execute_claiming(lambda: None)  # within budget: claims go on
    generous.run_claimed()
    generous.close()

    slow = ThreadMailbox("slow", claim_cpu_budget_s=-1.0, claim_pause_s=60.0)  # always over
    assert slow.execute_claiming(lambda: ran_on.append(slow.in_mailbox_thread()))
    slow.run_claimed()
    # paused: not claimed, run by the mailbox's own thread, in order
    assert not slow.execute_claiming(lambda: ran_on.append(slow.in_mailbox_thread()))
    slow.execute(done.set)
    assert done.wait(10)
    assert ran_on == [True, True, True]  # each ran as the mailbox thread of its time
    slow.close()


def _compute(seconds: float) -> None:
    # uses ``seconds`` of this thread's CPU time, however long the machine takes to give it
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


def _claims_go_on_after(mailbox: ThreadMailbox, action: Callable[[], None]) -> bool:
    """Run ``action`` as a claimed run; whether the next action is claimed too."""
    assert mailbox.execute_claiming(action)
    mailbox.run_claimed()
    claimed = mailbox.execute_claiming(lambda: None)
    if claimed:
        mailbox.run_claimed()
    mailbox.close()
    return claimed


def test_a_claimed_run_that_computes_past_the_cpu_budget_stops_claims() -> None:
    # the coordinator itself is slow: the I/O thread must not be borrowed for it again soon
    busy = ThreadMailbox("computes", claim_cpu_budget_s=0.01, claim_wall_budget_s=60.0,
                         claim_pause_s=60.0)
    assert not _claims_go_on_after(busy, lambda: _compute(0.03))


def test_a_claimed_run_that_blocks_past_the_wall_budget_stops_claims() -> None:
    # a coordinator that waits (I/O, a lock, a sleep) uses no CPU and still holds the loop
    blocks = ThreadMailbox("blocks", claim_cpu_budget_s=60.0, claim_wall_budget_s=0.01,
                           claim_pause_s=60.0)
    assert not _claims_go_on_after(blocks, lambda: time.sleep(0.03))


def test_a_claimed_run_that_waited_without_computing_keeps_claims_within_the_wall_budget() -> None:
    # preemption on a loaded machine: a run that took 30 ms of wall time but almost no CPU is
    # no sign of a slow coordinator (a 20 ms wall budget tripped on this alone: decision 46)
    waits = ThreadMailbox("preempted", claim_cpu_budget_s=0.02, claim_wall_budget_s=60.0,
                          claim_pause_s=60.0)
    assert _claims_go_on_after(waits, lambda: time.sleep(0.03))


def _collect_a_big_heap(mailbox: ThreadMailbox, cycles: int) -> tuple[bool, float]:
    """Whether claims go on after a claimed run that only runs a full collection of
    ``cycles`` reference cycles, and the collection's CPU time."""
    heap = []
    for _ in range(cycles):
        cycle: list[object] = []
        cycle.append(cycle)
        heap.append(cycle)
    took: list[float] = []

    def collect() -> None:
        start = time.thread_time()
        gc.collect()
        took.append(time.thread_time() - start)

    try:
        return _claims_go_on_after(mailbox, collect), took[0]
    finally:
        del heap


def test_a_claimed_run_that_triggers_a_long_garbage_collection_keeps_claims_by_cpu() -> None:
    # the collector's pass over the whole heap is not the coordinator's doing (decision 46);
    # CPU time only: preemption of the thread on a busy machine does not count in it either
    collects = ThreadMailbox("collects", claim_cpu_budget_s=0.001, claim_wall_budget_s=60.0,
                             claim_pause_s=60.0)
    goes_on, took = _collect_a_big_heap(collects, 200_000)
    assert goes_on
    assert took > 0.001  # though the collection alone was over the budget


def test_a_claimed_run_that_triggers_a_long_garbage_collection_keeps_claims_by_wall() -> None:
    # the same for the wall budget: a collection of ~55 ms CPU (more wall time on a busy
    # machine) against a 40 ms budget; what is left of the run besides it is microseconds,
    # so only a preemption of more than 40 ms outside the collection could trip it
    collects = ThreadMailbox("collects", claim_cpu_budget_s=60.0, claim_wall_budget_s=0.04,
                             claim_pause_s=60.0)
    goes_on, took = _collect_a_big_heap(collects, 1_000_000)
    assert goes_on
    assert took > 0.04  # the collection alone was over the budget


class Threads(OperatorCoordinator):
    """Completes its checkpoint from a foreign thread after sending from it."""

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        gw = self.gateway(0)

        def other_thread() -> None:
            gw.send_event(("before", checkpoint_id))
            result.set_result(checkpoint_id)
            gw.send_event(("after", checkpoint_id))

        threading.Thread(target=other_thread).start()


def test_the_blocking_checkpoint_with_real_threads_keeps_send_complete_send_order(tmp_path) -> None:
    service = CoordinationService([CoordinatorSpec("c", Threads, 1)],
                                  CheckpointStorage(str(tmp_path)))
    try:
        service.restore(FRESH)
        events = []
        for epoch in range(20):
            record = service.checkpoint(epoch)
            assert record is not None
            events.append([service.codec.decode(p) for p in record.events_for(SubtaskId("c", 0))])
            service.batch_committed(epoch)
        assert events[0] == [("before", 0)]
        for epoch in range(1, 20):
            assert events[epoch] == [("after", epoch - 1), ("before", epoch)]
    finally:
        service.close()
