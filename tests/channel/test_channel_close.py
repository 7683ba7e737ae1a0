"""How a task's channel connection ends, and what the server says of it (issue 25 item 6,
decision 59): a task closes cleanly, also with replies still unread, so the server has
nothing to say; a task whose process went away is a DEBUG line naming it; one that stopped in
the middle of a frame an INFO line; a partial frame that is not ours stays a WARNING.

Over real loopback TCP against the real coordination service (the fixtures of
tests/channel/test_channel_limits.py)."""

from __future__ import annotations

import logging
import pickle
import select
import socket
import struct
from collections.abc import Callable, Iterator

import pytest

from sparkcoord.channel.client import ChannelClient
from sparkcoord.channel.frames import HEADER, Event, Register, encode
from sparkcoord.channel.server import ChannelServer
from sparkcoord.testing import CoordinatorHarness
from tests.channel.test_channel import Collect
from tests.channel.test_channel_limits import SECRET, attempt, connect, wait_until

SERVER = "sparkcoord.channel.server"


@pytest.fixture()
def harness() -> CoordinatorHarness:
    h = CoordinatorHarness(Collect, 2, name="op")
    h.start()
    h.checkpoint()
    return h


@pytest.fixture()
def serve(harness: CoordinatorHarness) -> Iterator[Callable[..., ChannelServer]]:
    """Makes a started server of the harness' service; closes it (and the test's sockets,
    listed in ``serve.sockets``, first) at the end."""
    servers: list[ChannelServer] = []
    sockets: list[socket.socket] = []

    def make() -> ChannelServer:
        servers.append(ChannelServer(harness.service.inbox, SECRET).start())
        return servers[-1]

    make.sockets = sockets  # type: ignore[attr-defined]
    yield make
    for s in sockets:
        s.close()
    for server in servers:
        server.close()


def server_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == SERVER]


def unread_data_arrives(sock: socket.socket) -> None:
    """Wait until a reply of the server waits unread in ``sock``'s receive buffer."""
    readable, _, _ = select.select([sock], [], [], 5)
    assert readable, "the server wrote no reply"


def ended(server: ChannelServer, dropped: int = 0) -> None:
    """Wait until the server noticed the end of every connection, ``dropped`` of them not
    clean (its I/O thread: the line about a connection comes before it is no longer open)."""
    wait_until(lambda: server.dropped_connections == dropped and server.open_connections == 0)


def test_a_task_that_finished_its_batch_ends_its_connection_without_a_line(
        serve, harness, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger=SERVER)
    server = serve()
    client = ChannelClient(server.address, SECRET, attempt(harness, 0), ack_timeout_s=5)
    client.register_with_first_event()
    client.send(pickle.dumps("a"))
    client.send(pickle.dumps("b"))
    client.finish()
    client.close()
    ended(server)
    harness.run()
    assert sorted(v for _, v in harness.coordinator.got) == ["a", "b"]
    assert server.dropped_connections == 0
    assert server_lines(caplog) == []


def test_a_connection_closed_with_replies_unread_ends_cleanly_not_with_a_reset(
        serve, harness, caplog) -> None:
    # A task may close with replies still on their way to it (its batch ended before it read
    # them: an answer given on the server's I/O loop also goes out before the acknowledgements
    # of the same read). A plain close then sends a TCP reset, which the server took for a
    # task that "failed or was killed" (an INFO line in a healthy run); the clean close reads
    # them first.
    caplog.set_level(logging.DEBUG, logger=SERVER)
    server = serve()
    client = ChannelClient(server.address, SECRET, attempt(harness, 0), ack_timeout_s=5)
    client.register_with_first_event()
    client.send(pickle.dumps("a"))  # out at once with its registration; nothing read yet
    assert client._sock is not None
    unread_data_arrives(client._sock)
    client.close()
    ended(server)
    assert server.dropped_connections == 0
    assert server_lines(caplog) == []


def test_a_task_whose_process_went_away_is_a_debug_line_naming_the_task(
        serve, harness, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger=SERVER)
    server = serve()
    s = connect(serve, server)
    s.sendall(encode(Register(attempt(harness, 1)), SECRET))
    unread_data_arrives(s)
    # a process that dies closes its sockets as a plain close: with the reply unread, a reset
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    ended(server, dropped=1)
    lines = server_lines(caplog)
    assert [level for level, _ in lines] == [logging.DEBUG], lines
    assert lines[0][1].startswith("channel connection of the task of op[1] in epoch "
                                  f"{harness.epoch} (Spark attempt 0) from "), lines
    assert "ended without a clean close (ConnectionResetError" in lines[0][1]


def test_a_task_that_stopped_in_the_middle_of_a_frame_is_an_info_line(
        serve, harness, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger=SERVER)
    server = serve()
    s = connect(serve, server)
    task = attempt(harness, 0)
    s.sendall(encode(Register(task), SECRET))
    unread_data_arrives(s)
    s.recv(4096)
    event = encode(Event(task, 0, pickle.dumps("cut")), SECRET)
    s.sendall(event[:HEADER.size + 10])  # the process ends while writing this frame
    s.shutdown(socket.SHUT_WR)
    ended(server, dropped=1)
    harness.run()
    assert harness.coordinator.got == []
    lines = server_lines(caplog)
    assert [level for level, _ in lines] == [logging.INFO], lines
    assert (f"channel connection of the task of op[0] in epoch {harness.epoch} (Spark "
            f"attempt 0) from ") in lines[0][1]
    assert f"ended {HEADER.size + 10} bytes into a frame (closed): its task stopped while " \
           "writing it" in lines[0][1]


def test_a_partial_frame_from_an_unauthenticated_peer_is_still_a_warning(
        serve, harness, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger=SERVER)
    server = serve()
    s = connect(serve, server)
    s.sendall(encode(Register(attempt(harness, 0)), SECRET)[:20])  # never a whole frame
    s.shutdown(socket.SHUT_WR)
    ended(server, dropped=1)
    lines = server_lines(caplog)
    assert [level for level, _ in lines] == [logging.WARNING], lines
    assert "dropped channel connection from" in lines[0][1]
    assert "connection closed 20 bytes into a frame" in lines[0][1]
