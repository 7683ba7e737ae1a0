"""The guard of tests/conftest.py: it names a thread still inside the channel client, or of
sparkcoord's guarded names, after a test, and leaves every other thread alone."""

from __future__ import annotations

import socket
import threading

from sparkcoord.channel.client import ChannelClient, ChannelUnavailable
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from tests.conftest import describe, in_channel_client, lingering


def wait_for(condition: object, what: str, timeout_s: float = 10.0) -> None:
    pause = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if condition():  # type: ignore[operator]
            return
        pause.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_client_thread_waiting_on_a_service_is_named_until_it_gave_up() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    address = listener.getsockname()[:2]
    client = ChannelClient(address, b"s" * 32, TaskAttempt("run", SubtaskId("op", 0), 0, 0),
                           ack_timeout_s=30, max_retries=0)
    errors: list[BaseException] = []

    def register() -> None:
        try:
            client.register()
        except ChannelUnavailable as exc:
            errors.append(exc)

    task = threading.Thread(target=register, name="a task")
    task.start()
    peer, _ = listener.accept()
    try:
        wait_for(lambda: in_channel_client(task), "the client to wait for its reply")
        assert lingering([task], join_s=0.2) == [task]
        text = describe([task])
        assert "thread 'a task'" in text and "client.py" in text and "register" in text
    finally:
        listener.close()  # nothing listens any more: the retry is refused, the client gives up
        peer.close()
    task.join(10)
    assert not task.is_alive() and len(errors) == 1, errors
    assert lingering([task], join_s=0.0) == []


def test_a_guarded_name_is_named_and_any_other_thread_is_left_alone() -> None:
    stop = threading.Event()
    job = threading.Thread(target=stop.wait, args=(30,), name="sparkcoord-job", daemon=True)
    other = threading.Thread(target=stop.wait, args=(30,), name="Thread-1", daemon=True)
    job.start()
    other.start()
    try:
        assert lingering([job, other], join_s=0.2) == [job]
        assert lingering([other], join_s=30) == []  # not ours: not even waited for
    finally:
        stop.set()
    job.join(10)
    other.join(10)
    assert lingering([job, other], join_s=0.0) == []
