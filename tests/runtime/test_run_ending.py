"""The end of an availableNow run waits for the coordinators' side effects (run_ending).

``CoordinationService.run_ending`` asks every coordinator, on its mailbox, for a future
(``OperatorCoordinator.run_ending``; None: nothing to wait for) and waits for all of them up
to ``ServiceConfig.run_end_wait_s``; one that fails or is not done by then fails the job,
naming the coordinator. Real thread mailboxes (the service blocks its caller while the
mailboxes run) and storage in memory; the ordering test on the holder also runs on manual
mailboxes. Waits on events and futures; only the timeout test waits out a (short) time.
"""

from __future__ import annotations

import functools
import threading
import uuid
from concurrent.futures import Future
from typing import Any

import pytest

from sparkcoord import OperatorCoordinator
from sparkcoord.core.restore import FRESH
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec, JobFailed
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.testing import CoordinatorHarness


class Quiet(OperatorCoordinator):
    """Nothing to wait for at the end of a run (the default ``run_ending``)."""


class Ending(OperatorCoordinator):
    """Records its callbacks; ``run_ending`` returns ``self.pending`` (or what ``make`` gives)."""

    def __init__(self, context: Any, journal: list[tuple[Any, ...]] | None = None,
                 make: Any = None) -> None:
        super().__init__(context)
        self.journal = journal if journal is not None else []
        self.pending: Future[None] = Future()
        self.asked = threading.Event()
        self._make = make

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.journal.append(("complete", checkpoint_id))

    def run_ending(self) -> Future[None] | None:
        self.journal.append(("run_ending",))
        self.asked.set()
        return self._make(self) if self._make is not None else self.pending


def service_after_one_batch(*specs: CoordinatorSpec,
                            run_end_wait_s: float = 300.0) -> CoordinationService:
    """An availableNow service on thread mailboxes whose batch of epoch 0 committed."""
    service = CoordinationService(
        list(specs), CheckpointStorage(f"memory://sparkcoord-run-ending/{uuid.uuid4().hex}"),
        config=ServiceConfig(run_end_wait_s=run_end_wait_s), available_now=True)
    service.restore(FRESH)
    assert service.checkpoint(0) is not None
    service.batch_committed(0)
    return service


def instance(service: CoordinationService, name: str) -> Ending:
    coordinator = service.holders[name].coordinator
    assert isinstance(coordinator, Ending)
    return coordinator


def in_a_thread(action: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_run_ending_returns_at_once_when_every_coordinator_has_nothing_to_wait_for() -> None:
    service = service_after_one_batch(CoordinatorSpec("a", Quiet, 1),
                                      CoordinatorSpec("b", Quiet, 2))
    try:
        # run_end_wait_s is 300 s: a wait would show as a thread still running after 30 s
        thread, errors = in_a_thread(service.run_ending)
        thread.join(30)
        assert not thread.is_alive() and errors == []
        assert service.failure is None
    finally:
        service.close()


def test_run_ending_waits_until_a_coordinators_future_completes() -> None:
    service = service_after_one_batch(CoordinatorSpec("quiet", Quiet, 1),
                                      CoordinatorSpec("sink", Ending, 1))
    try:
        sink = instance(service, "sink")
        thread, errors = in_a_thread(service.run_ending)
        assert sink.asked.wait(30)
        assert thread.is_alive()  # its future is not done: run_ending cannot have returned
        # completed from a thread that is neither the driver's nor the mailbox's
        completer = threading.Thread(target=lambda: sink.pending.set_result(None))
        completer.start()
        completer.join(30)
        thread.join(30)
        assert not thread.is_alive() and errors == []
        assert service.failure is None
    finally:
        service.close()


def failed_with(error: BaseException) -> Any:
    """An ``Ending`` ``make`` whose future has failed with ``error``."""
    def make(coordinator: Ending) -> Future[None]:
        fut: Future[None] = Future()
        fut.set_exception(error)
        return fut
    return make


def test_a_run_ending_future_that_fails_fails_the_job_naming_the_coordinator() -> None:
    service = service_after_one_batch(
        CoordinatorSpec("quiet", Quiet, 1),
        CoordinatorSpec("sink", functools.partial(
            Ending, make=failed_with(OSError("the table's commit was refused"))), 1))
    try:
        with pytest.raises(JobFailed, match="coordinator 'sink'") as raised:
            service.run_ending()
        failure = service.failure
        assert failure is not None and str(raised.value) == failure
        assert failure.startswith("coordinator 'sink': ")
        assert "failed as the availableNow run ended" in failure
        assert "the table's commit was refused" in failure and "OSError" in failure
        with pytest.raises(JobFailed):
            service.raise_if_failed()
    finally:
        service.close()


def test_a_run_ending_future_not_done_within_run_end_wait_s_fails_the_job_naming_the_coordinator(
) -> None:
    service = service_after_one_batch(CoordinatorSpec("quiet", Quiet, 1),
                                      CoordinatorSpec("sink", Ending, 1), run_end_wait_s=0.2)
    try:
        with pytest.raises(JobFailed, match="coordinator 'sink'") as raised:
            service.run_ending()
        failure = service.failure
        assert failure is not None and str(raised.value) == failure
        assert failure.startswith("coordinator 'sink': ")
        assert "were not done 0.2 s after the availableNow run's last batch committed" in failure
        assert "run again after a restart" in failure
        assert not instance(service, "sink").pending.done()
    finally:
        service.close()


class RaisingAtTheEnd(OperatorCoordinator):
    def run_ending(self) -> Future[None] | None:
        raise OSError("cannot reach the table")


def test_a_coordinator_that_raises_in_run_ending_makes_the_run_fail_not_end_as_done() -> None:
    service = service_after_one_batch(CoordinatorSpec("sink", RaisingAtTheEnd, 1))
    try:
        with pytest.raises(JobFailed, match="coordinator 'sink' raised in run_ending"):
            service.run_ending()
    finally:
        service.close()


def test_a_coordinators_own_timeout_error_is_reported_as_its_failure_not_as_our_deadline(
) -> None:
    service = service_after_one_batch(CoordinatorSpec("sink", functools.partial(
        Ending, make=failed_with(TimeoutError("the catalog did not answer"))), 1))
    try:
        with pytest.raises(JobFailed, match="failed as the availableNow run ended") as raised:
            service.run_ending()
        assert "the catalog did not answer" in str(raised.value)
    finally:
        service.close()


def test_the_last_batchs_completion_reaches_the_coordinator_before_run_ending() -> None:
    journal: list[tuple[Any, ...]] = []

    def nothing_pending(coordinator: Ending) -> None:
        return None

    service = service_after_one_batch(
        CoordinatorSpec("sink", functools.partial(Ending, journal=journal,
                                                  make=nothing_pending), 1))
    try:
        assert service.checkpoint(1) is not None
        service.batch_committed(1)  # the run's last batch: its notice is queued first
        service.run_ending()
        assert journal == [("complete", 0), ("complete", 1), ("run_ending",)]
        assert service.failure is None
    finally:
        service.close()


def test_the_holder_queues_run_ending_behind_the_completion_notice_on_the_mailbox() -> None:
    journal: list[tuple[Any, ...]] = []
    h = CoordinatorHarness(functools.partial(Ending, journal=journal), 1, available_now=True)
    h.start()
    h.checkpoint()
    h.service.batch_committed(h.epoch)  # queued on the mailbox, not run yet
    done = h.service.holders[h.name].run_ending()
    assert journal == [] and not done.done()
    h.run()
    assert journal == [("complete", 0), ("run_ending",)]
    coordinator = h.coordinator
    assert isinstance(coordinator, Ending)
    assert not done.done()  # waits for the coordinator's future
    coordinator.pending.set_result(None)
    assert done.result(timeout=0) is None


class _Restored(OperatorCoordinator):
    seen: list[tuple[int, bool]] = []

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.seen.append((checkpoint_id, self.context.restored_committed))


@pytest.mark.parametrize("committed", [True, False])
def test_a_coordinator_is_told_whether_its_restore_points_batch_had_committed(
        committed: bool) -> None:
    from sparkcoord.core.restore import RestorePoint

    h = CoordinatorHarness(_Restored, 1)
    h.start()
    assert h.coordinator.context.restored_committed is False  # a fresh start
    assert h.checkpoint() is not None
    epoch = h.epoch
    if committed:
        h.commit()
    h.service.close()
    _Restored.seen.clear()
    again = CoordinatorHarness(_Restored, 1, storage_url=h.storage_url)
    again.start(RestorePoint(epoch, committed=committed))
    assert _Restored.seen == [(epoch, committed)]
