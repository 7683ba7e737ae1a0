"""The channel client's ledger (channel/ledger.py), sans-IO: numbering, the lazy registration,
the burst buffer, acknowledged ranges and the re-send after a reconnect, without a socket."""

from __future__ import annotations

from sparkcoord.channel.errors import ChannelRejected
from sparkcoord.channel.frames import (
    HEADER,
    MAC_SIZE,
    Events,
    Finished,
    FrameType,
    Register,
    Reply,
    ReplyVerdict,
    Request,
    authenticate_and_parse,
    encode,
)
from sparkcoord.channel.ledger import Ledger
from sparkcoord.core.ids import SubtaskId, TaskAttempt

SECRET = b"s" * 32
ATTEMPT = TaskAttempt("run", SubtaskId("op", 0), 3, 0)


def messages(data: bytes) -> list[object]:
    """The frames of ``data``, authenticated and parsed, in order."""
    out = []
    while data:
        _, _, _, length = HEADER.unpack_from(data)
        end = HEADER.size + MAC_SIZE + length
        out.append(authenticate_and_parse(data[:HEADER.size], data[HEADER.size:HEADER.size + MAC_SIZE],
                                          data[HEADER.size + MAC_SIZE:end], SECRET))
        data = data[end:]
    return out


def test_a_lazy_registration_travels_once_in_front_of_the_first_frame() -> None:
    ledger = Ledger(ATTEMPT, SECRET, batch_max=4, batch_max_bytes=1 << 16)
    ledger.register_pending = True
    assert [ledger.add(b"a"), ledger.add(b"b")] == [0, 1]
    burst = ledger.take_burst()
    assert messages(burst) == [Register(ATTEMPT), Events(ATTEMPT, 0, (b"a", b"b"))]
    assert ledger.take_burst() == b"" and not ledger.pending
    seq, frame = ledger.ask(b"q")
    assert seq == 2 and frame == encode(Request(ATTEMPT, 2, b"q"), SECRET)  # no second REGISTER


def test_a_resend_goes_in_bounded_bursts_in_order_then_the_waiting_request() -> None:
    ledger = Ledger(ATTEMPT, SECRET, batch_max=2, batch_max_bytes=5)
    for payload in (b"a", b"b", b"c", b"dddd", b"e"):
        ledger.add(payload)
    ledger.take_burst()
    ledger.acknowledged(Reply(FrameType.EVENT, 0, ReplyVerdict.ACCEPT, 1, "", 1))  # event 0
    ledger.add(b"f")  # still in the burst buffer: resent with the others, not twice
    ledger.ask(b"q")
    resent = [messages(frame) for frame in ledger.resend()]
    assert resent == [[Events(ATTEMPT, 1, (b"b", b"c"))],  # batch_max events
                      [Events(ATTEMPT, 3, (b"dddd", b"e"))],  # batch_max_bytes
                      [Events(ATTEMPT, 5, (b"f",))], [Request(ATTEMPT, 6, b"q")]]
    assert not ledger.pending and ledger.execution_attempt == 1
    assert ledger.in_flight() == 5  # events 1 to 5, unacknowledged


def test_a_registration_reply_sets_the_history_and_is_the_acknowledgement() -> None:
    ledger = Ledger(ATTEMPT, SECRET, batch_max=4, batch_max_bytes=1 << 16)
    ledger.acknowledged(Reply(FrameType.REGISTER, 7, ReplyVerdict.DUPLICATE, 2, "", 1))
    assert (ledger.register_acked, ledger.history_length, ledger.execution_attempt) == (True, 7, 2)
    assert messages(ledger.finished()) == [Finished(ATTEMPT, 0)]  # registered: no REGISTER


def test_the_client_s_errors_keep_the_name_of_the_client_module() -> None:
    # their traceback line is what a task's failure shows (tests/test_operator_errors.py)
    from sparkcoord.channel import client

    assert client.ChannelRejected is ChannelRejected
    assert f"{ChannelRejected.__module__}.{ChannelRejected.__qualname__}" == (
        "sparkcoord.channel.client.ChannelRejected")
    assert client.ChannelUnavailable.__module__ == "sparkcoord.channel.client"
    assert client.JobClient.__module__ == "sparkcoord.channel.job_client"
