"""The channel's wire format: versioned, length-prefixed frames authenticated with HMAC-SHA256.

Rules:
  1. Every frame is ``header | mac | body``: header = magic ``SC``, version, type, body length
     (8 bytes); mac = HMAC-SHA256 over header and body with the job's secret (32 bytes).
  2. A reader checks magic, version, type and length limit from the header, then the MAC,
     and only then parses the body. Event payloads stay opaque bytes here: nothing received is
     unpickled before it is authenticated.
  3. Any violation raises :class:`FrameError`; the connection that sent it is dropped.

Thread model: none (pure functions and a small incremental decoder per connection).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from dataclasses import dataclass

from sparkcoord.core.errors import SparkCoordError
from sparkcoord.core.ids import SubtaskId, TaskAttempt

MAGIC = b"SC"
VERSION = 1
HEADER = struct.Struct(">2sBBI")
MAC_SIZE = 32
_ATTEMPT = struct.Struct(">IqI")  # index, epoch, number
_SEQ = struct.Struct(">Q")
_REPLY = struct.Struct(">BQBI")  # request type, seq, verdict, execution attempt


class FrameError(SparkCoordError):
    """A malformed, oversized, unauthenticated or unknown frame."""


class FrameType(enum.IntEnum):
    REGISTER = 1
    EVENT = 2
    REPLY = 3
    FETCH = 4
    DELIVERY = 5


class ReplyVerdict(enum.IntEnum):
    ACCEPT = 0
    DUPLICATE = 1
    REJECT = 2


@dataclass(frozen=True, slots=True)
class Register:
    attempt: TaskAttempt


@dataclass(frozen=True, slots=True)
class Event:
    attempt: TaskAttempt
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    request: FrameType
    seq: int
    verdict: ReplyVerdict
    execution_attempt: int
    reason: str


@dataclass(frozen=True, slots=True)
class Fetch:
    """A downstream subtask asks for its events of ``epoch`` (it knows the epoch from Spark's
    offset log; it does not know the run yet)."""

    operator: str
    index: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """The answer to a Fetch: the run id and the events, or a refusal reason."""

    run: str
    epoch: int
    events: tuple[bytes, ...]
    reason: str = ""


Message = Register | Event | Reply | Fetch | Delivery


def _text(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def _attempt(a: TaskAttempt) -> bytes:
    return _text(a.run) + _text(a.subtask.operator) + _ATTEMPT.pack(a.subtask.index, a.epoch, a.number)


def encode(message: Message, secret: bytes) -> bytes:
    """One authenticated frame for ``message``."""
    if isinstance(message, Register):
        kind, body = FrameType.REGISTER, _attempt(message.attempt)
    elif isinstance(message, Event):
        kind = FrameType.EVENT
        body = _attempt(message.attempt) + _SEQ.pack(message.seq) + message.payload
    elif isinstance(message, Reply):
        kind = FrameType.REPLY
        body = _REPLY.pack(message.request, message.seq, message.verdict,
                           message.execution_attempt) + message.reason.encode()
    elif isinstance(message, Fetch):
        kind = FrameType.FETCH
        body = _text(message.operator) + struct.pack(">Iq", message.index, message.epoch)
    else:
        kind = FrameType.DELIVERY
        events = message.events
        body = b"".join([_text(message.run), _text(message.reason),
                         struct.pack(f">qI{len(events)}I", message.epoch, len(events),
                                     *map(len, events)), *events])
    header = HEADER.pack(MAGIC, VERSION, kind, len(body))
    mac = hmac.new(secret, header + body, hashlib.sha256).digest()
    return header + mac + body


def check_header(header: bytes, max_body: int) -> tuple[FrameType, int]:
    """Validate a frame header; returns (type, body length)."""
    magic, version, kind, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise FrameError(f"not a sparkcoord frame (magic {magic!r})")
    if version != VERSION:
        raise FrameError(f"frame version {version}; this side speaks version {VERSION}")
    try:
        frame_type = FrameType(kind)
    except ValueError:
        raise FrameError(f"unknown frame type {kind}") from None
    if length > max_body:
        raise FrameError(f"frame body of {length} bytes exceeds the limit of {max_body}")
    return frame_type, length


def authenticate_and_parse(header: bytes, mac: bytes, body: bytes, secret: bytes) -> Message:
    """Verify ``mac`` over header and body, then parse the body."""
    expected = hmac.new(secret, header + body, hashlib.sha256).digest()
    if not hmac.compare_digest(mac, expected):
        raise FrameError("frame authentication failed (wrong secret or tampered frame)")
    frame_type, _ = check_header(header, len(body))
    try:
        return _parse(frame_type, memoryview(body))
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise FrameError(f"malformed {frame_type.name} frame: {exc}") from None


def _parse(frame_type: FrameType, body: memoryview) -> Message:
    pos = 0

    def text() -> str:
        nonlocal pos
        (n,) = struct.unpack_from(">H", body, pos)
        pos += 2
        if pos + n > len(body):
            raise ValueError("string runs past the end of the frame")
        s = bytes(body[pos:pos + n]).decode()
        pos += n
        return s

    if frame_type is FrameType.REPLY:
        request, seq, verdict, execution_attempt = _REPLY.unpack_from(body, 0)
        return Reply(FrameType(request), seq, ReplyVerdict(verdict), execution_attempt,
                     bytes(body[_REPLY.size:]).decode())
    if frame_type is FrameType.FETCH:
        operator = text()
        index, epoch = struct.unpack_from(">Iq", body, pos)
        if pos + 12 != len(body):
            raise ValueError("trailing bytes after a fetch")
        return Fetch(operator, index, epoch)
    if frame_type is FrameType.DELIVERY:
        run = text()
        reason = text()
        epoch, count = struct.unpack_from(">qI", body, pos)
        pos += 12
        lengths = struct.unpack_from(f">{count}I", body, pos)
        pos += 4 * count
        if pos + sum(lengths) != len(body):
            raise ValueError("delivery lengths do not match the frame")
        events = []
        for n in lengths:
            events.append(bytes(body[pos:pos + n]))
            pos += n
        return Delivery(run, epoch, tuple(events), reason)
    run = text()
    operator = text()
    index, epoch, number = _ATTEMPT.unpack_from(body, pos)
    pos += _ATTEMPT.size
    attempt = TaskAttempt(run, SubtaskId(operator, index), epoch, number)
    if frame_type is FrameType.REGISTER:
        if pos != len(body):
            raise ValueError("trailing bytes after a registration")
        return Register(attempt)
    (seq,) = _SEQ.unpack_from(body, pos)
    pos += _SEQ.size
    return Event(attempt, seq, bytes(body[pos:]))
