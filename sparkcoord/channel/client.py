"""The channel client, used by a subtask inside a Spark task.

Rules:
  1. Register the task attempt first; then send events numbered 0, 1, ... (no gaps).
  2. A first attempt may register lazily (:meth:`register_with_first_event`): the REGISTER
     frame then travels just before its first frame (an event, a request or its FINISHED), on
     the same connection, so the server still handles it first. A retried
     attempt registers eagerly, so that the service resets the coordinator before anything
     else even if the retry sends nothing.
  3. A registration's reply tells the length of the history the attempt continues (a retry,
     or the rerun of a batch after a restore, adopts the logged history once requests were
     answered). Every attempt says at its end how many items it sent (:meth:`finish`), also
     one that sent nothing: the service logs it, withdraws the rest of a longer history
     (docs/protocol.md [every-answer-consumed-or-returned]), and holds a batch that runs again
     after a restart to it (a sink may hold the finished attempt's output: docs/protocol.md
     [logged-finish-binds-the-rerun]).
  4. Up to ``window`` events may be unacknowledged; :meth:`flush` waits for every
     acknowledgement. The task must not finish its batch before ``flush`` returns.
  5. Coalescing (like Nagle's algorithm): an event sent while none is in flight goes out at
     once; events sent while others are in flight wait in a burst buffer, which goes out as
     one EVENTS frame when the in-flight ones are acknowledged, when it holds ``batch_max``
     events or ``batch_max_bytes``, when the window is full, or at :meth:`flush`. So a lone
     event costs one round trip, and a burst costs about one frame per round trip.
  6. A request (:meth:`request`) is the next item of the same sequence: the burst buffer goes
     out before it, and the call blocks until its RESPONSE arrives (the answer was logged
     before it was sent) or ``timeout_s`` passes. After a reconnect it is sent again with
     the same number, after the unacknowledged events; the service answers a repeated
     request from its log.
  7. A REJECT fails the task with the service's reason (one line, no traceback of ours: the
     task did nothing wrong). A REJECT or FAILED response because the job failed carries a
     hold: the task waits that long before it fails, so that the job runner, which stops the
     query on a job failure, cancels it first (Spark logs a cancelled task as one line, and
     does not retry it; docs/decisions/044-quiet-failover.md). It waits on the refusing
     connection, which the service closes when that stop closes the run (server rule 8): the
     task then ends at once, and its Python worker is free for the restarted query
     (docs/decisions/081-release-refused-tasks.md). A lost connection or a reply that does
     not come within ``ack_timeout_s`` is retried: reconnect, register again (a duplicate
     registration is acknowledged), re-send every unacknowledged event with its number; after
     ``max_retries`` the task fails, but not before ``retry_window_s`` (15 s) has passed
     since the first failure: a connection the service closes unanswered is what its full
     connection cap, or a flood of foreign connections it sheds, looks like, and the window
     outlasts the service's first-frame deadline (10 s by default; server rules 4 to 6).
     Except when nothing listens at the address (a refused connect: the run ended): that
     fails after ``max_retries`` alone (about 1.3 s).
  8. A task closes its connection cleanly when it ends (:meth:`close`, also after its
     operator raised): a half close, then what the service still writes is read until the
     service closes its side (at most ``CLOSE_WAIT_S``). A socket closed with replies unread
     in it ends with a TCP reset, which the server cannot tell from a task whose process went
     away (server rule 3; replies can trail the answer a task last read: an answer given on
     the server's I/O loop goes out before the acknowledgements of the same read). A
     connection that broke, or that the service refused, is closed at once
     (docs/decisions/059-healthy-log.md).

Parts: what the attempt sent and what was acknowledged is its ledger's (channel/ledger.py,
sans-IO); this module does the socket work: connecting, writing, reading replies, retries and
refusal waits. A client of the running job (the user's driver program) is a
:class:`JobClient` (channel/job_client.py, exported here too).

Thread model: one client per task, used from the task's thread only.
"""

from __future__ import annotations

import socket
import time

from sparkcoord.channel.errors import ChannelRejected as ChannelRejected
from sparkcoord.channel.errors import ChannelUnavailable as ChannelUnavailable
from sparkcoord.channel.frames import (
    Delivery,
    Fetch,
    FrameError,
    FrameReader,
    FrameType,
    Replies,
    Reply,
    ReplyVerdict,
    Response,
    ResponseStatus,
    authenticate_and_parse,
    encode,
)
from sparkcoord.channel.job_client import JobClient as JobClient
from sparkcoord.channel.ledger import Ledger
from sparkcoord.core.errors import RequestFailed
from sparkcoord.core.ids import TaskAttempt


def refused(what: str, reason: str, hold_ms: int,
            sock: socket.socket | None = None) -> ChannelRejected:
    """The error for a refusal of ``what`` (task thread), after waiting up to ``hold_ms`` for
    the job runner to cancel this task (rule 7): on ``sock``, the refusing connection, which
    the service closes when the query is stopped for the failover (server rule 8; the task
    was cancelled just before, so Spark takes its error for the cancellation's), else for the
    whole hold. A job failure's cause may span lines (a coordinator's traceback, which the job
    runner reports whole); the task's error keeps the first. ``sock`` is closed."""
    try:
        if hold_ms > 0:
            released = _released(sock, hold_ms / 1000)
            lines = reason.strip().splitlines() or [""]
            reason = lines[0] + (" [...]" if len(lines) > 1 else "")
            if not released:
                reason += (" (nothing cancelled this task: is the query run by "
                           "CoordinatedJob.run/start?)")
    finally:
        if sock is not None:
            sock.close()
    return ChannelRejected(f"{what}: {reason}")


def _released(sock: socket.socket | None, wait_s: float) -> bool:
    """Wait up to ``wait_s`` for the service to close ``sock`` (its end of the connection);
    whether it did. Without a socket, the whole wait."""
    deadline = time.monotonic() + wait_s
    if sock is None:
        time.sleep(wait_s)
        return False
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(1 << 16):
                return True  # the service closed the connection: the run was stopped
    except TimeoutError:
        return False
    except OSError:
        return True  # reset: the service's process went away with the run
    return False


class ChannelClient:
    """Sends one task attempt's events to the coordination service."""

    def __init__(self, address: tuple[str, int], secret: bytes, attempt: TaskAttempt, *,
                 window: int = 1024, batch_max: int = 256, batch_max_bytes: int = 1 << 16,
                 ack_timeout_s: float = 30.0, max_retries: int = 5,
                 retry_window_s: float = 15.0) -> None:
        self.address = address
        self.secret = secret
        self.attempt = attempt
        self.window = window
        self.ack_timeout_s = ack_timeout_s
        self.max_retries = max_retries
        self.retry_window_s = retry_window_s
        #: what this attempt sent and what was acknowledged (sans-IO: channel/ledger.py)
        self._ledger = Ledger(attempt, secret, batch_max=batch_max,
                              batch_max_bytes=batch_max_bytes)
        self._sock: socket.socket | None = None
        self._reader: FrameReader | None = None
        self.reconnects = 0

    @property
    def next_seq(self) -> int:
        """The number of the next item (ledger rule 1); set before the first send, it
        continues a subtask's sequence where another client left it. Task thread."""
        return self._ledger.next_seq

    @next_seq.setter
    def next_seq(self, seq: int) -> None:
        self._ledger.next_seq = seq

    @property
    def execution_attempt(self) -> int:
        """The coordinator-visible execution attempt (the latest reply's). Task thread."""
        return self._ledger.execution_attempt

    @property
    def history_length(self) -> int:
        """The length of the history this attempt continues (its registration's reply)."""
        return self._ledger.history_length

    # ------------------------------------------------------------------------------- api
    def fetch(self, operator: str, index: int, epoch: int) -> Delivery:
        """Ask for a downstream subtask's events of ``epoch`` (before registering)."""
        result: list[Delivery] = []

        def once() -> None:
            sock = self._connected()
            sock.sendall(encode(Fetch(operator, index, epoch), self.secret))
            message = self._read_message()
            if not isinstance(message, Delivery):
                raise FrameError(f"expected a delivery, got {type(message).__name__}")
            result.append(message)

        self._with_retries(once, resend=False)
        delivery = result[-1]
        if delivery.reason:
            raise ChannelRejected(f"{operator}[{index}]: no events for epoch {epoch}: {delivery.reason}")
        return delivery

    def register(self) -> int:
        """Register the attempt; returns the coordinator-visible execution attempt number."""
        self._ledger.register_pending = False
        self._with_retries(self._register_once)
        return self.execution_attempt

    def register_with_first_event(self) -> None:
        """Register lazily: the REGISTER frame goes out with the first event (rule 2)."""
        self._ledger.register_pending = True

    def registered_attempt(self) -> int:
        """The coordinator-visible execution attempt; registers now if still lazy. Task thread."""
        ledger = self._ledger
        if ledger.register_pending and not ledger.unacked:
            return self.register()
        while not ledger.register_acked:
            self._with_retries(self._read_one_reply)
        return self.execution_attempt

    def send(self, payload: bytes) -> int:
        """Send one encoded event; returns its sequence number. May block on the window.

        Task thread. The event is on the wire now, or in the burst buffer (rule 5).
        """
        ledger = self._ledger
        seq = ledger.add(payload)
        full = ledger.burst_full()
        if not full and ledger.in_flight() and len(ledger.pending) % 8 == 1:
            # others in flight: have their acknowledgements arrived? (a non-blocking look,
            # taken at the first buffered event and every 8th after it, not per event)
            self._poll_replies()
        if full or not ledger.in_flight():
            self._write_pending()
        while len(ledger.unacked) >= self.window:
            self._with_retries(self._read_one_reply)
        return seq

    def request(self, payload: bytes, timeout_s: float) -> Response:
        """Send one encoded request as the next item and wait for its answer. Task thread.

        Returns the RESPONSE: ANSWER (the pickled answer), REFUSED (the coordinator's reason)
        or FAILED (the service's reason: the job failed, the run ended, ...). Raises
        :class:`~sparkcoord.core.errors.RequestFailed` after ``timeout_s`` without an answer,
        and :class:`ChannelUnavailable` when the service cannot be reached (rule 7).
        """
        self._write_pending()  # events sent before the request go first, in order
        seq, frame = self._ledger.ask(payload)  # rule 2: behind the registration if lazy
        deadline = time.monotonic() + timeout_s
        try:
            self._connected().sendall(frame)
        except OSError:
            self._drop()
        failures = 0
        first_failure = 0.0
        shortened = False
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RequestFailed(f"{self.attempt}: no answer to request {seq} within "
                                        f"{timeout_s} s")
                try:
                    if self._sock is None:
                        self._resend_all()  # registers, re-sends the events and the request
                    assert self._sock is not None
                    if remaining < self.ack_timeout_s:  # else the socket's own timeout
                        self._sock.settimeout(remaining)
                        shortened = True
                    message = self._read_message()
                except TimeoutError:
                    continue  # the deadline decides; the connection stays
                except (OSError, FrameError) as exc:
                    failures += 1
                    self._drop()
                    if failures == 1:
                        first_failure = time.monotonic()
                    if self._give_up(failures, first_failure, exc):
                        raise ChannelUnavailable(
                            f"{self.attempt}: channel to {self.address} failed {failures} "
                            f"times in {time.monotonic() - first_failure:.1f} s while request "
                            f"{seq} waited for its answer: {exc!r}") from exc
                    time.sleep(min(0.02 * 2 ** failures, 1.0))
                    self.reconnects += 1
                    continue
                if isinstance(message, Response):
                    if message.seq != seq:
                        continue  # a stale answer of an earlier connection
                    if message.status is ResponseStatus.FAILED and message.hold_ms > 0:
                        # the job failed: nothing more to say on this channel
                        raise refused(f"{self.attempt}: the coordination service refused "
                                      f"request {seq}", message.payload.decode(errors="replace"),
                                      message.hold_ms, self._detach())
                    return message
                if isinstance(message, Reply):
                    self._apply(message)
                elif isinstance(message, Replies):
                    for reply in message.replies:
                        self._apply(reply)
                else:
                    raise FrameError(f"expected a response, got {type(message).__name__}")
        finally:
            self._ledger.request = None
            if shortened and self._sock is not None:
                self._sock.settimeout(self.ack_timeout_s)

    def flush(self) -> None:
        """Wait until every sent event is acknowledged (logged and on the coordinator's mailbox).

        Task thread; the task calls it before it finishes its batch.
        """
        while self._ledger.unacked:
            self._with_retries(self._read_one_reply)

    def finish(self) -> None:
        """The task's batch is done: wait for every acknowledgement (:meth:`flush`), then say
        how many items this attempt sent and wait until the service logged it (and withdrew
        the rest of a longer history): rule 3. An attempt that sent nothing registers with
        it (rule 2). Task thread, at the end of the batch, before the task's state is stored
        and before any of its rows can reach a sink."""
        self.flush()

        def once() -> None:
            # behind the registration if it sent nothing (rule 2)
            self._connected().sendall(self._ledger.finished())
            while not any(r.request is FrameType.FINISHED for r in self._read_replies()):
                pass

        self._with_retries(once)

    #: How long :meth:`close` waits for the service to close its side of the connection.
    CLOSE_WAIT_S = 1.0

    def close(self) -> None:
        """Close the connection cleanly (rule 8). Task thread, at the task's end."""
        sock = self._sock
        if sock is None:
            return
        self._sock = None
        self._reader = None
        try:
            sock.shutdown(socket.SHUT_WR)  # the service reads the end, and closes its side
            sock.settimeout(self.CLOSE_WAIT_S)
            deadline = time.monotonic() + self.CLOSE_WAIT_S
            while sock.recv(1 << 16) and time.monotonic() < deadline:
                pass  # replies still on their way: read, so that none is left unread
        except OSError:
            pass  # broken, reset, or no close within the wait: nothing to do but close
        finally:
            sock.close()

    # -------------------------------------------------------------------------- internals
    def _detach(self) -> socket.socket | None:
        """The connection, taken from this client (a refusal waits on it, then closes it)."""
        sock, self._sock, self._reader = self._sock, None, None
        return sock

    def _drop(self) -> None:
        """Close at once: the connection broke, or the service refused (rule 8)."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._reader = None

    def _write_pending(self) -> None:
        frame = self._ledger.take_burst()  # rule 2: behind the registration if still lazy
        if not frame:
            return
        try:
            self._connected().sendall(frame)
        except OSError:
            self._drop()
            self._with_retries(self._resend_all)  # reconnect, register, re-send every unacked

    def _poll_replies(self) -> None:
        reader = self._reader
        if reader is None:
            return
        try:
            if reader.poll():
                while self._ledger.unacked and reader.frame_ready():
                    self._read_replies()
        except (OSError, FrameError):
            pass  # the next blocking read meets the same problem and retries (rule 7)

    def _connected(self) -> socket.socket:
        if self._sock is None:
            sock = socket.create_connection(self.address, timeout=self.ack_timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
            self._reader = FrameReader(sock, 1 << 30)
        return self._sock

    def _give_up(self, failures: int, first_failure: float, exc: BaseException) -> bool:
        """Whether a failing channel has been retried enough (rule 7)."""
        if failures <= self.max_retries:
            return False
        return (isinstance(exc, ConnectionRefusedError)  # nothing listens: the run ended
                or time.monotonic() - first_failure >= self.retry_window_s)

    def _with_retries(self, action: object, resend: bool = True) -> None:
        failures = 0
        first_failure = 0.0
        reconnect = False
        while True:
            try:
                if reconnect and resend:
                    self._resend_all()
                action()  # type: ignore[operator]
                return
            except (OSError, FrameError) as exc:
                failures += 1
                self._drop()
                if failures == 1:
                    first_failure = time.monotonic()
                if self._give_up(failures, first_failure, exc):
                    raise ChannelUnavailable(
                        f"{self.attempt}: channel to {self.address} failed {failures} times in "
                        f"{time.monotonic() - first_failure:.1f} s: {exc!r}") from exc
                time.sleep(min(0.02 * 2 ** failures, 1.0))
                self.reconnects += 1
                reconnect = True

    def _register_once(self) -> None:
        self._connected().sendall(self._ledger.registration())
        while not any(r.request is FrameType.REGISTER for r in self._read_replies()):
            pass

    def _resend_all(self) -> None:
        # After a reconnect: register again (acknowledged as a duplicate), then every
        # unacknowledged event again, in order, with its own number.
        sock = self._connected()
        sock.sendall(self._ledger.registration())
        self._read_replies()
        for frame in self._ledger.resend():  # the events in order, then the request (rule 6)
            sock.sendall(frame)

    def _read_one_reply(self) -> None:
        self._write_pending()  # never wait for acknowledgements of events still buffered here
        # one socket read usually brings a batch of replies: apply all that are buffered
        self._read_replies()
        reader = self._reader
        while reader is not None and self._ledger.unacked and reader.frame_ready():
            self._read_replies()

    def _read_message(self) -> object:
        self._connected()
        assert self._reader is not None
        frame = self._reader.read_frame()
        if frame is None:
            raise OSError("the coordination service closed the connection")
        return authenticate_and_parse(*frame, self.secret)

    def _read_replies(self) -> list[Reply]:
        """Read one REPLY or REPLIES frame and apply each reply in order."""
        message = self._read_message()
        if isinstance(message, Reply):
            replies = [message]
        elif isinstance(message, Replies):
            replies = list(message.replies)
        elif isinstance(message, Response):
            return []  # a stale answer to a request a reconnect asked again
        else:
            raise FrameError(f"expected a reply, got {type(message).__name__}")
        for reply in replies:
            self._apply(reply)
        return replies

    def _apply(self, reply: Reply) -> None:
        if reply.verdict is ReplyVerdict.REJECT:
            what = ("registration" if reply.request is FrameType.REGISTER
                    else "the end of its batch" if reply.request is FrameType.FINISHED
                    else f"event {reply.seq}")
            raise refused(f"{self.attempt}: the coordination service refused {what}",
                          reply.reason, reply.hold_ms, self._detach())
        self._ledger.acknowledged(reply)
