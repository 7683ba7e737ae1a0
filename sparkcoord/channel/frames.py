"""The channel's wire format: versioned, length-prefixed frames authenticated with HMAC-SHA256.

Rules:
  1. Every frame is ``header | mac | body``: header = magic ``SC``, version, type, body length
     (8 bytes); mac = HMAC-SHA256 over header and body with the job's secret (32 bytes).
  2. A reader checks magic, version, type and length limit from the header, then the MAC,
     and only then parses the body. Event payloads stay opaque bytes here: nothing received is
     unpickled before it is authenticated.
  3. Any violation raises :class:`FrameError`; the connection that sent it is dropped.

Thread model: none for the pure functions; a :class:`FrameReader` (the decoder that reads
whole frames from a socket, for the server's I/O loop and for a client) belongs to the one
thread that serves or uses its socket.
"""

from __future__ import annotations

import enum
import hmac
import select
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from sparkcoord.core.errors import SparkCoordError
from sparkcoord.core.ids import SubtaskId, TaskAttempt

MAGIC = b"SC"
VERSION = 6  # 2: a reply covers a range of sequence numbers (count); 3: requests;
# 4: a refusal because the job failed carries how long the task waits to be cancelled;
# 5: FINISHED, and a registration's reply carries the adopted history's length in ``seq``;
# 6: the response status UNAVAILABLE (a client asks the job's next run: no text to match)
HEADER = struct.Struct(">2sBBI")
MAC_SIZE = 32
_ATTEMPT = struct.Struct(">IqI")  # index, epoch, number
_SEQ = struct.Struct(">Q")
# request type, first seq, count, verdict, execution attempt, hold (ms)
_REPLY = struct.Struct(">BQIBII")
_HOLD = struct.Struct(">I")


class FrameError(SparkCoordError):
    """A malformed, oversized, unauthenticated or unknown frame."""


class FrameType(enum.IntEnum):
    REGISTER = 1
    EVENT = 2
    REPLY = 3
    FETCH = 4
    DELIVERY = 5
    REPLIES = 6  # several replies in one frame (the server's answer to a pipelined batch)
    EVENTS = 7  # consecutive events of one attempt in one frame (a client's burst)
    REQUEST = 8  # a request of one attempt (shares the sequence of its events)
    RESPONSE = 9  # the logged answer to a request, or why there is none
    CLIENT_REQUEST = 10  # a request of a client of the job (the user's driver program)
    FINISHED = 11  # an attempt that adopted a history finished after ``seq`` items (the rest
    # is withdrawn: docs/protocol.md [every-answer-consumed-or-returned])


class ResponseStatus(enum.IntEnum):
    ANSWER = 0   # the coordinator's answer (pickled)
    REFUSED = 1  # the coordinator refused the request; the body is its reason
    FAILED = 2   # no answer will come (the service refused it, the job failed); the reason
    #: no run can take a client's request now (starting, between a checkpoint's trigger and
    #: its seal, failed, closed); the job's next run (or this one, a moment later) will; the
    #: reason. The client re-sends the same request (docs/protocol.md
    #: [client-requests-take-effect-once]).
    UNAVAILABLE = 3


class ReplyVerdict(enum.IntEnum):
    ACCEPT = 0
    DUPLICATE = 1
    REJECT = 2


@dataclass(frozen=True, slots=True)
class Register:
    attempt: TaskAttempt


@dataclass(frozen=True, slots=True)
class Finished:
    """The attempt finished its batch having sent items 0 .. ``seq`` - 1."""

    attempt: TaskAttempt
    seq: int


@dataclass(frozen=True, slots=True)
class Event:
    attempt: TaskAttempt
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to a registration, or to events ``seq`` .. ``seq + count - 1`` of the
    connection's attempt (one verdict for a run of events: an acknowledgement of a burst)."""

    request: FrameType
    seq: int
    verdict: ReplyVerdict
    execution_attempt: int
    reason: str
    count: int = 1
    #: A REJECT because the job failed: how long (ms) the task should wait for the job runner
    #: to cancel it before failing by itself (docs/decisions/044-quiet-failover.md); 0 otherwise.
    hold_ms: int = 0


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


@dataclass(frozen=True, slots=True)
class Events:
    """Events ``first_seq``, ``first_seq + 1``, ... of one attempt, in order."""

    attempt: TaskAttempt
    first_seq: int
    payloads: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Request:
    """Request ``seq`` of ``attempt``: the task waits for its :class:`Response`."""

    attempt: TaskAttempt
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """Request ``seq`` of client ``client`` (a driver program's id) to coordinator ``operator``."""

    operator: str
    client: str
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Response:
    """The answer to request ``seq`` of the connection's attempt (logged before it is sent)."""

    seq: int
    status: ResponseStatus
    payload: bytes
    #: FAILED because the job failed: as :attr:`Reply.hold_ms`.
    hold_ms: int = 0


@dataclass(frozen=True, slots=True)
class Replies:
    """The replies to several requests of one connection, in request order."""

    replies: tuple[Reply, ...]


Message = (Register | Event | Events | Reply | Fetch | Delivery | Replies | Request | Response
           | ClientRequest | Finished)
_REASON = struct.Struct(">H")


def _events_body(prefix: bytes, first_seq: int, payloads: Sequence[bytes]) -> bytes:
    n = len(payloads)
    return b"".join([prefix, _SEQ.pack(first_seq), struct.pack(f">I{n}I", n, *map(len, payloads)),
                     *payloads])


def _mac(secret: bytes, data: bytes) -> bytes:
    return hmac.digest(secret, data, "sha256")  # one-shot OpenSSL call: the hot path's MAC


class EventFrames:
    """Encodes the event and request frames of one task attempt (the attempt's bytes are
    encoded once).

    Thread model: owned by the client's task thread.
    """

    def __init__(self, attempt: TaskAttempt, secret: bytes) -> None:
        self.prefix = _attempt(attempt)
        self.secret = secret

    def encode(self, seq: int, payload: bytes) -> bytes:
        """The authenticated frame of event ``seq``; the same bytes as ``encode(Event(...))``."""
        return self._item(FrameType.EVENT, seq, payload)

    def encode_request(self, seq: int, payload: bytes) -> bytes:
        """The authenticated frame of request ``seq``; the same bytes as
        ``encode(Request(...))``."""
        return self._item(FrameType.REQUEST, seq, payload)

    def _item(self, kind: FrameType, seq: int, payload: bytes) -> bytes:
        # an EVENT and a REQUEST frame differ only in their type: attempt, number, payload
        body = self.prefix + _SEQ.pack(seq) + payload
        header = HEADER.pack(MAGIC, VERSION, kind, len(body))
        return header + _mac(self.secret, header + body) + body

    def encode_many(self, first_seq: int, payloads: list[bytes]) -> bytes:
        """One authenticated EVENTS frame for events ``first_seq``, ``first_seq + 1``, ..."""
        body = _events_body(self.prefix, first_seq, payloads)
        header = HEADER.pack(MAGIC, VERSION, FrameType.EVENTS, len(body))
        return header + _mac(self.secret, header + body) + body


def _text(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def _attempt(a: TaskAttempt) -> bytes:
    return _text(a.run) + _text(a.subtask.operator) + _ATTEMPT.pack(a.subtask.index, a.epoch, a.number)


def encode(message: Message, secret: bytes) -> bytes:
    """One authenticated frame for ``message``."""
    # the request path's two frames first: each isinstance test costs on every frame
    if isinstance(message, Response):
        kind = FrameType.RESPONSE
        body = (_SEQ.pack(message.seq) + bytes([message.status]) + _HOLD.pack(message.hold_ms)
                + message.payload)
    elif isinstance(message, Request):
        kind = FrameType.REQUEST
        body = _attempt(message.attempt) + _SEQ.pack(message.seq) + message.payload
    elif isinstance(message, Register):
        kind, body = FrameType.REGISTER, _attempt(message.attempt)
    elif isinstance(message, Finished):
        kind, body = FrameType.FINISHED, _attempt(message.attempt) + _SEQ.pack(message.seq)
    elif isinstance(message, Event):
        kind = FrameType.EVENT
        body = _attempt(message.attempt) + _SEQ.pack(message.seq) + message.payload
    elif isinstance(message, Reply):
        kind = FrameType.REPLY
        body = _REPLY.pack(message.request, message.seq, message.count, message.verdict,
                           message.execution_attempt, message.hold_ms) + message.reason.encode()
    elif isinstance(message, Events):
        kind = FrameType.EVENTS
        body = _events_body(_attempt(message.attempt), message.first_seq, message.payloads)
    elif isinstance(message, Replies):
        kind = FrameType.REPLIES
        parts = [struct.pack(">I", len(message.replies))]
        for r in message.replies:
            reason = r.reason.encode()
            parts.append(_REPLY.pack(r.request, r.seq, r.count, r.verdict, r.execution_attempt,
                                     r.hold_ms))
            parts.append(_REASON.pack(len(reason)) + reason)
        body = b"".join(parts)
    elif isinstance(message, ClientRequest):
        kind = FrameType.CLIENT_REQUEST
        body = (_text(message.operator) + _text(message.client) + _SEQ.pack(message.seq)
                + message.payload)
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
    return header + _mac(secret, header + body) + body


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
    if not hmac.compare_digest(mac, _mac(secret, header + body)):
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
        request, seq, count, verdict, execution_attempt, hold = _REPLY.unpack_from(body, 0)
        return Reply(FrameType(request), seq, ReplyVerdict(verdict), execution_attempt,
                     bytes(body[_REPLY.size:]).decode(), count, hold)
    if frame_type is FrameType.REPLIES:
        (count,) = struct.unpack_from(">I", body, 0)
        pos = 4
        replies = []
        for _ in range(count):
            request, seq, covered, verdict, execution_attempt, hold = _REPLY.unpack_from(body, pos)
            pos += _REPLY.size
            (n,) = _REASON.unpack_from(body, pos)
            pos += _REASON.size
            if pos + n > len(body):
                raise ValueError("reply reason runs past the end of the frame")
            replies.append(Reply(FrameType(request), seq, ReplyVerdict(verdict), execution_attempt,
                                 bytes(body[pos:pos + n]).decode(), covered, hold))
            pos += n
        if pos != len(body):
            raise ValueError("trailing bytes after the replies")
        return Replies(tuple(replies))
    if frame_type is FrameType.RESPONSE:
        (seq,) = _SEQ.unpack_from(body, 0)
        if len(body) < _SEQ.size + 1 + _HOLD.size:
            raise ValueError("a response without its status byte and hold")
        (hold,) = _HOLD.unpack_from(body, _SEQ.size + 1)
        return Response(seq, ResponseStatus(body[_SEQ.size]),
                        bytes(body[_SEQ.size + 1 + _HOLD.size:]), hold)
    if frame_type is FrameType.CLIENT_REQUEST:
        operator = text()
        client = text()
        (seq,) = _SEQ.unpack_from(body, pos)
        return ClientRequest(operator, client, seq, bytes(body[pos + _SEQ.size:]))
    if frame_type is FrameType.FETCH:
        operator = text()
        index, epoch = struct.unpack_from(">Iq", body, pos)
        if pos + 12 != len(body):
            raise ValueError("trailing bytes after a fetch")
        return Fetch(operator, index, epoch)
    if frame_type is FrameType.DELIVERY:
        run = text()
        reason = text()
        (epoch,) = struct.unpack_from(">q", body, pos)
        return Delivery(run, epoch, _blobs(body, pos + 8, "delivery"), reason)
    attempt, pos = _parse_attempt(body)
    if frame_type is FrameType.REGISTER:
        if pos != len(body):
            raise ValueError("trailing bytes after a registration")
        return Register(attempt)
    (seq,) = _SEQ.unpack_from(body, pos)
    pos += _SEQ.size
    if frame_type is FrameType.EVENTS:
        return Events(attempt, seq, _blobs(body, pos, "event"))
    if frame_type is FrameType.REQUEST:
        return Request(attempt, seq, bytes(body[pos:]))
    if frame_type is FrameType.FINISHED:
        if pos != len(body):
            raise ValueError("trailing bytes after a finish")
        return Finished(attempt, seq)
    return Event(attempt, seq, bytes(body[pos:]))


def _blobs(body: memoryview, pos: int, what: str) -> tuple[bytes, ...]:
    """``count | count lengths | the blobs`` from ``pos`` to the end of the frame."""
    (count,) = struct.unpack_from(">I", body, pos)
    pos += 4
    if pos + 4 * count > len(body):
        raise ValueError(f"{what} count runs past the end of the frame")
    lengths = struct.unpack_from(f">{count}I", body, pos)
    pos += 4 * count
    if pos + sum(lengths) != len(body):
        raise ValueError(f"{what} lengths do not match the frame")
    blobs = []
    for n in lengths:
        blobs.append(bytes(body[pos:pos + n]))
        pos += n
    return tuple(blobs)


# A task sends its attempt in every frame: parse each distinct encoding once and hand out the
# same object, so that the gate's "is this the live attempt" check is an identity check.
_ATTEMPT_CACHE: dict[bytes, TaskAttempt] = {}
_ATTEMPT_CACHE_LIMIT = 256


def _parse_attempt(body: memoryview) -> tuple[TaskAttempt, int]:
    (n_run,) = struct.unpack_from(">H", body, 0)
    n_op_at = 2 + n_run
    (n_op,) = struct.unpack_from(">H", body, n_op_at)
    end = n_op_at + 2 + n_op + _ATTEMPT.size
    if end > len(body):
        raise ValueError("task attempt runs past the end of the frame")
    key = bytes(body[:end])
    attempt = _ATTEMPT_CACHE.get(key)
    if attempt is None:
        run = key[2:n_op_at].decode()
        operator = key[n_op_at + 2:n_op_at + 2 + n_op].decode()
        index, epoch, number = _ATTEMPT.unpack_from(key, n_op_at + 2 + n_op)
        attempt = TaskAttempt(run, SubtaskId(operator, index), epoch, number)
        if len(_ATTEMPT_CACHE) >= _ATTEMPT_CACHE_LIMIT:
            _ATTEMPT_CACHE.clear()  # bounded: attempts of old epochs are not needed again
        _ATTEMPT_CACHE[key] = attempt
    return attempt, end


class FrameReader:
    """Reads whole frames from a socket through a buffer (one ``recv`` for many frames).

    Blocking use (the client): :meth:`read_frame`. Event-driven use (the server's I/O loop,
    once the socket is readable): :meth:`receive`, then :meth:`next_frame` until None.

    Thread model: owned by the one thread that serves (or, in the client, uses) the socket.
    """

    _CHUNK = 1 << 16

    def __init__(self, sock: socket.socket, max_body: int) -> None:
        self.sock = sock
        self.max_body = max_body
        self._buf = bytearray()
        self._pos = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a frame."""
        return len(self._buf) - self._pos

    def receive(self) -> bool:
        """One ``recv`` (the socket is readable: it does not block); False on end of stream."""
        self._compact()
        chunk = self.sock.recv(self._CHUNK)
        if not chunk:
            return False
        self._buf += chunk
        return True

    def next_frame(self) -> tuple[bytes, bytes, bytes] | None:
        """The next complete buffered frame as (header, mac, body), unauthenticated, or None
        if it is not all here yet. A bad header raises :class:`FrameError` as soon as header
        and MAC are here (an oversized frame is refused before its body is waited for)."""
        head = HEADER.size + MAC_SIZE
        start = self._pos
        if len(self._buf) - start < head:
            return None
        _, length = check_header(bytes(self._buf[start:start + HEADER.size]), self.max_body)
        if len(self._buf) - start < head + length:
            return None
        return self._take(start, length)

    def _compact(self) -> None:
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[:self._pos]  # now and then, not per frame
            self._pos = 0

    def _take(self, start: int, length: int) -> tuple[bytes, bytes, bytes]:
        head = HEADER.size + MAC_SIZE
        header = bytes(self._buf[start:start + HEADER.size])
        mac = bytes(self._buf[start + HEADER.size:start + head])
        body = bytes(self._buf[start + head:start + head + length])
        self._pos = start + head + length
        return header, mac, body

    def frame_ready(self) -> bool:
        """Whether a complete frame is already buffered (no socket read needed)."""
        available = len(self._buf) - self._pos
        head = HEADER.size + MAC_SIZE
        if available < head:
            return False
        # the length field only; read_frame checks the whole header before using it
        length = int.from_bytes(self._buf[self._pos + HEADER.size - 4:self._pos + HEADER.size], "big")
        return available >= head + length

    def read_frame(self) -> tuple[bytes, bytes, bytes] | None:
        """The next frame as (header, mac, body), unauthenticated; None on a clean close
        between frames. Blocks on the socket until the frame is complete."""
        head = HEADER.size + MAC_SIZE
        if not self._fill(head):
            return None
        start = self._pos
        header = bytes(self._buf[start:start + HEADER.size])
        _, length = check_header(header, self.max_body)  # before reading a huge body
        if not self._fill(head + length):
            raise FrameError("connection closed in the middle of a frame")
        return self._take(self._pos, length)

    def poll(self) -> bool:
        """Buffer whatever the socket already has, without blocking; whether anything came.

        Raises ``OSError`` when the peer closed the connection.
        """
        readable, _, _ = select.select([self.sock], [], [], 0)
        if not readable:
            return False
        chunk = self.sock.recv(self._CHUNK)
        if not chunk:
            raise OSError("the peer closed the connection")
        self._buf += chunk
        return True

    def _fill(self, need: int) -> bool:
        """Make ``need`` bytes available from the read position; False on EOF before any."""
        self._compact()
        while len(self._buf) - self._pos < need:
            chunk = self.sock.recv(max(self._CHUNK, need))
            if not chunk:
                if len(self._buf) == self._pos:
                    return False
                raise FrameError(f"connection closed {len(self._buf) - self._pos} bytes into "
                                 f"a {need}-byte read")
            self._buf += chunk
        return True
