"""Requests over real loopback TCP against the real coordination service (thread mailboxes)."""

from __future__ import annotations

import pickle
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from sparkcoord import OperatorCoordinator
from sparkcoord.channel.client import ChannelClient
from sparkcoord.channel.frames import (
    HEADER,
    Request,
    Response,
    ResponseStatus,
    authenticate_and_parse,
    encode,
)
from sparkcoord.channel.server import ChannelServer
from sparkcoord.core.errors import RequestFailed
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.restore import FRESH
from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec
from sparkcoord.runtime.storage import CheckpointStorage

SECRET = b"r" * 32


class Counter(OperatorCoordinator):
    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.next = 0
        self.asked: list[Any] = []
        self.events: list[Any] = []
        self.parked: list[Future[Any]] = []

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.events.append(event)

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        self.asked.append(request)
        if request == "park":
            fut: Future[Any] = Future()
            self.parked.append(fut)
            return fut
        if request == "refuse":
            refused: Future[Any] = Future()
            refused.set_exception(LookupError("nothing left"))
            return refused
        self.next += 1
        return (request, self.next, list(self.events))


@pytest.fixture()
def running(tmp_path) -> Iterator[tuple[CoordinationService, ChannelServer]]:
    service = CoordinationService([CoordinatorSpec("op", Counter, 2)],
                                  CheckpointStorage(str(tmp_path / f"c-{uuid.uuid4().hex}")))
    service.restore(FRESH)
    record = service.checkpoint(0)
    assert record is not None
    server = ChannelServer(service.inbox, SECRET).start()
    yield service, server
    server.close()
    service.close()


def attempt(service: CoordinationService, index: int, number: int = 0) -> TaskAttempt:
    return TaskAttempt(service.run_id, SubtaskId("op", index), 0, number)


def coordinator(service: CoordinationService) -> Counter:
    instance = service.holders["op"].coordinator
    assert isinstance(instance, Counter)
    return instance


def wait_for(condition: Any, what: str, timeout_s: float = 10.0) -> None:
    """Wait (in short steps, with a deadline) for another thread to make ``condition`` true."""
    deadline = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        deadline.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def ask_parked(service: CoordinationService, client: ChannelClient
               ) -> tuple[threading.Thread, list[Response]]:
    """Ask "park" from another thread; return once the coordinator parked the answer."""
    result: list[Response] = []
    asking = threading.Thread(target=lambda: result.append(
        client.request(pickle.dumps("park"), timeout_s=20)))
    asking.start()
    wait_for(lambda: coordinator(service).parked, "the coordinator to park the request")
    return asking, result


def test_request_and_response_frames_round_trip() -> None:
    a = TaskAttempt("run", SubtaskId("op", 1), 4, 0)
    for message in (Request(a, 7, b"ask"), Response(7, ResponseStatus.REFUSED, b"why"),
                    Response(8, ResponseStatus.UNAVAILABLE, b"starting")):
        frame = encode(message, SECRET)
        header, mac, body = frame[:HEADER.size], frame[HEADER.size:HEADER.size + 32], frame[HEADER.size + 32:]
        assert authenticate_and_parse(header, mac, body, SECRET) == message


def test_a_task_gets_the_answer_after_the_events_it_sent_before_the_request(running) -> None:
    service, server = running
    client = ChannelClient(server.address, SECRET, attempt(service, 0))
    client.register_with_first_event()  # lazily: the registration travels with the first item
    client.send(pickle.dumps("e0"))
    client.send(pickle.dumps("e1"))
    response = client.request(pickle.dumps("first"), timeout_s=10)
    assert response.status is ResponseStatus.ANSWER
    # the coordinator had both events when it answered: one connection, one order
    assert pickle.loads(response.payload) == ("first", 1, ["e0", "e1"])
    client.flush()
    client.close()


def test_a_refused_request_comes_back_with_the_coordinators_reason(running) -> None:
    service, server = running
    client = ChannelClient(server.address, SECRET, attempt(service, 1))
    client.register()
    response = client.request(pickle.dumps("refuse"), timeout_s=10)
    assert response.status is ResponseStatus.REFUSED
    assert "nothing left" in response.payload.decode()
    client.close()


def test_a_request_times_out_with_an_error_naming_it(running) -> None:
    service, server = running
    client = ChannelClient(server.address, SECRET, attempt(service, 1))
    client.register()
    with pytest.raises(RequestFailed, match="no answer to request 0 within 0.3 s"):
        client.request(pickle.dumps("park"), timeout_s=0.3)
    client.close()


def test_a_request_whose_connection_breaks_is_asked_again_and_answered_once(running) -> None:
    service, server = running
    client = ChannelClient(server.address, SECRET, attempt(service, 0))
    client.register()
    asking, result = ask_parked(service, client)
    # the connection dies while the task waits: it reconnects and asks item 0 again
    assert client._sock is not None
    client._sock.shutdown(2)
    wait_for(lambda: client.reconnects > 0, "the client to reconnect")
    coordinator(service).parked[0].set_result("late answer")
    asking.join(10)
    assert [pickle.loads(r.payload) for r in result] == ["late answer"]
    assert coordinator(service).asked == ["park"]  # asked once, answered from the log after
    client.close()


def test_a_job_failure_answers_a_waiting_task_with_the_cause(running) -> None:
    service, server = running
    client = ChannelClient(server.address, SECRET, attempt(service, 1))
    client.register()
    asking, result = ask_parked(service, client)
    service.fail_job("the source broke")
    asking.join(10)
    assert result and result[0].status is ResponseStatus.FAILED
    assert "the source broke" in result[0].payload.decode()
    client.close()


@pytest.mark.parametrize("message,body", [
    ("RESPONSE", b"\x00" * 8),                    # no status byte
    ("RESPONSE", b"\x00" * 8 + b"\x07"),          # an unknown status
    ("REQUEST", b"\x00\x01"),                      # an attempt cut short
    ("CLIENT_REQUEST", b"\x00\x05op"),             # an operator name cut short
    ("CLIENT_REQUEST", b"\x00\x02op\x00\x01c\x00"),  # a sequence number cut short
])
def test_a_malformed_request_or_response_frame_is_a_frame_error_naming_it(message: str,
                                                                          body: bytes) -> None:
    import hmac as _hmac

    from sparkcoord.channel.frames import MAGIC, VERSION, FrameError, FrameType

    header = HEADER.pack(MAGIC, VERSION, FrameType[message], len(body))
    mac = _hmac.digest(SECRET, header + body, "sha256")
    with pytest.raises(FrameError, match=f"malformed {message} frame"):
        authenticate_and_parse(header, mac, body, SECRET)


def test_a_client_request_no_run_can_take_now_comes_back_unavailable_by_status(tmp_path) -> None:
    # spark/job.py re-sends by this status (no refusal text is matched): starting, then taken
    from sparkcoord.channel.client import JobClient

    service = CoordinationService([CoordinatorSpec("op", Counter, 2)],
                                  CheckpointStorage(str(tmp_path / "c")))
    service.restore(FRESH)
    server = ChannelServer(service.inbox, SECRET).start()
    client = JobClient(server.address, SECRET, "driver-1")
    try:
        starting = client.request("op", pickle.dumps("status"), 10, 0)
        assert starting.status is ResponseStatus.UNAVAILABLE, starting
        assert "ask again" in starting.payload.decode()
        unknown = client.request("nobody", pickle.dumps("status"), 10, 1)
        assert unknown.status is ResponseStatus.FAILED  # refused for good: not re-sent
        record = service.checkpoint(0)
        assert record is not None
        service.inbox.epoch_logged(record.epoch)  # as Spark's offset log does
        taken = client.request("op", pickle.dumps("status"), 10, 0)  # the same request again
        assert taken.status is ResponseStatus.REFUSED  # Counter takes no client requests
    finally:
        client.close()
        server.close()
        service.close()
