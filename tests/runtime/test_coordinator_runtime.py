"""The coordinator runtime: gateways, the valve through the mailbox, futures, failures.

Deterministic: manual mailboxes and a manual clock. "From another thread" means outside the
mailbox's run, which is how a user thread's calls reach the mailbox.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import pytest

from sparkcoord import (
    AttemptNoLongerLive,
    EventEncodingError,
    EventTooLarge,
    OperatorCoordinator,
    WrongThread,
)
from sparkcoord.core.errors import CheckpointIdRegression
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.holder import CoordinatorFenced
from sparkcoord.runtime.service import CheckpointDeclined, JobFailed
from sparkcoord.runtime.storage import RecordNotFound
from sparkcoord.testing import CoordinatorHarness, RecordingGateway


class Recorder(OperatorCoordinator):
    """Keeps its checkpoint futures for the test to complete; records every callback."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.calls: list[tuple[Any, ...]] = []
        self.results: dict[int, Future[Any]] = {}

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.calls.append(("reset", checkpoint_id, state))

    def start(self) -> None:
        self.calls.append(("start",))

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.calls.append(("event", subtask, attempt, event))

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        self.results[checkpoint_id] = result

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.calls.append(("complete", checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.calls.append(("aborted", checkpoint_id))


def started(parallelism: int = 2, **config: Any) -> CoordinatorHarness:
    h = CoordinatorHarness(Recorder, parallelism, config=ServiceConfig(**config) if config else None)
    h.start()
    return h


def seal(h: CoordinatorHarness, future: Future[Any]) -> dict[int, list[Any]]:
    h.run()
    record = h.service.seal(future.result())
    h.run()
    from sparkcoord.core.ids import SubtaskId
    return {s: [h.service.codec.decode(p) for p in record.events_for(SubtaskId(h.name, s))]
            for s in range(h.parallelism)}


def test_a_coordinator_is_reset_started_and_handed_a_gateway_per_subtask_in_that_order() -> None:
    h = started(parallelism=3)
    assert h.coordinator.calls[:2] == [("reset", -1, None), ("start",)]
    gateways = h.coordinator.ready_gateways()
    assert [s for s, _ in gateways] == [0, 1, 2]
    assert [g.subtask for _, g in gateways] == [0, 1, 2]
    assert len({id(g) for _, g in gateways}) == 3


def test_send_complete_send_from_another_thread_keeps_its_order_around_the_boundary() -> None:
    h = started()
    gw = h.coordinator.gateway(0)
    future = h.trigger_checkpoint()
    h.run()
    result = h.coordinator.results[0]
    gw.send_event("e1")           # all three from outside the mailbox
    result.set_result("snap")
    gw.send_event("e2")
    assert seal(h, future) == {0: ["e1"], 1: []}
    assert h.service.holders["coordinator"].valve.held_for(0) == [h.service.codec.encode("e2")]


def test_a_send_inside_a_callback_after_completing_the_future_is_held_for_the_next_epoch() -> None:
    class Eager(OperatorCoordinator):
        def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
            self.gateway(0).send_event(("before", checkpoint_id))
            result.set_result(checkpoint_id)
            self.gateway(0).send_event(("after", checkpoint_id))

    h = CoordinatorHarness(Eager, 1)
    h.start()
    assert h.checkpoint() == {0: [("before", 0)]}
    h.commit()
    assert h.checkpoint() == {0: [("after", 0), ("before", 1)]}


def test_a_late_completion_of_a_timed_out_checkpoint_closes_no_boundary() -> None:
    h = started(checkpoint_timeout_s=5.0, tolerable_checkpoint_failures=3)
    gw = h.coordinator.gateway(0)
    gw.send_event("a")
    future = h.trigger_checkpoint()
    h.run()
    h.clock.advance(5.0)
    with pytest.raises(CheckpointDeclined, match="timed out after 5.0s"):
        future.result(timeout=0)
    h.run()
    assert ("aborted", 0) in h.coordinator.calls
    h.coordinator.results[0].set_result("late")  # late: must hold nothing
    gw.send_event("b")
    future = h.trigger_checkpoint()
    h.run()
    h.coordinator.results[1].set_result("snap")
    assert seal(h, future) == {0: ["a", "b"], 1: []}


def test_a_declined_checkpoint_keeps_the_held_events_in_order() -> None:
    h = started(tolerable_checkpoint_failures=1)
    gw = h.coordinator.gateway(1)
    gw.send_event(1)
    future = h.trigger_checkpoint()
    h.run()
    gw.send_event(2)
    h.coordinator.results[0].set_exception(RuntimeError("not now"))
    h.run()
    with pytest.raises(CheckpointDeclined, match="not now"):
        future.result(timeout=0)
    assert h.service.failure is None
    future = h.trigger_checkpoint()
    h.run()
    h.coordinator.results[1].set_result(None)
    assert seal(h, future) == {0: [], 1: [1, 2]}


def test_declines_past_the_tolerable_count_fail_the_job() -> None:
    h = started(tolerable_checkpoint_failures=0)
    future = h.trigger_checkpoint()
    h.run()
    h.coordinator.results[0].set_exception(RuntimeError("no"))
    h.run()
    with pytest.raises(JobFailed, match=r"1 checkpoint failed in a row, more than the 0 tolerated "
                                        r"\(ServiceConfig.tolerable_checkpoint_failures\)"):
        future.result(timeout=0)
    with pytest.raises(JobFailed):
        h.service.raise_if_failed()


def test_an_unpicklable_checkpoint_state_declines_the_checkpoint_with_a_clear_reason() -> None:
    h = started(tolerable_checkpoint_failures=1)
    future = h.trigger_checkpoint()
    h.run()
    h.coordinator.results[0].set_result(threading.Lock())
    h.run()
    with pytest.raises(CheckpointDeclined, match="cannot be pickled"):
        future.result(timeout=0)


def test_futures_of_sealed_events_complete_when_their_batch_commits() -> None:
    h = started()
    sent = h.coordinator.gateway(0).send_event("x")
    future = h.trigger_checkpoint()
    h.run()
    h.coordinator.results[0].set_result(None)
    seal(h, future)
    assert not sent.done()
    h.commit()
    assert sent.done() and sent.exception() is None
    assert ("complete", 0) in h.coordinator.calls


def test_sends_held_together_share_a_future_and_a_send_after_the_boundary_gets_its_own() -> None:
    h = started()
    futures: dict[str, Future[None]] = {}

    def send(subtask: int, *names: str) -> None:
        for name in names:
            futures[name] = h.coordinator.gateway(subtask).send_event(name)

    h.coordinator.context.run_in_coordinator_thread(lambda: (send(0, "a", "b"), send(1, "x")))
    h.run()
    assert futures["a"] is futures["b"]  # held together for subtask 0: one fate, one future
    assert futures["x"] is not futures["a"]  # another subtask
    future = h.trigger_checkpoint()
    h.run()
    h.coordinator.results[0].set_result(None)  # the boundary, from another thread
    h.coordinator.context.run_in_coordinator_thread(lambda: send(0, "c"))
    assert seal(h, future) == {0: ["a", "b"], 1: ["x"]}
    assert futures["c"] is not futures["a"]
    assert futures["a"].cancel() is False  # a sent event cannot be unsent
    h.commit()
    assert futures["a"].done() and futures["x"].done() and not futures["c"].done()


def test_a_straggler_task_of_a_closed_service_is_refused_and_nothing_is_logged() -> None:
    h = started()
    from sparkcoord.core.ids import SubtaskId, TaskAttempt

    h.service.close()
    straggler = TaskAttempt(h.service.run_id, SubtaskId(h.name, 0), h.epoch, 0)
    assert h.service.inbox.attempt_registered(straggler).verdict.name == "REJECT"
    decision = h.service.inbox.event_received(straggler, 0, h.service.codec.encode("late"))
    assert decision.verdict.name == "REJECT" and "closed" in decision.reason
    with pytest.raises(RecordNotFound, match="inbound log of epoch -1 is missing"):
        h.service.storage.read_inbound_log(h.epoch)  # nothing was ever appended


def test_a_global_failover_fails_held_and_sealed_futures_and_fences_the_coordinator() -> None:
    h = started()
    gw = h.coordinator.gateway(0)
    sealed = gw.send_event("sealed")
    future = h.trigger_checkpoint()
    h.run()
    h.coordinator.results[0].set_result(None)
    seal(h, future)
    held = gw.send_event("held")
    h.run()
    h.coordinator.context.fail_job("boom")
    h.run()
    for f in (sealed, held):
        assert isinstance(f.exception(timeout=0), CoordinatorFenced)
    late = gw.send_event("after failover")
    h.run()
    assert isinstance(late.exception(timeout=0), CoordinatorFenced)
    assert "boom" in h.service.failure


def test_fail_job_fires_once_until_the_coordinator_is_reset() -> None:
    h = started()
    causes: list[str] = []
    h.service.add_failure_listener(causes.append)
    ctx = h.coordinator.context
    ctx.fail_job("first")
    ctx.fail_job(RuntimeError("second"))
    h.run()
    assert len(causes) == 1 and "first" in causes[0] and "'coordinator'" in causes[0]


def test_fail_job_of_a_reset_coordinator_instance_is_ignored_and_the_new_one_may_fail() -> None:
    h = started()
    h.coordinator.gateway(0).send_event("x")
    future = h.trigger_checkpoint()
    h.run()
    h.coordinator.results[0].set_result("s0")
    seal(h, future)
    old = h.coordinator
    h.send_from_subtask(0, "ev")
    h.retry_task(0)  # default mode: the whole coordinator is reset
    assert h.coordinator is not old
    old.context.fail_job("from the fenced instance")
    h.run()
    assert h.service.failure is None
    h.coordinator.context.fail_job("from the new instance")
    h.run()
    assert "new instance" in h.service.failure


def test_a_callback_exception_fails_the_job_naming_the_coordinator_and_the_callback() -> None:
    class Broken(OperatorCoordinator):
        def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
            raise ValueError("bad event")

    h = CoordinatorHarness(Broken, 1, name="enumerator")
    h.start()
    h.checkpoint()
    h.send_from_subtask(0, "x")
    assert h.service.failure is not None
    assert "'enumerator'" in h.service.failure and "handle_event_from_operator" in h.service.failure
    assert "bad event" in h.service.failure


def test_checkpoint_ids_must_increase_through_the_service() -> None:
    h = started()
    future = h.service.trigger_checkpoint(3)
    h.run()
    h.coordinator.results[3].set_result(None)
    seal(h, future)
    h.commit()
    with pytest.raises(CheckpointIdRegression) as info:
        h.service.trigger_checkpoint(2)
    assert "2" in str(info.value) and "3" in str(info.value)
    assert h.service.next_checkpoint_id == 4


def test_an_unpicklable_or_oversized_event_fails_at_send_and_nothing_is_held() -> None:
    h = started(max_event_bytes=64)
    gw = h.coordinator.gateway(0)
    with pytest.raises(EventEncodingError, match="cannot be pickled"):
        gw.send_event(threading.Lock())
    with pytest.raises(EventTooLarge, match="over the limit of 64 bytes"):
        gw.send_event(b"x" * 100)
    h.run()
    assert not h.service.has_held_events()


def test_a_send_to_a_subtask_with_no_task_running_is_accepted_and_held() -> None:
    h = started()
    f = h.coordinator.gateway(1).send_event("between batches")
    h.run()
    assert not f.done() and h.service.has_held_events()


def test_a_callback_run_outside_its_mailbox_raises_wrong_thread() -> None:
    h = started()
    holder = h.service.holders["coordinator"]
    with pytest.raises(WrongThread, match="outside its mailbox"):
        holder._callback(OperatorCoordinator.start)


def test_call_periodically_runs_on_the_mailbox_and_stops_when_cancelled() -> None:
    ticks: list[bool] = []

    class Ticker(OperatorCoordinator):
        def start(self) -> None:
            self.timer = self.context.call_periodically(
                1.0, lambda: ticks.append(self.context.is_coordinator_thread()))

    h = CoordinatorHarness(Ticker, 1)
    h.start()
    h.clock.advance(3.5)
    h.run()
    assert ticks == [True, True, True]
    h.coordinator.timer.cancel()
    h.clock.advance(5)
    h.run()
    assert len(ticks) == 3


class PerSubtaskRecorder(Recorder):
    """A recorder in per-subtask mode that also records Flink's failure sequence."""

    resets_per_subtask = True

    def execution_attempt_failed(self, subtask: int, attempt: int, reason: str) -> None:
        self.calls.append(("failed", subtask, attempt))
        super().execution_attempt_failed(subtask, attempt, reason)

    def subtask_reset(self, subtask: int, checkpoint_id: int) -> None:
        self.calls.append(("subtask_reset", subtask, checkpoint_id))

    def execution_attempt_ready(self, subtask: int, attempt: int, gateway: Any) -> None:
        self.calls.append(("ready", subtask, attempt))
        super().execution_attempt_ready(subtask, attempt, gateway)


def test_per_subtask_mode_runs_flinks_failure_sequence_before_the_new_attempts_events() -> None:
    h = CoordinatorHarness(PerSubtaskRecorder, 2)
    h.start()
    future = h.trigger_checkpoint()
    h.run()
    h.coordinator.results[0].set_result(None)
    seal(h, future)
    old_gateway = h.coordinator.gateway(0)
    held = old_gateway.send_event("unsealed")
    other = h.coordinator.gateway(1).send_event("for subtask 1")
    h.run()
    h.send_from_subtask(0, "from attempt 0")
    instance = h.coordinator
    h.retry_task(0)
    h.send_from_subtask(0, "from attempt 1")
    assert h.coordinator is instance  # not recreated
    tail = instance.calls[-4:]
    assert tail == [("failed", 0, 0), ("subtask_reset", 0, 0), ("ready", 0, 1),
                    ("event", 0, 1, "from attempt 1")]
    assert isinstance(held.exception(timeout=0), AttemptNoLongerLive)
    assert not other.done()  # the other subtask's held event is untouched
    refused = old_gateway.send_event("via the old gateway")
    h.run()
    assert isinstance(refused.exception(timeout=0), AttemptNoLongerLive)


def test_a_recording_gateway_records_events_and_checks_picklability() -> None:
    gw = RecordingGateway(subtask=2)
    f = gw.send_event({"split": 1})
    assert gw.events == [{"split": 1}] and not f.done()
    gw.complete_all()
    assert f.done()
    with pytest.raises(EventEncodingError):
        gw.send_event(lambda: None)


def test_send_events_keeps_the_order_among_single_sends_and_completes_each_future_at_commit() -> None:
    h = started()
    gw = h.coordinator.gateway(0)
    first = gw.send_event("a")
    many = gw.send_events(iter(["b", "c", "d"]))
    last = gw.send_event("e")
    future = h.trigger_checkpoint()
    h.run()
    h.coordinator.results[0].set_result(None)
    assert seal(h, future) == {0: ["a", "b", "c", "d", "e"], 1: []}
    futures = [first, *many, last]
    assert len(many) == 3 and not any(f.done() for f in futures)
    h.commit()
    assert all(f.done() and f.exception() is None for f in futures)


def test_send_events_with_one_unpicklable_event_raises_and_sends_none_of_them() -> None:
    h = started()
    with pytest.raises(EventEncodingError, match="type lock cannot be pickled"):
        h.coordinator.gateway(1).send_events(["fine", threading.Lock(), "also fine"])
    h.run()
    assert not h.service.has_held_events()


def test_send_events_through_a_fenced_gateway_fail_every_future() -> None:
    h = started()
    gw = h.coordinator.gateway(0)
    h.coordinator.context.fail_job("boom")
    h.run()
    refused = gw.send_events(["x", "y"])
    h.run()
    assert [type(f.exception(timeout=0)) for f in refused] == [CoordinatorFenced, CoordinatorFenced]


def test_a_retry_whose_first_attempt_failed_silently_runs_the_failure_sequence() -> None:
    # Regression: a first attempt registers with its first event; one that failed before
    # sending anything never registered, and its retry was taken for a fresh attempt, so a
    # per-subtask coordinator kept sending into the failed attempt's epoch unaware.
    h = CoordinatorHarness(PerSubtaskRecorder, 2)
    h.start()
    future = h.trigger_checkpoint()
    h.run()
    h.coordinator.results[0].set_result(None)
    seal(h, future)
    held = h.coordinator.gateway(0).send_event("sent while attempt 0 ran")
    h.run()
    from sparkcoord.core.ids import SubtaskId, TaskAttempt

    retry = TaskAttempt(h.service.run_id, SubtaskId(h.name, 0), h.epoch, 1)
    assert h.service.inbox.attempt_registered(retry).execution_attempt == 1
    h.run()
    assert h.coordinator.calls[-3:] == [("failed", 0, 0), ("subtask_reset", 0, 0), ("ready", 0, 1)]
    assert isinstance(held.exception(timeout=0), AttemptNoLongerLive)
