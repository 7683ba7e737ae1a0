"""A coordinator instance that failed gets no further callback (issue 11, holder rule 5).

Deterministic: manual mailboxes and clock. The first test is the case found by a user: a
callback that raises while the logged inbound events are replayed after a restore used to
leave the failed instance receiving the rest of the replay and then
``notify_checkpoint_complete``, in a state that matches no checkpoint.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from sparkcoord import OperatorCoordinator
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.restore import RestorePoint
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.testing import CoordinatorHarness, InputRefused, ManualClock, ManualMailboxes


class Journal(OperatorCoordinator):
    """Appends every callback it gets to a shared journal; raises on the configured event."""

    def __init__(self, context: Any, journal: list[tuple[Any, ...]], raise_on: str | None = None,
                 name: str = "") -> None:
        super().__init__(context)
        self.journal = journal
        self.raise_on = raise_on
        self.name = name
        self.seen: list[Any] = []

    def _note(self, *call: Any) -> None:
        self.journal.append((self.name, *call) if self.name else call)

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.seen = list(state or [])
        self._note("reset", checkpoint_id)

    def start(self) -> None:
        self._note("start")

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self._note("handle", event)
        if event == self.raise_on:
            raise ValueError(f"cannot handle {event!r}")
        self.seen.append(event)

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        self._note("checkpoint", checkpoint_id)
        result.set_result(list(self.seen))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._note("complete", checkpoint_id, list(self.seen))

    def close(self) -> None:
        self._note("close")


def journal_in_a_running_batch(journal: list[tuple[Any, ...]],
                               raise_on: str | None = "boom") -> CoordinatorHarness:
    """A started harness of one Journal coordinator with epoch 0 sealed (its batch running)."""
    h = CoordinatorHarness(functools.partial(Journal, journal=journal, raise_on=raise_on), 1)
    h.start()
    h.checkpoint()
    return h


def test_a_callback_that_raises_during_the_replay_gets_no_further_event_and_no_completion(
        tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ckpt"
    first: list[tuple[Any, ...]] = []
    run1 = CoordinatorHarness(functools.partial(Journal, journal=first), 1, storage_url=url)
    run1.start()
    run1.checkpoint()
    for event in ("a", "boom", "c"):
        run1.send_from_subtask(0, event)
    run1.commit()
    assert ("complete", 0, ["a", "boom", "c"]) in first
    run1.service.close()

    second: list[tuple[Any, ...]] = []
    run2 = CoordinatorHarness(functools.partial(Journal, journal=second, raise_on="boom"), 1,
                              storage_url=url)
    run2.start(RestorePoint(0, committed=True))

    assert second == [("reset", 0), ("start",), ("handle", "a"), ("handle", "boom"), ("close",)]
    failure = run2.service.failure
    assert failure is not None
    assert failure.startswith("coordinator 'coordinator' raised in handle_event_from_operator(): "
                              "ValueError(\"cannot handle 'boom'\")")
    # the user's own traceback, from the user's frame on
    assert "Traceback (most recent call last)" in failure
    assert "in handle_event_from_operator" in failure and 'raise ValueError(f"cannot handle' in failure


def test_a_live_callback_that_raises_gets_none_of_the_events_after_it_nor_checkpoints_nor_completions(
) -> None:
    journal: list[tuple[Any, ...]] = []
    h = journal_in_a_running_batch(journal)
    # one burst: the three events reach the mailbox as one action
    attempt = h._attempt(0)
    codec = h.service.codec
    h.service.inbox.event_runs_received([(attempt, 0, tuple(codec.encode(e) for e in ("a", "boom", "c")))])
    h.service.batch_committed(h.epoch)  # queued behind the failing action
    h.run()
    assert [c for c in journal if c[0] in ("handle", "complete", "checkpoint", "close")] == [
        ("checkpoint", 0), ("handle", "a"), ("handle", "boom"), ("close",)]
    assert h.service.failure is not None and "'boom'" in h.service.failure


def test_timers_and_actions_of_a_failed_instance_do_not_run() -> None:
    ticks: list[float] = []

    class Ticking(OperatorCoordinator):
        def start(self) -> None:
            self.context.call_periodically(1.0, lambda: ticks.append(1.0))

        def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
            self.context.run_in_coordinator_thread(lambda: ticks.append(-1.0))
            raise RuntimeError("broken")

    h = CoordinatorHarness(Ticking, 1)
    h.start()
    h.checkpoint()
    h.clock.advance(1.0)
    h.run()
    assert ticks == [1.0]
    h.send_from_subtask(0, "x")  # queues an action, then raises
    h.clock.advance(5.0)
    h.run()
    assert ticks == [1.0]
    assert h.service.failure is not None and "broken" in h.service.failure


def test_fail_job_inside_a_callback_fences_at_once_and_closes_after_the_callback_returned() -> None:
    journal: list[tuple[Any, ...]] = []

    class Quitter(Journal):
        def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
            self.context.fail_job("giving up")
            self._note("after fail_job", self.context.is_coordinator_thread())

    h = CoordinatorHarness(functools.partial(Quitter, journal=journal), 1)
    h.start()
    h.checkpoint()
    h.send_from_subtask(0, "x")
    with pytest.raises(InputRefused, match="the job failed: coordinator 'coordinator' called fail_job"):
        h.send_from_subtask(0, "y")
    h.service.batch_committed(h.epoch)
    h.run()
    tail = journal[journal.index(("checkpoint", 0)) + 1:]
    assert tail == [("after fail_job", True), ("close",)]
    assert "called fail_job: giving up" in (h.service.failure or "")


def test_a_global_failure_of_one_coordinator_fences_the_others_before_their_queued_callbacks() -> None:
    journal: list[tuple[Any, ...]] = []
    mailboxes = ManualMailboxes()
    service = CoordinationService(
        [CoordinatorSpec("a", functools.partial(Journal, journal=journal, raise_on="boom", name="a"), 1),
         CoordinatorSpec("b", functools.partial(Journal, journal=journal, name="b"), 1)],
        CheckpointStorage("memory://sparkcoord-fencing/two"), clock=ManualClock(),
        mailbox_factory=mailboxes)
    service.restore(RestorePoint(-1, committed=True))
    mailboxes.run_all()
    future = service.trigger_checkpoint(0)
    mailboxes.run_all()
    service.seal(future.result())
    mailboxes.run_all()
    attempt = TaskAttempt(service.run_id, SubtaskId("a", 0), 0, 0)
    service.inbox.attempt_registered(attempt)
    service.inbox.event_received(attempt, 0, service.codec.encode("boom"))
    service.batch_committed(0)  # a completion notice queued on both mailboxes
    box_a, box_b = mailboxes.all
    box_a.run_all()  # a fails here: b is fenced before its queued notice runs
    box_b.run_all()
    assert ("b", "complete", 0, []) not in journal
    assert [c for c in journal if c[0] == "b"][-1] == ("b", "close")
    assert service.failure is not None and "'a'" in service.failure


def test_a_checkpoint_future_completed_by_a_failed_instance_from_another_thread_seals_nothing(
) -> None:
    class Slow(OperatorCoordinator):
        def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
            self.pending = result

        def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
            raise RuntimeError("broken")

    h = CoordinatorHarness(Slow, 1)
    h.start()
    instance = h.coordinator
    assert isinstance(instance, Slow)
    future = h.trigger_checkpoint()
    h.run()
    pending = instance.pending
    h.service.fail_job("a Spark-side error")
    h.run()
    thread = threading.Thread(target=lambda: pending.set_result("state of a failed instance"))
    thread.start()
    thread.join()
    h.run()
    assert future.exception(timeout=0) is not None
    assert h.service.last_sealed == -1


def test_a_failed_instance_is_closed_even_when_the_holder_closes_before_its_deferred_close_ran(
) -> None:
    journal: list[tuple[Any, ...]] = []
    h = journal_in_a_running_batch(journal)
    attempt = h._attempt(0)
    h.service.inbox.event_received(attempt, 0, h.service.codec.encode("boom"))  # queued, not run
    h.service.holders[h.name].close()  # queued behind it, from outside the mailbox
    h.run()  # the failure queues close() for after the callback; the holder closes first
    assert journal.count(("close",)) == 1


def test_the_failure_is_recorded_before_it_is_published(monkeypatch) -> None:
    h = CoordinatorHarness(OperatorCoordinator, 1)
    h.start()
    seen_at_write: list[str | None] = []
    record = h.storage.record_failure

    def recording(run_id: str, cause: str) -> None:
        seen_at_write.append(h.service.failure)
        record(run_id, cause)

    monkeypatch.setattr(h.storage, "record_failure", recording)
    h.service.fail_job("from the Spark side")
    assert seen_at_write == [None]  # nobody could see the failure before its report existed
    assert h.service.failure == "from the Spark side"
    import json

    report = json.loads(h.storage.files.read(h.storage.failure_path()))
    assert report == {"run": h.service.run_id, "cause": "from the Spark side"}


def test_a_seal_that_cannot_be_written_fails_the_job_naming_the_epoch(monkeypatch) -> None:
    h = CoordinatorHarness(OperatorCoordinator, 1)
    h.start()
    h.checkpoint()

    def broken(epoch: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(h.storage, "seal_inbound_log", broken)
    try:
        h.service.batch_committed(h.epoch)
    except OSError:
        pass
    else:
        raise AssertionError("the seal error was swallowed")
    assert h.service.failure is not None
    assert h.service.failure.startswith("cannot write the seal of the inbound log of epoch 0: "
                                        "OSError('disk full')")


def test_a_coordinator_whose_init_skips_the_base_init_fails_the_job_saying_so() -> None:
    from sparkcoord.coordinator import OperatorCoordinator
    from sparkcoord.testing import CoordinatorHarness

    class Forgetful(OperatorCoordinator):
        def __init__(self, context: object) -> None:  # no super().__init__(context)
            self.count = 0

    h = CoordinatorHarness(Forgetful, 1)
    h.start()
    assert h.service.failure is not None
    assert "must call super().__init__(context) first" in h.service.failure
    assert "Forgetful" in h.service.failure
