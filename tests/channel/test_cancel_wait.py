"""A task refused because the job failed waits to be cancelled, then fails in one line
(decision 44, issue 14 item 5): real loopback TCP against the real coordination service; the
client's wait is observed through its ``time.sleep`` (no real waiting)."""

from __future__ import annotations

import pickle
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sparkcoord import OperatorCoordinator
from sparkcoord.channel import client as client_module
from sparkcoord.channel.client import ChannelClient, ChannelRejected
from sparkcoord.channel.server import ChannelServer
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.restore import FRESH
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec
from sparkcoord.runtime.storage import CheckpointStorage

SECRET = b"w" * 32
CAUSE = "coordinator 'op' called fail_job: the table is gone\nTraceback (most recent call last):"


class Parks(OperatorCoordinator):
    """Never answers a request (the failure answers it); says when it got one."""

    asked = threading.Event()

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        from concurrent.futures import Future
        Parks.asked.set()
        return Future()


@pytest.fixture()
def running(tmp_path) -> Iterator[tuple[CoordinationService, ChannelServer]]:
    service = CoordinationService([CoordinatorSpec("op", Parks, 2)],
                                  CheckpointStorage(str(tmp_path / f"c-{uuid.uuid4().hex}")))
    service.restore(FRESH)
    assert service.checkpoint(0) is not None
    server = ChannelServer(service.inbox, SECRET).start()
    yield service, server
    server.close()
    service.close()


class _ClientTime:
    """What ``sparkcoord.channel.client`` sees as its ``time`` module while a test records its
    sleeps: the real module but for ``sleep``."""

    def __init__(self, sleep: Any) -> None:
        self.sleep = sleep

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def record_sleeps(monkeypatch: Any) -> list[float]:
    """The channel client's sleeps (seconds) in this test's threads (its own, and the thread
    :func:`parked_request_when_failing` asks from), recorded instead of slept; a refusal's
    hold counts as one, which no close of the run ends.

    Only the client module's name ``time`` is replaced, never the ``time`` module itself:
    ``time.sleep`` is one function for every thread of the process, and patched there the
    record took in every other thread's sleep, which no longer slept and so spun. That is what
    failed test_driver_side in CI with 325,954 recorded sleeps of 1 s: py4j's
    ``FinalizerWorker`` thread (``Thread-1``, started with the first in-process SparkSession
    and alive for the rest of the process, by py4j's design) polls its queue with
    ``time.sleep(1)``. A client thread of an earlier test would sleep for real here (none
    outlives its test: tests/conftest.py fails one that does)."""
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        current = threading.current_thread()
        if current is threading.main_thread() or current.name.endswith("(ask)"):
            slept.append(seconds)
        else:
            time.sleep(seconds)

    def released(sock: Any, wait_s: float) -> bool:
        # a refusal's hold (rule 7) waits on its connection for the run's close: recorded as
        # a sleep that nothing ended (the job runner never stopped the query)
        sleep(wait_s)
        return False

    monkeypatch.setattr(client_module, "time", _ClientTime(sleep))
    monkeypatch.setattr(client_module, "_released", released)
    return slept


@pytest.fixture()
def sleeps(monkeypatch) -> list[float]:
    """The client's sleeps (seconds), recorded instead of slept."""
    return record_sleeps(monkeypatch)


def attempt(service: CoordinationService, index: int, number: int = 0) -> TaskAttempt:
    return TaskAttempt(service.run_id, SubtaskId("op", index), 0, number)


def holding(service: CoordinationService, server: ChannelServer, hold_ms: int) -> None:
    """Refusals carry ``hold_ms`` once the job failed (what the driver side sets up)."""
    server.failover_hold = lambda: hold_ms if service.failure is not None else 0


def registered(service: CoordinationService, server: ChannelServer, index: int
               ) -> ChannelClient:
    client = ChannelClient(server.address, SECRET, attempt(service, index))
    client.register()
    return client


def parked_request_when_failing(client: ChannelClient, fail: Any) -> list[BaseException]:
    """Ask from another thread a request that :class:`Parks` keeps waiting, call ``fail()``
    once the coordinator has it, and return what the request raised."""
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            client.request(pickle.dumps("park"), timeout_s=20)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    Parks.asked.clear()
    asking = threading.Thread(target=ask)
    asking.start()
    assert Parks.asked.wait(10), "the request never reached the coordinator"
    fail()
    asking.join(10)
    assert not asking.is_alive()
    return errors


def test_an_event_refused_after_a_job_failure_waits_the_hold_then_fails_in_one_line(
        running, sleeps) -> None:
    service, server = running
    holding(service, server, 2500)
    client = registered(service, server, 0)
    service.fail_job(CAUSE)
    client.send(pickle.dumps("late"))
    with pytest.raises(ChannelRejected) as caught:
        client.flush()
    assert sleeps == [2.5]  # waited for the job runner to cancel the task
    text = str(caught.value)
    assert "\n" not in text, text  # the cause's first line only: one line in Spark's log
    assert "refused event 0: the job failed: coordinator 'op' called fail_job: the table is " \
           "gone [...] (nothing cancelled this task" in text, text


def test_a_registration_refused_after_a_job_failure_waits_too(running, sleeps) -> None:
    service, server = running
    holding(service, server, 700)
    service.fail_job("the source broke")
    client = ChannelClient(server.address, SECRET, attempt(service, 1, number=1))
    with pytest.raises(ChannelRejected, match="refused registration: the job failed: the "
                                              "source broke .nothing cancelled this task"):
        client.register()
    assert sleeps == [0.7]


def test_a_request_answered_by_a_job_failure_waits_the_hold_then_fails_in_one_line(
        running, sleeps) -> None:
    service, server = running
    holding(service, server, 1200)
    client = registered(service, server, 1)
    errors = parked_request_when_failing(client, lambda: service.fail_job(CAUSE))
    assert len(errors) == 1 and isinstance(errors[0], ChannelRejected), errors
    assert "refused request 0: " in str(errors[0])
    assert "the job failed: coordinator 'op' called fail_job: the table is gone [...]" in str(
        errors[0])
    assert "\n" not in str(errors[0])
    assert sleeps == [1.2]


def test_a_refusal_without_a_job_failure_fails_at_once_with_the_whole_reason(
        running, sleeps) -> None:
    service, server = running
    holding(service, server, 2500)
    stale = TaskAttempt("another-run", SubtaskId("op", 0), 0, 0)
    with pytest.raises(ChannelRejected, match="not the current run"):
        ChannelClient(server.address, SECRET, stale).register()
    assert sleeps == []  # nothing to wait for: no job runner will cancel this task


def test_the_record_takes_the_clients_sleeps_and_no_other_module_stops_sleeping(
        monkeypatch) -> None:
    # Regression: the record replaced time.sleep for the whole process, so py4j's finalizer
    # thread (time.sleep(1) while its queue is empty, alive after any in-process SparkSession)
    # spun and flooded the record: 325,954 sleeps of 1 s in test_driver_side in CI
    slept = record_sleeps(monkeypatch)
    polls: list[float] = []
    stop = threading.Event()

    def poll() -> None:  # a thread of another library polling the way py4j's does
        while not stop.is_set():
            polls.append(time.monotonic())
            time.sleep(0.05)

    poller = threading.Thread(target=poll, name="Thread-1", daemon=True)
    poller.start()
    started = time.monotonic()
    time.sleep(0.3)  # the test's own, outside the client: slept for real, not recorded
    client_module.time.sleep(60)  # the client's: recorded, not slept
    stop.set()
    poller.join(10)
    assert slept == [60]
    assert 0.3 <= time.monotonic() - started < 30
    assert 1 <= len(polls) <= 20, len(polls)  # it slept: 0.3 s is about 6 polls, not thousands
    assert client_module.time.monotonic() > 0  # the rest of the module is the real one


@pytest.mark.parametrize("refused", ["event", "request"])
def test_a_refused_task_is_released_at_once_when_the_failed_run_closes(
        running, monkeypatch, refused: str) -> None:
    """Server rule 8, client rule 7 (decision 81): the query stop that cancels the failed
    job's tasks closes the run, and its server closes their connections: the refused task
    ends then, not after its whole hold (Spark's kill timeout kept its Python worker busy
    for seconds meanwhile, and the restarted query's tasks waited for a free core)."""
    service, server = running
    holding(service, server, 120_000)  # two minutes: only the release ends it in time
    client = registered(service, server, 0)
    errors: list[BaseException] = []
    waiting = threading.Event()
    released = client_module._released

    def noted(sock: Any, wait_s: float) -> bool:
        waiting.set()  # the refusal arrived: the task waits for its cancellation
        return released(sock, wait_s)

    monkeypatch.setattr(client_module, "_released", noted)

    def task() -> None:
        try:
            if refused == "event":
                client.send(pickle.dumps("late"))
                client.flush()
            else:
                client.request(pickle.dumps("park"), timeout_s=300)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    Parks.asked.clear()
    if refused == "event":
        service.fail_job(CAUSE)
    thread = threading.Thread(target=task, name="refused task")
    thread.start()
    if refused == "request":
        assert Parks.asked.wait(10), "the request never reached the coordinator"
        service.fail_job(CAUSE)
    assert waiting.wait(30), errors  # refused, holding: waiting for the job runner's stop
    assert thread.is_alive(), errors
    server.close()  # what the query's stop does to the run (its source closes the driver side)
    thread.join(60)
    assert not thread.is_alive(), "the close did not release the refused task"
    assert len(errors) == 1 and isinstance(errors[0], ChannelRejected), errors
    text = str(errors[0])
    assert "the job failed: coordinator 'op' called fail_job: the table is gone [...]" in text
    assert "nothing cancelled this task" not in text and "\n" not in text, text


def test_a_server_closed_while_the_job_runs_keeps_serving_its_connections(running) -> None:
    # rule 8 only after a failure: a run that ends normally serves its tasks to their end
    service, server = running
    holding(service, server, 120_000)
    client = registered(service, server, 0)
    server.close()
    client.send(pickle.dumps("still served"))
    client.flush()
    client.finish()
    client.close()


def test_a_refused_task_that_nothing_releases_waits_its_whole_hold_then_says_so(running) -> None:
    # the real wait on the connection (the other tests record it): the hold runs out, the
    # service still holds the connection open, and the task fails in one line saying that
    # nothing cancelled it
    service, server = running
    holding(service, server, 300)
    client = registered(service, server, 0)
    service.fail_job(CAUSE)
    started = time.monotonic()
    client.send(pickle.dumps("late"))
    with pytest.raises(ChannelRejected, match="nothing cancelled this task"):
        client.flush()
    assert time.monotonic() - started >= 0.3  # the whole hold, not cut short
