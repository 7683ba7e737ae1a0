"""The threaded runtime for real: mailbox threads and the blocking checkpoint path.

No sleeps: the test waits on futures and events with generous timeouts.
"""

from __future__ import annotations

import threading
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
