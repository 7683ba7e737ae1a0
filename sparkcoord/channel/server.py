"""The channel server: a TCP server in the driver-side runner process.

Rules:
  1. Binds to loopback unless a host is configured (clusters set the driver's address).
  2. One thread per connection reads frames one by one; each frame is authenticated before
     its body is parsed; the handler's decision is written back as a REPLY frame.
  3. A malformed, oversized or unauthenticated frame, or a connection closed mid-frame, drops
     that connection only; the server and the other connections carry on.

Thread model: ``start``/``close`` from the owner's thread; one daemon thread accepts, one daemon
thread per connection serves. The handler must be thread-safe (the coordination service is).
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from typing import Protocol

from sparkcoord.channel.frames import (
    HEADER,
    MAC_SIZE,
    Delivery,
    Event,
    Fetch,
    FrameError,
    FrameType,
    Register,
    Reply,
    ReplyVerdict,
    authenticate_and_parse,
    check_header,
    encode,
)
from sparkcoord.core.ids import TaskAttempt
from sparkcoord.core.inbound import InboundDecision, Verdict

log = logging.getLogger(__name__)

_VERDICTS = {Verdict.ACCEPT: ReplyVerdict.ACCEPT, Verdict.DUPLICATE: ReplyVerdict.DUPLICATE,
             Verdict.REJECT: ReplyVerdict.REJECT}


class InboundHandler(Protocol):
    """What the server hands frames to (the coordination service)."""

    def attempt_registered(self, attempt: TaskAttempt) -> InboundDecision: ...

    def event_received(self, attempt: TaskAttempt, seq: int, payload: bytes) -> InboundDecision: ...


class DeliveryHandler(Protocol):
    """Serves Fetch requests of downstream subtasks (optional)."""

    def fetch(self, operator: str, index: int, epoch: int) -> Delivery: ...


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """Read exactly ``n`` bytes; None if the peer closed before sending any of them.

    A peer that closes after sending part of them cut a frame short: :class:`FrameError`.
    """
    chunks = []
    want = n
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            if n == want:
                return None
            raise FrameError(f"connection closed {want - n} bytes into a {want}-byte read")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class ChannelServer:
    """Serves subtask connections for one coordination service."""

    def __init__(self, handler: InboundHandler, secret: bytes, *, host: str = "127.0.0.1",
                 port: int = 0, max_frame_bytes: int = (1 << 20) + 4096,
                 deliveries: DeliveryHandler | None = None) -> None:
        if len(secret) < 16:
            raise ValueError("the channel secret must be at least 16 bytes")
        self.handler = handler
        self.deliveries = deliveries
        self.secret = secret
        self.max_frame_bytes = max_frame_bytes
        #: Test hook, None in normal operation: called with each authenticated message, it may
        #: return "drop-before" (close without handling it) or "drop-after" (handle it, then
        #: close without replying: a lost acknowledgement), or "delay:<seconds>".
        self.fault: Callable[[object], str | None] | None = None
        self.dropped_connections = 0
        self.frames_served = 0
        self._lock = threading.Lock()
        server = self

        class _Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server._serve(self.request)

        class _Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = _Server((host, port), _Handler, bind_and_activate=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="sparkcoord-channel",
                                        daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> ChannelServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = sock.getpeername()
        try:
            while True:
                head = recv_exact(sock, HEADER.size + MAC_SIZE)
                if head is None:
                    return  # closed between frames: normal end
                header, mac = head[:HEADER.size], head[HEADER.size:]
                _, length = check_header(header, self.max_frame_bytes)
                body = recv_exact(sock, length)
                if body is None:
                    raise FrameError("connection closed in the middle of a frame")
                message = authenticate_and_parse(header, mac, body, self.secret)
                if self.fault is not None and self._inject(message, sock):
                    return
                sock.sendall(encode(self._dispatch(message), self.secret))
                self.frames_served += 1
        except (FrameError, OSError) as exc:
            with self._lock:
                self.dropped_connections += 1
            log.warning("dropped channel connection from %s: %s", peer, exc)

    def _inject(self, message: object, sock: socket.socket) -> bool:
        assert self.fault is not None
        action = self.fault(message)
        if action == "drop-before":
            sock.close()
            return True
        if action == "drop-after":
            self._dispatch(message)
            sock.close()
            return True
        if action and action.startswith("delay:"):
            threading.Event().wait(float(action.split(":", 1)[1]))
        return False

    def _dispatch(self, message: object) -> Reply | Delivery:
        if isinstance(message, Register):
            decision = self.handler.attempt_registered(message.attempt)
            return Reply(FrameType.REGISTER, 0, _VERDICTS[decision.verdict],
                         decision.execution_attempt, decision.reason)
        if isinstance(message, Event):
            decision = self.handler.event_received(message.attempt, message.seq, message.payload)
            return Reply(FrameType.EVENT, message.seq, _VERDICTS[decision.verdict],
                         decision.execution_attempt, decision.reason)
        if isinstance(message, Fetch):
            if self.deliveries is None:
                return Delivery("", message.epoch, (), "this server serves no downstream operators")
            return self.deliveries.fetch(message.operator, message.index, message.epoch)
        raise FrameError(f"a client may not send {type(message).__name__} frames")
