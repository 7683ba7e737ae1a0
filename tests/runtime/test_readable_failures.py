"""Stalls and failures a user can read (issue 11): warnings for blocked callbacks and waiting
checkpoints, a clear error for a send before gateways exist, precise error texts.

Deterministic: manual mailboxes and clock. A callback "blocks" by advancing the manual clock
while it runs, which is what the watchdog on the timer thread sees of a blocked callback.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

import pytest

from sparkcoord import EventEncodingError, EventTooLarge, GatewayNotReady, OperatorCoordinator
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.testing import CoordinatorHarness


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_callback_blocked_for_35_s_is_reported_every_10_s_naming_coordinator_and_callback(
        caplog: pytest.LogCaptureFixture) -> None:
    holder: list[CoordinatorHarness] = []

    class Blocking(OperatorCoordinator):
        def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
            holder[0].clock.advance(35.0)  # 35 s pass while this callback runs

    h = CoordinatorHarness(Blocking, 1, name="splits")
    holder.append(h)
    h.start()
    h.checkpoint()
    caplog.set_level(logging.WARNING)
    h.send_from_subtask(0, "x")
    blocked = [w for w in warnings_of(caplog) if "has been running" in w]
    assert blocked == [
        "coordinator 'splits' has been running handle_event_from_operator() for more than 10 s; "
        "callbacks run on its mailbox and must not block: its events, its checkpoints and with "
        "them the job's batches wait behind it",
        "coordinator 'splits' has been running handle_event_from_operator() for more than 20 s; "
        "callbacks run on its mailbox and must not block: its events, its checkpoints and with "
        "them the job's batches wait behind it"]


def test_quick_callbacks_with_time_passing_between_them_raise_no_stall_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    h = CoordinatorHarness(OperatorCoordinator, 1)
    h.start()
    h.checkpoint()
    caplog.set_level(logging.WARNING)
    for i in range(5):
        h.send_from_subtask(0, i)
        h.clock.advance(30.0)
    assert warnings_of(caplog) == []


def test_a_checkpoint_waiting_for_a_coordinator_is_reported_naming_it_until_it_completes(
        caplog: pytest.LogCaptureFixture) -> None:
    class Late(OperatorCoordinator):
        def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
            self.pending = result

    h = CoordinatorHarness(Late, 1, name="committer",
                           config=ServiceConfig(checkpoint_timeout_s=120.0))
    h.start()
    caplog.set_level(logging.WARNING)
    timers_before = h.clock.scheduled
    future = h.trigger_checkpoint()
    h.run()
    h.clock.advance(25.0)
    assert warnings_of(caplog) == [
        f"checkpoint 0 has waited {s} s for coordinator 'committer' to complete the checkpoint "
        f"future (it is declined after 120 s: ServiceConfig.checkpoint_timeout_s)"
        for s in (10, 20)]
    coordinator = h.coordinator
    assert isinstance(coordinator, Late)
    coordinator.pending.set_result(None)
    h.run()
    assert future.done()
    assert h.clock.scheduled == timers_before  # the timeout and the warning timer cancelled
    h.clock.advance(60.0)
    assert len(warnings_of(caplog)) == 2


def test_stall_warnings_can_be_turned_off(caplog: pytest.LogCaptureFixture) -> None:
    class Late(OperatorCoordinator):
        def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
            pass

    h = CoordinatorHarness(Late, 1, config=ServiceConfig(stall_warning_s=0,
                                                         checkpoint_timeout_s=100.0))
    h.start()
    caplog.set_level(logging.WARNING)
    h.trigger_checkpoint()
    h.run()
    h.clock.advance(50.0)
    assert warnings_of(caplog) == []


def test_sending_from_start_is_a_clear_error_that_fails_the_job() -> None:
    class Eager(OperatorCoordinator):
        def start(self) -> None:
            for _, gateway in self.ready_gateways():
                gateway.send_event("too early")

    h = CoordinatorHarness(Eager, 2, name="eager")
    h.start()
    failure = h.service.failure
    assert failure is not None
    assert failure.startswith("coordinator 'eager' raised in start(): GatewayNotReady(")
    assert "no subtask gateway is ready during start()" in failure
    assert "execution_attempt_ready()" in failure


def test_a_gateway_asked_for_before_it_exists_names_the_subtask() -> None:
    seen: list[BaseException] = []

    class Asks(OperatorCoordinator):
        def start(self) -> None:
            try:
                self.gateway(1)
            except GatewayNotReady as exc:
                seen.append(exc)

    h = CoordinatorHarness(Asks, 2, name="asks")
    h.start()
    assert len(seen) == 1 and isinstance(seen[0], LookupError)
    assert "coordinator 'asks' has no gateway for subtask 1 during start()" in str(seen[0])
    with pytest.raises(GatewayNotReady, match="has no gateway for subtask 7 now"):
        h.coordinator.gateway(7)
    assert [s for s, _ in h.coordinator.ready_gateways()] == [0, 1]  # after start: all ready


def test_send_events_names_the_index_of_the_event_that_cannot_be_sent() -> None:
    h = CoordinatorHarness(OperatorCoordinator, 1, config=ServiceConfig(max_event_bytes=100))
    h.start()
    gateway = h.coordinator.gateway(0)
    with pytest.raises(EventEncodingError, match=r"^event at index 2 of send_events\(\): event of "
                                                 r"type function cannot be pickled"):
        gateway.send_events(["a", "b", lambda: None])
    with pytest.raises(EventTooLarge) as caught:
        gateway.send_events(["a", "x" * 500])
    text = str(caught.value)
    assert text.startswith("event at index 1 of send_events() (type str) is ")
    assert "over the limit of 100 bytes" in text
    assert "CoordinatedJob(spark, dir, config=ServiceConfig(max_event_bytes=...))" in text
    assert h.service.holders[h.name].held_count() == 0  # nothing was sent
