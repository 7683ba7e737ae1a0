"""The channel over real loopback TCP against the real coordination service."""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

import pytest

from sparkcoord import OperatorCoordinator
from sparkcoord.channel.client import ChannelClient, ChannelRejected
from sparkcoord.channel.frames import (
    HEADER,
    VERSION,
    Event,
    Events,
    FrameError,
    FrameReader,
    Register,
    authenticate_and_parse,
    check_header,
    encode,
)
from sparkcoord.channel.server import ChannelServer
from sparkcoord.core.entries import EventRunEntry
from sparkcoord.core.ids import SubtaskId, TaskAttempt
from sparkcoord.core.inbound import surviving_events
from sparkcoord.testing import CoordinatorHarness

SECRET = b"s" * 32


class Collect(OperatorCoordinator):
    def start(self) -> None:
        self.got: list[Any] = []

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.got.append((subtask, event))


@pytest.fixture()
def setup():
    h = CoordinatorHarness(Collect, 2, name="op")
    h.start()
    h.checkpoint()
    server = ChannelServer(h.service.inbox, SECRET).start()
    yield h, server
    server.close()


def attempt(h: CoordinatorHarness, subtask: int, number: int = 0) -> TaskAttempt:
    return TaskAttempt(h.service.run_id, SubtaskId("op", subtask), h.epoch, number)


def test_frames_round_trip_and_are_authenticated() -> None:
    a = TaskAttempt("run", SubtaskId("op", 3), 7, 1)
    frame = encode(Event(a, 5, b"payload"), SECRET)
    header, mac, body = frame[:HEADER.size], frame[HEADER.size:HEADER.size + 32], frame[HEADER.size + 32:]
    assert authenticate_and_parse(header, mac, body, SECRET) == Event(a, 5, b"payload")
    with pytest.raises(FrameError, match="authentication failed"):
        authenticate_and_parse(header, mac, body, b"x" * 32)
    with pytest.raises(FrameError, match="authentication failed"):
        authenticate_and_parse(header, mac, body[:-1] + b"!", SECRET)


def test_bad_headers_are_named() -> None:
    with pytest.raises(FrameError, match="magic"):
        check_header(struct.pack(">2sBBI", b"GE", 1, 1, 0), 100)
    with pytest.raises(FrameError, match="version 9"):
        check_header(struct.pack(">2sBBI", b"SC", 9, 1, 0), 100)
    with pytest.raises(FrameError, match="unknown frame type 77"):
        check_header(struct.pack(">2sBBI", b"SC", VERSION, 77, 0), 100)
    with pytest.raises(FrameError, match="exceeds the limit"):
        check_header(struct.pack(">2sBBI", b"SC", VERSION, 2, 101), 100)


def test_events_from_a_task_reach_the_coordinator_in_order_and_are_acknowledged(setup) -> None:
    h, server = setup
    client = ChannelClient(server.address, SECRET, attempt(h, 1))
    client.register()
    for i in range(200):
        client.send(pickle.dumps(i))
    client.flush()
    client.close()
    h.run()
    assert h.coordinator.got == [(1, i) for i in range(200)]


def seqs_of(message: object) -> list[int]:
    """The event numbers a frame carries (an EVENTS frame carries a client's burst)."""
    if isinstance(message, Event):
        return [message.seq]
    if isinstance(message, Events):
        return list(range(message.first_seq, message.first_seq + len(message.payloads)))
    return []


def test_a_lost_ack_is_retried_with_the_same_number_and_applied_once(setup) -> None:
    h, server = setup
    dropped = []

    def lose_ack_of_event_3(message: object) -> str | None:
        if 3 in seqs_of(message) and not dropped:
            dropped.append(3)
            return "drop-after"
        return None

    server.fault = lose_ack_of_event_3
    client = ChannelClient(server.address, SECRET, attempt(h, 0), ack_timeout_s=5)
    client.register()
    for i in range(6):
        client.send(pickle.dumps(i))
    client.flush()
    h.run()
    assert dropped == [3] and client.reconnects >= 1
    assert h.coordinator.got == [(0, i) for i in range(6)]


def test_a_connection_dropped_while_sending_loses_nothing(setup) -> None:
    h, server = setup
    drops = []

    def drop_event_2_once(message: object) -> str | None:
        if 2 in seqs_of(message) and not drops:
            drops.append(1)
            return "drop-before"
        return None

    server.fault = drop_event_2_once
    client = ChannelClient(server.address, SECRET, attempt(h, 0), ack_timeout_s=5)
    client.register()
    for i in range(5):
        client.send(pickle.dumps(i))
    client.flush()
    h.run()
    assert h.coordinator.got == [(0, i) for i in range(5)]


def test_a_rejected_registration_fails_the_task_with_the_reason(setup) -> None:
    h, server = setup
    stale = TaskAttempt("another-run", SubtaskId("op", 0), h.epoch, 0)
    client = ChannelClient(server.address, SECRET, stale)
    with pytest.raises(ChannelRejected, match="not the current run"):
        client.register()


def raw_exchange(address: tuple[str, int], data: bytes) -> bytes:
    """Send ``data``, then everything the server answers before it closes the connection.

    The server may drop the connection as soon as it has read a bad header, before our
    shutdown or recv: a reset then means the same as a close without an answer.
    """
    with socket.create_connection(address, timeout=5) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            return s.recv(1024)
        except TimeoutError:
            raise  # no answer and no close: that is a failure of the test
        except OSError:  # reset, broken pipe, not connected: dropped without an answer
            return b""


def test_forged_garbage_and_truncated_frames_are_dropped_and_the_server_keeps_serving(setup) -> None:
    h, server = setup
    a = attempt(h, 0)
    good = encode(Register(a), SECRET)
    forged = encode(Register(a), b"w" * 32)  # wrong secret
    tampered = bytearray(encode(Event(a, 0, pickle.dumps("evil")), SECRET))
    tampered[-1] ^= 1
    for junk in (forged, bytes(tampered), b"GET / HTTP/1.1\r\n\r\n" + bytes(40), good[:20]):
        assert raw_exchange(server.address, junk) == b""
    assert server.dropped_connections == 4
    h.run()
    assert h.coordinator.got == []
    client = ChannelClient(server.address, SECRET, attempt(h, 0))
    client.register()
    client.send(pickle.dumps("fine"))
    client.flush()
    h.run()
    assert h.coordinator.got == [(0, "fine")]


def test_an_event_the_driver_cannot_unpickle_is_refused_with_a_clear_reason(setup) -> None:
    h, server = setup
    client = ChannelClient(server.address, SECRET, attempt(h, 0))
    client.register()
    client.send(b"\x80\x05not a pickle")
    with pytest.raises(ChannelRejected, match="cannot be unpickled on the driver"):
        client.flush()


def test_the_server_binds_to_loopback_by_default(setup) -> None:
    _, server = setup
    assert server.address[0] == "127.0.0.1"


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        ChannelServer(None, b"short")  # type: ignore[arg-type]


def test_replies_frames_round_trip_and_a_truncated_one_is_named() -> None:
    from sparkcoord.channel.frames import FrameType, Replies, Reply, ReplyVerdict

    replies = Replies((Reply(FrameType.EVENT, 4, ReplyVerdict.ACCEPT, 1, ""),
                       Reply(FrameType.EVENT, 5, ReplyVerdict.REJECT, 1, "gap: expected 4")))
    frame = encode(replies, SECRET)
    header, mac, body = frame[:HEADER.size], frame[HEADER.size:HEADER.size + 32], frame[HEADER.size + 32:]
    assert authenticate_and_parse(header, mac, body, SECRET) == replies
    short = body[:-3]
    short_header = struct.pack(">2sBBI", b"SC", VERSION, int(FrameType.REPLIES), len(short))
    import hmac as _hmac

    short_mac = _hmac.digest(SECRET, short_header + short, "sha256")
    with pytest.raises(FrameError, match="malformed REPLIES frame"):
        authenticate_and_parse(short_header, short_mac, short, SECRET)


def test_runs_of_events_are_decided_in_order_logged_once_and_delivered_in_order(setup) -> None:
    h, _ = setup
    a = attempt(h, 0)
    assert h.service.inbox.attempt_registered(a).verdict.name == "ACCEPT"
    d = pickle.dumps
    decisions = h.service.inbox.event_runs_received([
        (a, 0, (d("e0"), d("e1"))),
        (a, 3, (d("gap"),)),
        (a, 1, (d("e1"), d("e2"))),  # a re-send repeats the logged bytes (checked since 36)
        (a, 3, (d("e3"), b"\x80\x05not a pickle", d("after the bad one"))),
    ])
    assert [(x.duplicates, x.accepted, x.rejected) for x in decisions] == [
        (0, 2, 0), (0, 0, 1), (1, 1, 0), (0, 1, 2)]
    assert "event 3 of" in decisions[1].reason and "arrived before event 2" in decisions[1].reason
    assert "event 4 of" in decisions[3].reason and "cannot be unpickled" in decisions[3].reason
    h.run()
    assert h.coordinator.got == [(0, "e0"), (0, "e1"), (0, "e2"), (0, "e3")]
    log = h.service.storage.read_inbound_log(h.epoch)
    assert sum(isinstance(e, EventRunEntry) for e in log) == 1  # the first run: one entry
    assert [(e.seq, pickle.loads(e.payload)) for e in surviving_events(log)] == [
        (0, "e0"), (1, "e1"), (2, "e2"), (3, "e3")]


def test_pipelined_frames_sent_together_are_all_answered_in_request_order(setup) -> None:
    from sparkcoord.channel.frames import FrameType, Replies

    h, server = setup
    a = attempt(h, 1)
    frames = [encode(Register(a), SECRET)] + [encode(Event(a, i, pickle.dumps(i)), SECRET)
                                              for i in range(20)]
    answers: list[tuple[FrameType, int, str]] = []  # one per request: ranges expanded
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(b"".join(frames))
        reader = FrameReader(s, 1 << 20)
        while len(answers) < 21:
            frame = reader.read_frame()
            assert frame is not None, f"connection closed after {len(answers)} answers"
            message = authenticate_and_parse(*frame, SECRET)
            for r in (message.replies if isinstance(message, Replies) else [message]):
                answers.extend((r.request, seq, r.verdict.name) for seq in range(r.seq, r.seq + r.count))
    assert answers == (
        [(FrameType.REGISTER, 0, "ACCEPT")] + [(FrameType.EVENT, i, "ACCEPT") for i in range(20)])
    h.run()
    assert h.coordinator.got == [(1, i) for i in range(20)]


class _FailingOnce:
    """A socket whose next sendall fails as if the connection had just broken."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def sendall(self, data: bytes) -> None:
        self.sock.close()
        raise BrokenPipeError("connection broke while writing")

    def close(self) -> None:
        self.sock.close()


def test_a_write_that_fails_reconnects_and_resends_at_once_without_waiting_for_a_timeout(
        setup) -> None:
    h, server = setup
    client = ChannelClient(server.address, SECRET, attempt(h, 0), ack_timeout_s=600)
    client.register()
    client.send(pickle.dumps("before"))
    client.flush()
    client._sock = _FailingOnce(client._sock)  # type: ignore[assignment]
    client.send(pickle.dumps("after"))  # the write fails: reconnect, register, resend now
    client.flush()  # with a 600 s ack timeout, a missed resend would hang here
    h.run()
    assert h.coordinator.got == [(0, "before"), (0, "after")]
    assert client.reconnects == 0  # resent by the write's own recovery, not by a read timeout


def test_events_sent_while_one_is_in_flight_travel_as_one_burst_frame(setup) -> None:
    h, server = setup
    seen: list[object] = []

    def hold_the_first_ack(message: object) -> str | None:
        seen.append(message)
        return "delay:2" if isinstance(message, Event) and message.seq == 0 else None

    server.fault = hold_the_first_ack
    client = ChannelClient(server.address, SECRET, attempt(h, 1))
    client.register()
    for i in range(50):  # event 0 goes at once; 1..49 wait for its acknowledgement
        client.send(pickle.dumps(i))
    client.flush()
    h.run()
    assert h.coordinator.got == [(1, i) for i in range(50)]
    assert [type(m).__name__ for m in seen] == ["Register", "Event", "Events"]
    burst = seen[2]
    assert isinstance(burst, Events) and burst.first_seq == 1 and len(burst.payloads) == 49


def test_an_events_frame_round_trips_and_lengths_that_do_not_add_up_are_named() -> None:
    from sparkcoord.channel.frames import EventFrames, FrameType

    a = TaskAttempt("run", SubtaskId("op", 1), 4, 0)
    frame = EventFrames(a, SECRET).encode_many(7, [b"a", b"bb", b""])
    header, mac, body = frame[:HEADER.size], frame[HEADER.size:HEADER.size + 32], frame[HEADER.size + 32:]
    parsed = authenticate_and_parse(header, mac, body, SECRET)
    assert parsed == Events(a, 7, (b"a", b"bb", b""))
    assert encode(parsed, SECRET) == frame
    bad = body + b"x"  # one byte more than the lengths say
    bad_header = struct.pack(">2sBBI", b"SC", VERSION, int(FrameType.EVENTS), len(bad))
    import hmac as _hmac

    with pytest.raises(FrameError, match="malformed EVENTS frame: event lengths"):
        authenticate_and_parse(bad_header, _hmac.digest(SECRET, bad_header + bad, "sha256"), bad, SECRET)


def test_a_task_attempts_cached_frames_are_the_bytes_of_the_generic_encoder() -> None:
    from sparkcoord.channel.frames import EventFrames, Request

    a = TaskAttempt("run", SubtaskId("op", 1), 4, 0)
    frames = EventFrames(a, SECRET)
    assert frames.encode_request(9, b"ask") == encode(Request(a, 9, b"ask"), SECRET)
    assert frames.encode(3, b"ev") == encode(Event(a, 3, b"ev"), SECRET)


def test_a_fault_plan_hits_every_nth_new_event_and_never_a_resent_burst() -> None:
    from sparkcoord.channel.faults import fault_plan

    plan = fault_plan("drop-mid-send")  # every 5th new event
    a = TaskAttempt("run", SubtaskId("op", 0), 0, 0)
    assert [plan(Event(a, i, b"")) for i in range(4)] == [None] * 4
    burst = Events(a, 4, (b"",) * 6)  # events 4..9 carry the 5th and the 10th
    assert plan(burst) == "drop-before"
    assert plan(burst) is None  # the same burst resent after the drop
    assert plan(Register(a)) is None
    with pytest.raises(ValueError, match="unknown channel fault plan 'nope'"):
        fault_plan("nope")


def test_a_lazily_registered_first_attempt_that_sends_nothing_never_connects(setup) -> None:
    h, server = setup
    client = ChannelClient(server.address, SECRET, attempt(h, 0))
    client.register_with_first_event()
    client.flush()
    client.close()
    assert server.frames_served == 0
    assert h.service.inbox.attempt_registered(attempt(h, 0)).verdict.name == "ACCEPT"  # not a duplicate


def test_a_lazy_registration_travels_before_the_first_event_on_the_same_connection(setup) -> None:
    h, server = setup
    seen: list[str] = []

    def record(message: object) -> None:
        seen.append(type(message).__name__)

    server.fault = record  # type: ignore[assignment]
    client = ChannelClient(server.address, SECRET, attempt(h, 1))
    client.register_with_first_event()
    client.send(pickle.dumps("first"))
    assert client.registered_attempt() == 0
    client.send(pickle.dumps("second"))
    client.flush()
    h.run()
    assert seen[:2] == ["Register", "Event"]
    assert h.coordinator.got == [(1, "first"), (1, "second")]


def test_reading_the_attempt_of_a_lazy_client_that_sent_nothing_registers_it(setup) -> None:
    h, server = setup
    client = ChannelClient(server.address, SECRET, attempt(h, 0))
    client.register_with_first_event()
    assert client.registered_attempt() == 0
    assert h.service.inbox.attempt_registered(attempt(h, 0)).verdict.name == "DUPLICATE"


@pytest.mark.parametrize("plan", [None, "hits-nothing", "drops-the-third"])
def test_frames_read_at_once_go_to_the_service_as_one_batch_with_a_fault_plan_too(
        setup, plan) -> None:
    # a fault plan runs the production path (frames batched per read): only a frame it hits
    # is handled apart, after the frames before it went as one batch
    from sparkcoord.channel import server as server_module

    h, server = setup
    if plan == "hits-nothing":
        server.fault = lambda message: None
    elif plan == "drops-the-third":
        server.fault = lambda message: ("drop-before" if isinstance(message, Event)
                                        and message.seq == 2 else None)
    sizes: list[int] = []
    dispatch = server._dispatch_batch

    def recorded(batch: Any, writer: Any) -> Any:
        sizes.append(len(batch))
        return dispatch(batch, writer)

    server._dispatch_batch = recorded  # type: ignore[method-assign]
    ours, theirs = socket.socketpair()
    a = attempt(h, 0)
    frames = [Register(a), *(Event(a, i, pickle.dumps(i)) for i in range(5))]
    theirs.sendall(b"".join(encode(f, SECRET) for f in frames))  # all there before the read
    conn = server_module._Connection(ours, FrameReader(ours, server.max_frame_bytes),
                                     server_module._Writer(ours, server), float("inf"))
    server._readable(conn)
    h.run()
    if plan == "drops-the-third":
        assert sizes == [3]  # Register and events 0 and 1, batched; the connection then closed
        assert h.coordinator.got == [(0, 0), (0, 1)]
    else:
        assert sizes == [6]
        assert h.coordinator.got == [(0, i) for i in range(5)]
    theirs.close()
