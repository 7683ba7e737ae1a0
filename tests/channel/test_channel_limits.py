"""The channel server's limits, over real loopback TCP against the real coordination service:
the first-frame deadline, the budget of unauthenticated connections, the connection cap and
the listen backlog; and a foreign process flooding the server with connections."""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
import random
import select
import socket
import subprocess
import sys
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
        server = ChannelServer(harness.service.inbox, SECRET, **options)
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


#: A foreign local process (no secret) that opens ``count`` idle connections to the channel
#: server and holds them until its stdin closes; then prints how many it opened and how many
#: the server closed. Arguments: the target ("host:port", or a channel.json to read it from,
#: followed when a restart rewrites it), ``count``, and "hold" (keep what stays open) or
#: "reopen" (open a new one for each the server closes, at once: a sustained flood).
FLOOD = r"""
import json, select, socket, sys, time
target, count, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def address():
    if not target.endswith(".json"):
        host, port = target.rsplit(":", 1)
        return host, int(port)
    while True:
        try:
            with open(target) as f:
                info = json.load(f)
            return info["host"], int(info["port"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.05)

addr = address()
socks, opened, closed = [], 0, 0

def top_up():
    global opened
    while len(socks) < count:
        try:
            socks.append(socket.create_connection(addr, timeout=5))
        except OSError:
            return  # nothing listens (a run ended): again on the next round
        opened += 1

top_up()
print("ready", len(socks), flush=True)
checked = time.monotonic()
while True:
    readable = select.select(socks + [sys.stdin], [], [], 0.05)[0]
    if sys.stdin in readable:
        break
    for s in readable:
        try:
            if s.recv(1):
                continue
        except OSError:
            pass
        socks.remove(s)  # the server closed it
        s.close()
        closed += 1
    if target.endswith(".json") and time.monotonic() - checked > 0.5:
        checked = time.monotonic()
        if address() != addr:  # a new run listens elsewhere: follow it
            addr = address()
            for s in socks:
                s.close()
            socks.clear()
    if mode == "reopen" and len(socks) < count:
        time.sleep(0.01)
        top_up()
print(json.dumps({"opened": opened, "closed": closed}), flush=True)
"""


@contextlib.contextmanager
def flood(target: str, count: int, mode: str) -> Iterator[dict[str, int]]:
    """Runs :data:`FLOOD` against ``target`` while the block runs (entered once its first
    ``count`` connections are open); then the dict holds what it reported."""
    attacker = subprocess.Popen([sys.executable, "-c", FLOOD, target, str(count), mode],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert attacker.stdin is not None and attacker.stdout is not None
    report: dict[str, int] = {}
    try:
        ready = attacker.stdout.readline().split()
        assert ready[:1] == ["ready"], ready
        report["ready"] = int(ready[1])
        yield report
    finally:
        out, _ = attacker.communicate(timeout=30)  # closes its stdin: it stops
        if out.strip():
            report.update(json.loads(out.strip().splitlines()[-1]))


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


def registered_socket(serve: Any, server: ChannelServer, task: TaskAttempt) -> socket.socket:
    """A raw connection that registered ``task`` (a duplicate registration is acknowledged)."""
    s = connect(serve, server)
    s.sendall(encode(Register(task), SECRET))
    assert s.recv(4096), "no reply to the registration"
    return s


def test_the_cap_counts_authenticated_connections_and_refuses_more_on_accept_logged_once(
        serve, harness, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="sparkcoord.channel.server")
    server = serve(max_connections=5)
    threads_before = threading.active_count()
    waiting = connect(serve, server)  # admitted, not authenticated: not counted by the cap
    wait_until(lambda: server.open_connections == 1)
    tasks = [registered_socket(serve, server, attempt(harness, 0)) for _ in range(5)]
    assert server.authenticated_connections == 5
    # the cap is full: a connection that authenticates now is closed unanswered
    waiting.sendall(encode(Register(attempt(harness, 0)), SECRET))
    assert closed_by_server(waiting, 3)
    idle = [connect(serve, server) for _ in range(15)]
    # and new ones are closed as soon as they are accepted
    for s in idle:
        assert closed_by_server(s, 3)
    assert select.select(tasks, [], [], 0)[0] == []  # the served ones are still open
    assert server.refused_connections == 16 and server.authenticated_connections == 5
    assert server.evicted_connections == 0
    assert threading.active_count() <= threads_before + 2
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]  # one line, not sixteen
    assert refusals[0].levelno == logging.WARNING
    message = refusals[0].getMessage()
    assert ("5 authenticated connections open, the cap is 5 "
            "(ServiceConfig.max_channel_connections)" in message), message
    assert f"{server.address[0]}:{server.address[1]}" in message

    for s in tasks:
        s.close()
    wait_until(lambda: server.open_connections == 0)
    client = send_as(server, attempt(harness, 0), "after")
    assert client.reconnects == 0 and server.refused_connections == 16
    harness.run()
    assert harness.coordinator.got == [(0, "after")]


def test_two_hundred_idle_connections_of_another_process_keep_no_task_out(
        serve, harness, caplog) -> None:
    # issue 24 item 5: before, they filled the cap (64) until the first-frame deadline, and
    # every task's connection was refused until it gave up
    caplog.set_level(logging.WARNING, logger="sparkcoord.channel.server")
    server = serve(max_connections=64, first_frame_timeout_s=60)  # no help from the deadline
    host, port = server.address
    before = ChannelClient(server.address, SECRET, attempt(harness, 1), ack_timeout_s=5)
    before.register()  # a task connected before the attack
    with flood(f"{host}:{port}", 200, "hold") as attack:
        assert attack["ready"] == 200
        during = send_as(server, attempt(harness, 0), "during")  # a task connecting now
        before.send(pickle.dumps("still"))
        before.flush()
        assert during.reconnects == 0 and before.reconnects == 0
        # what the attacker holds is bounded by the budget of unauthenticated connections
        wait_until(lambda: server.open_connections <= 1 + server.max_unauthenticated)
    before.close()
    assert attack["opened"] == 200
    assert server.evicted_connections >= 200 - server.max_unauthenticated
    assert server.refused_connections == 0
    evictions = [r.getMessage() for r in caplog.records if "unauthenticated" in r.getMessage()]
    assert len(evictions) == 1, evictions  # one line for the flood
    harness.run()
    assert sorted(harness.coordinator.got) == [(0, "during"), (1, "still")]


def test_a_sustained_flood_of_reopened_connections_keeps_no_task_out(serve, harness) -> None:
    # the attacker opens a new connection for each the server drops: the first-frame deadline
    # never frees anything, so tasks must get in past the attack itself
    server = serve(max_connections=64)
    host, port = server.address
    with flood(f"{host}:{port}", 200, "reopen") as attack:
        for i in range(10):  # ten connections, one after the other, each a fresh one
            client = ChannelClient(server.address, SECRET, attempt(harness, i % 2),
                                   ack_timeout_s=5)
            client.next_seq = i // 2  # its subtask's next event
            client.register()
            client.send(pickle.dumps(i))
            client.flush()
            client.close()
    assert attack["closed"] > 0 and attack["opened"] > 200  # the attack went on
    harness.run()
    assert sorted(v for _, v in harness.coordinator.got) == list(range(10))


def test_a_task_refused_at_a_full_cap_keeps_retrying_past_six_tries_and_gets_in(
        serve, harness) -> None:
    # the cap is full of a task (authenticated) for longer than six tries take: the refused
    # task keeps trying for its retry window (15 s, past the first-frame deadline's 10 s)
    server = serve(max_connections=1)
    holder = registered_socket(serve, server, attempt(harness, 1))
    stop = threading.Event()

    def release_after_seven_refusals() -> None:
        while server.refused_connections < 7 and not stop.wait(0.005):
            pass
        holder.close()

    releaser = threading.Thread(target=release_after_seven_refusals, daemon=True)
    releaser.start()
    try:
        client = send_as(server, attempt(harness, 0), "in")
    finally:
        stop.set()
        releaser.join(5)
    assert client.reconnects >= 7 and server.refused_connections >= 7
    harness.run()
    assert harness.coordinator.got == [(0, "in")]


def test_connections_a_busy_io_loop_has_not_taken_are_bounded_oldest_dropped_first(
        serve, harness) -> None:
    # the I/O loop is held inside a handler while a flood arrives: the accept thread keeps
    # only the newest budget's worth of them, and a task that connects last still gets in
    server = serve(max_connections=64, max_unauthenticated=8)
    entered, gate = threading.Event(), threading.Event()

    def hold_the_loop(message: object) -> str | None:
        if not gate.is_set() and "hold" in repr(message):
            entered.set()
            gate.wait(30)
        return None

    server.fault = hold_the_loop
    blocker = ChannelClient(server.address, SECRET, attempt(harness, 1), ack_timeout_s=30)
    blocker.register()
    host, port = server.address
    try:
        blocker.send(pickle.dumps("hold"))
        assert entered.wait(5)
        with flood(f"{host}:{port}", 100, "hold"):
            wait_until(lambda: server.evicted_connections >= 100 - 8)
            assert server.open_connections == 1 + 8
            task = ChannelClient(server.address, SECRET, attempt(harness, 0), ack_timeout_s=30)
            done = threading.Thread(target=task.register, daemon=True)
            done.start()  # connects after the flood: the newest the accept thread holds
            wait_until(lambda: server.evicted_connections >= 100 + 1 - 8)
            assert server.open_connections == 1 + 8
            gate.set()
            done.join(10)
            assert not done.is_alive() and task.reconnects == 0
            blocker.flush()
    finally:
        gate.set()
    task.send(pickle.dumps("in"))
    task.flush()
    task.close()
    blocker.close()
    harness.run()
    assert sorted(v for _, v in harness.coordinator.got) == ["hold", "in"]


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
