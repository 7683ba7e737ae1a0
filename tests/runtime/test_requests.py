"""Requests inside the running batch: logged, answered once, adopted by retries, replayed.

Deterministic: the coordinator harness (a real service on manual mailboxes and clock, storage
in memory). Each test is one scenario of docs/decisions/036-requests-in-the-batch.md.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import pytest

from sparkcoord import OperatorCoordinator, RequestFailed, RequestRefused
from sparkcoord.core.entries import RegistrationEntry, RequestEntry, ResponseEntry
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.restore import RestorePoint
from sparkcoord.testing import CoordinatorHarness, InputRefused


class IdIssuer(OperatorCoordinator):
    """Hands out unique ids; announces each to the next subtask (another subtask acts on it)."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.next_id = 0
        self.asked: list[tuple[int, int, Any]] = []
        self.events: list[tuple[int, Any]] = []
        self.parked: list[tuple[Future[Any], int]] = []
        self.resets = 0

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.resets += 1
        self.next_id = state or 0

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.events.append((subtask, event))

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        self.asked.append((subtask, attempt, request))
        if request == "refuse":
            refused: Future[Any] = Future()
            refused.set_exception(ValueError("no ids for you"))
            return refused
        answer = self.next_id
        self.next_id += 1
        self.gateway((subtask + 1) % self.context.parallelism).send_event(("taken", answer))
        if request == "later":
            fut: Future[Any] = Future()
            self.parked.append((fut, answer))
            return fut
        return answer

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result(self.next_id)


def running(parallelism: int = 2, url: str | None = None) -> CoordinatorHarness:
    h = CoordinatorHarness(IdIssuer, parallelism, storage_url=url)
    h.start()
    h.checkpoint()  # epoch 0 sealed: its batch runs
    return h


def log_of(h: CoordinatorHarness, epoch: int | None = None) -> list[Any]:
    epoch = h.epoch if epoch is None else epoch
    return h.storage.read_uncommitted_inbound_log(epoch)


def test_a_request_is_logged_before_the_coordinator_sees_it_and_its_answer_before_the_task() -> None:
    h = running()
    answer = h.ask_from_subtask(0, "id please")
    assert answer.result() == 0
    entries = log_of(h)
    kinds = [type(e) for e in entries]
    assert kinds == [RegistrationEntry, RequestEntry, ResponseEntry]
    assert entries[2].seq == entries[1].seq == 0 and not entries[2].failed
    assert h.coordinator.asked == [(0, 0, "id please")]


def test_an_answer_given_later_from_another_thread_reaches_the_task_after_it_is_logged() -> None:
    h = running()
    answer = h.ask_from_subtask(1, "later")
    assert not answer.done()
    assert [type(e) for e in log_of(h)] == [RegistrationEntry, RequestEntry]
    fut, value = h.coordinator.parked.pop()
    worker = threading.Thread(target=fut.set_result, args=(value,))
    worker.start()
    worker.join()
    assert answer.result(timeout=5) == value
    assert isinstance(log_of(h)[-1], ResponseEntry)


def test_a_refused_request_raises_the_coordinators_reason_and_is_logged_as_refused() -> None:
    h = running()
    with pytest.raises(RequestRefused, match="no ids for you"):
        h.ask_from_subtask(0, "refuse").result()
    assert log_of(h)[-1].failed


def test_the_default_coordinator_refuses_requests_naming_what_to_implement() -> None:
    h = CoordinatorHarness(OperatorCoordinator, 1)
    h.start()
    h.checkpoint()
    with pytest.raises(RequestRefused, match="implement handle_request"):
        h.ask_from_subtask(0, "anything").result()


def test_events_and_requests_share_one_sequence_without_gaps() -> None:
    h = running()
    h.send_from_subtask(0, "e0")
    assert h.request_from_subtask(0, "q1") == 0
    h.send_from_subtask(0, "e2")
    with pytest.raises(RequestFailed, match="arrived before item 3"):
        h.ask_from_subtask(0, "q4", seq=4).result()
    assert [(type(e).__name__, getattr(e, "seq", None)) for e in log_of(h)][1:] == [
        ("EventEntry", 0), ("RequestEntry", 1), ("ResponseEntry", 1), ("EventEntry", 2)]


def test_a_request_asked_again_gets_the_logged_answer_without_asking_the_coordinator() -> None:
    h = running()
    assert h.request_from_subtask(0, "id") == 0
    # the answer was lost on the way: the task asks item 0 again
    assert h.request_from_subtask(0, "id", seq=0) == 0
    assert len(h.coordinator.asked) == 1


def test_a_retry_after_a_request_adopts_the_history_instead_of_resetting_the_coordinator() -> None:
    """The trace of docs/protocol.md [retry-adopts-history-once-answered]: s asks and gets X,
    t asks and gets Y (because X is taken), s's task fails. A reset would replay only t's
    request and answer X to it again; the retry instead continues s's history: it gets X from
    the log, and t's Y stays true."""
    h = running()
    coordinator = h.coordinator
    h.send_from_subtask(0, "started")
    x = h.request_from_subtask(0, "next")
    y = h.request_from_subtask(1, "next")
    decision = h.retry_task(0)
    assert decision.adopted and decision.replaced is not None
    assert h.coordinator is coordinator and coordinator.resets == 1  # no reset
    # the retry re-sends its history: a duplicate event, then the logged answer
    assert h.send_from_subtask(0, "started").verdict.name == "DUPLICATE"
    assert h.request_from_subtask(0, "next") == x
    assert h.request_from_subtask(0, "after") == 2  # and continues it
    assert (x, y) == (0, 1)
    assert coordinator.events == [(0, "started")]
    assert [a[2] for a in coordinator.asked] == ["next", "next", "after"]


def test_a_retry_whose_request_differs_from_the_logged_one_fails_the_job_naming_it() -> None:
    h = running()
    h.request_from_subtask(0, "next")
    h.retry_task(0)
    with pytest.raises(RequestFailed, match="nondeterministic subtask"):
        h.ask_from_subtask(0, "something else").result()
    failure = h.service.failure or ""
    assert "coordinator[0]" in failure and "item 0 of epoch 0" in failure
    assert "different bytes" in failure


def test_a_retry_that_sends_an_event_where_a_request_was_logged_fails_the_job() -> None:
    h = running()
    h.request_from_subtask(0, "next")
    h.retry_task(0)
    with pytest.raises(InputRefused, match="it was a request"):
        h.send_from_subtask(0, "next")
    assert "nondeterministic subtask" in (h.service.failure or "")


def test_a_retry_waits_for_the_answer_its_failed_attempt_was_still_waiting_for() -> None:
    h = running()
    first = h.ask_from_subtask(0, "later")
    h.retry_task(0)
    dead = TaskAttempt(h.service.run_id, SubtaskId(h.name, 0), h.epoch, 0)
    late = h.service.inbox.request_received(dead, 0, h.service.codec.encode("later"))
    with pytest.raises(RequestFailed, match="not the live attempt"):
        late.result(timeout=1)  # the failed attempt itself is refused from now on
    again = h.ask_from_subtask(0, "later")
    assert not again.done()
    fut, value = h.coordinator.parked.pop()
    fut.set_result(value)
    h.run()
    assert again.result(timeout=5) == value
    assert first.result(timeout=5) == value
    assert len(h.coordinator.asked) == 1


def test_a_retry_in_an_epoch_without_requests_still_resets_the_coordinator() -> None:
    h = running()
    before = h.coordinator
    h.send_from_subtask(0, "a")
    h.send_from_subtask(1, "b")
    decision = h.retry_task(0)
    assert not decision.adopted
    assert h.coordinator is not before  # a fresh instance, reset to the epoch's snapshot
    assert h.coordinator.events == [(1, "b")]  # the other subtask's event, replayed


def test_a_global_failure_fails_every_task_waiting_for_an_answer() -> None:
    h = running()
    waiting = h.ask_from_subtask(0, "later")
    h.service.fail_job("the driver side broke")
    h.run()
    with pytest.raises(RequestFailed, match="the driver side broke"):
        waiting.result(timeout=1)


def test_a_restore_after_the_batch_committed_hands_the_logged_requests_to_the_coordinator_again() -> None:
    h = running()
    url = h.storage_url
    assert h.request_from_subtask(0, "a") == 0
    assert h.request_from_subtask(1, "b") == 1
    epoch = h.epoch
    h.commit()
    h.service.close()
    again = CoordinatorHarness(IdIssuer, 2, storage_url=url)
    again.start(RestorePoint(epoch, committed=True))
    assert [a[2] for a in again.coordinator.asked] == ["a", "b"]
    assert again.coordinator.next_id == 2  # the ids handed out stay handed out
    assert again.service.failure is None


class Forgetful(IdIssuer):
    """Answers from a counter it does not checkpoint: a replay gives different answers."""

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.next_id = 100 if state is not None or checkpoint_id >= 0 else 0


def test_a_coordinator_that_answers_a_replayed_request_differently_fails_the_job() -> None:
    h = CoordinatorHarness(Forgetful, 1)
    h.start()
    h.checkpoint()
    epoch = h.epoch
    assert h.request_from_subtask(0, "a") == 0
    h.commit()
    h.checkpoint()  # epoch 1: state 101
    h.request_from_subtask(0, "b")
    h.commit()
    h.service.close()
    again = CoordinatorHarness(Forgetful, 1, storage_url=h.storage_url)
    again.service.restore(RestorePoint(epoch + 1, committed=True))
    again.run()
    failure = again.service.failure or ""
    assert "nondeterministic coordinator" in failure and "request 0 of coordinator[0]" in failure


def test_a_batch_that_runs_again_after_a_crash_gets_the_answers_its_first_run_logged() -> None:
    h = running()
    url = h.storage_url
    h.send_from_subtask(0, "ev")  # an event of subtask 0, then its request
    assert h.request_from_subtask(0, "a") == 0
    assert h.request_from_subtask(1, "b") == 1
    pending = h.ask_from_subtask(1, "later")  # the driver dies before this one is answered
    assert not pending.done()
    epoch = h.epoch
    h.service.close()  # the driver died; Spark logged the epoch, nothing committed
    rerun = CoordinatorHarness(IdIssuer, 2, storage_url=url)
    rerun.service.restore(RestorePoint(epoch, committed=False))
    rerun.run()
    coordinator = rerun.coordinator
    # restored to snapshot 0 and handed the kept history again, in log order
    assert coordinator.events == [(0, "ev")]
    assert [a[2] for a in coordinator.asked] == ["a", "b", "later"]
    # the batch's new tasks re-send and re-ask: every answer is the logged one
    assert rerun.send_from_subtask(0, "ev").verdict.name == "DUPLICATE"
    assert rerun.request_from_subtask(0, "a") == 0
    assert rerun.request_from_subtask(1, "b") == 1
    later = rerun.ask_from_subtask(1, "later")
    fut, value = coordinator.parked.pop()
    fut.set_result(value)
    rerun.run()
    assert later.result(timeout=5) == value == 2
    assert len(coordinator.asked) == 3


class Silent(OperatorCoordinator):
    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.events: list[Any] = []

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.events.append(event)


def test_a_batch_that_runs_again_drops_the_events_of_operators_that_answered_no_request() -> None:
    import uuid

    from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec
    from sparkcoord.runtime.storage import CheckpointStorage
    from sparkcoord.testing import ManualClock, ManualMailboxes

    url = f"memory://sparkcoord-test/{uuid.uuid4().hex}"

    def service() -> tuple[CoordinationService, ManualMailboxes]:
        boxes = ManualMailboxes()
        svc = CoordinationService([CoordinatorSpec("ids", IdIssuer, 1),
                                   CoordinatorSpec("plain", Silent, 1)],
                                  CheckpointStorage(url), clock=ManualClock(),
                                  mailbox_factory=boxes)
        return svc, boxes

    from sparkcoord.core.restore import FRESH
    svc, boxes = service()
    svc.restore(FRESH)
    boxes.run_all()
    fut = svc.trigger_checkpoint(0)
    boxes.run_all()
    svc.seal(fut.result())
    codec = svc.codec
    ids = TaskAttempt(svc.run_id, SubtaskId("ids", 0), 0, 0)
    plain = TaskAttempt(svc.run_id, SubtaskId("plain", 0), 0, 0)
    svc.inbox.attempt_registered(ids)
    svc.inbox.attempt_registered(plain)
    svc.inbox.event_received(plain, 0, codec.encode("plain event"))
    svc.inbox.request_received(ids, 0, codec.encode("q"))
    boxes.run_all()
    svc.close()
    again, boxes = service()
    again.restore(RestorePoint(0, committed=False))
    boxes.run_all()
    assert again.holders["plain"].coordinator.events == []  # type: ignore[union-attr]
    kept = again.storage.read_uncommitted_inbound_log(0)
    assert {e.attempt.subtask.operator for e in kept} == {"ids"}


# ------------------------------------------------- a retry that asks less (decision 47)
class ReturningIssuer(IdIssuer):
    """An id issuer that takes ids back: a withdrawn request's id is handed out again first."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.returned: list[int] = []
        self.withdrawals: list[tuple[int, list[Any]]] = []

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.resets += 1
        self.next_id, self.returned = state or (0, [])
        self.returned = list(self.returned)

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        if self.returned and request != "later":
            self.asked.append((subtask, attempt, request))
            return self.returned.pop(0)
        return super().handle_request(subtask, attempt, request)

    def handle_items_withdrawn(self, subtask: int, attempt: int, withdrawn: list[Any]) -> None:
        self.withdrawals.append((subtask, withdrawn))
        for item in withdrawn:
            if item.is_request and item.answered:
                self.returned.append(item.answer)
            elif item.is_request:  # parked: its id was taken when it was asked
                self.returned.extend(v for f, v in self.parked if f.done() is False)
                self.parked.clear()
            else:
                self.events.remove((subtask, item.item))

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result((self.next_id, list(self.returned)))


def returning(url: str | None = None) -> CoordinatorHarness:
    h = CoordinatorHarness(ReturningIssuer, 2, storage_url=url)
    h.start()
    h.checkpoint()
    return h


def test_a_retry_that_asks_less_hands_the_answers_it_did_not_use_back_to_the_coordinator() -> None:
    h = returning()
    assert [h.request_from_subtask(0, "next") for _ in range(3)] == [0, 1, 2]
    h.send_from_subtask(0, "report")
    registered = h.retry_task(0)
    assert registered.adopted and registered.history_length == 4
    assert h.request_from_subtask(0, "next") == 0  # the retry's time budget allows one item
    decision = h.finish_task(0)
    assert decision.verdict.name == "ACCEPT"
    (subtask, withdrawn), = h.coordinator.withdrawals
    assert subtask == 0
    assert [(w.item, w.is_request, w.answered, w.answer) for w in withdrawn] == [
        ("next", True, True, 1), ("next", True, True, 2), ("report", False, False, None)]
    assert h.coordinator.events == []  # the withdrawn event's effect was undone
    # the ids the retry did not use are handed out again, to whoever asks next
    assert h.request_from_subtask(1, "next") == 1
    assert h.request_from_subtask(1, "next") == 2
    assert h.request_from_subtask(1, "next") == 3


def test_a_retry_that_sends_its_whole_history_withdraws_nothing() -> None:
    h = returning()
    h.request_from_subtask(0, "next")
    h.retry_task(0)
    h.request_from_subtask(0, "next")
    decision = h.finish_task(0)
    assert decision.verdict.name == "ACCEPT" and decision.withdrawn == ()
    assert h.finish_task(0).verdict.name == "DUPLICATE"  # a re-sent finish
    assert h.coordinator.withdrawals == []
    assert [type(e).__name__ for e in log_of(h)].count("FinishedEntry") == 1


def test_without_handle_items_withdrawn_a_retry_that_asks_less_fails_the_job_naming_it() -> None:
    h = running()
    h.request_from_subtask(0, "next")
    h.request_from_subtask(0, "next")
    h.retry_task(0)
    h.request_from_subtask(0, "next")
    with pytest.raises(InputRefused, match="the job failed"):
        h.finish_task(0)  # the task hears it before its batch can commit
    failure = h.service.failure or ""
    assert "WithdrawnNotHandled" in failure and "subtask 0" in failure
    assert "request 'next' answered 1" in failure
    assert "implement handle_items_withdrawn" in failure


def test_a_later_retry_that_asks_a_withdrawn_number_again_gets_a_new_answer() -> None:
    h = returning()
    assert h.request_from_subtask(0, "next") == 0
    assert h.request_from_subtask(0, "next") == 1
    h.retry_task(0)
    h.request_from_subtask(0, "next")
    h.finish_task(0)  # 1 is returned
    assert h.request_from_subtask(1, "next") == 1  # and taken by subtask 1
    # the finished attempt's task then failed (in its sink write): the next retry continues
    # the cut history and asks item 1 anew: it is no longer the logged answer 1
    second = h.retry_task(0)
    assert second.history_length == 1
    assert h.request_from_subtask(0, "next") == 0
    assert h.request_from_subtask(0, "next") == 2
    assert h.service.failure is None


def test_a_withdrawn_request_still_waiting_for_its_answer_is_never_answered() -> None:
    h = returning()
    assert h.request_from_subtask(0, "next") == 0
    waiting = h.ask_from_subtask(0, "later")  # parked: id 1
    h.retry_task(0)
    assert h.request_from_subtask(0, "next") == 0
    h.finish_task(0)
    (_, withdrawn), = h.coordinator.withdrawals
    assert [(w.item, w.answered) for w in withdrawn] == [("later", False)]
    assert h.coordinator.returned == [1]
    with pytest.raises(RequestFailed, match="not the live attempt|withdrawn"):
        waiting.result(timeout=1)
    assert not any(type(e).__name__ == "ResponseEntry" and e.seq == 1 for e in log_of(h))


def test_a_restore_replays_a_withdrawal_at_its_place_in_the_log() -> None:
    h = returning()
    url = h.storage_url
    assert [h.request_from_subtask(0, "next") for _ in range(2)] == [0, 1]
    h.retry_task(0)
    h.request_from_subtask(0, "next")
    h.finish_task(0)
    assert h.request_from_subtask(1, "next") == 1  # the returned id, after the withdrawal
    assert h.request_from_subtask(1, "next") == 2
    epoch = h.epoch
    h.commit()
    h.service.close()  # the driver dies after the commit
    again = CoordinatorHarness(ReturningIssuer, 2, storage_url=url)
    again.start(RestorePoint(epoch, committed=True))
    # the same answers in the same order (a replay without the withdrawal would answer
    # subtask 1 with 2 where 1 was logged, and fail the job as nondeterministic)
    assert again.service.failure is None
    coordinator = again.coordinator
    assert len(coordinator.withdrawals) == 1
    assert (coordinator.next_id, coordinator.returned) == (3, [])


def test_a_batch_that_runs_again_after_a_withdrawal_keeps_it() -> None:
    h = returning()
    url = h.storage_url
    assert [h.request_from_subtask(0, "next") for _ in range(3)] == [0, 1, 2]
    h.retry_task(0)
    h.request_from_subtask(0, "next")
    h.finish_task(0)
    epoch = h.epoch
    h.service.close()  # the driver dies inside the batch
    rerun = CoordinatorHarness(ReturningIssuer, 2, storage_url=url)
    rerun.service.restore(RestorePoint(epoch, committed=False))
    rerun.run()
    assert rerun.service.failure is None
    assert rerun.coordinator.returned == [1, 2]
    # the rerun's task of subtask 0 continues the cut history: it must register eagerly and
    # say at its end how much it sent
    assert rerun.service.inbox.history_length(SubtaskId(rerun.name, 0)) == 1
    registered = rerun.service.inbox.attempt_registered(
        TaskAttempt(rerun.service.run_id, SubtaskId(rerun.name, 0), epoch, 0))
    assert registered.adopted and registered.history_length == 1


def test_a_rerun_that_sends_less_than_a_finished_attempt_of_the_earlier_run_fails_the_job() -> None:
    """The first run's task finished (a sink may hold its output: Spark's file sink keeps a
    batch it committed when only the commit log was lost); the batch runs again after a
    crash and its task sends less: withdrawing would hand out again what the sink holds."""
    h = returning()
    url = h.storage_url
    assert [h.request_from_subtask(0, "next") for _ in range(2)] == [0, 1]
    h.finish_task(0)
    epoch = h.epoch
    h.service.close()  # the driver dies before Spark's commit log has the batch
    rerun = CoordinatorHarness(ReturningIssuer, 2, storage_url=url)
    rerun.service.restore(RestorePoint(epoch, committed=False))
    rerun.run()
    assert rerun.request_from_subtask(0, "next") == 0
    with pytest.raises(InputRefused, match="nondeterministic subtask"):
        rerun.finish_task(0)
    failure = rerun.service.failure or ""
    assert "a sink may hold that attempt's output" in failure and "after 1 items" in failure


def test_a_rerun_whose_earlier_attempt_never_finished_may_send_less() -> None:
    h = returning()
    url = h.storage_url
    assert [h.request_from_subtask(0, "next") for _ in range(2)] == [0, 1]
    epoch = h.epoch
    h.service.close()  # the driver dies while the task still runs: no sink holds its output
    rerun = CoordinatorHarness(ReturningIssuer, 2, storage_url=url)
    rerun.service.restore(RestorePoint(epoch, committed=False))
    rerun.run()
    assert rerun.request_from_subtask(0, "next") == 0
    assert rerun.finish_task(0).verdict.name == "ACCEPT"
    assert rerun.service.failure is None
    assert rerun.coordinator.returned == [1]


def test_a_rerun_that_sends_more_than_a_finished_attempt_of_the_earlier_run_fails_the_job() -> None:
    h = returning()
    url = h.storage_url
    assert h.request_from_subtask(0, "next") == 0
    h.finish_task(0)
    epoch = h.epoch
    h.service.close()
    rerun = CoordinatorHarness(ReturningIssuer, 2, storage_url=url)
    rerun.service.restore(RestorePoint(epoch, committed=False))
    rerun.run()
    assert rerun.request_from_subtask(0, "next") == 0
    with pytest.raises(RequestFailed, match="nondeterministic subtask"):
        rerun.ask_from_subtask(0, "next").result(timeout=1)
    assert "must send the same items" in (rerun.service.failure or "")


def _rerun(url: str, epoch: int) -> CoordinatorHarness:
    rerun = CoordinatorHarness(ReturningIssuer, 2, storage_url=url)
    rerun.service.restore(RestorePoint(epoch, committed=False))
    rerun.run()
    return rerun


def test_a_rerun_keeps_the_earlier_runs_bound_after_its_own_attempt_finished_and_was_retried() -> None:
    h = returning()
    assert [h.request_from_subtask(0, "next") for _ in range(3)] == [0, 1, 2]
    h.finish_task(0)  # run 1's task finished: a sink may hold its output
    epoch = h.epoch
    h.service.close()
    rerun = _rerun(h.storage_url, epoch)
    assert [rerun.request_from_subtask(0, "next") for _ in range(3)] == [0, 1, 2]
    rerun.finish_task(0)  # the same items: accepted
    rerun.retry_task(0)  # then its task failed (in its sink write): the retry sends less
    assert rerun.request_from_subtask(0, "next") == 0
    with pytest.raises(InputRefused, match="nondeterministic subtask"):
        rerun.finish_task(0)
    assert "after 3" in (rerun.service.failure or "")


def test_a_rerun_may_send_anything_when_its_earlier_runs_finished_attempt_was_retried() -> None:
    h = returning()
    assert [h.request_from_subtask(0, "next") for _ in range(2)] == [0, 1]
    h.finish_task(0)
    h.retry_task(0)  # the finished attempt's task failed after all: no sink holds its output
    assert h.request_from_subtask(0, "next") == 0
    assert h.request_from_subtask(0, "next") == 1
    epoch = h.epoch
    h.service.close()  # the driver dies before the retry finished
    rerun = _rerun(h.storage_url, epoch)
    assert rerun.request_from_subtask(0, "next") == 0
    assert rerun.finish_task(0).withdrawn[0].seq == 1  # withdrawn: no sink can hold it
    assert rerun.service.failure is None


def test_a_rerun_that_sends_fewer_events_than_a_finished_history_without_requests_fails_the_job(
        ) -> None:
    """Every attempt says when it finished (decision 76): a finished attempt's history is
    bound, with or without requests of its own, once its operator's log is kept."""
    h = returning()
    h.request_from_subtask(1, "next")  # the operator answered a request: its log is kept
    for event in ("e0", "e1", "e2"):
        h.send_from_subtask(0, event)
    h.finish_task(0)  # a sink may hold its output
    epoch = h.epoch
    h.service.close()
    rerun = _rerun(h.storage_url, epoch)
    rerun.send_from_subtask(0, "e0")
    with pytest.raises(InputRefused, match="nondeterministic subtask"):
        rerun.finish_task(0)
    assert "after 3" in (rerun.service.failure or "")


def test_a_rerun_continues_a_kept_history_whose_attempt_had_not_finished_when_the_driver_died(
        ) -> None:
    """Decision 75's deterministic job refused at every restart: subtask 1 asked (the log is
    kept), subtask 0 sent an event and the driver died before subtask 0 asked. Its history
    was counted as finished after 1 item, so the rerun's request was refused, run after run.
    Only a logged finish binds a rerun now."""
    h = returning()
    assert h.request_from_subtask(1, "next") == 0
    h.send_from_subtask(0, "e0")
    epoch = h.epoch
    h.service.close()  # the driver dies before subtask 0 asks
    rerun = _rerun(h.storage_url, epoch)
    rerun.send_from_subtask(0, "e0")
    assert rerun.request_from_subtask(0, "next") == 1
    assert rerun.finish_task(0).verdict.name == "ACCEPT"
    assert rerun.service.failure is None


def test_a_rerun_that_asks_where_an_earlier_runs_attempt_finished_without_asking_fails_the_job(
        ) -> None:
    """Decision 75's silent divergence: no subtask asked in the epoch, so the operator's log
    is not kept, yet subtask 0's attempt finished and a sink may hold its output (with no
    answer in it). Its finish is kept, and a rerun that asks now is refused loudly instead of
    taking work that the sink's output will never hold."""
    h = returning()
    h.send_from_subtask(0, "e0")
    h.finish_task(0)
    epoch = h.epoch
    h.service.close()  # the driver dies between the sink's commit and Spark's commit log
    rerun = _rerun(h.storage_url, epoch)
    rerun.send_from_subtask(0, "e0")
    with pytest.raises(RequestFailed):
        rerun.request_from_subtask(0, "next")
    assert "nondeterministic subtask" in (rerun.service.failure or "")
    assert "without asking any" in (rerun.service.failure or "")


def test_a_rerun_without_requests_may_send_other_events_than_the_finished_attempt_did() -> None:
    """Where no request was asked, the rerun's events replace the earlier run's
    (docs/protocol.md [rerun-keeps-answered-histories]: the log is truncated), as before: a sink
    task that writes files under new names reports other bytes in every run."""
    h = returning()
    h.send_from_subtask(0, "e0")
    h.finish_task(0)
    h.finish_task(1)  # a task that sent nothing says so too
    epoch = h.epoch
    h.service.close()
    rerun = _rerun(h.storage_url, epoch)
    for event in ("f0", "f1"):
        rerun.send_from_subtask(0, event)
    assert rerun.finish_task(0).verdict.name == "ACCEPT"
    assert rerun.finish_task(1).verdict.name == "ACCEPT"
    assert rerun.service.failure is None


def test_a_finish_without_a_request_still_binds_the_batch_after_a_second_restart() -> None:
    h = returning()
    h.finish_task(0)  # run 1: subtask 0 finished having sent nothing
    epoch = h.epoch
    h.service.close()
    run2 = _rerun(h.storage_url, epoch)
    assert run2.request_from_subtask(1, "next") == 0  # now the operator's log is kept
    run2.service.close()  # the driver dies again before subtask 0's task ran
    run3 = _rerun(h.storage_url, epoch)
    with pytest.raises(RequestFailed):
        run3.request_from_subtask(0, "next")
    assert "without asking any" in (run3.service.failure or "")


def test_a_registration_sent_again_is_told_the_history_length_again() -> None:
    h = returning()
    h.request_from_subtask(0, "next")
    h.request_from_subtask(0, "next")
    first = h.retry_task(0)
    again = h.service.inbox.attempt_registered(h.service.inbox.live_attempt(SubtaskId(h.name, 0)))
    assert (first.verdict.name, again.verdict.name) == ("ACCEPT", "DUPLICATE")
    assert first.history_length == again.history_length == 2


def test_a_finish_sent_again_waits_for_the_coordinator_to_take_the_items_back() -> None:
    h = returning()
    h.request_from_subtask(0, "next")
    h.retry_task(0)
    attempt = h.service.inbox.live_attempt(SubtaskId(h.name, 0))
    assert attempt is not None
    first = h.service.inbox.attempt_finished(attempt, 0)
    again = h.service.inbox.attempt_finished(attempt, 0)  # a reconnect re-sent it
    assert not first.done() and again is first  # not DUPLICATE before the callback ran
    h.run()
    assert first.result(timeout=0).verdict.name == "ACCEPT"
    assert h.coordinator.returned == [0]


def test_a_finish_a_retry_of_its_run_replaced_does_not_bind_the_rerun_without_requests() -> None:
    """Review finding (decision 76): the operator answered no request, subtask 0's attempt
    finished, its task then failed (its sink write) and a retry registered; the driver died.
    The kept log held the finish without the retry's registration, so every rerun that asked
    was refused. No sink can hold a replaced attempt's output: nothing binds the rerun."""
    h = returning()
    h.send_from_subtask(0, "e0")
    h.finish_task(0)
    h.retry_task(0)
    epoch = h.epoch
    h.service.close()
    for _ in range(2):  # and again after a second restart
        rerun = _rerun(h.storage_url, epoch)
        rerun.send_from_subtask(0, "e0")
        assert rerun.request_from_subtask(0, "next") == 0
        assert rerun.service.failure is None
        rerun.service.close()
