"""Dispatch: the channel server's decoded frames to the coordination service, and its answers.

Rules:
  1. Dispatch sees only messages the I/O loop authenticated and parsed (frames rule 2, server
     rule 2); event and request payloads stay opaque bytes here and go to the service as they
     are: nothing from the network is unpickled before it is authenticated. Dispatch does no
     socket I/O of its own: it writes through a connection's :class:`Writer`
     (channel/connection.py).
  2. The frames of one read go to the service in frame order. Consecutive event frames go as
     one call of runs (an EVENTS frame is a run, a lone EVENT a run of one: one lock, one log
     write); each run is answered by at most three range replies (duplicates, accepted,
     rejected: a count each), and adjacent ranges with the same verdict are merged.
  3. A frame is acknowledged only after the service logged it: a REGISTER, FETCH or event
     is answered by the I/O loop with the read's other replies (consecutive replies as one
     REPLIES frame: one MAC for the batch); a REQUEST, CLIENT_REQUEST or FINISHED is answered
     by the thread that completes its answer (the coordinator's, usually, or the I/O loop
     itself when the coordinator's mailbox was idle: mailbox rules 2 and 3), the moment it
     exists, through the connection's writer.
  4. A refusal of a task (a REJECT, or a FAILED response) carries the failover hold of that
     moment (docs/decisions/044-quiet-failover.md); a client's refusal carries none.
  5. A client may send only REGISTER, EVENT, EVENTS, FETCH, REQUEST, CLIENT_REQUEST and
     FINISHED frames; any other raises :class:`FrameError` (its connection is dropped, server
     rule 3).

Thread model: :meth:`Dispatcher.dispatch_batch` on the server's I/O loop; the answers'
callbacks on whichever thread completes them. The handler must be thread-safe (the
coordination service is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Protocol

from sparkcoord.channel.connection import Writer
from sparkcoord.channel.frames import (
    ClientRequest,
    Delivery,
    Event,
    Events,
    Fetch,
    Finished,
    FrameError,
    FrameType,
    Message,
    Register,
    Replies,
    Reply,
    ReplyVerdict,
    Request,
    Response,
    ResponseStatus,
    encode,
)
from sparkcoord.core.entries import Answer, Asker, DriverClient
from sparkcoord.core.errors import RunUnavailable, SparkCoordError
from sparkcoord.core.ids import TaskAttempt
from sparkcoord.core.inbound import InboundDecision, RunDecision, Verdict

VERDICTS = {Verdict.ACCEPT: ReplyVerdict.ACCEPT, Verdict.DUPLICATE: ReplyVerdict.DUPLICATE,
            Verdict.REJECT: ReplyVerdict.REJECT}

#: what dispatch answers with: a reply (written by the I/O loop), a delivery or a response
Answered = Reply | Delivery | Response


class InboundHandler(Protocol):
    """What the server hands frames to (the coordination service)."""

    def attempt_registered(self, attempt: TaskAttempt) -> InboundDecision: ...

    def attempt_finished(self, attempt: TaskAttempt, sent: int) -> Future[InboundDecision]:
        """An attempt that adopted a history finished after ``sent`` items: the future of
        the decision (it resolves once the coordinator took back what it did not send)."""
        ...

    def event_runs_received(self, runs: Sequence[tuple[TaskAttempt, int, tuple[bytes, ...]]]
                            ) -> list[RunDecision]:
        """Runs of consecutive events ``(attempt, first_seq, payloads)`` of one connection,
        decided in order."""
        ...

    def request_received(self, asker: Asker, seq: int, payload: bytes) -> Future[Answer]:
        """Request ``seq`` of ``asker`` (a task attempt, or a client of the job): the future
        of its logged answer (it fails with the reason when no answer will come)."""
        ...


class DeliveryHandler(Protocol):
    """Serves Fetch requests of downstream subtasks (optional)."""

    def fetch(self, operator: str, index: int, epoch: int) -> Delivery: ...


def no_hold() -> int:
    """The hold of a refusal that waits for nothing (a client's; a server with no owner)."""
    return 0


class Dispatcher:
    """Hands one server's decoded frames to its handler and encodes the answers (rules 2 to
    5). Made by the :class:`~sparkcoord.channel.server.ChannelServer`; ``hold`` is the
    server's failover hold of the moment (it reads the owner's ``failover_hold`` each time)."""

    def __init__(self, handler: InboundHandler, deliveries: DeliveryHandler | None,
                 secret: bytes, hold: Callable[[], int]) -> None:
        self.handler = handler
        self.deliveries = deliveries
        self.secret = secret
        self.hold = hold

    def encode(self, answers: list[Answered]) -> bytes:
        """The frames of a read's answers, for one ``sendall`` (the I/O loop): consecutive
        replies travel as one REPLIES frame, one MAC for the whole batch (rule 3)."""
        frames: list[bytes] = []
        run: list[Reply] = []
        for answer in [*answers, None]:
            if isinstance(answer, Reply):
                run.append(answer)
                continue
            if run:
                frames.append(encode(run[0] if len(run) == 1 else Replies(tuple(run)), self.secret))
                run = []
            if answer is not None:
                frames.append(encode(answer, self.secret))
        return b"".join(frames)

    def dispatch_batch(self, batch: list[Message], writer: Writer | None = None
                       ) -> list[Answered]:
        """Hand the authenticated messages of one read to the service, in order (rule 2);
        the answers the I/O loop writes. Requests and FINISHED frames are answered later
        through ``writer`` (rule 3). The I/O loop, or a fault plan's action on it."""
        replies: list[Answered] = []
        i = 0
        while i < len(batch):
            j = i
            while j < len(batch) and isinstance(batch[j], (Event, Events)):
                j += 1
            if j == i:
                message = batch[i]
                i += 1
                if isinstance(message, (Request, ClientRequest)) and writer is not None:
                    self._request(message, writer)  # answered when its answer is logged
                    continue
                if isinstance(message, Finished) and writer is not None:
                    self._finished(message, writer)  # answered when the coordinator took
                    continue                         # back what the attempt did not send
                replies.append(self._dispatch(message))
                continue
            runs = [(m.attempt, m.first_seq, m.payloads) if isinstance(m, Events)
                    else (m.attempt, m.seq, (m.payload,))
                    for m in batch[i:j] if isinstance(m, (Event, Events))]
            for (_, first, _), decision in zip(runs, self.handler.event_runs_received(runs), strict=True):
                seq = first
                for count, verdict, reason in ((decision.duplicates, ReplyVerdict.DUPLICATE, ""),
                                               (decision.accepted, ReplyVerdict.ACCEPT, ""),
                                               (decision.rejected, ReplyVerdict.REJECT, decision.reason)):
                    if count:
                        hold = self.hold() if verdict is ReplyVerdict.REJECT else 0
                        add_range(replies, Reply(FrameType.EVENT, seq, verdict,
                                                 decision.execution_attempt, reason, count, hold))
                        seq += count
            i = j
        return replies

    def _request(self, message: Request | ClientRequest, writer: Writer) -> None:
        # The answer is written by the thread that logs it (the coordinator's, usually) the
        # moment it exists: the connection's thread does not wait for it (one thread handoff
        # less per request), and goes back to reading the socket.
        seq = message.seq
        if isinstance(message, Request):
            asker: Asker = message.attempt
            # a task's answer: a failed job's tasks wait (rule 4)
            hold = self.hold
        else:
            asker, hold = DriverClient(message.operator, message.client), no_hold
        answer = self.handler.request_received(asker, seq, message.payload)

        def answered(f: Future[Answer]) -> None:
            writer.send(encode(response(seq, f, hold), self.secret), quiet=True)
        answer.add_done_callback(answered)

    def _finished(self, message: Finished, writer: Writer) -> None:
        # As a request: the reply is written by the thread that completes the decision (the
        # coordinator's, after handle_items_withdrawn), not waited for here.
        seq = message.seq

        def decided(f: Future[InboundDecision]) -> None:
            decision = f.result()
            verdict = VERDICTS[decision.verdict]
            reply = Reply(FrameType.FINISHED, seq, verdict, decision.execution_attempt,
                          decision.reason, 1,
                          self.hold() if verdict is ReplyVerdict.REJECT else 0)
            writer.send(encode(reply, self.secret), quiet=True)
        self.handler.attempt_finished(message.attempt, seq).add_done_callback(decided)

    def _dispatch(self, message: object) -> Answered:
        if isinstance(message, Register):
            decision = self.handler.attempt_registered(message.attempt)
            verdict = VERDICTS[decision.verdict]
            # ``seq``: the length of the history the attempt continues (it then says how
            # much of it it sent when it finishes)
            return Reply(FrameType.REGISTER, decision.history_length, verdict,
                         decision.execution_attempt, decision.reason, 1,
                         self.hold() if verdict is ReplyVerdict.REJECT else 0)

        if isinstance(message, Fetch):
            if self.deliveries is None:
                return Delivery("", message.epoch, (), "this server serves no downstream operators")
            return self.deliveries.fetch(message.operator, message.index, message.epoch)
        raise FrameError(f"a client may not send {type(message).__name__} frames")  # rule 5


def response(seq: int, answer: Future[Answer], hold: Callable[[], int] = no_hold) -> Response:
    """The RESPONSE frame's message for a resolved answer future (its error: FAILED, with the
    task's hold if the job failed)."""
    exc = answer.exception()
    if isinstance(exc, RunUnavailable):  # a client's request: the next run takes it
        return Response(seq, ResponseStatus.UNAVAILABLE, str(exc).encode())
    if exc is not None:
        reason = str(exc) if isinstance(exc, SparkCoordError) else repr(exc)
        return Response(seq, ResponseStatus.FAILED, reason.encode(), hold())
    entry = answer.result()
    status = ResponseStatus.REFUSED if entry.failed else ResponseStatus.ANSWER
    return Response(seq, status, entry.payload)


def add_range(replies: list[Answered], reply: Reply) -> None:
    """Append ``reply``, merged into the previous one if it continues its range alike."""
    last = replies[-1] if replies else None
    if (isinstance(last, Reply) and last.request is FrameType.EVENT and not last.reason
            and not reply.reason and last.verdict is reply.verdict
            and last.execution_attempt == reply.execution_attempt
            and last.seq + last.count == reply.seq):
        replies[-1] = Reply(FrameType.EVENT, last.seq, last.verdict, last.execution_attempt, "",
                            last.count + reply.count)
    else:
        replies.append(reply)
