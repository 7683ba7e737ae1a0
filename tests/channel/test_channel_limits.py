"""The channel server's limits, over real loopback TCP against the real coordination service:
the first-frame deadline, the connection cap and the listen backlog."""

from __future__ import annotations

import logging
import pickle
import random
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sparkcoord.channel.client import ChannelClient
from sparkcoord.channel.frames import Register, encode
from sparkcoord.channel.server import ChannelServer
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.testing import CoordinatorHarness
from tests.channel.test_channel import Collect

SECRET = b"s" * 32
DEADLINE = 0.5  # a short first-frame deadline, so that the slow clients below cost little


@pytest.fixture()
def harness() -> CoordinatorHarness:
    h = CoordinatorHarness(Collect, 2, name="op")
    h.start()
    h.checkpoint()
    return h


@pytest.fixture()
def serve(harness: CoordinatorHarness) -> Iterator[Callable[..., ChannelServer]]:
    """Makes started servers of the harness' service; closes them (and the test's sockets,
    listed in ``serve.sockets``) at the end."""
    servers: list[ChannelServer] = []
    sockets: list[socket.socket] = []

    def make(*, start: bool = True, **options: Any) -> ChannelServer:
        server = ChannelServer(harness.service, SECRET, **options)
        servers.append(server)
        return server.start() if start else server

    make.sockets = sockets  # type: ignore[attr-defined]
    yield make
    for s in sockets:
        s.close()  # first: their connection threads end before the servers close
    for server in servers:
        server.close()


def attempt(h: CoordinatorHarness, subtask: int) -> TaskAttempt:
    return TaskAttempt(h.service.run_id, SubtaskId("op", subtask), h.epoch, 0)


def send_as(server: ChannelServer, task: TaskAttempt, *events: Any,
            before: Callable[[], Any] = lambda: None) -> ChannelClient:
    """Register ``task`` on a new client, run ``before``, then send and flush each event (one
    acknowledged round each) and close the client."""
    client = ChannelClient(server.address, SECRET, task, ack_timeout_s=5)
    client.register()
    before()
    for event in events:
        client.send(pickle.dumps(event))
        client.flush()
    client.close()
    return client


def connect(serve: Any, server: ChannelServer) -> socket.socket:
    s = socket.create_connection(server.address, timeout=5)
    serve.sockets.append(s)
    return s


def closed_by_server(s: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``s`` within ``timeout`` (EOF or reset, no data before)."""
    s.settimeout(timeout)
    try:
        data = s.recv(1024)
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    assert data == b"", f"the server answered {data!r}"
    return True


def wait_until(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    """Poll for a state another thread reaches (a server thread noticing a client's close)."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not reached in time"
        threading.Event().wait(0.005)


def test_a_slow_client_is_dropped_at_the_first_frame_deadline(serve, harness, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="sparkcoord.channel.server")
    server = serve(first_frame_timeout_s=DEADLINE)
    frame = encode(Register(attempt(harness, 0)), SECRET)  # a valid frame, trickled (4+ s)
    s = connect(serve, server)
    started = time.monotonic()
    s.settimeout(0.1)  # paces the trickle: one byte per 0.1 s while the server says nothing
    closed = False
    for i in range(len(frame)):
        if time.monotonic() > started + DEADLINE + 1.5:
            break
        try:
            s.sendall(frame[i:i + 1])
            data = s.recv(1024)
        except TimeoutError:
            continue  # the server still waits: send the next byte
        except (ConnectionResetError, BrokenPipeError):
            closed = True
            break
        assert data == b"", f"the server answered {data!r}"
        closed = True
        break
    elapsed = time.monotonic() - started
    assert closed, f"a client trickling one byte per 0.1 s was still connected after {elapsed:.1f} s"
    assert DEADLINE - 0.1 <= elapsed < DEADLINE + 1.5
    assert i < len(frame) - 1  # dropped before its frame was complete
    assert server.dropped_connections == 1
    assert any(f"no authenticated frame within {DEADLINE} s of connecting" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("garbage", [b"", random.Random(0).randbytes(10)],
                         ids=["nothing", "ten-bytes"])
def test_a_client_that_sends_less_than_a_header_and_goes_silent_is_dropped_at_the_deadline(
        serve, garbage: bytes) -> None:
    server = serve(first_frame_timeout_s=DEADLINE)
    s = connect(serve, server)
    started = time.monotonic()
    s.sendall(garbage)
    assert closed_by_server(s, DEADLINE + 1.5)
    assert time.monotonic() - started >= DEADLINE - 0.1
    assert server.dropped_connections == 1


def test_an_authenticated_client_may_stay_idle_longer_than_the_first_frame_deadline(
        serve, harness) -> None:
    server = serve(first_frame_timeout_s=DEADLINE)
    client = send_as(server, attempt(harness, 1), "late", "later",
                     before=lambda: threading.Event().wait(DEADLINE + 0.3))  # idle past it
    assert client.reconnects == 0 and server.dropped_connections == 0
    harness.run()
    assert harness.coordinator.got == [(1, "late"), (1, "later")]


def test_connections_over_the_cap_are_closed_on_accept_without_a_thread_and_logged_once(
        serve, harness, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="sparkcoord.channel.server")
    server = serve(max_connections=5)
    threads_before = threading.active_count()
    idle = [connect(serve, server) for _ in range(20)]
    # the server accepts in connection order: the first 5 are served, the other 15 closed
    closed: set[int] = set()
    end = time.monotonic() + 3
    while len(closed) < 15 and time.monotonic() < end:
        readable, _, _ = select.select([s for i, s in enumerate(idle) if i not in closed], [], [],
                                       0.1)
        for s in readable:
            assert closed_by_server(s, 0)
            closed.add(idle.index(s))
    assert closed == set(range(5, 20))
    assert select.select(idle[:5], [], [], 0)[0] == []  # the served ones are still open
    assert server.refused_connections == 15 and server.open_connections == 5
    assert threading.active_count() <= threads_before + 5 + 2
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]  # one line, not fifteen
    assert refusals[0].levelno == logging.WARNING
    message = refusals[0].getMessage()
    assert ("5 connections open, the cap is 5 (ServiceConfig.max_channel_connections)"
            in message), message
    assert f"{server.address[0]}:{server.address[1]}" in message

    for s in idle[:5]:
        s.close()
    wait_until(lambda: server.open_connections == 0)
    client = send_as(server, attempt(harness, 0), "after")
    assert client.reconnects == 0 and server.refused_connections == 15
    harness.run()
    assert harness.coordinator.got == [(0, "after")]


def test_a_dropped_connection_frees_its_place_under_the_cap(serve, harness) -> None:
    server = serve(max_connections=1)
    s = connect(serve, server)
    s.sendall(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n" + b"x" * 16)  # a whole bad header
    assert closed_by_server(s, 3)
    assert server.dropped_connections == 1 and server.open_connections == 0
    client = ChannelClient(server.address, SECRET, attempt(harness, 0), ack_timeout_s=5)
    client.register()
    client.send(pickle.dumps("in"))
    client.flush()
    client.close()
    assert client.reconnects == 0 and server.refused_connections == 0


def test_the_listen_backlog_holds_200_connections_before_the_server_accepts_any(serve) -> None:
    # Not started: nothing accepts, so only the kernel's queue (the backlog) holds the
    # connections. With a backlog of 128, the 130th connect would wait for SYN retries.
    server = serve(start=False, listen_backlog=256)
    # the kernel caps any backlog at net.core.somaxconn (4096 here; 128 on old kernels)
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            wanted = min(200, int(f.read()))
    except OSError:
        wanted = 200
    pending: list[socket.socket] = []
    connected = 0
    try:
        for _ in range(wanted):
            s = socket.socket()
            serve.sockets.append(s)
            s.setblocking(False)
            s.connect_ex(server.address)
            pending.append(s)
        end = time.monotonic() + 5
        while pending and time.monotonic() < end:
            _, writable, _ = select.select([], pending, [], 0.1)
            for s in writable:
                pending.remove(s)
                assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                connected += 1
    finally:
        for s in serve.sockets:
            s.close()
        server.start()  # accepts the queued connections, which end at once (closed)
    assert connected == wanted, f"{len(pending)} connects still pending after 5 s"
