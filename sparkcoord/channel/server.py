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
     of being accepted; after that it may stay idle (admission rule 1, channel/admission.py).
  5. Nothing unauthenticated can crowd out a task: connections that have not yet sent an
     authenticated frame have a budget of their own, ``max_unauthenticated``; beyond it the
     oldest are dropped (admission rule 2).
  6. At most ``max_connections`` authenticated connections are served at once; unauthenticated
     ones never count against it; more are closed unanswered (admission rules 3 and 5).
  7. The listen backlog is ``listen_backlog`` (admission rule 4).
  8. Closing the server of a run whose job failed (the query stopped for the failover:
     ``failover_hold`` is positive) closes every connection at once: a task refused for the
     failure waits on its connection for its cancellation (client rule 7), and this close
     is that cancellation's sign, so its Python worker is free for the restarted query at
     once instead of after Spark's kill timeout (docs/decisions/081-release-refused-tasks.md).

Theory of operation: a client pipelines up to its window of events, in bursts (EVENTS frames).
The I/O loop reads a readable socket in large chunks (:class:`FrameReader`), authenticates
every complete frame in its buffer, and hands the frames of the read to dispatch
(channel/dispatch.py) as one batch: consecutive event frames reach the service as runs in one
call (one lock, one log write), and are answered by range replies, all written with one
``sendall``. A frame is acknowledged only after the service logged it, so batching changes
the cost, not the guarantee. A request's answer, and any answer completed later on another
thread, is written by the thread that has it (the connection's writer, channel/connection.py).
Sockets stay blocking: the loop reads only a readable one, and a write blocks only until the
task's own socket buffer takes it (a task reads its replies). Admission (channel/admission.py)
decides which connections are taken and kept; a test's fault plan (channel/faults.py) acts on
the frames it hits, the others taking the production path.

Thread model: ``start``/``close`` from the owner's thread; one daemon thread accepts (and
refuses connections while the cap is full, rule 6) and hands admitted connections to the one
daemon I/O thread, which serves them all until their peers close them (also after ``close``,
which only stops accepting). The handler must be thread-safe (the coordination service is).
"""

from __future__ import annotations

import logging
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Callable

from sparkcoord.channel import faults
from sparkcoord.channel.admission import Admission, Throttle, peer_of
from sparkcoord.channel.connection import Connection, Writer
from sparkcoord.channel.dispatch import (
    VERDICTS,
    Answered,
    Dispatcher,
    add_range,
    no_hold,
    response,
)
from sparkcoord.channel.dispatch import DeliveryHandler as DeliveryHandler
from sparkcoord.channel.dispatch import InboundHandler as InboundHandler
from sparkcoord.channel.frames import (
    Finished,
    FrameError,
    FrameReader,
    Message,
    Register,
    authenticate_and_parse,
)

log = logging.getLogger(__name__)

# the names these had in this module before admission, dispatch and the connection had
# modules of their own (docs/decisions/100-channel-server-split.md): old imports keep working
_VERDICTS = VERDICTS
_no_hold = no_hold
_response = response
_add_range = add_range
_Connection = Connection
_Writer = Writer
_Throttle = Throttle
_peer = peer_of


class ChannelServer:
    """Serves subtask connections for one coordination service.

    Limits (module rules 4 to 7, channel/admission.py): ``first_frame_timeout_s`` for a
    connection's first authenticated frame, counted from its accept; ``max_unauthenticated``
    connections waiting for it (beyond that the oldest are dropped, counted in
    ``evicted_connections``); ``max_connections`` authenticated ones served at once (more are
    closed and counted in ``refused_connections``); ``listen_backlog`` for the kernel's queue
    of connections not yet accepted.
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
        server = self
        # admission checks its limits first: a bad one binds no port
        self._admission = admission = Admission(
            first_frame_timeout_s=first_frame_timeout_s, max_connections=max_connections,
            listen_backlog=listen_backlog, max_unauthenticated=max_unauthenticated,
            where=lambda: server.address, wake=self._wake,
            log_interval_s=self.REFUSAL_LOG_INTERVAL_S)
        self.handler = handler
        self.deliveries = deliveries
        self.secret = secret
        self.max_frame_bytes = max_frame_bytes
        self.first_frame_timeout_s = first_frame_timeout_s
        self.max_connections = max_connections
        self.max_unauthenticated = admission.max_unauthenticated
        self.listen_backlog = listen_backlog
        #: Test hook, None in normal operation: called with each authenticated message, it may
        #: return "drop-before" (close without handling it) or "drop-after" (handle it, then
        #: close without replying: a lost acknowledgement), or "delay:<seconds>"
        #: (channel/faults.py).
        self.fault: Callable[[object], str | None] | None = None
        #: How long (ms) a task refused now should wait to be cancelled
        #: (docs/decisions/044-quiet-failover.md): set by the owner to a function that is
        #: positive only while the job has failed and the run is not closed; any thread may
        #: call it.
        self.failover_hold: Callable[[], int] = no_hold
        self._dispatcher = Dispatcher(handler, deliveries, secret,
                                      lambda: server.failover_hold())
        self.dropped_connections = 0
        self.frames_served = 0

        # The I/O loop: one thread serves every admitted connection (rule 2)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()  # hands it new connections, or close
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._closing = False
        self._connections: dict[socket.socket, Connection] = {}  # the loop's

        class _Server(socketserver.TCPServer):
            allow_reuse_address = True
            request_queue_size = listen_backlog  # server_activate's listen() uses it (rule 7)

            def verify_request(self, request: object, client_address: object) -> bool:
                assert isinstance(request, socket.socket)
                return admission.admit(request, client_address)  # False: closed at once

            def process_request(self, request: object, client_address: object) -> None:
                assert isinstance(request, socket.socket)
                admission.hand_over(request)  # the I/O loop serves it from now on

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
        return self._admission.open

    @property
    def authenticated_connections(self) -> int:
        """Connections being served now that sent an authenticated frame (the ones the cap
        counts, rule 6). Any thread."""
        return self._admission.authenticated

    @property
    def refused_connections(self) -> int:
        """Connections closed because the cap was full (rule 6), since the start. Any thread."""
        return self._admission.refused

    @property
    def evicted_connections(self) -> int:
        """Unauthenticated connections dropped for newer ones (rule 5), since the start. Any
        thread."""
        return self._admission.evicted

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

    # ----------------------------------------------------------------------- the I/O loop
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
        admission = self._admission
        try:
            while True:
                for key, _ in self._selector.select(admission.timeout()):
                    if key.data is None:
                        self._take_incoming()
                    else:
                        self._readable(key.data)
                if admission.waiting:
                    if admission.crowded():
                        self._shed()
                    for conn in admission.late(time.monotonic()):  # rule 4
                        self._dropped(conn, FrameError(
                            f"no authenticated frame within {self.first_frame_timeout_s} s of "
                            "connecting"))
                if self._closing and self.failover_hold() > 0:
                    # rule 8: the failed run's tasks wait for this (also a job that failed
                    # while its run was closing; the hold stays positive once it failed)
                    for conn in list(self._connections.values()):
                        self._end(conn)
                if self._closing and not self._connections and not admission.has_incoming:
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
        for sock, deadline in self._admission.take_incoming():
            conn = Connection(sock, FrameReader(sock, self.max_frame_bytes), Writer(sock, self),
                              deadline)
            try:
                conn.peer = sock.getpeername()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._selector.register(sock, selectors.EVENT_READ, conn)
            except OSError as exc:  # gone before it was served
                self._connections[sock] = conn
                self._ended_unclosed(conn, repr(exc))
                continue
            self._connections[sock] = self._admission.waiting[sock] = conn

    def _shed(self) -> None:
        # rule 5: more connections wait for their first authenticated frame than their budget.
        # First read the waiting ones that sent something (a task's first frame is there as
        # soon as it connected; garbage is dropped by rule 3), then drop the oldest that still
        # wait. Only under a flood: nothing of this runs per request.
        waiting = self._admission.waiting
        for key, _ in self._selector.select(0):
            conn = key.data
            if conn is not None and conn.sock in waiting:
                self._readable(conn)
        oldest = self._admission.excess()
        if not oldest:
            return
        for conn in oldest:
            self._end(conn)
        self._admission.evicted_some(len(oldest), oldest[-1].peer)

    def _readable(self, conn: Connection) -> None:
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
                message = authenticate_and_parse(*frame, self.secret)  # rule 2: before parsing
                if not conn.authenticated and not self._admission.authenticated_first(conn):
                    self._end(conn)  # the cap is full: closed unanswered (rule 6)
                    return
                if isinstance(message, (Register, Finished)):  # whom it serves (rule 3)
                    conn.attempt = message.attempt
                    conn.finished = isinstance(message, Finished)
                if self.fault is not None:  # test hook (channel/faults.py): off, one check
                    action = self.fault(message)
                    if action is not None:
                        # the frames before the hit one go the production way (one batch, as
                        # without a plan), in order; then the fault happens to this one
                        if batch:
                            self._serve(conn, batch)
                            batch = []
                        if faults.inject(action, message, conn.sock, conn.writer,
                                         self._dispatch_batch):
                            self._end(conn)
                            return
                batch.append(message)
            if batch:
                self._serve(conn, batch)
        except (ConnectionResetError, BrokenPipeError) as exc:
            if conn.authenticated or not conn.reader.buffered:
                self._ended_unclosed(conn, repr(exc))
            else:
                self._dropped(conn, exc)  # a partial unauthenticated frame: not ours (rule 3)
        except (FrameError, OSError) as exc:
            self._dropped(conn, exc)

    def _serve(self, conn: Connection, batch: list[Message]) -> None:
        # the authenticated frames of one read, dispatched as one batch, their replies written
        # with one sendall (channel/dispatch.py)
        conn.writer.send(self._dispatcher.encode(self._dispatch_batch(batch, conn.writer)))
        self.frames_served += len(batch)

    def _dispatch_batch(self, batch: list[Message], writer: Writer | None = None
                        ) -> list[Answered]:
        # the one way a read's frames reach the service, with a fault plan too (faults rule 2)
        return self._dispatcher.dispatch_batch(batch, writer)

    def _dropped(self, conn: Connection, exc: BaseException) -> None:
        self.dropped_connections += 1
        log.warning("dropped channel connection from %s: %s", conn.peer, exc)
        self._end(conn)

    def _ended_unclosed(self, conn: Connection, how: str) -> None:
        # Rule 3: the peer went away without a clean close (a reset, or a close in the middle
        # of a frame). A task closes cleanly after its batch (client rule 8), so this is a
        # task whose process ended mid-connection: cancelled (a query stop), killed, or
        # failed. Not a warning: Spark's log says which, and the service logs a failed
        # task's retry; one line per connection.
        self.dropped_connections += 1  # the loop's count (other threads only read it)
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

    def _end(self, conn: Connection) -> None:
        sock = conn.sock
        if self._connections.pop(sock, None) is None:
            return
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass  # never registered, or its descriptor is closed already
        # its place under the cap is free before its peer can see the close (admission
        # rule 5): a client that reconnects at once must not be refused for its own dead
        # connection
        self._admission.ended(conn)
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
