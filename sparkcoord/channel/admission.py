"""Admission: which connections the channel server takes, keeps and serves (server rules 4 to 7).

A connection is admitted by the accept thread, handed to the I/O loop, and authenticated by
its first authenticated frame: that frame is the handshake (the job's secret, frames rule 1;
no frame's body is parsed before its MAC is checked, and an unauthenticated connection is
never answered: frames rule 2, server rule 2). This module
holds the limits on the way there. It is connection admission, not the inbound gate's
(docs/protocol.md [inbound-admission], core/inbound.py), which decides each authenticated
input.

Rules (rules 1 to 4 are server rules 4 to 7, which cite them; rule 5 belongs to server rule 6):
  1. A connection must complete its first authenticated frame within ``first_frame_timeout_s``
     of being accepted (a total deadline, not per read: a client trickling bytes is dropped
     too); after that it may stay idle for as long as it likes (a task between events).
  2. Nothing unauthenticated can crowd out a task. Connections that have not yet sent an
     authenticated frame have a budget of their own, ``max_unauthenticated`` (default
     max(16, max_connections // 4)), apart from the cap of rule 3. When more than that wait,
     the I/O loop first reads the ones that sent something (a task sends its first frame
     as soon as it connects), then drops the oldest that still wait: the newest are kept,
     so idle sockets opened earlier cannot keep a task's fresh connection out. Connections
     the accept thread handed over and the loop has not taken yet are bounded alike (a busy
     loop: the oldest are closed). One WARNING line, then at most one every 10 s.
  3. At most ``max_connections`` authenticated connections are served at once; unauthenticated
     ones never count against it and never evict an authenticated one. While it is full, a
     new connection is closed as soon as it is accepted, before the I/O loop sees it; one
     that authenticates while it is full is closed then, unanswered (its task retries). One
     WARNING line, then at most one every 10 s with the number refused since.
  4. The listen backlog is ``listen_backlog`` (connections the kernel queues before the
     accept thread takes them: sized for the run's parallelism; the server's listening
     socket applies it).
  5. A connection's place under the cap is free before its peer can see its close: a client
     that reconnects at once is not refused for its own dead connection.

Thread model: :meth:`Admission.admit` and :meth:`Admission.hand_over` on the server's accept
thread; the rest on its I/O loop, except the counts, which any thread may read. The counts
shared by both threads are guarded by the admission's own lock; ``waiting`` is the loop's.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable

from sparkcoord.channel.connection import Connection

# the server's lines, under the server's logger name: a logging setup that names the channel
# server's logger sees them as before admission had a module of its own
log = logging.getLogger("sparkcoord.channel.server")


class Admission:
    """The limits of one channel server (rules 1 to 5) and the connections they count.

    ``where`` gives the server's bound (host, port), for the WARNING lines; ``wake`` wakes
    the I/O loop (a connection was handed over); ``log_interval_s``: at most one WARNING line
    about refused (or about evicted) connections per this many seconds."""

    def __init__(self, *, first_frame_timeout_s: float, max_connections: int,
                 listen_backlog: int, max_unauthenticated: int | None,
                 where: Callable[[], tuple[str, int]], wake: Callable[[], None],
                 log_interval_s: float = 10.0) -> None:
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
        # (``listen_backlog`` is checked here, and applied by the server's listening socket)
        self.first_frame_timeout_s = first_frame_timeout_s
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self._where, self._wake = where, wake
        self.refused = 0  # refused at a full cap (rule 3)
        self.evicted = 0  # unauthenticated, dropped for newer ones (rule 2)
        self._lock = threading.Lock()
        self._open = 0  # connections admitted and not yet ended (under _lock)
        self._authenticated = 0  # of those, the authenticated ones: the cap's (under _lock)
        self._accepted_at: dict[socket.socket, float] = {}  # admitted, not yet in the loop
        self._incoming: list[socket.socket] = []  # admitted, not yet in the loop (under _lock)
        self._refusals = Throttle(log_interval_s)  # WARNING lines (under _lock)
        self._evictions = Throttle(log_interval_s)
        #: the loop's: not yet authenticated, oldest first (rules 1 and 2)
        self.waiting: dict[socket.socket, Connection] = {}

    @property
    def open(self) -> int:
        """Connections admitted and not yet ended. Any thread."""
        with self._lock:
            return self._open

    @property
    def authenticated(self) -> int:
        """Of those, the ones that sent an authenticated frame (the cap's, rule 3). Any thread."""
        with self._lock:
            return self._authenticated

    @property
    def has_incoming(self) -> bool:
        """Whether connections wait for the I/O loop to take them. The I/O loop."""
        with self._lock:
            return bool(self._incoming)

    # ------------------------------------------------------------------ the accept thread
    def admit(self, sock: socket.socket, peer: object) -> bool:
        """Whether to serve ``sock``, just accepted (False: the server closes it at once).
        The accept thread, right after accept(): admit while the cap has room, or refuse
        (rule 3); an unauthenticated connection does not count against the cap (rule 2)."""
        now = time.monotonic()
        with self._lock:
            if self._authenticated < self.max_connections:
                self._open += 1
                self._accepted_at[sock] = now
                return True
        self._refused(peer, now)
        return False

    def hand_over(self, sock: socket.socket) -> None:
        """An admitted connection goes to the I/O loop. The accept thread. If the loop has
        not taken a budget's worth of them yet (it is busy), the oldest of those is closed
        (rule 2): the accept thread outpaces a busy loop, and what it holds is bounded."""
        oldest = None
        with self._lock:
            if len(self._incoming) >= self.max_unauthenticated:
                oldest = self._incoming.pop(0)
                self._open -= 1
                self._accepted_at.pop(oldest, None)
            self._incoming.append(sock)
        self._wake()
        if oldest is not None:
            peer = peer_of(oldest)
            oldest.close()  # never seen by the loop: nothing else refers to it
            self.evicted_some(1, peer)

    # --------------------------------------------------------------------- the I/O loop
    def take_incoming(self) -> list[tuple[socket.socket, float]]:
        """The connections handed over since, each with the deadline of its first
        authenticated frame (rule 1: counted from its accept). The I/O loop, woken."""
        with self._lock:
            incoming, self._incoming = self._incoming, []
        now = time.monotonic()
        taken = []
        for sock in incoming:
            with self._lock:
                accepted = self._accepted_at.pop(sock, now)
            taken.append((sock, accepted + self.first_frame_timeout_s))
        return taken

    def timeout(self) -> float | None:
        """How long the I/O loop may wait for its sockets: until the nearest first-frame
        deadline (rule 1), or None. The I/O loop."""
        if not self.waiting:
            return None
        first = next(iter(self.waiting.values())).deadline  # oldest first: the nearest
        return max(0.0, first - time.monotonic())

    def late(self, now: float) -> list[Connection]:
        """The waiting connections past their first-frame deadline (rule 1), to be dropped.
        The I/O loop (oldest first: the late ones are at the front)."""
        late: list[Connection] = []
        for conn in self.waiting.values():
            if conn.deadline > now:
                break
            late.append(conn)
        return late

    def crowded(self) -> bool:
        """Whether more connections wait for their first authenticated frame than their
        budget (rule 2). The I/O loop."""
        return len(self.waiting) > self.max_unauthenticated

    def excess(self) -> list[Connection]:
        """The oldest waiting connections beyond the budget, to be dropped (rule 2). The I/O
        loop, after it read the waiting ones that sent something."""
        count = len(self.waiting) - self.max_unauthenticated
        return list(itertools.islice(self.waiting.values(), count)) if count > 0 else []

    def authenticated_first(self, conn: Connection) -> bool:
        """``conn`` sent its first authenticated frame: it may idle between events from now
        on (rule 1) and counts against the cap, if the cap has room (rule 3). False: it is
        refused (counted before the peer sees the close), and the loop ends it unanswered.
        The I/O loop."""
        with self._lock:
            admitted = self._authenticated < self.max_connections
            if admitted:
                self._authenticated += 1
                conn.authenticated = True
        if admitted:
            self.waiting.pop(conn.sock, None)
            return True
        self._refused(conn.peer, time.monotonic())
        return False

    def ended(self, conn: Connection) -> None:
        """``conn`` ends: its place is free (rule 5). The I/O loop, before it closes it."""
        sock = conn.sock
        self.waiting.pop(sock, None)
        with self._lock:
            self._open -= 1
            if conn.authenticated:
                self._authenticated -= 1
            self._accepted_at.pop(sock, None)

    # ---------------------------------------------------------------- the WARNING lines
    def _refused(self, peer: object, now: float) -> None:
        # the accept thread, or the I/O loop for a connection that authenticated at a full cap
        with self._lock:
            self.refused += 1
            due = self._refusals.note(now)
            open_now = self._authenticated
        if due is None:
            return
        refused, last = due
        host, port = self._where()
        if last is None:
            what = f"refused a connection from {peer}"
        else:
            what = (f"refused {refused} connection{'s' if refused != 1 else ''} in the last "
                    f"{now - last:.0f} s, the latest from {peer}")
        log.warning("channel server at %s:%d %s: %d authenticated connections open, the cap "
                    "is %d (ServiceConfig.max_channel_connections)", host, port, what, open_now,
                    self.max_connections)

    def evicted_some(self, count: int, peer: object) -> None:
        """``count`` unauthenticated connections were dropped for newer ones, the latest from
        ``peer`` (rule 2). The accept thread or the I/O loop."""
        now = time.monotonic()
        with self._lock:
            self.evicted += count
            due = self._evictions.note(now, count)
        if due is None:
            return
        evicted, last = due
        host, port = self._where()
        since = "" if last is None else f" in the last {now - last:.0f} s"
        log.warning("channel server at %s:%d dropped %d unauthenticated connection%s%s, the "
                    "latest from %s: more than %d connections had not sent an authenticated "
                    "frame (the oldest are dropped first)", host, port, evicted,
                    "s" if evicted != 1 else "", since, peer, self.max_unauthenticated)


class Throttle:
    """When to write a WARNING line about a repeated happening: the first at once, then at
    most one per ``interval`` with the number since. Used under the admission's lock."""

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


def peer_of(sock: socket.socket) -> object:
    """The peer's address of ``sock``, or "?" when it is gone."""
    try:
        return sock.getpeername()
    except OSError:
        return "?"
