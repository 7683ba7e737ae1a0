"""A task refused because the job failed waits to be cancelled, then fails in one line
(decision 44, issue 14 item 5): real loopback TCP against the real coordination service; the
client's wait is observed through its ``time.sleep`` (no real waiting)."""

from __future__ import annotations

import pickle
import threading
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


def record_sleeps(monkeypatch: Any) -> list[float]:
    """The sleeps (seconds) of this test's threads (its own, and the thread
    :func:`parked_request_when_failing` asks from), recorded instead of slept. ``time`` is one
    module for every thread: a thread an earlier test left behind (a client retrying a
    closed channel) sleeps for real, or its retry loop would spin and flood the record (seen
    in CI: 325,954 sleeps of 1 s)."""
    slept: list[float] = []
    real = client_module.time.sleep

    def sleep(seconds: float) -> None:
        current = threading.current_thread()
        if current is threading.main_thread() or current.name.endswith("(ask)"):
            slept.append(seconds)
        else:
            real(seconds)

    monkeypatch.setattr(client_module.time, "sleep", sleep)
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
