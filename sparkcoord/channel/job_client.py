"""The client of a running job: the user's driver program side of client requests.

Rules:
  1. Each request carries this client's id and a sequence number; after a lost connection it
     is sent again with the same number, and the service answers a repeated one from its log
     (the request takes effect once).
  2. A request returns its RESPONSE, whatever its status (ANSWER, REFUSED, FAILED, or
     UNAVAILABLE: the caller waits for the next run, docs/decisions/096-client-retry-by-status.md);
     no answer within ``timeout_s`` raises :class:`~sparkcoord.core.errors.RequestFailed`, a
     connection that fails more than ``max_retries`` times :class:`ChannelUnavailable`.
  3. Everything it reads is authenticated before it is parsed (frames rule 2).

Thread model: one request at a time (the caller serializes; ``CoordinatedJob`` holds a lock
around it).
"""

from __future__ import annotations

import socket
import time

from sparkcoord.channel.errors import ChannelUnavailable
from sparkcoord.channel.frames import (
    ClientRequest,
    FrameError,
    FrameReader,
    Response,
    authenticate_and_parse,
    encode,
)
from sparkcoord.core.errors import RequestFailed


class JobClient:
    """Asks the coordinators of a running job: the user's driver program side of client
    requests (``CoordinatedJob.request``; module rules 1 to 3).

    Thread model: one request at a time (the caller serializes; ``CoordinatedJob`` holds a
    lock around it).
    """

    def __init__(self, address: tuple[str, int], secret: bytes, client_id: str, *,
                 max_retries: int = 5) -> None:
        self.address = address
        self.secret = secret
        self.client_id = client_id
        self.max_retries = max_retries
        self.next_seq = 0
        self._sock: socket.socket | None = None
        self._reader: FrameReader | None = None

    def request(self, operator: str, payload: bytes, timeout_s: float,
                seq: int | None = None) -> Response:
        """Ask coordinator ``operator``; the RESPONSE (see :meth:`ChannelClient.request`).
        ``seq``: the request's number (this client's next one by default); the same number
        again is a re-send (e.g. to the next run after a restart), answered once.
        Raises :class:`~sparkcoord.core.errors.RequestFailed` after ``timeout_s`` and
        :class:`ChannelUnavailable` when the connection keeps failing."""
        if seq is None:
            seq = self.next_seq
        self.next_seq = max(self.next_seq, seq + 1)
        frame = encode(ClientRequest(operator, self.client_id, seq, payload), self.secret)
        deadline = time.monotonic() + timeout_s
        failures = 0
        sent = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestFailed(f"no answer from coordinator {operator!r} to client "
                                    f"request {seq} within {timeout_s} s")
            try:
                if self._sock is None:
                    sock = socket.create_connection(self.address, timeout=remaining)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._sock, self._reader = sock, FrameReader(sock, 1 << 30)
                    sent = False
                if not sent:
                    self._sock.sendall(frame)
                    sent = True
                self._sock.settimeout(remaining)
                assert self._reader is not None
                raw = self._reader.read_frame()
                if raw is None:
                    raise OSError("the coordination service closed the connection")
                message = authenticate_and_parse(*raw, self.secret)
            except TimeoutError:
                continue
            except (OSError, FrameError) as exc:
                failures += 1
                self.close()
                if failures > self.max_retries:
                    raise ChannelUnavailable(f"client request {seq} to {operator!r}: channel to "
                                             f"{self.address} failed {failures} times: "
                                             f"{exc!r}") from exc
                time.sleep(min(0.02 * 2 ** failures, 1.0))
                continue
            if isinstance(message, Response) and message.seq == seq:
                return message

    def close(self) -> None:
        """Close the connection (the next request opens one). The caller's thread: a client
        of an ended run, or the job's close."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._reader = None
