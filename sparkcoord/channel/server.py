"""The channel server: a TCP server in the driver-side runner process.

Rules:
  1. Binds to loopback unless a host is configured (clusters set the driver's address).
  2. One thread, the I/O loop, reads every connection (a selector: no thread per connection);
     each frame is authenticated before its body is parsed; the handler's decisions are
     written back as replies, in request order.
  3. A malformed, oversized or unauthenticated frame, or a connection closed mid-frame, drops
     that connection only; the server and the other connections carry on. The end of a
     connection: a close between frames is a normal end, without a line (a task closes
     cleanly after its batch, client rule 8; so does the socket of a process that dies with
     no reply unread in it). A reset between frames (a process that went away with replies
     unread: a task cancelled by a query stop, killed, or failed) is a DEBUG line naming the
     task, since it is no fault of the channel: Spark's log says what happened to the task,
     and the service logs a failed task's retry at INFO. A connection that authenticated and
     ends in the middle of a frame (its task stopped while writing) is an INFO line; an
     unauthenticated one that does is dropped with a WARNING, as any frame that is not ours
     (docs/decisions/059-healthy-log.md).
  4. A connection must complete its first authenticated frame within ``first_frame_timeout_s``
     of being accepted (a total deadline, not per read: a client trickling bytes is dropped
     too); after that it may stay idle for as long as it likes (a task between events).
  5. Nothing unauthenticated can crowd out a task. Connections that have not yet sent an
     authenticated frame have a budget of their own, ``max_unauthenticated`` (default
     max(16, max_connections // 4)), apart from the cap of rule 6. When more than that wait,
     the I/O loop first reads the ones that sent something (a task sends its first frame
     as soon as it connects), then drops the oldest that still wait: the newest are kept,
     so idle sockets opened earlier cannot keep a task's fresh connection out. Connections
     the accept thread handed over and the loop has not taken yet are bounded alike (a busy
     loop: the oldest are closed). One WARNING line, then at most one every 10 s.
  6. At most ``max_connections`` authenticated connections are served at once; unauthenticated
     ones never count against it and never evict an authenticated one. While it is full, a
     new connection is closed as soon as it is accepted, before the I/O loop sees it; one
     that authenticates while it is full is closed then, unanswered (its task retries). One
     WARNING line, then at most one every 10 s with the number refused since.
  7. The listen backlog is ``listen_backlog`` (connections the kernel queues before the
     accept thread takes them: sized for the run's parallelism).
  8. Closing the server of a run whose job failed (the query stopped for the failover:
     ``failover_hold`` is positive) closes every connection at once: a task refused for the
     failure waits on its connection for its cancellation (client rule 7), and this close
     is that cancellation's sign, so its Python worker is free for the restarted query at
     once instead of after Spark's kill timeout (docs/decisions/081-release-refused-tasks.md).

Theory of operation: a client pipelines up to its window of events, in bursts (EVENTS frames).
The I/O loop reads a readable socket in large chunks (:class:`FrameReader`), authenticates
every complete frame in its buffer, and hands the consecutive event frames to the service as
runs in one call (one lock, one log write: the service's critical section is per batch, in
frame order). Each run is answered by range replies (duplicates, accepted, rejected: a count
each, adjacent ranges merged), all written with one ``sendall``. A frame is acknowledged only
after the service logged it, so batching changes the cost, not the guarantee. A request whose
coordinator's mailbox is idle is answered on the I/O loop itself (the service claims the
mailbox: mailbox rules 2 and 3); its answer, and any answer completed later on another
thread, is written by the thread that has it (:class:`_Writer`). Sockets stay blocking: the
loop reads only a readable one, and a write blocks only until the task's own socket buffer
takes it (a task reads its replies).

Thread model: ``start``/``close`` from the owner's thread; one daemon thread accepts (and
refuses connections while the cap is full, rule 6) and hands admitted connections to the one
daemon I/O thread, which serves them all until their peers close them (also after ``close``,
which only stops accepting). The handler must be thread-safe (the coordination service is).
"""

from __future__ import annotations

import itertools
import logging
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Protocol

from sparkcoord.channel.frames import (
    ClientRequest,
    Delivery,
    Event,
    Events,
    Fetch,
    Finished,
    FrameError,
    FrameReader,
    FrameType,
    Message,
    Register,
    Replies,
    Reply,
    ReplyVerdict,
    Request,
    Response,
    ResponseStatus,
    authenticate_and_parse,
    encode,
)
from sparkcoord.core.entries import Answer, Asker, DriverClient
from sparkcoord.core.errors import RunUnavailable, SparkCoordError
from sparkcoord.core.ids import TaskAttempt
from sparkcoord.core.inbound import (
    InboundDecision,
    RunDecision,
    Verdict,
)

log = logging.getLogger(__name__)

_VERDICTS = {Verdict.ACCEPT: ReplyVerdict.ACCEPT, Verdict.DUPLICATE: ReplyVerdict.DUPLICATE,
             Verdict.REJECT: ReplyVerdict.REJECT}


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


class ChannelServer:
    """Serves subtask connections for one coordination service.

    Limits (module rules 4 to 7): ``first_frame_timeout_s`` for a connection's first
    authenticated frame, counted from its accept; ``max_unauthenticated`` connections waiting
    for it (beyond that the oldest are dropped, counted in ``evicted_connections``);
    ``max_connections`` authenticated ones served at once (more are closed and counted in
    ``refused_connections``); ``listen_backlog`` for the kernel's queue of connections not
    yet accepted.
    """

    #: At most one WARNING line about refused (or about evicted) connections per this many
    #: seconds.
    REFUSAL_LOG_INTERVAL_S = 10.0

    def __init__(self, handler: InboundHandler, secret: bytes, *, host: str = "127.0.0.1",
                 port: int = 0, max_frame_bytes: int = (1 << 20) + 4096,
                 deliveries: DeliveryHandler | None = None, first_frame_timeout_s: float = 10.0,
                 max_connections: int = 256, listen_backlog: int = 128,
                 max_unauthenticated: int | None = None) -> None:
        if len(secret) < 16:
            raise ValueError("the channel secret must be at least 16 bytes")
        if first_frame_timeout_s <= 0:
            raise ValueError(f"first_frame_timeout_s must be > 0, got {first_frame_timeout_s}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if listen_backlog < 1:
            raise ValueError(f"listen_backlog must be >= 1, got {listen_backlog}")
        if max_unauthenticated is None:
            max_unauthenticated = max(16, max_connections // 4)
        if max_unauthenticated < 1:
            raise ValueError(f"max_unauthenticated must be >= 1, got {max_unauthenticated}")
        self.handler = handler
        self.deliveries = deliveries
        self.secret = secret
        self.max_frame_bytes = max_frame_bytes
        self.first_frame_timeout_s = first_frame_timeout_s
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self.listen_backlog = listen_backlog
        #: Test hook, None in normal operation: called with each authenticated message, it may
        #: return "drop-before" (close without handling it) or "drop-after" (handle it, then
        #: close without replying: a lost acknowledgement), or "delay:<seconds>".
        self.fault: Callable[[object], str | None] | None = None
        #: How long (ms) a task refused now should wait to be cancelled
        #: (docs/decisions/044-quiet-failover.md): set by the owner to a function that is
        #: positive only while the job has failed and the run is not closed; any thread may
        #: call it.
        self.failover_hold: Callable[[], int] = _no_hold
        self.dropped_connections = 0
        self.refused_connections = 0
        self.evicted_connections = 0  # unauthenticated, dropped for newer ones (rule 5)
        self.frames_served = 0
        self._lock = threading.Lock()
        self._open = 0  # connections admitted and not yet ended (under _lock)
        self._authenticated = 0  # of those, the authenticated ones: the cap's (under _lock)
        self._accepted_at: dict[socket.socket, float] = {}  # admitted, thread not yet serving
        self._refusals = _Throttle(self.REFUSAL_LOG_INTERVAL_S)  # WARNING lines (under _lock)
        self._evictions = _Throttle(self.REFUSAL_LOG_INTERVAL_S)
        server = self

        # The I/O loop: one thread serves every admitted connection (rule 2)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()  # hands it new connections, or close
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._incoming: list[socket.socket] = []  # admitted, not yet in the loop (under _lock)
        self._closing = False
        # the loop's: not yet authenticated, oldest first (rules 4 and 5)
        self._waiting_first: dict[socket.socket, _Connection] = {}
        self._connections: dict[socket.socket, _Connection] = {}  # the loop's

        class _Server(socketserver.TCPServer):
            allow_reuse_address = True
            request_queue_size = listen_backlog  # server_activate's listen() uses it

            def verify_request(self, request: object, client_address: object) -> bool:
                assert isinstance(request, socket.socket)
                return server._admit(request, client_address)  # False: closed at once

            def process_request(self, request: object, client_address: object) -> None:
                assert isinstance(request, socket.socket)
                server._hand_over(request)  # the I/O loop serves it from now on

        self._server = _Server((host, port), socketserver.BaseRequestHandler,
                               bind_and_activate=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="sparkcoord-channel",
                                        daemon=True)
        self._io = threading.Thread(target=self._io_loop, name="sparkcoord-channel-io",
                                    daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port). Any thread."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def open_connections(self) -> int:
        """Connections being served now (admitted, not yet ended). Any thread."""
        with self._lock:
            return self._open

    @property
    def authenticated_connections(self) -> int:
        """Connections being served now that sent an authenticated frame (the ones the cap
        counts, rule 6). Any thread."""
        with self._lock:
            return self._authenticated

    def start(self) -> ChannelServer:
        """Start accepting and serving. The owner's thread (the driver side's constructor, or
        a test)."""
        self._io.start()
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting and close the listening socket (also if never started). Connections
        already open are still served until their peers close them (a task of the ended run
        gets its refusal); the I/O loop ends after the last. Except when the job failed
        (``failover_hold`` positive): then the I/O loop closes every connection at once,
        which releases the refused tasks waiting for their cancellation (rule 8). The
        owner's thread."""
        if self._thread.ident is not None:  # shutdown() waits for serve_forever to return
            self._server.shutdown()
        self._server.server_close()
        self._closing = True
        self._wake()

    def _admit(self, sock: socket.socket, peer: object) -> bool:
        # the accept thread, right after accept(): admit while the cap has room, or refuse
        # (rule 6); an unauthenticated connection does not count against the cap (rule 5)
        now = time.monotonic()
        with self._lock:
            if self._authenticated < self.max_connections:
                self._open += 1
                self._accepted_at[sock] = now
                return True
        self._refused(peer, now)
        return False

    def _refused(self, peer: object, now: float) -> None:
        # the accept thread, or the I/O loop for a connection that authenticated at a full cap
        with self._lock:
            self.refused_connections += 1
            due = self._refusals.note(now)
            open_now = self._authenticated
        if due is None:
            return
        refused, last = due
        host, port = self.address
        if last is None:
            what = f"refused a connection from {peer}"
        else:
            what = (f"refused {refused} connection{'s' if refused != 1 else ''} in the last "
                    f"{now - last:.0f} s, the latest from {peer}")
        log.warning("channel server at %s:%d %s: %d authenticated connections open, the cap "
                    "is %d (ServiceConfig.max_channel_connections)", host, port, what, open_now,
                    self.max_connections)

    def _evicted(self, count: int, peer: object) -> None:
        # rule 5: ``count`` unauthenticated connections were dropped for newer ones
        now = time.monotonic()
        with self._lock:
            self.evicted_connections += count
            due = self._evictions.note(now, count)
        if due is None:
            return
        evicted, last = due
        host, port = self.address
        since = "" if last is None else f" in the last {now - last:.0f} s"
        log.warning("channel server at %s:%d dropped %d unauthenticated connection%s%s, the "
                    "latest from %s: more than %d connections had not sent an authenticated "
                    "frame (the oldest are dropped first)", host, port, evicted,
                    "s" if evicted != 1 else "", since, peer, self.max_unauthenticated)

    def _connection_ended(self, sock: socket.socket, authenticated: bool) -> None:
        with self._lock:
            self._open -= 1
            if authenticated:
                self._authenticated -= 1
            self._accepted_at.pop(sock, None)

    # ----------------------------------------------------------------------- the I/O loop
    def _hand_over(self, sock: socket.socket) -> None:
        # the accept thread: an admitted connection goes to the I/O loop. If the loop has not
        # taken a budget's worth of them yet (it is busy), the oldest of those is closed
        # (rule 5): the accept thread outpaces a busy loop, and what it holds is bounded.
        oldest = None
        with self._lock:
            if len(self._incoming) >= self.max_unauthenticated:
                oldest = self._incoming.pop(0)
                self._open -= 1
                self._accepted_at.pop(oldest, None)
            self._incoming.append(sock)
        self._wake()
        if oldest is not None:
            peer = _peer(oldest)
            oldest.close()  # never seen by the loop: nothing else refers to it
            self._evicted(1, peer)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # the loop has ended (and closed its end): nothing to wake

    def _io_loop(self) -> None:
        # The one thread that reads every connection (rule 2). Why one: with a thread per
        # connection, P tasks asking at once cost P threads handing the GIL to each other per
        # request, about two thirds of the server's CPU per request
        # (docs/decisions/045-one-io-thread.md).
        try:
            while True:
                timeout = None
                if self._waiting_first:  # oldest first: the first has the nearest deadline
                    first = next(iter(self._waiting_first.values())).deadline
                    timeout = max(0.0, first - time.monotonic())
                for key, _ in self._selector.select(timeout):
                    if key.data is None:
                        self._take_incoming()
                    else:
                        self._readable(key.data)
                if self._waiting_first:
                    if len(self._waiting_first) > self.max_unauthenticated:
                        self._shed()
                    self._drop_late(time.monotonic())
                if self._closing and self.failover_hold() > 0:
                    # rule 8: the failed run's tasks wait for this (also a job that failed
                    # while its run was closing; the hold stays positive once it failed)
                    for conn in list(self._connections.values()):
                        self._end(conn)
                if self._closing and not self._connections and not self._incoming:
                    return
        finally:
            for conn in list(self._connections.values()):
                self._end(conn)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _take_incoming(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            incoming, self._incoming = self._incoming, []
        now = time.monotonic()
        for sock in incoming:
            with self._lock:
                accepted = self._accepted_at.pop(sock, now)
            conn = _Connection(sock, FrameReader(sock, self.max_frame_bytes), _Writer(sock, self),
                               accepted + self.first_frame_timeout_s)
            try:
                conn.peer = sock.getpeername()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._selector.register(sock, selectors.EVENT_READ, conn)
            except OSError as exc:  # gone before it was served
                self._connections[sock] = conn
                self._ended_unclosed(conn, repr(exc))
                continue
            self._connections[sock] = self._waiting_first[sock] = conn

    def _drop_late(self, now: float) -> None:
        # rule 4: a total deadline for the first authenticated frame, counted from accept
        # (oldest first: the late ones are at the front)
        late: list[_Connection] = []
        for conn in self._waiting_first.values():
            if conn.deadline > now:
                break
            late.append(conn)
        for conn in late:
            self._dropped(conn, FrameError(
                f"no authenticated frame within {self.first_frame_timeout_s} s of connecting"))

    def _shed(self) -> None:
        # rule 5: more connections wait for their first authenticated frame than their budget.
        # First read the waiting ones that sent something (a task's first frame is there as
        # soon as it connected; garbage is dropped by rule 3), then drop the oldest that still
        # wait. Only under a flood: nothing of this runs per request.
        waiting = self._waiting_first
        for key, _ in self._selector.select(0):
            conn = key.data
            if conn is not None and conn.sock in waiting:
                self._readable(conn)
        excess = len(waiting) - self.max_unauthenticated
        if excess <= 0:
            return
        oldest = list(itertools.islice(waiting.values(), excess))
        for conn in oldest:
            self._end(conn)
        self._evicted(len(oldest), oldest[-1].peer)

    def _readable(self, conn: _Connection) -> None:
        # the I/O loop: read what the socket has, answer every complete frame in it
        try:
            reader = conn.reader
            if not reader.receive():
                if not reader.buffered:
                    self._end(conn)  # closed between frames: normal end (rule 3)
                elif conn.authenticated:
                    self._ended_unclosed(conn, "closed")  # its task stopped mid-write
                else:
                    raise FrameError(f"connection closed {reader.buffered} bytes into a frame")
                return
            batch: list[Message] = []
            while (frame := reader.next_frame()) is not None:
                message = authenticate_and_parse(*frame, self.secret)
                if not conn.authenticated and not self._authenticated_first(conn):
                    return  # the cap is full: closed unanswered (rule 6)
                if isinstance(message, (Register, Finished)):  # whom it serves (rule 3)
                    conn.attempt = message.attempt
                    conn.finished = isinstance(message, Finished)
                if self.fault is not None:  # test hook (channel/faults.py): off, one check
                    action = self.fault(message)
                    if action is not None:
                        # the frames before the hit one go the production way (one batch, as
                        # without a plan), in order; then the fault happens to this one
                        if batch:
                            conn.writer.send(self._answer(self._dispatch_batch(batch,
                                                                               conn.writer)))
                            self.frames_served += len(batch)
                            batch = []
                        if self._inject(action, message, conn.sock, conn.writer):
                            self._end(conn)
                            return
                batch.append(message)
            if batch:
                conn.writer.send(self._answer(self._dispatch_batch(batch, conn.writer)))
                self.frames_served += len(batch)
        except (ConnectionResetError, BrokenPipeError) as exc:
            if conn.authenticated or not conn.reader.buffered:
                self._ended_unclosed(conn, repr(exc))
            else:
                self._dropped(conn, exc)  # a partial unauthenticated frame: not ours (rule 3)
        except (FrameError, OSError) as exc:
            self._dropped(conn, exc)

    def _authenticated_first(self, conn: _Connection) -> bool:
        # its first authenticated frame: it may idle between events from now on (rule 4),
        # and counts against the cap, if the cap has room (rule 6)
        with self._lock:
            admitted = self._authenticated < self.max_connections
            if admitted:
                self._authenticated += 1
                conn.authenticated = True
        if admitted:
            self._waiting_first.pop(conn.sock, None)
            return True
        self._refused(conn.peer, time.monotonic())  # counted before the peer sees the close
        self._end(conn)
        return False

    def _dropped(self, conn: _Connection, exc: BaseException) -> None:
        with self._lock:
            self.dropped_connections += 1
        log.warning("dropped channel connection from %s: %s", conn.peer, exc)
        self._end(conn)

    def _ended_unclosed(self, conn: _Connection, how: str) -> None:
        # Rule 3: the peer went away without a clean close (a reset, or a close in the middle
        # of a frame). A task closes cleanly after its batch (client rule 8), so this is a
        # task whose process ended mid-connection: cancelled (a query stop), killed, or
        # failed. Not a warning: Spark's log says which, and the service logs a failed
        # task's retry; one line per connection.
        with self._lock:
            self.dropped_connections += 1
        attempt = conn.attempt
        who = (f"the task of {attempt.subtask} in epoch {attempt.epoch} (Spark attempt "
               f"{attempt.number})" if attempt is not None
               else "a task or client of the job" if conn.authenticated
               else "an unauthenticated peer")
        partial = conn.reader.buffered
        if partial and conn.authenticated:
            log.info("channel connection of %s from %s ended %d bytes into a frame (%s): its "
                     "task stopped while writing it (cancelled, killed or failed: Spark's log "
                     "says which)", who, conn.peer, partial, how)
        else:
            log.debug("channel connection of %s from %s ended without a clean close (%s)%s: "
                      "its process went away (a task cancelled, killed or failed: Spark's log "
                      "says which)", who, conn.peer, how,
                      ", after its task said it finished" if conn.finished else "")
        self._end(conn)

    def _end(self, conn: _Connection) -> None:
        sock = conn.sock
        if self._connections.pop(sock, None) is None:
            return
        self._waiting_first.pop(sock, None)
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass  # never registered, or its descriptor is closed already
        # its place under the cap is free before its peer can see the close (rule 6): a
        # client that reconnects at once must not be refused for its own dead connection
        self._connection_ended(sock, conn.authenticated)
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        # not while another thread writes an answer to it (the coordinator's, the service
        # closing): its descriptor could be reused by then (a review finding on rule 8)
        writer = conn.writer
        locked = writer.lock.acquire(timeout=1.0)
        try:
            writer.closed = True
            sock.close()
        finally:
            if locked:
                writer.lock.release()

    def _answer(self, answers: list[Reply | Delivery | Response]) -> bytes:
        # consecutive replies travel as one REPLIES frame: one MAC for the whole batch
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

    def _dispatch_batch(self, batch: list[Message], writer: _Writer | None = None
                        ) -> list[Reply | Delivery | Response]:
        # Consecutive event frames go to the service as one call of runs (an EVENTS frame is a
        # run, a lone EVENT a run of one); each run is answered with at most three range
        # replies (duplicates, accepted, rejected), and adjacent ranges with the same verdict
        # are merged, so a burst of any size costs a few bytes of acknowledgement.
        replies: list[Reply | Delivery | Response] = []
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
                        hold = self.failover_hold() if verdict is ReplyVerdict.REJECT else 0
                        _add_range(replies, Reply(FrameType.EVENT, seq, verdict,
                                                  decision.execution_attempt, reason, count, hold))
                        seq += count
            i = j
        return replies

    def _request(self, message: Request | ClientRequest, writer: _Writer) -> None:
        # The answer is written by the thread that logs it (the coordinator's, usually) the
        # moment it exists: the connection's thread does not wait for it (one thread handoff
        # less per request), and goes back to reading the socket.
        seq = message.seq
        if isinstance(message, Request):
            asker: Asker = message.attempt
            # a task's answer: a failed job's tasks wait (docs/decisions/044-quiet-failover.md)
            hold = self.failover_hold
        else:
            asker, hold = DriverClient(message.operator, message.client), _no_hold
        answer = self.handler.request_received(asker, seq, message.payload)

        def answered(f: Future[Answer]) -> None:
            writer.send(encode(_response(seq, f, hold), self.secret), quiet=True)
        answer.add_done_callback(answered)

    def _finished(self, message: Finished, writer: _Writer) -> None:
        # As a request: the reply is written by the thread that completes the decision (the
        # coordinator's, after handle_items_withdrawn), not waited for here.
        seq = message.seq

        def decided(f: Future[InboundDecision]) -> None:
            decision = f.result()
            verdict = _VERDICTS[decision.verdict]
            reply = Reply(FrameType.FINISHED, seq, verdict, decision.execution_attempt,
                          decision.reason, 1,
                          self.failover_hold() if verdict is ReplyVerdict.REJECT else 0)
            writer.send(encode(reply, self.secret), quiet=True)
        self.handler.attempt_finished(message.attempt, seq).add_done_callback(decided)

    def _inject(self, action: str, message: Message, sock: socket.socket,
                writer: _Writer) -> bool:
        """Do the fault plan's ``action`` to ``message`` (the I/O loop; channel/faults.py):
        True when the connection ended; False when the message goes on the production way
        (after a delay)."""
        if action == "drop-before":
            sock.close()
            return True
        if action == "drop-after":
            writer.closed = True  # a lost answer: nothing more is written to this connection
            self._dispatch_batch([message], writer)
            sock.close()
            return True
        if action and action.startswith("delay:"):
            threading.Event().wait(float(action.split(":", 1)[1]))
        return False

    def _dispatch(self, message: object) -> Reply | Delivery | Response:
        if isinstance(message, Register):
            decision = self.handler.attempt_registered(message.attempt)
            verdict = _VERDICTS[decision.verdict]
            # ``seq``: the length of the history the attempt continues (it then says how
            # much of it it sent when it finishes)
            return Reply(FrameType.REGISTER, decision.history_length, verdict,
                         decision.execution_attempt, decision.reason, 1,
                         self.failover_hold() if verdict is ReplyVerdict.REJECT else 0)

        if isinstance(message, Fetch):
            if self.deliveries is None:
                return Delivery("", message.epoch, (), "this server serves no downstream operators")
            return self.deliveries.fetch(message.operator, message.index, message.epoch)
        raise FrameError(f"a client may not send {type(message).__name__} frames")


def _no_hold() -> int:
    return 0


class _Connection:
    """One admitted connection, as the I/O loop keeps it."""

    __slots__ = ("sock", "reader", "writer", "deadline", "peer", "authenticated", "attempt",
                 "finished")

    def __init__(self, sock: socket.socket, reader: FrameReader, writer: _Writer,
                 deadline: float) -> None:
        self.sock, self.reader, self.writer, self.deadline = sock, reader, writer, deadline
        self.peer: object = "?"
        self.authenticated = False  # sent an authenticated frame: counted by the cap (rule 6)
        self.attempt: TaskAttempt | None = None  # the task attempt it serves (its REGISTER)
        self.finished = False  # its last frame of note was FINISHED (the task's end, client rule 3)


class _Throttle:
    """When to write a WARNING line about a repeated happening: the first at once, then at
    most one per ``interval`` with the number since. Used under the server's lock."""

    __slots__ = ("interval", "unlogged", "logged_at")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.unlogged = 0
        self.logged_at: float | None = None

    def note(self, now: float, count: int = 1) -> tuple[int, float | None] | None:
        """Count ``count`` more; None, or (the number to report, when the last line was)."""
        self.unlogged += count
        last = self.logged_at
        if last is not None and now - last < self.interval:
            return None
        reported, self.unlogged = self.unlogged, 0
        self.logged_at = now
        return reported, last


def _peer(sock: socket.socket) -> object:
    try:
        return sock.getpeername()
    except OSError:
        return "?"


def _response(seq: int, answer: Future[Answer],
              hold: Callable[[], int] = _no_hold) -> Response:
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


class _Writer:
    """Writes to one connection from its own thread and from the threads that answer its
    requests (one ``sendall`` at a time, so frames never interleave)."""

    __slots__ = ("sock", "server", "lock", "closed")

    def __init__(self, sock: socket.socket, server: ChannelServer) -> None:
        self.sock = sock
        self.server = server
        self.lock = threading.Lock()
        self.closed = False

    def send(self, data: bytes, quiet: bool = False) -> None:
        """Write ``data`` whole. ``quiet``: from an answering thread, where a connection that
        went away is not an error (the task asks again on its next connection)."""
        if not data:
            return
        with self.lock:
            if self.closed:
                return
            try:
                self.sock.sendall(data)
            except OSError:
                if not quiet:
                    raise
                self.closed = True


def _add_range(replies: list[Reply | Delivery | Response], reply: Reply) -> None:
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
