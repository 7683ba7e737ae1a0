"""``CoordinatorContext.call_async`` and the workers behind it (runtime/workers.py): I/O off the
mailbox, its result back on it, a failure failing the job; lanes one work at a time."""

from __future__ import annotations

import threading
from typing import Any

from sparkcoord.coordinator import OperatorCoordinator
from sparkcoord.runtime.workers import ThreadWorkers
from sparkcoord.testing import CoordinatorHarness, ManualWorkers


class Asking(OperatorCoordinator):
    """Hands a work to ``call_async`` per client request ``("work", value, lane)``; a value
    that is an exception is raised by the work. Records where each part ran."""

    def __init__(self, context: Any, handled: bool = True) -> None:
        super().__init__(context)
        self.handled = handled
        self.results: list[tuple[Any, Any]] = []
        self.work_on_mailbox: list[bool] = []
        self.handler_on_mailbox: list[bool] = []

    def handle_client_request(self, request: Any) -> Any:
        _, value, lane = request

        def work() -> Any:
            self.work_on_mailbox.append(self.context.is_coordinator_thread())
            if isinstance(value, BaseException):
                raise value
            return value

        def handler(result: Any, error: BaseException | None) -> None:
            self.handler_on_mailbox.append(self.context.is_coordinator_thread())
            self.results.append((result, error))

        self.context.call_async(work, handler if self.handled else None, lane=lane)
        return True


def started(workers: ManualWorkers | None = None, handled: bool = True) -> CoordinatorHarness:
    h = CoordinatorHarness(lambda context: Asking(context, handled), 1,
                           workers=workers or ManualWorkers())
    h.start()
    h.checkpoint()  # client requests are taken once an epoch was sealed
    return h


def test_a_work_runs_off_the_mailbox_and_its_result_comes_back_on_the_mailbox() -> None:
    h = started()
    h.ask_as_client(("work", 41, "io"))
    h.run()
    coordinator = h.coordinator
    assert isinstance(coordinator, Asking)
    assert coordinator.results == [] and len(h.workers.queued("io")) == 1  # not yet run
    assert h.workers.run_all("io") == 1
    assert coordinator.work_on_mailbox == [False]
    assert coordinator.results == []  # the handler waits for the mailbox
    h.run()
    assert coordinator.results == [(41, None)] and coordinator.handler_on_mailbox == [True]


def test_a_failing_work_hands_its_error_to_the_handler_and_the_job_goes_on() -> None:
    h = started()
    h.ask_as_client(("work", OSError("the server went away"), "io"))
    h.run()
    h.workers.run_all()
    h.run()
    coordinator = h.coordinator
    assert isinstance(coordinator, Asking)
    [(result, error)] = coordinator.results
    assert result is None and isinstance(error, OSError)
    assert h.service.failure is None


def test_a_failing_work_without_a_handler_fails_the_job_naming_its_lane() -> None:
    h = started(handled=False)
    h.ask_as_client(("work", OSError("the server went away"), "slot"))
    h.run()
    h.workers.run_all()
    h.run()
    failure = str(h.service.failure)
    assert "lane 'slot'" in failure and "the server went away" in failure, failure


def test_lanes_are_run_apart_and_each_in_the_order_its_works_came() -> None:
    h = started()
    for value, lane in ((1, "a"), (2, "b"), (3, "a")):
        h.ask_as_client(("work", value, lane))
    h.run()
    assert h.workers.run_all("b") == 1
    h.run()
    assert h.workers.run_all("a") == 2
    h.run()
    coordinator = h.coordinator
    assert isinstance(coordinator, Asking)
    assert [r for r, _ in coordinator.results] == [2, 1, 3]


def test_a_work_handed_over_runs_after_the_coordinator_closed_but_its_handler_does_not() -> None:
    h = started()
    coordinator = h.coordinator
    assert isinstance(coordinator, Asking)
    h.ask_as_client(("work", 7, "io"))
    h.run()
    h.service.close()
    h.run()
    assert h.workers.run_all() == 1
    h.run()
    assert coordinator.work_on_mailbox == [False]  # a release of connections is not lost
    assert coordinator.results == []


def test_thread_workers_run_one_work_of_a_lane_at_a_time_in_order_beside_other_lanes() -> None:
    workers = ThreadWorkers(prefix="test")
    release = threading.Event()
    other_ran = threading.Event()
    done = threading.Event()
    order: list[str] = []
    running = [0]
    most = [0]
    lock = threading.Lock()

    def step(name: str, wait: threading.Event | None = None) -> Any:
        def work() -> None:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            if wait is not None:
                assert wait.wait(30), "never released"
            with lock:
                running[0] -= 1
                order.append(name)
            if name == "a3":
                done.set()
        return work

    workers.run("op.0", "a", step("a1", release))
    workers.run("op.0", "a", step("a2"))
    workers.run("op.0", "a", step("a3"))
    workers.run("op.0", "b", lambda: other_ran.set())
    # lane b runs while lane a's first work is blocked
    assert other_ran.wait(30), "a blocked lane held another lane"
    assert order == []
    release.set()
    assert done.wait(30)
    assert order == ["a1", "a2", "a3"] and most[0] == 1
    for _ in range(3000):  # a lane's thread ends once its queue is empty
        if not workers.busy_lanes():
            break
        threading.Event().wait(0.01)
    assert workers.busy_lanes() == []
    assert not [t for t in threading.enumerate() if t.name.startswith("test-op.0")]


def test_a_blocked_lane_of_an_old_generation_does_not_hold_the_new_generations_lane() -> None:
    # holder_context.py names each generation's lanes apart (workers.py rule 3): a reset
    # coordinator whose predecessor's work still hangs on a dead server gets on with its own
    workers = ThreadWorkers(prefix="test")
    release, new_ran = threading.Event(), threading.Event()
    workers.run("op.1", "slot", lambda: release.wait(30) and None)
    workers.run("op.2", "slot", new_ran.set)
    try:
        assert new_ran.wait(30), "the old generation's lane held the new one's"
    finally:
        release.set()
