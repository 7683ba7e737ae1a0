"""The ledger of a task's channel client: what one attempt sent and what was acknowledged.

Sans-IO: the frames to write, never a socket; the client (channel/client.py) writes them,
reads the replies, retries and waits.

Rules (they carry out client rules 1 to 6):
  1. Items are numbered 0, 1, ... without gaps: events and requests share the sequence.
  2. A lazy registration (client rule 2) travels in front of the attempt's first frame, an
     event, a request or its FINISHED, in the same write, so the server handles it first.
  3. An event is unacknowledged until a reply's range covers it; the newest unacknowledged
     events not yet written wait in the burst buffer (client rule 5), which is due when it
     holds ``batch_max`` events or ``batch_max_bytes``, or when nothing else is in flight.
  4. After a reconnect the attempt registers again, then every unacknowledged event goes again
     with its own number, in order, in EVENTS frames of at most ``batch_max`` events and
     ``batch_max_bytes``, then the request waiting for its answer (client rule 6).
  5. A registration's reply sets the execution attempt and the length of the history the
     attempt continues (client rule 3); a refusal is not applied (the client raises it).

Thread model: the client's: the task's thread only.
"""

from __future__ import annotations

from collections import OrderedDict

from sparkcoord.channel.frames import EventFrames, Finished, FrameType, Register, Reply, encode
from sparkcoord.core.ids import TaskAttempt


class Ledger:
    """One task attempt's items on the channel (rules 1 to 5)."""

    def __init__(self, attempt: TaskAttempt, secret: bytes, *, batch_max: int,
                 batch_max_bytes: int) -> None:
        self.attempt = attempt
        self.secret = secret
        self.batch_max = batch_max
        self.batch_max_bytes = batch_max_bytes
        self.next_seq = 0
        self.execution_attempt = 0
        #: the length of the history this attempt continues (its registration's reply)
        self.history_length = 0
        self.register_pending = False  # lazy registration not written yet (rule 2)
        self.register_acked = False
        self.unacked: OrderedDict[int, bytes] = OrderedDict()  # seq -> payload
        self.pending: list[bytes] = []  # the burst buffer: the newest unacked, not yet written
        self.pending_bytes = 0
        self.request: tuple[int, bytes] | None = None  # the request waiting for its answer
        self.frames = EventFrames(attempt, secret)

    def add(self, payload: bytes) -> int:
        """Number an event and put it in the burst buffer (rules 1 and 3); its number. The
        client's ``send``."""
        seq = self.next_seq
        self.next_seq += 1
        self.unacked[seq] = payload
        self.pending.append(payload)
        self.pending_bytes += len(payload)
        return seq

    def burst_full(self) -> bool:
        """Whether the burst buffer holds ``batch_max`` events or ``batch_max_bytes`` (rule 3)."""
        return len(self.pending) >= self.batch_max or self.pending_bytes >= self.batch_max_bytes

    def in_flight(self) -> int:
        """How many events were written and are not acknowledged yet."""
        return len(self.unacked) - len(self.pending)

    def registered_first(self, frame: bytes) -> bytes:
        """``frame``, behind the lazy registration if it is not written yet (rule 2)."""
        if not self.register_pending:
            return frame
        self.register_pending = False
        return encode(Register(self.attempt), self.secret) + frame

    def take_burst(self) -> bytes:
        """The burst buffer as one frame (an EVENT, or EVENTS), emptied; b"" when empty."""
        pending = self.pending
        if not pending:
            return b""
        first = self.next_seq - len(pending)
        frame = (self.frames.encode(first, pending[0]) if len(pending) == 1
                 else self.frames.encode_many(first, pending))
        self.pending = []
        self.pending_bytes = 0
        return self.registered_first(frame)

    def ask(self, payload: bytes) -> tuple[int, bytes]:
        """Number a request as the next item (rule 1): its number and its frame. The burst
        buffer was written before it (client rule 6)."""
        seq = self.next_seq
        self.next_seq += 1
        self.request = (seq, payload)
        return seq, self.registered_first(self.frames.encode_request(seq, payload))

    def finished(self) -> bytes:
        """The FINISHED frame: how many items this attempt sent (client rule 3)."""
        return self.registered_first(encode(Finished(self.attempt, self.next_seq), self.secret))

    def registration(self) -> bytes:
        """A REGISTER frame (a duplicate is acknowledged as one)."""
        return encode(Register(self.attempt), self.secret)

    def resend(self) -> list[bytes]:
        """After a reconnect and its registration: every unacknowledged event again, then
        the waiting request (rule 4). The burst buffer is emptied: its events are among them."""
        self.pending = []
        self.pending_bytes = 0
        frames: list[bytes] = []
        chunk: list[bytes] = []
        first = size = 0
        for seq, payload in self.unacked.items():  # consecutive numbers, oldest first
            if chunk and (len(chunk) >= self.batch_max or size + len(payload) > self.batch_max_bytes):
                frames.append(self.frames.encode_many(first, chunk))
                chunk, size = [], 0
            if not chunk:
                first = seq
            chunk.append(payload)
            size += len(payload)
        if chunk:
            frames.append(self.frames.encode_many(first, chunk))
        if self.request is not None:  # the request waiting for its answer comes last
            seq, payload = self.request
            frames.append(self.frames.encode_request(seq, payload))
        return frames

    def acknowledged(self, reply: Reply) -> None:
        """Apply a reply that is not a refusal (rule 5): its range of events is acknowledged."""
        self.execution_attempt = reply.execution_attempt
        if reply.request is FrameType.REGISTER:
            self.register_acked = True
            self.history_length = max(self.history_length, reply.seq)
        if reply.request is FrameType.EVENT:
            unacked = self.unacked
            for seq in range(reply.seq, reply.seq + reply.count):
                unacked.pop(seq, None)
